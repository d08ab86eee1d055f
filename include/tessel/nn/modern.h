// The modern GPT variant's parts (model.norm, model.position, model.mlp; docs/models.md):
// RMSNorm, the SwiGLU gated unit and the rotary position embedding that the transformer
// blocks apply to their queries and keys. Modules as in layers.h: parameters only, what a
// forward keeps lives in the caller's Cache; used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/names.h"
#include "tessel/nn/module.h"

namespace tessel::nn {

enum class Norm { kLayerNorm, kRmsNorm };
enum class Position { kLearned, kRotary };  // a position table, or rotary q and k
enum class Mlp { kGelu, kSwiglu };          // fc 4C -> GELU, or fc 2H -> SwiGLU (H below)

// A GPT's choice of parts; the defaults are the classic GPT-2 block.
struct GptVariant {
  Norm norm = Norm::kLayerNorm;
  Position position = Position::kLearned;
  Mlp mlp = Mlp::kGelu;
};
// SwiGLU's hidden width H for C channels: 8C/3 rounded to a multiple of 8, so its three C x H
// matrices hold about the parameters of the classic MLP's two C x 4C ones.
int64_t swiglu_hidden(int64_t channels);

// LayerNorm (layers.h) or RMSNorm over C channels.
std::unique_ptr<Module> make_norm(Norm norm, int64_t channels);

// RMSNorm over the last dimension C (eps 1e-5): y = x / sqrt(mean(x^2) + eps) * weight; weight
// starts at ones. No bias, no centring.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t channels);
  std::string kind() const override { return "rmsnorm"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
  std::vector<Parameter*> parameters() override { return {&weight_}; }

 private:
  int64_t C_;
  Parameter weight_;
};

// SwiGLU on [..., 2H] = [a | b] -> [..., H]: silu(a) * b (the gate and up projections come from
// one linear layer of 2H outputs before it; cut by columns with groups 2 under tensor
// parallelism, so each rank holds matching slices of a and b).
class SwiGLU : public Module {
 public:
  std::string kind() const override { return "swiglu"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
};

// The position of each of the rows [B, T] of a training forward (t for row b * T + t).
std::vector<int64_t> sequence_positions(int64_t B, int64_t T);

}  // namespace tessel::nn

namespace tessel {
TESSEL_NAMES(nn::Norm, "layernorm", "rmsnorm");
TESSEL_NAMES(nn::Position, "learned", "rotary");
TESSEL_NAMES(nn::Mlp, "gelu", "swiglu");
}  // namespace tessel
