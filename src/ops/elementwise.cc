// Elementwise activations, the residual add and row softmax. Loops are kept branch-free where
// possible so gcc -O3 -march=native vectorises them.
#include <cmath>

#include "tessel/ops/cpu.h"
#include "vec_math.h"

namespace tessel::ops {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

}  // namespace

void relu_forward(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_backward(float* dx, const float* dy, const float* y, int64_t n) {
  if (dx == nullptr) return;
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void gelu_forward(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = kGeluScale * (v + kGeluCube * v * v * v);
    y[i] = 0.5f * v * (1.0f + detail::tanh(u));
  }
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  if (dx == nullptr) return;
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = kGeluScale * (v + kGeluCube * v * v * v);
    float t = detail::tanh(u);
    // d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx
    float du = kGeluScale * (1.0f + 3.0f * kGeluCube * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

void add_forward(float* y, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void softmax_forward(float* y, const float* x, int64_t N, int64_t C) {
  float mx;
  for (int64_t r = 0; r < N; ++r) detail::softmax_row(y + r * C, x + r * C, C, &mx);
}

void softmax_backward(float* dx, const float* dy, const float* y, int64_t N, int64_t C) {
  if (dx == nullptr) return;
  // dx = y * (dy - <dy, y>) row by row: the Jacobian of softmax applied without forming it.
  for (int64_t r = 0; r < N; ++r) {
    const float* yr = y + r * C;
    const float* dyr = dy + r * C;
    float* dxr = dx + r * C;
    const float dot = detail::dot(dyr, yr, C);
    for (int64_t c = 0; c < C; ++c) dxr[c] = yr[c] * (dyr[c] - dot);
  }
}

}  // namespace tessel::ops
