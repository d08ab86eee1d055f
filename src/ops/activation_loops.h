// Private to ops: the GELU loops and attention's causal softmax, compiled into the portable kernels
// (elementwise.cc) and into each ISA level's translation units (elementwise_avx2.cc,
// elementwise_avx512.cc), where the compiler vectorises them 8 or 16 lanes wide. The same source at
// every level, no contraction and lanes only across independent elements: the same bits at every
// level.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vec_math.h"

namespace tessel::ops::detail {
// Internal linkage on purpose (see vec_math.h).
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
inline void gelu_forward_loop(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = kGeluScale * (v + kGeluCube * v * v * v);
    y[i] = 0.5f * v * (1.0f + tanh(u));
  }
}

inline void gelu_backward_loop(float* dx, const float* dy, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = kGeluScale * (v + kGeluCube * v * v * v);
    float t = tanh(u);
    // d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx
    float du = kGeluScale * (1.0f + 3.0f * kGeluCube * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

// Row i of p[rows, ld] (query first + i) softmaxed over its keys [0, first + i], zero after,
// up to `keys`. The max is exact in any order and the sum is lane_sum's 16 partial sums.
inline void causal_softmax_loop(float* p, int64_t rows, int64_t ld, int64_t first, int64_t keys) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = p + i * ld;
    const int64_t n = first + i + 1;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < n; ++j) row[j] = exp(row[j] - mx);
    const float inv = 1.0f / sum(row, n);
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    for (int64_t j = n; j < keys; ++j) row[j] = 0.0f;
  }
}

// Its backward in place: row i of d[rows, ld] (query first + i) holds dP over the keys [0, keys)
// and becomes dS = P * (dP - rowsum(P * dP)) * scale over the keys [0, first + i], zero after;
// P's rows p[rows, ld] are zero after their keys.
inline void causal_softmax_backward_loop(float* d, const float* p, int64_t rows, int64_t ld,
                                         int64_t first, int64_t keys, float scale) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* pi = p + i * ld;
    float* row = d + i * ld;
    const int64_t n = first + i + 1;
    const float weighted = dot(pi, row, n);
    for (int64_t j = 0; j < n; ++j) row[j] = pi[j] * (row[j] - weighted) * scale;
    for (int64_t j = n; j < keys; ++j) row[j] = 0.0f;
  }
}

}  // namespace
}  // namespace tessel::ops::detail
