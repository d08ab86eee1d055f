// Optimizers over flat ranges of the parameter and gradient arenas. State (momentum, Adam m
// and v) lives in flat tensors of the same length as the range, so a sharded strategy (ZeRO)
// gives each rank an optimizer over its own offset range. step() is deterministic and
// elementwise; an optimizer is used by one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel::optim {

struct OptimSpec {
  std::string kind = "sgd";  // sgd | adamw
  float lr = 0.05f;
  float weight_decay = 0.0f;  // sgd: L2 added to the gradient; adamw: decoupled decay
  float momentum = 0.9f;      // sgd
  bool nesterov = false;      // sgd
  float beta1 = 0.9f;         // adamw
  float beta2 = 0.999f;
  float eps = 1e-8f;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // params and grads are 1-D f32 tensors of the optimizer's length n; updates elements
  // [lo, hi) (default: all) with the state of the same elements. A sharded layout (ZeRO, a
  // pipeline stage, a parameter server's shard) steps only the range it owns; the state of the
  // other elements is left alone. One call is one step (AdamW's bias correction counts calls).
  virtual void step(Tensor& params, const Tensor& grads, float lr, int64_t lo = 0,
                    int64_t hi = -1) = 0;
  // Named state tensors, for checkpoints; load_state() restores them (same names and sizes).
  virtual std::vector<std::pair<std::string, Tensor>> state() = 0;
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 protected:
  int64_t steps_ = 0;  // completed steps (AdamW's bias correction uses it)
};

// Creates an optimizer for a range of n elements. Throws InvalidArgument on a bad spec
// (negative lr, momentum outside [0, 1), unknown kind), naming the key.
std::unique_ptr<Optimizer> make_optimizer(const OptimSpec& spec, int64_t n);

}  // namespace tessel::optim
