// Private helpers for the CPU kernels: reductions and exp written so that gcc -O3 vectorises
// the loops that use them without -ffast-math. A float sum with one accumulator is a serial
// chain the compiler may not reorder, and std::exp/std::tanh are library calls; both keep a
// loop scalar.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace tessel::ops::detail {
// Internal linkage on purpose: ISA translation units include this header too (kernels.h says
// why an inline function with external linkage must not be shared with them).
namespace {

// sum over i in [0, n) of f(i), with kLanes independent partial sums (also more accurate than
// one running sum).
template <typename F>
inline float lane_sum(int64_t n, F f) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += f(i + j);
  }
  float total = 0.0f;
  for (; i < n; ++i) total += f(i);
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  return total;
}

inline float sum(const float* v, int64_t n) {
  return lane_sum(n, [v](int64_t i) { return v[i]; });
}

inline float dot(const float* a, const float* b, int64_t n) {
  return lane_sum(n, [a, b](int64_t i) { return a[i] * b[i]; });
}

// e^x to about 2 ulp, inlinable and branch-free (Cephes expf): x = k ln2 + r with |r| <= ln2/2,
// a degree-6 polynomial for e^r, and 2^k built in the exponent bits (so k must stay within the
// normal exponents [-126, 127]). Results below FLT_MIN flush to 0, so exp(-inf) = 0; x above
// 127.5 ln2 saturates at 2.4e38 instead of overflowing to inf; NaN gives NaN.
inline float exp(float x) {
  constexpr float kLo = -87.33654f, kHi = 88.37626f;
  const bool tiny = x < kLo;
  x = tiny ? kLo : x;
  x = x > kHi ? kHi : x;
  // k = round(x / ln2) by adding 1.5 * 2^23, which leaves k in the low mantissa bits. Unlike
  // std::floor or an int conversion this keeps the loop vectorisable, and a NaN stays a NaN.
  constexpr float kShift = 12582912.0f;
  const float shifted = x * 1.44269504088896341f + kShift;
  const float k = shifted - kShift;
  const int32_t k_int = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kShift);
  float r = x - k * 0.693359375f;  // ln2 split in two so k * ln2 is exact
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float v = p * std::bit_cast<float>((k_int + 127) << 23);
  return tiny ? 0.0f : v;
}

// tanh(u) = 1 - 2 / (e^{2u} + 1): exact at both tails, ~1e-7 absolute error near 0.
inline float tanh(float u) { return 1.0f - 2.0f / (exp(2.0f * u) + 1.0f); }

// y = softmax(x) over one row of C values, stable (subtracts the row max). Returns
// log(sum(exp(x - max))) so a caller can form log-softmax without taking log(y).
inline float softmax_row(float* y, const float* x, int64_t C, float* row_max) {
  float mx = -INFINITY;
  // std::max, not std::fmax (a libm call per value at the baseline ISA): both skip NaN, and a
  // max of +0 or -0 changes neither x - max nor the log-sum returned.
  for (int64_t c = 0; c < C; ++c) mx = std::max(mx, x[c]);
  for (int64_t c = 0; c < C; ++c) y[c] = exp(x[c] - mx);
  const float total = sum(y, C);
  const float inv = 1.0f / total;
  for (int64_t c = 0; c < C; ++c) y[c] *= inv;
  *row_max = mx;
  return std::log(total);
}

}  // namespace
}  // namespace tessel::ops::detail
