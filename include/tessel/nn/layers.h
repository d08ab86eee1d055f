// The layer blocks models are made of, each a Module over the CPU kernels of tessel/ops. Public
// so that other code (tensor-parallel blocks, tests) can compose them. A forward's outputs live
// in its cache's buffers (valid until that cache's next forward), a backward's in the cache's
// scratch; a forward keeps a reference to its input in the cache, so the caller must not
// overwrite the input before the backward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/nn/modern.h"
#include "tessel/nn/module.h"
#include "tessel/nn/tensor_parallel.h"
#include "tessel/ops/cpu.h"

namespace tessel::nn {

// How a layer is cut across a tensor-parallel group (Megatron): kColumn splits the output
// features, each rank computing its slice from the whole input (tp_enter before it); kRow
// splits the input features, each rank computing a partial sum of the whole output (tp_leave
// after it; rank 0 adds the bias). `groups`: the output features are that many equal blocks,
// each cut separately (a transformer's qkv: q, k and v, each by heads).
enum class Cut { kNone, kColumn, kRow };
struct TpCut {
  TensorParallel* tp = nullptr;  // null: not cut
  Cut cut = Cut::kNone;
  int64_t groups = 1;
};

// y[..., out] = x[..., in] @ weight[out, in]^T + bias[out]; leading dimensions are rows.
// Init as PyTorch: weight and bias U(-1/sqrt(in), 1/sqrt(in)). in and out are the whole
// layer's; cut by `tp`, this rank holds and computes its part.
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, TpCut tp = {});
  std::string kind() const override { return "linear"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
  // W: the weight gradient dy^T x (the bias gradient stays in backward()).
  void backward_weights(Cache& cache) override;
  void release_for_weights(Cache& cache) override;
  std::vector<Parameter*> parameters() override;
  void freeze(bool values_too) override;
  // Rows per sample (1 for [N, in] inputs, T for [B, T, in]) for the FLOP count.
  void set_rows_per_sample(int64_t rows) { rows_per_sample_ = rows; }
  double forward_flops(int64_t batch) const override;

  Parameter& weight() { return weight_; }
  Parameter* bias() { return has_bias_ ? &bias_ : nullptr; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_, out_, rows_per_sample_ = 1;
  bool has_bias_;
  TpCut tp_;
  Parameter weight_, bias_;
  // Frozen (an f32 CPU weight only), the weight's values are transposed in place, [in, out]:
  // the GEMM reads them as they are where it packs [out, in] for every batch otherwise (45% of a
  // batch-size-1 server's CPU on fashion_mlp, AVX2). The bits are the same.
  bool frozen_ = false;
};

class ReLU : public Module {
 public:
  std::string kind() const override { return "relu"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
};

// GELU, tanh approximation.
class GELU : public Module {
 public:
  std::string kind() const override { return "gelu"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
};

// Inverted dropout keyed by (ctx.seed, ctx.step, ctx.first_sample + row, first_col + column):
// the identity when not training or p == 0. Dimension 0 of the input is the sample;
// first_col > 0 when the input is a tensor-parallel slice of the features.
class Dropout : public Module {
 public:
  explicit Dropout(float p, int64_t first_col = 0);
  std::string kind() const override { return "dropout"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;

 private:
  float p_;
  int64_t first_col_;
};

// [N, d1, d2, ...] -> [N, d1*d2*...]; a view, no copy.
class Flatten : public Module {
 public:
  std::string kind() const override { return "flatten"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
};

// x[N, C, H, W] -> y[N, OC, OH, OW], square kernel k. Init U(-1/sqrt(C*k*k), +1/sqrt(C*k*k)).
// in_h, in_w (optional) are the expected input size: checked in forward() and used for FLOPs.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1,
         int64_t pad = 0, int64_t in_h = 0, int64_t in_w = 0);
  std::string kind() const override { return "conv2d"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  double forward_flops(int64_t batch) const override;

 private:
  int64_t C_, OC_, k_, stride_, pad_, in_h_, in_w_;
  Parameter weight_, bias_;
};

// Conv2d (stride 1, padding pad) -> ReLU -> MaxPool2d(pool, pool) as one block: the fused
// kernels pool the convolution's output while it is still in cache and never write the
// unpooled activation (ops: conv2d_relu_maxpool_*). The same parameters ("weight", "bias"),
// initialisation and results as the three blocks in a row.
class ConvReluPool : public Module {
 public:
  ConvReluPool(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t pad, int64_t pool,
               int64_t in_h, int64_t in_w);
  std::string kind() const override { return "conv2d_relu_maxpool"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  double forward_flops(int64_t batch) const override;

 private:
  ops::Conv2dShape shape(int64_t batch) const;
  int64_t C_, OC_, k_, pad_, pool_, in_h_, in_w_;
  Parameter weight_, bias_;
};

// Max pooling with a square window k and stride: x[N, C, H, W] -> y[N, C, OH, OW].
class MaxPool2d : public Module {
 public:
  MaxPool2d(int64_t kernel, int64_t stride);
  std::string kind() const override { return "maxpool2d"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;

 private:
  int64_t k_, stride_;
};

// LayerNorm over the last dimension C (eps 1e-5); weight starts at ones, bias at zeros.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t channels);
  std::string kind() const override { return "layernorm"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }

 private:
  int64_t C_;
  Parameter weight_, bias_;
};

// ---- GPT blocks (gpt.cc) ----

// Token ids i32 [B, T] -> wte[ids] + wpe[t]: [B, T, C], T <= context. Parameters "wte" [V, C]
// and "wpe" [context, C], both N(0, 0.02). backward() returns an undefined Tensor (ids have no
// gradient). With tensor parallelism the table is cut by vocabulary rows (padded to a multiple
// of the group): each rank looks up the ids it holds and the group sums the rows (tp_leave);
// with sequence parallelism the output is this rank's part of the sequence. With rotary
// positions (the modern variant) there is no "wpe": the blocks rotate their queries and keys.
class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t context, int64_t channels, TensorParallel* tp = nullptr,
            Position position = Position::kLearned);
  std::string kind() const override { return "embedding"; }
  Tensor forward(const Tensor& ids, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
  // W: both tables' gradients (so that a tied head's share can be added first).
  void backward_weights(Cache& cache) override;
  void release_for_weights(Cache& cache) override;
  std::vector<Parameter*> parameters() override;
  Parameter* token_table() { return &wte_; }
  // Inference on ids [B, T] at the given positions, one per id in row order (decoding with a
  // KV cache: rows of several sequences, each at its own position < context).
  Tensor forward_at(const Tensor& ids, const std::vector<int64_t>& positions);
  int64_t context() const { return T_; }

 private:
  Tensor embed(const Tensor& ids, Cache* cache);
  Tensor lookup(const Tensor& ids, Cache* cache);  // wte rows, whole on every rank
  void table_grads(const Tensor& dy, const Tensor& ids);

  int64_t V_, T_, C_;
  TensorParallel* tp_;
  bool learned_;  // a position table wpe
  Parameter wte_, wpe_;
};

// Pre-LN transformer block on [B, T, C]: x1 = x + proj(attention(qkv(ln1(x)))), then
// y = x1 + mlp.proj(gelu(mlp.fc(ln2(x1)))). GPT-2 init: weights N(0, 0.02), the two residual
// projections N(0, 0.02/sqrt(2*layers)), biases 0. With tensor parallelism qkv and mlp.fc are
// column-cut and the two projections row-cut: each rank runs heads/t heads and 4C/t hidden
// units, and the group communicates twice in the forward and twice in the backward.
// A GptVariant (modern.h) swaps the norms for RMSNorm, rotates q and k by position (rotary) and
// the MLP for fc [C -> 2H] (column-cut in two groups), SwiGLU, proj [H -> C].
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t channels, int64_t heads, int64_t context, int64_t layers,
                   TensorParallel* tp = nullptr, GptVariant variant = {});
  std::string kind() const override { return "transformer_block"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
  // W: the four projections' weight gradients (the layer norms' and biases' stay in B).
  void backward_weights(Cache& cache) override;
  void release_for_weights(Cache& cache) override;
  std::vector<Parameter*> parameters() override;
  void freeze(bool values_too) override;  // its four projections
  double forward_flops(int64_t batch) const override;
  // Inference on x [B, T, C]: the B * T rows of kv's step (cache.h), this block being block
  // `block` of kv's; appends their keys and values and attends over each sequence's. The same
  // arithmetic as forward() on the whole sequence, for the new positions' rows.
  Tensor forward_cached(const Tensor& x, KvCache& kv, size_t block);

 private:
  void recompute_gelu(Cache& cache);
  // Selective recompute left the GELU output (not SwiGLU's) in scratch: B and W rewrite it.
  bool gelu_dropped(const Cache& cache) const {
    return cache.ctx.selective && variant_.mlp != Mlp::kSwiglu;
  }
  void recompute_attention(Cache& cache);
  Tensor run(const Tensor& x, const Context& ctx, Cache* cache, KvCache* kv, size_t block);

  int64_t C_, NH_, T_;  // NH_: this rank's heads
  GptVariant variant_;
  std::unique_ptr<Module> ln1_, ln2_;
  Linear qkv_, attn_proj_, fc_, mlp_proj_;
  GELU gelu_;
  SwiGLU swiglu_;
};

// Final LayerNorm + LM head whose weight is the token table of an Embedding (tied): logits
// [B, T, V]. The table is borrowed, not listed in parameters(); backward() adds the head's
// share of the table gradient into the same Parameter::grad. With tensor parallelism the
// table is the rank's vocabulary rows, so are the logits [B, T, V/t] (the loss is
// vocabulary-parallel: loss.h).
class LmHead : public Module {
 public:
  LmHead(Parameter* token_table, int64_t vocab, int64_t channels, int64_t context,
         TensorParallel* tp = nullptr, Norm norm = Norm::kLayerNorm);
  std::string kind() const override { return "lm_head"; }
  Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) override;
  Tensor backward(const Tensor& dy, Cache& cache) override;
  // W: the head's share of the table gradient.
  void backward_weights(Cache& cache) override;
  void release_for_weights(Cache& cache) override;
  std::vector<Parameter*> parameters() override { return ln_->parameters(); }
  double forward_flops(int64_t batch) const override;
  Parameter* token_table() const { return wte_; }  // the borrowed (tied) table

 private:
  Parameter* wte_;
  int64_t V_, C_, T_;  // V_: this rank's rows of the table
  TensorParallel* tp_;
  std::unique_ptr<Module> ln_;
};

}  // namespace tessel::nn
