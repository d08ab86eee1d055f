// Elementwise activations and the residual add. Loops are kept branch-free where
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

}  // namespace tessel::ops
