#include "tessel/nn/model.h"

#include <algorithm>

#include "tessel/core/rng.h"
#include "tessel/core/sha256.h"

namespace tessel::nn {
namespace {

// Each element's value is a pure function of (seed, parameter index, element index), so the
// same model gets the same values whatever the layout, thread count or block slicing.
void init_parameter(Parameter& p, uint64_t seed, size_t index) {
  float* v = p.value.data<float>();
  const int64_t n = p.value.numel();
  const CounterRng rng(seed, mix_stream(RngPurpose::kInit, index));
  switch (p.init) {
    case Init::kZeros:
      p.value.zero_();
      break;
    case Init::kOnes:
      p.value.fill_(1.0f);
      break;
    case Init::kUniform:
      for (int64_t i = 0; i < n; ++i) v[i] = (2.0f * rng.uniform(i) - 1.0f) * p.scale;
      break;
    case Init::kNormal:
      for (int64_t i = 0; i < n; ++i) v[i] = rng.normal(i) * p.scale;
      break;
  }
}

}  // namespace

void Model::add(std::string name, std::unique_ptr<Module> block) {
  TESSEL_CHECK(!params_.allocated(), "model: add('", name, "') after finalize()");
  TESSEL_CHECK(block != nullptr, "model: add('", name, "') with a null block");
  for (const std::string& n : names_)
    TESSEL_CHECK(n != name, "model: two blocks named '", name, "'");
  block->set_input_grad(!blocks_.empty() || input_grad_);
  names_.push_back(std::move(name));
  blocks_.push_back(std::move(block));
}

void Model::set_input_grad(bool needed) {
  input_grad_ = needed;
  if (!blocks_.empty()) blocks_[0]->set_input_grad(needed);
}

void Model::finalize(uint64_t seed) {
  TESSEL_CHECK(!params_.allocated(), "model: finalize() twice");
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const size_t first = parameters_.size();
    for (Parameter* p : blocks_[i]->parameters()) {
      p->name = names_[i] + "." + p->name;
      params_.add(p->name, p->shape);
      grads_.add(p->name, p->shape);
      parameters_.push_back(p);
    }
    block_params_.emplace_back(first, parameters_.size());
  }
  params_.allocate();
  grads_.allocate();
  for (size_t k = 0; k < parameters_.size(); ++k) {
    Parameter& p = *parameters_[k];
    p.value = params_.view(k);
    p.grad = grads_.view(k);
    init_parameter(p, seed, k);
  }
}

Tensor Model::forward(const Tensor& x, const Context& ctx, size_t begin, size_t end) {
  end = std::min(end, blocks_.size());
  TESSEL_CHECK(params_.allocated(), "model: forward() before finalize()");
  TESSEL_CHECK(begin <= end, "model: forward over blocks [", begin, ", ", end, ")");
  Tensor h = x;
  for (size_t i = begin; i < end; ++i) h = blocks_[i]->forward(h, ctx);
  return h;
}

Tensor Model::backward(const Tensor& dy, const std::function<void(size_t)>& after_block,
                       size_t begin, size_t end) {
  end = std::min(end, blocks_.size());
  TESSEL_CHECK(params_.allocated(), "model: backward() before finalize()");
  TESSEL_CHECK(begin <= end, "model: backward over blocks [", begin, ", ", end, ")");
  Tensor g = dy;
  for (size_t i = end; i-- > begin;) {
    g = blocks_[i]->backward(g);
    if (after_block) after_block(i);
  }
  return g;
}

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (const Parameter* p : parameters_) n += shape_numel(p->shape);
  return n;
}

void Model::zero_grad() {
  if (!grads_.allocated()) return;
  Tensor flat = grads_.flat();
  flat.zero_();
}

std::string Model::params_sha256() const {
  TESSEL_CHECK(params_.allocated(), "model: params_sha256() before finalize()");
  return sha256_hex(params_.flat().raw(), params_.flat().nbytes());
}

double Model::forward_flops(int64_t batch) const {
  double f = 0;
  for (const auto& b : blocks_) f += b->forward_flops(batch);
  return f;
}

}  // namespace tessel::nn
