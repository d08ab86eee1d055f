// LayerNorm over the last dimension: the kernel table's loops of the ISA level in use
// (layernorm_loops.h, elementwise_level.h).
#include "kernels.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C) {
  kernels().layernorm_forward(y, mean, rstd, x, w, b, N, C);
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N,
                        int64_t C) {
  kernels().layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C);
}

}  // namespace tessel::ops
