// Test helpers for the ops tests: deterministic random buffers and a double-precision
// central-difference gradient check of a scalar objective against an analytic gradient.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tessel/core/rng.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops::testing {

using Vec = std::vector<float>;

inline Vec randn(int64_t n, uint64_t seed, float scale = 1.0f) {
  CounterRng rng(seed, mix_stream(RngPurpose::kData, 0xC0FFEE));
  Vec v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * rng.normal(static_cast<uint64_t>(i));
  return v;
}

inline Vec uniform(int64_t n, uint64_t seed, float lo, float hi) {
  CounterRng rng(seed, mix_stream(RngPurpose::kData, 0xBEEF));
  Vec v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * rng.uniform(static_cast<uint64_t>(i));
  return v;
}

// A buffer full of NaN: handed to a backward as dx, it catches a kernel that accumulates into
// dx (or skips elements) instead of overwriting it.
inline Vec poisoned(int64_t n) {
  return Vec(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
}

// Softmax of the rows of x[N,C]: the probabilities cross_entropy_forward writes (the loss's
// softmax is the one the models run).
inline void softmax_rows(float* y, const float* x, int64_t N, int64_t C) {
  const std::vector<int32_t> labels(static_cast<size_t>(N), 0);
  cross_entropy_forward(y, x, labels.data(), N, C);
}

// sum(r * y) in double: the random scalar objective whose gradient w.r.t. y is r.
inline double weighted_sum(const Vec& r, const Vec& y) {
  double s = 0.0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(r[i]) * y[i];
  return s;
}

struct GradTolerance {
  double eps = 1e-2;   // perturbation of each input
  double rtol = 5e-3;  // relative to the larger of the two gradients
  double atol = 1e-3;  // relative to the largest numerical gradient of the tensor
};

// Perturbs every element of `wrt` by +-eps, evaluates `objective`, and compares the central
// difference with `analytic` elementwise: |a - n| <= rtol * max(|a|, |n|) + atol * max|n|.
// The actual float step (x + eps) - (x - eps) is used, not 2 * eps, so rounding of the input
// does not bias the quotient.
inline void expect_grad(const std::string& name, Vec& wrt, const Vec& analytic,
                        const std::function<double()>& objective, GradTolerance tol = {}) {
  ASSERT_EQ(wrt.size(), analytic.size()) << name;
  std::vector<double> numeric(wrt.size());
  for (size_t i = 0; i < wrt.size(); ++i) {
    const float saved = wrt[i];
    const float up = static_cast<float>(saved + tol.eps);
    const float down = static_cast<float>(saved - tol.eps);
    wrt[i] = up;
    const double lp = objective();
    wrt[i] = down;
    const double lm = objective();
    wrt[i] = saved;
    numeric[i] = (lp - lm) / (static_cast<double>(up) - static_cast<double>(down));
  }
  double scale = 0.0;
  for (double n : numeric) scale = std::max(scale, std::abs(n));
  int failures = 0;
  for (size_t i = 0; i < wrt.size(); ++i) {
    const double a = analytic[i], n = numeric[i];
    const double bound = tol.rtol * std::max(std::abs(a), std::abs(n)) + tol.atol * scale + 1e-7;
    const double err = std::abs(a - n);
    if (!(err <= bound) && failures++ < 5) {  // written so that NaN fails too
      ADD_FAILURE() << name << "[" << i << "]: analytic " << a << " vs numeric " << n << " (|diff| "
                    << err << " > " << bound << ")";
    }
  }
  EXPECT_EQ(failures, 0) << name << ": " << failures << " of " << wrt.size() << " elements off";
  EXPECT_GT(scale, 0.0) << name << ": gradient is identically zero, the check proves nothing";
}

// max |a - b| / max(max|b|, tiny): one number for "these two tensors agree".
inline double max_rel_diff(const Vec& a, const Vec& b) {
  double diff = 0.0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return a.size() == b.size() ? diff / scale : std::numeric_limits<double>::infinity();
}

}  // namespace tessel::ops::testing
