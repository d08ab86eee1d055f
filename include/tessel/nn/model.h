// Model: a sequence of blocks (Modules) whose parameters live in one flat parameter arena and
// whose gradients live in one flat gradient arena with the same layout. A pipeline stage is a
// slice [begin, end) of the blocks; a strategy can act after each block's backward through the
// callback of backward(). Built by build_model() (models.h) or by hand: add() blocks, then
// finalize(seed) to allocate the arenas, bind the views and initialise the values.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/nn/module.h"

namespace tessel::nn {

class Model {
 public:
  void add(std::string name, std::unique_ptr<Module> block);
  void finalize(uint64_t seed);  // allocate arenas, bind parameter views, initialise values

  size_t num_blocks() const { return blocks_.size(); }
  Module& block(size_t i) { return *blocks_[i]; }
  const std::string& block_name(size_t i) const { return names_[i]; }

  // Runs blocks [begin, end) (all by default).
  Tensor forward(const Tensor& x, const Context& ctx, size_t begin = 0, size_t end = SIZE_MAX);
  // Runs the backward of blocks [begin, end) in reverse; after_block(i) is called as soon as
  // block i's parameter gradients are complete. Returns the gradient w.r.t. the input of `begin`;
  // for begin == 0 that is an undefined Tensor unless set_input_grad(true) (the model's input
  // is data, and skipping its gradient saves work).
  Tensor backward(const Tensor& dy, const std::function<void(size_t)>& after_block = {},
                  size_t begin = 0, size_t end = SIZE_MAX);
  void set_input_grad(bool needed);  // default false

  Arena& params() { return params_; }
  Arena& grads() { return grads_; }
  // All parameters, in arena order, named "<block>.<param>" (e.g. "fc1.weight").
  const std::vector<Parameter*>& parameters() const { return parameters_; }
  // Parameter index range [first, last) owned by block i (for bucketing and pipeline stages).
  std::pair<size_t, size_t> block_parameters(size_t i) const { return block_params_[i]; }
  int64_t num_parameters() const;  // excluding arena padding
  void zero_grad();
  std::string params_sha256() const;  // SHA-256 of the parameter arena bytes
  double forward_flops(int64_t batch) const;

 private:
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<Module>> blocks_;
  std::vector<Parameter*> parameters_;
  std::vector<std::pair<size_t, size_t>> block_params_;
  Arena params_;
  Arena grads_;
  bool input_grad_ = false;
};

}  // namespace tessel::nn
