// Module: one block of a model with an explicit forward and backward (no dynamic tape).
// forward() caches what backward() needs; backward(dy) accumulates parameter gradients into
// the gradient arena and returns dx. Parameters are declared by the module (name, shape, init)
// and bound later to views of the model's ONE parameter arena and ONE gradient arena.
// A module instance is used by one thread at a time. A returned tensor may be a buffer the
// module reuses: it stays valid until the module's next forward() (or backward()); clone() it
// to keep it longer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

struct Parameter {
  std::string name;  // local name, e.g. "weight"; the model prefixes the block path
  Shape shape;
  Init init = Init::kZeros;
  float scale = 0.0f;
  Tensor value;  // view into the parameter arena (bound by Model::finalize)
  Tensor grad;   // view into the gradient arena, same offset
};

// Per-call facts a forward pass may need. Dropout keys its mask by (seed, step, sample index).
struct Context {
  bool training = true;
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t first_sample = 0;  // global index of row 0 of this batch
};

class Module {
 public:
  virtual ~Module() = default;
  virtual std::string kind() const = 0;  // "linear", "relu", "transformer_block", ...
  virtual Tensor forward(const Tensor& x, const Context& ctx) = 0;
  virtual Tensor backward(const Tensor& dy) = 0;
  // Parameters this module owns (not ones it borrows, e.g. a tied LM head).
  virtual std::vector<Parameter*> parameters() { return {}; }
  // Multiply-adds x 2 of one forward pass for a batch of `batch` samples (for GFLOP/s reports).
  virtual double forward_flops(int64_t batch) const { (void)batch; return 0; }
  // A copy that shares this module's parameters (the same arena views for values and
  // gradients) but has its own forward cache and buffers: a pipeline stage keeps one per
  // micro-batch in flight, since a module caches only one forward. Null if not supported.
  virtual std::unique_ptr<Module> clone() const { return nullptr; }

  // Whether backward() must compute dx. A model turns it off for its first block, whose input
  // is data: that skips the largest GEMM of an MLP's backward. When off, backward() may return
  // an undefined Tensor.
  void set_input_grad(bool needed) { input_grad_ = needed; }
  bool input_grad() const { return input_grad_; }

 protected:
  bool input_grad_ = true;
};

}  // namespace tessel::nn
