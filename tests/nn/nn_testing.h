// Test helpers for the nn tests: deterministic random tensors, bitwise comparisons and a
// double-precision central-difference gradient check of a scalar objective, sampled over a
// tensor's coordinates. Models are materialized by the caller; the checks run the training
// forward through an Activations and evaluate the objective in inference (null activations).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/rng.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/model.h"
#include "tessel/nn/models.h"

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

// Same shape, dtype and bytes (bit-for-bit equality, NaN payloads included).
inline ::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  if (std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0) return ::testing::AssertionSuccess();
  if (a.dtype() == DType::kF32)
    for (int64_t i = 0; i < a.numel(); ++i)
      if (std::memcmp(a.data<float>() + i, b.data<float>() + i, sizeof(float)) != 0)
        return ::testing::AssertionFailure()
               << "element " << i << ": " << a.data<float>()[i] << " vs " << b.data<float>()[i];
  return ::testing::AssertionFailure() << "bytes differ";
}

// ---- models ----

inline std::unique_ptr<Model> materialized(const ModelSpec& spec, uint64_t seed) {
  auto m = build_model(spec);
  m->materialize(seed);
  return m;
}

// Models of each kind at their default sizes (fashion-like inputs; a 2-block GPT, tied head).
inline ModelSpec mlp_spec() {
  ModelSpec s;
  s.input_shape = {784};
  s.num_classes = 10;
  return s;
}

inline ModelSpec cnn_spec() {
  ModelSpec s;
  s.kind = ModelKind::kCnn;
  s.input_shape = {1, 28, 28};
  s.num_classes = 10;
  return s;
}

inline ModelSpec gpt_spec() {
  ModelSpec s;
  s.kind = ModelKind::kGpt;
  s.input_shape = {8};
  s.num_classes = 11;
  s.layers = 2;
  s.heads = 2;
  s.embed = 16;
  return s;
}

// Small models of every kind, with dropout where the kind has it: mlp, cnn, gpt (tied head).
inline std::vector<ModelSpec> small_specs() {
  ModelSpec mlp;
  mlp.input_shape = {20};
  mlp.num_classes = 10;
  mlp.hidden = {16, 12};
  mlp.dropout = 0.2f;
  ModelSpec cnn;
  cnn.kind = ModelKind::kCnn;
  cnn.input_shape = {2, 8, 8};
  cnn.num_classes = 10;
  cnn.channels = {3, 4};
  cnn.kernel = 3;
  cnn.fc_hidden = 6;
  cnn.dropout = 0.3f;
  return {mlp, cnn, gpt_spec()};
}

// A batch of `batch` inputs and labels for spec (token ids for gpt).
inline std::pair<Tensor, Tensor> batch_for(const ModelSpec& spec, int64_t batch, uint64_t seed) {
  Shape in{batch};
  in.insert(in.end(), spec.input_shape.begin(), spec.input_shape.end());
  if (reads_tokens(spec))
    return {random_ids(in, spec.num_classes, seed), random_ids(in, spec.num_classes, seed + 1)};
  return {randn(in, seed), random_ids({batch}, spec.num_classes, seed + 1)};
}

// Shifts every parameter by N(0, scale^2) so zero biases and unit LayerNorm weights take
// generic values: a gradient check at a special point can miss bugs. Needs materialize().
inline void jitter_params(Model& m, float scale = 0.3f) {
  Tensor flat = m.values();
  Tensor noise = randn({flat.numel()}, 99, scale);
  for (int64_t i = 0; i < flat.numel(); ++i) flat.data<float>()[i] += noise.data<float>()[i];
}

// The gradient of parameter k inside a copy of the gradient arena.
inline Tensor param_grad(const Model& m, const Tensor& grads, size_t k) {
  return grads.view(m.offset(k), m.parameters()[k]->shape);
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

// Gradient check of a whole (materialized) model: model.forward -> L (CrossEntropyLoss unless
// given), for dx (when the input is f32) and a sample of coordinates of every parameter tensor.
template <typename L = CrossEntropyLoss>
void check_model_grads(Model& model, const Tensor& x, const Tensor& labels, const Context& ctx,
                       FdOptions o = {}) {
  model.set_input_grad(x.dtype() == DType::kF32);
  jitter_params(model);
  Activations acts;
  L loss;
  loss.forward(model.forward(x, ctx, &acts), labels);
  model.zero_grad();
  Tensor dx = model.backward(loss.backward(1.0f), acts);
  if (dx.defined()) dx = dx.clone();
  const Tensor grads = model.grads().clone();
  auto objective = [&] {
    L l;
    return static_cast<double>(l.forward(model.forward(x, ctx, nullptr), labels).mean);
  };
  if (x.dtype() == DType::kF32) {
    ASSERT_TRUE(dx.defined());
    check_grad("dx", x, dx, objective, o);
  }
  for (size_t k = 0; k < model.parameters().size(); ++k) {
    const Parameter& p = *model.parameters()[k];
    check_grad(p.name, p.value, param_grad(model, grads, k), objective, o);
  }
}

// Gradient check of one module through sum(r * y), inside a one-block materialized model.
inline void check_module_grads(std::unique_ptr<Module> m, const Tensor& x, const Context& ctx,
                               FdOptions o = {}) {
  Model model;
  model.add("m", std::move(m));
  model.finalize();
  model.materialize(7);
  model.set_input_grad(true);
  jitter_params(model);
  Activations acts;
  const Tensor r = randn(model.forward(x, ctx, &acts).shape(), 5);
  model.zero_grad();
  Tensor dx = model.backward(r, acts);
  ASSERT_TRUE(dx.defined());
  dx = dx.clone();
  const Tensor grads = model.grads().clone();
  auto objective = [&] { return dot(r, model.forward(x, ctx, nullptr)); };
  check_grad("dx", x, dx, objective, o);
  for (size_t k = 0; k < model.parameters().size(); ++k) {
    const Parameter& p = *model.parameters()[k];
    check_grad(p.name, p.value, param_grad(model, grads, k), objective, o);
  }
}

}  // namespace tessel::nn::testing
