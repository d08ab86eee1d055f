// Private to ops: tessel's own single-threaded AVX-512 SGEMM, which ops::gemm calls instead of
// OpenBLAS when the build targets AVX-512 and BLAS runs on one thread (see blas.cc). Same
// contract as ops::gemm; the caller has already checked sizes and leading dimensions.
// Safe to call from several threads at once: each thread packs into its own scratch.
#pragma once

#include <cstdint>

namespace tessel::ops::detail {

#ifdef __AVX512F__
// C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major. beta = 0 never reads C; alpha = 0 never
// reads A or B (as in OpenBLAS, so a NaN there does not reach C).
void sgemm_avx512(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc);
#endif

}  // namespace tessel::ops::detail
