// Module: one block of a model with an explicit forward and backward (no dynamic tape). A module
// holds parameters, never activations: forward(x, ctx, cache) writes what backward needs into
// the caller's Cache (cache.h) and backward(dy, cache) reads it back, accumulates parameter
// gradients into Parameter::grad and returns dx. A null cache is inference: nothing is kept and
// every output is fresh storage. Parameters are declared by the module (name, shape, init);
// whoever holds the model's memory binds their views (Model::bind_values / bind_grads).
// A module may run several forwards before their backwards (one cache each) and is used by one
// thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/nn/cache.h"
#include "tessel/tensor/tensor.h"

namespace tessel::nn {

// How a parameter starts. Values are drawn from CounterRng keyed by (seed, parameter index,
// element index), so initialisation does not depend on the layout.
enum class Init {
  kZeros,
  kOnes,
  kUniform,  // U(-scale, scale)
  kNormal,   // N(0, scale^2)
};

// Tensor parallelism: which part of a logical parameter a rank holds. The logical tensor
// `full`, viewed as [outer, dim, inner], is cut along dim and this rank holds indices [lo, hi)
// of it; indices >= dim are padding (a vocabulary padded to a multiple of the group), zero and
// in no checkpoint. An empty `full` means the parameter is whole; `replica` marks a whole
// parameter that every rank of the group holds and of which this rank's copy does not count
// (norms, checkpoints and digests take the group's rank 0).
struct Split {
  Shape full;
  int64_t outer = 1, dim = 0, inner = 1, lo = 0, hi = 0;
  bool replica = false;
};

struct Parameter {
  std::string name;  // local name, e.g. "weight"; the model prefixes the block path
  Shape shape;       // this rank's part (the whole tensor unless split)
  Init init = Init::kZeros;
  float scale = 0.0f;
  Tensor value;  // view into the memory holding the values (bound by the model's owner)
  Tensor grad;   // view into the memory where its gradient accumulates
  Split split;   // tensor parallelism (whole by default)

  bool is_split() const { return !split.full.empty(); }
  const Shape& full_shape() const { return is_split() ? split.full : shape; }
  // Cuts dimension `dim_index` of this (whole) parameter into `parts` after `groups` equal
  // blocks of it (qkv's q, k and v: groups 3), padded to a multiple of parts * groups; this
  // rank keeps part `part` of every block. Sets shape and split.
  void cut(size_t dim_index, int64_t groups, int part, int parts);
};

class Module {
 public:
  virtual ~Module() = default;
  virtual std::string kind() const = 0;  // "linear", "relu", "transformer_block", ...
  virtual Tensor forward(const Tensor& x, const Context& ctx, Cache* cache) = 0;
  virtual Tensor backward(const Tensor& dy, Cache& cache) = 0;
  // Parameters this module owns (not ones it borrows, e.g. a tied LM head's table).
  virtual std::vector<Parameter*> parameters() { return {}; }
  // Multiply-adds x 2 of one forward pass for a batch of `batch` samples (for GFLOP/s reports).
  virtual double forward_flops(int64_t /*batch*/) const { return 0; }

  // Whether backward() must compute dx. A model turns it off for its first block, whose input
  // is data: that skips the largest GEMM of an MLP's backward. When off, backward() may return
  // an undefined Tensor.
  void set_input_grad(bool needed) { input_grad_ = needed; }
  bool input_grad() const { return input_grad_; }

  // Zero-bubble pipeline schedules split a backward in two. With defer_weights on, backward()
  // computes the input gradient (B) and keeps what the GEMM-heavy weight gradients need in the
  // cache; backward_weights(cache) adds them later (W), once after each such backward and
  // before the cache's next forward. B and W together give the same bits as one backward()
  // with it off. A module without parameters, or whose weight gradients are cheap, computes
  // everything in backward() and its W does nothing (the default).
  void set_defer_weights(bool on) { defer_weights_ = on; }
  bool defer_weights() const { return defer_weights_; }
  virtual void backward_weights(Cache& cache) { (void)cache; }
  // Right after a deferred backward (B): drops from the cache all that backward_weights()
  // does not read, so that a micro-batch waiting for its W holds only W's tensors (its layer
  // inputs and output gradients). The default, for a module whose W does nothing, drops all.
  virtual void release_for_weights(Cache& cache) { cache.release_all(); }

  // The values stay as they are from now on (a serving or predict replica's model): a module
  // may rearrange its parameters' values for faster forwards, after which only forward() reads
  // them. `values_too` false: the values are shared with a model frozen already, so only the
  // module's own state changes. The default keeps everything as it is.
  virtual void freeze(bool /*values_too*/) {}

 protected:
  bool input_grad_ = true;
  bool defer_weights_ = false;
};

}  // namespace tessel::nn
