// Elementwise activations, the residual add and row softmax. Loops are kept branch-free where
// possible so gcc -O3 vectorises them; GELU and attention's causal softmax, whose exp is worth
// wider vectors, run the kernel table's loops of the ISA level in use (activation_loops.h).
#include <cmath>

#include "activation_loops.h"
#include "kernels.h"
#include "layernorm_loops.h"
#include "tessel/ops/cpu.h"
#include "vec_math.h"

namespace tessel::ops {

namespace portable {
#include "elementwise_level.h"
}  // namespace portable

void relu_forward(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_backward(float* dx, const float* dy, const float* y, int64_t n) {
  if (dx == nullptr) return;
  // dy read unconditionally: a conditional load keeps the loop scalar, with a branch per value.
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

void gelu_forward(float* y, const float* x, int64_t n) { kernels().gelu_forward(y, x, n); }

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  if (dx == nullptr) return;
  kernels().gelu_backward(dx, dy, x, n);
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
