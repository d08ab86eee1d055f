// Private to ops: the two implementations behind ops::gemm_lowp (cpu.h), declared here so that
// the tests can run each one on every shape.
//   - tessel's own AVX512_BF16 kernel (gemm_bf16.cc, `vdpbf16ps`), built whenever the compiler
//     can target the instruction and run only where CPUID reports it (gemm_bf16_supported);
//   - the portable path (gemm_lowp.cc): operands rounded to bf16 and widened to f32, then the
//     f32 GEMM. The same products; only the order of the f32 additions differs.
// Same contract as ops::gemm_lowp; the caller has checked sizes and leading dimensions.
#pragma once

#include <cstdint>

#include "tessel/ops/cpu.h"

namespace tessel::ops::detail {

// Whether this build has the kernel and this CPU (and OS) runs AVX-512 with BF16.
bool gemm_bf16_supported();
void gemm_bf16_avx512(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      ConstMatrix A, ConstMatrix B, float beta, Matrix C);
void gemm_lowp_portable(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        ConstMatrix A, ConstMatrix B, float beta, Matrix C);

}  // namespace tessel::ops::detail
