// The GELU loops of activation_loops.h at the AVX2 level (the compiler vectorises them for it).
#include "activation_loops.h"
#include "kernels.h"

namespace tessel::ops::avx2 {

void gelu_forward(float* y, const float* x, int64_t n) { detail::gelu_forward_loop(y, x, n); }

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  detail::gelu_backward_loop(dx, dy, x, n);
}

}  // namespace tessel::ops::avx2
