// The kernels of the modern GPT variant (model.norm = rmsnorm, model.position = rotary,
// model.mlp = swiglu), f32, as plain loops: RMSNorm over the last dimension, the rotary
// position embedding of the queries and keys inside qkv rows, and SwiGLU's gated unit.
#include <cmath>

#include "tessel/ops/cpu.h"
#include "vec_math.h"

namespace tessel::ops {
namespace {

constexpr float kEps = 1e-5f;
constexpr float kRotaryBase = 10000.0f;

// Rotates the pairs (i, i + hs/2) of every head of the first 2C values of each qkv row (q and
// k) by sign * pos * base^(-2i/hs): forward +1, backward -1 (the transpose of a rotation).
void rotate(float* qkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, float sign) {
  const int64_t hs = C / NH, half = hs / 2;
  for (int64_t r = 0; r < N; ++r) {
    float* row = qkv + r * 3 * C;
    for (int64_t i = 0; i < half; ++i) {
      // The angle in double: the same bits for a position whichever batch or cache step holds it.
      const double freq = std::pow(static_cast<double>(kRotaryBase), -2.0 * i / hs);
      const double angle = static_cast<double>(pos[r]) * freq;
      const float c = static_cast<float>(std::cos(angle));
      const float s = sign * static_cast<float>(std::sin(angle));
      for (int64_t h = 0; h < 2 * NH; ++h) {  // q's heads, then k's
        float* a = row + h * hs + i;
        float* b = a + half;
        const float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = x0 * s + x1 * c;
      }
    }
  }
}

float sigmoid(float a) { return 1.0f / (1.0f + detail::exp(-a)); }

}  // namespace

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t N, int64_t C) {
  for (int64_t r = 0; r < N; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    const float ms = detail::dot(xr, xr, C) / static_cast<float>(C);
    const float s = 1.0f / std::sqrt(ms + kEps);
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * s * w[c];
    rstd[r] = s;
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t N, int64_t C) {
  for (int64_t r = 0; r < N; ++r) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    const float s = rstd[r];
    for (int64_t c = 0; c < C; ++c) dw[c] += xr[c] * s * dyr[c];
    if (dx == nullptr) continue;
    // With xhat = x s and g = w * dy: dx = s * (g - xhat * mean(g * xhat)).
    const float gx_mean =
        detail::lane_sum(C, [&](int64_t c) { return w[c] * dyr[c] * xr[c] * s; }) /
        static_cast<float>(C);
    float* dxr = dx + r * C;
    for (int64_t c = 0; c < C; ++c) dxr[c] = s * (w[c] * dyr[c] - xr[c] * s * gx_mean);
  }
}

void rotary_forward(float* qkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH) {
  rotate(qkv, pos, N, C, NH, 1.0f);
}

void rotary_backward(float* dqkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH) {
  rotate(dqkv, pos, N, C, NH, -1.0f);
}

void swiglu_forward(float* y, const float* x, int64_t N, int64_t H) {
  for (int64_t r = 0; r < N; ++r) {
    const float* a = x + r * 2 * H;
    const float* b = a + H;
    float* yr = y + r * H;
    for (int64_t j = 0; j < H; ++j) yr[j] = a[j] * sigmoid(a[j]) * b[j];
  }
}

void swiglu_backward(float* dx, const float* dy, const float* x, int64_t N, int64_t H) {
  for (int64_t r = 0; r < N; ++r) {
    const float* a = x + r * 2 * H;
    const float* b = a + H;
    const float* dyr = dy + r * H;
    float* da = dx + r * 2 * H;
    float* db = da + H;
    for (int64_t j = 0; j < H; ++j) {
      const float sg = sigmoid(a[j]);
      // silu(a) = a sg(a); silu'(a) = sg(a) (1 + a (1 - sg(a))).
      da[j] = dyr[j] * b[j] * sg * (1.0f + a[j] * (1.0f - sg));
      db[j] = dyr[j] * a[j] * sg;
    }
  }
}

}  // namespace tessel::ops
