// The GELU and causal softmax loops of activation_loops.h at the AVX2 level (the compiler
// vectorises them for it).
#include "activation_loops.h"
#include "kernels.h"

namespace tessel::ops::avx2 {

void gelu_forward(float* y, const float* x, int64_t n) { detail::gelu_forward_loop(y, x, n); }

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  detail::gelu_backward_loop(dx, dy, x, n);
}

void causal_softmax(float* p, int64_t rows, int64_t ld, int64_t first, int64_t keys) {
  detail::causal_softmax_loop(p, rows, ld, first, keys);
}

}  // namespace tessel::ops::avx2
