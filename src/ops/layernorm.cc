// LayerNorm over the last dimension (llm.c layout): statistics per row, affine per column.
#include <cmath>

#include "tessel/ops/cpu.h"
#include "vec_math.h"

namespace tessel::ops {
namespace {

constexpr float kEps = 1e-5f;

}  // namespace

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C) {
  for (int64_t r = 0; r < N; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    const float m = detail::sum(xr, C) / static_cast<float>(C);
    // Two passes (mean, then centred squares) avoid the cancellation of E[x^2] - E[x]^2.
    const auto centred_square = [xr, m](int64_t c) { return (xr[c] - m) * (xr[c] - m); };
    const float v = detail::lane_sum(C, centred_square) / static_cast<float>(C);
    const float s = 1.0f / std::sqrt(v + kEps);
    for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * w[c] + b[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N,
                        int64_t C) {
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

}  // namespace tessel::ops
