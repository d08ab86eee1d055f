// Test helpers for the nn tests: deterministic random tensors and a double-precision
// central-difference gradient check of a scalar objective, sampled over a tensor's coordinates.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "tessel/core/rng.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/model.h"

namespace tessel::nn::testing {

inline Tensor randn(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape);
  const CounterRng rng(seed, mix_stream(RngPurpose::kData, 0x5EED));
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * rng.normal(i);
  return t;
}

// Values with |x| >= 0.2: a small step never crosses ReLU's kink at 0.
inline Tensor away_from_zero(const Shape& shape, uint64_t seed) {
  Tensor t = randn(shape, seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] += p[i] >= 0 ? 0.2f : -0.2f;
  return t;
}

// Distinct values 0.05 apart in a scrambled order: a small step never changes a max.
inline Tensor distinct(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape);
  const int64_t n = t.numel();
  const CounterRng rng(seed, mix_stream(RngPurpose::kData, 0xD15));
  std::vector<std::pair<uint32_t, int64_t>> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = {rng.bits(i), i};
  std::sort(order.begin(), order.end());
  for (int64_t i = 0; i < n; ++i) t.data<float>()[order[i].second] = 0.05f * (i - n / 2);
  return t;
}

inline Tensor random_ids(const Shape& shape, int64_t vocab, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  const CounterRng rng(seed, mix_stream(RngPurpose::kData, 0x1D5));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = rng.bits(i) % vocab;
  return t;
}

// sum(r * y) in double: a random scalar objective whose gradient w.r.t. y is r.
inline double dot(const Tensor& r, const Tensor& y) {
  EXPECT_EQ(r.numel(), y.numel());
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i)
    s += static_cast<double>(r.data<float>()[i]) * y.data<float>()[i];
  return s;
}

// Shifts every parameter by N(0, scale^2) so zero biases and unit LayerNorm weights take
// generic values: a gradient check at a special point can miss bugs.
inline void jitter_params(Model& m, float scale = 0.3f) {
  Tensor noise = randn({m.params().numel()}, 99, scale);
  Tensor flat = m.params().flat();
  for (int64_t i = 0; i < flat.numel(); ++i) flat.data<float>()[i] += noise.data<float>()[i];
}

struct FdOptions {
  double eps = 1e-2;
  double rtol = 2e-2;  // relative to the larger of the two gradients
  double atol = 2e-3;  // relative to the tensor's largest analytic gradient
  int max_coords = 24;
  // For piecewise-linear objectives: a coordinate whose one-sided differences disagree sits on
  // a kink and is skipped (at most a quarter of them may be).
  bool skip_kinks = false;
};

// Compares analytic[i] with the central difference of objective() w.r.t. values[i], for up to
// max_coords coordinates spread over the tensor.
inline void check_grad(const std::string& what, Tensor values, const Tensor& analytic,
                       const std::function<double()>& objective, FdOptions o = {}) {
  ASSERT_TRUE(analytic.defined()) << what;
  ASSERT_EQ(values.numel(), analytic.numel()) << what;
  const int64_t n = values.numel();
  float* v = values.data<float>();
  const float* a = analytic.data<float>();
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(static_cast<double>(a[i])));
  const int64_t coords = std::min<int64_t>(n, o.max_coords);
  int checked = 0, skipped = 0, failures = 0;
  for (int64_t k = 0; k < coords; ++k) {
    const int64_t i = coords == n ? k : (k * n + n / 2) / coords;
    const float saved = v[i];
    const float up = static_cast<float>(saved + o.eps), down = static_cast<float>(saved - o.eps);
    const double f0 = o.skip_kinks ? objective() : 0.0;
    v[i] = up;
    const double fp = objective();
    v[i] = down;
    const double fm = objective();
    v[i] = saved;
    const double num = (fp - fm) / (static_cast<double>(up) - down);
    const double bound =
        o.rtol * std::max(std::abs(num), std::abs(double{a[i]})) + o.atol * scale + 1e-6;
    if (o.skip_kinks) {
      const double fwd = (fp - f0) / (static_cast<double>(up) - saved);
      const double bwd = (f0 - fm) / (saved - static_cast<double>(down));
      if (std::abs(fwd - bwd) > bound) {
        ++skipped;
        continue;
      }
    }
    ++checked;
    if (!(std::abs(num - a[i]) <= bound) && failures++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << a[i] << ", numeric " << num
                    << " (bound " << bound << ")";
  }
  EXPECT_LE(skipped * 4, coords) << what << ": too many coordinates on kinks";
  EXPECT_GT(checked, 0) << what;
}

// Gradient check of a whole model: model.forward -> CrossEntropyLoss, for dx (when the input
// is f32) and a sample of coordinates of every parameter tensor.
inline void check_model_grads(Model& model, const Tensor& x, const Tensor& labels,
                              const Context& ctx, FdOptions o = {}) {
  model.set_input_grad(x.dtype() == DType::kF32);
  jitter_params(model);
  CrossEntropyLoss loss;
  loss.forward(model.forward(x, ctx), labels);
  model.zero_grad();
  Tensor dx = model.backward(loss.backward());
  if (dx.defined()) dx = dx.clone();
  const Tensor grads = model.grads().flat().clone();
  auto objective = [&] {
    CrossEntropyLoss l;
    return static_cast<double>(l.forward(model.forward(x, ctx), labels));
  };
  if (x.dtype() == DType::kF32) {
    ASSERT_TRUE(dx.defined());
    check_grad("dx", x, dx, objective, o);
  }
  for (size_t k = 0; k < model.parameters().size(); ++k) {
    const Parameter& p = *model.parameters()[k];
    const Tensor g = grads.view(model.params().entries()[k].offset, p.shape);
    check_grad(p.name, p.value, g, objective, o);
  }
}

// Gradient check of one module through sum(r * y), inside a one-block model (which binds its
// parameters). `extra` blocks may precede it (e.g. the embedding a tied head borrows from).
inline void check_module_grads(std::unique_ptr<Module> m, const Tensor& x, const Context& ctx,
                               FdOptions o = {}) {
  Model model;
  model.add("m", std::move(m));
  model.finalize(7);
  model.set_input_grad(true);
  jitter_params(model);
  const Tensor r = randn(model.forward(x, ctx).shape(), 5);
  model.zero_grad();
  Tensor dx = model.backward(r);
  ASSERT_TRUE(dx.defined());
  dx = dx.clone();
  const Tensor grads = model.grads().flat().clone();
  auto objective = [&] { return dot(r, model.forward(x, ctx)); };
  check_grad("dx", x, dx, objective, o);
  for (size_t k = 0; k < model.parameters().size(); ++k) {
    const Parameter& p = *model.parameters()[k];
    const Tensor g = grads.view(model.params().entries()[k].offset, p.shape);
    check_grad(p.name, p.value, g, objective, o);
  }
}

}  // namespace tessel::nn::testing
