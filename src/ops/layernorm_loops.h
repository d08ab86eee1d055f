// Private to ops: LayerNorm's loops over the last dimension (llm.c layout: statistics per row,
// affine per column), compiled into the portable kernels (layernorm.cc) and into each ISA
// level's translation units (elementwise_avx2.cc, elementwise_avx512.cc), where the compiler
// vectorises them 8 or 16 lanes wide. The same source at every level, no contraction, and row
// sums in lane_sum's 16 partial sums: the same bits at every level.
#pragma once

#include <cmath>
#include <cstdint>

#include "vec_math.h"

namespace tessel::ops::detail {
// Internal linkage on purpose (see vec_math.h).
namespace {

constexpr float kLayerNormEps = 1e-5f;

inline void layernorm_forward_loop(float* y, float* mean, float* rstd, const float* x,
                                   const float* w, const float* b, int64_t N, int64_t C) {
  for (int64_t r = 0; r < N; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    const float m = detail::sum(xr, C) / static_cast<float>(C);
    // Two passes (mean, then centred squares) avoid the cancellation of E[x^2] - E[x]^2.
    const auto centred_square = [xr, m](int64_t c) { return (xr[c] - m) * (xr[c] - m); };
    const float v = detail::lane_sum(C, centred_square) / static_cast<float>(C);
    const float s = 1.0f / std::sqrt(v + kLayerNormEps);
    for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * w[c] + b[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

inline void layernorm_backward_loop(float* dx, float* dw, float* db, const float* dy,
                                    const float* x, const float* w, const float* mean,
                                    const float* rstd, int64_t N, int64_t C) {
  for (int64_t r = 0; r < N; ++r) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    const float m = mean[r];
    const float s = rstd[r];
    // With xhat = (x - m) s and g = w * dy:
    //   dx = s * (g - mean(g) - xhat * mean(g * xhat))
    for (int64_t c = 0; c < C; ++c) {
      dw[c] += (xr[c] - m) * s * dyr[c];
      db[c] += dyr[c];
    }
    if (dx == nullptr) continue;
    const float g_mean = detail::dot(w, dyr, C) / static_cast<float>(C);
    const float gx_mean =
        detail::lane_sum(C, [&](int64_t c) { return w[c] * dyr[c] * (xr[c] - m) * s; }) /
        static_cast<float>(C);
    float* dxr = dx + r * C;
    for (int64_t c = 0; c < C; ++c) {
      float xhat = (xr[c] - m) * s;
      dxr[c] = s * (w[c] * dyr[c] - g_mean - xhat * gx_mean);
    }
  }
}

}  // namespace
}  // namespace tessel::ops::detail
