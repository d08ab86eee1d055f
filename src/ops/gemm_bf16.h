// Private to ops: the f32 path behind ops::gemm_lowp (cpu.h), declared here so that the tests
// can run it beside the kernel table's native bf16 GEMM (kernels.h's gemm_bf16, `vdpbf16ps`, at
// the avx512_bf16 level) on every shape: operands rounded to bf16 and widened to f32, then the
// f32 GEMM. The same products; only the order of the f32 additions differs. Same contract as
// ops::gemm_lowp; the caller has checked sizes and leading dimensions.
#pragma once

#include <cstdint>

#include "tessel/ops/cpu.h"

namespace tessel::ops::detail {

void gemm_lowp_portable(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        ConstMatrix A, ConstMatrix B, float beta, Matrix C);

}  // namespace tessel::ops::detail
