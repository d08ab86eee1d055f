// Optimizers over runs of elements. State (momentum, Adam m and v) lives in flat per-element
// buffers as long as the elements the optimizer updates, which need not be contiguous in the
// model: a ZeRO rank's optimizer covers its pieces of every unit, so its state is allocated
// 1/N of the model. step() is deterministic and elementwise; an optimizer is used by one
// thread at a time.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/memory.h"
#include "tessel/core/names.h"
#include "tessel/tensor/tensor.h"

namespace tessel::optim {

enum class OptimKind : uint8_t { kSgd, kAdamw };  // optim.kind

struct OptimSpec {
  OptimKind kind = OptimKind::kSgd;
  float lr = 0.05f;
  float weight_decay = 0.0f;  // sgd: L2 added to the gradient; adamw: decoupled decay
  float momentum = 0.9f;      // sgd
  bool nesterov = false;      // sgd
  float beta1 = 0.9f;         // adamw
  float beta2 = 0.999f;
  float eps = 1e-8f;
};

// A run of elements that one step updates: `count` parameters and their gradients, whose state
// sits at `state_offset` of the optimizer's per-element state buffers. `working` (optional):
// a 16-bit copy of the parameters (train.precision bf16 | fp16, of `working_type`) that the
// step rewrites from the new values while they are still in cache.
struct Segment {
  float* params;
  const float* grads;
  int64_t count;
  int64_t state_offset;
  void* working = nullptr;
  DType working_type = DType::kF32;
};

// A per-element state buffer (numel() long), e.g. "momentum", "exp_avg", "exp_avg_sq".
struct StateBuffer {
  std::string name;
  Tensor values;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One optimizer step over the segments (AdamW's bias correction counts steps, not calls).
  // Gradients are read multiplied by grad_scale (global-norm clipping), never modified.
  virtual void step(std::span<const Segment> segments, float lr, float grad_scale = 1.0f) = 0;
  // Per-element state, for checkpoints: each buffer is numel() long, element i belonging to
  // the parameter element at state offset i.
  virtual std::vector<StateBuffer> state() = 0;
  int64_t numel() const { return numel_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 protected:
  explicit Optimizer(int64_t numel) : numel_(numel) {}
  int64_t numel_;
  int64_t steps_ = 0;  // completed steps (AdamW's bias correction uses it)
};

// Creates an optimizer over n elements (its state allocated now on the current device, charged
// to `category`: optimizer state, or optimizer_offloaded for a device rank's host copy).
// Throws InvalidArgument on a bad spec (negative lr, momentum outside [0, 1), unknown kind), naming
// the key.
std::unique_ptr<Optimizer> make_optimizer(const OptimSpec& spec, int64_t n,
                                          MemCategory category = MemCategory::kOptimizer);

}  // namespace tessel::optim

namespace tessel {
TESSEL_NAMES(optim::OptimKind, "sgd", "adamw");
}  // namespace tessel
