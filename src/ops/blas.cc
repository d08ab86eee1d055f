// GEMM and the Linear layer built on it: one sgemm each for y, dw and dx. On one BLAS thread
// (every rank, predict and serve) the kernel table's own GEMM of the ISA level in use runs
// (sgemm_portable.cc, sgemm_avx2.cc, sgemm_avx512.cc): the same bits at every level and for any
// row count, which OpenBLAS does not give (its result for a row depends on how many rows the
// call has), and faster than it on every GEMM shape of the example models. Only with more BLAS
// threads set (runtime.threads > 1 in a one-worker run), OpenBLAS, which brings the threading.
#include <cblas.h>

#include <algorithm>
#include <atomic>

#include "kernels.h"
#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  TESSEL_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: sizes must be >= 0, got M=", M, " N=", N,
               " K=", K);
  if (M == 0 || N == 0) return;
  // OpenBLAS only prints a message for a bad leading dimension and skips the call. A and B are
  // not read when K = 0.
  TESSEL_CHECK(ldc >= N && (K == 0 || (lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N))),
               "gemm: leading dimension too small, got lda=", lda, " ldb=", ldb, " ldc=", ldc,
               " for M=", M, " N=", N, " K=", K, " trans_a=", trans_a, " trans_b=", trans_b);
  if (K == 0 || alpha == 0.0f) {  // C = beta * C; beta = 0 clears C, even of NaN
    for (int64_t i = 0; i < M; ++i) {
      float* row = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
    }
    return;
  }
  // cblas takes int sizes; tensors this large would not fit one GEMM call anyway.
  constexpr int64_t kMax = 0x7fffffff;
  TESSEL_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
               "gemm: sizes must fit in 32 bits, got M=", M, " N=", N, " K=", K,
               "; split the call");
  if (blas_threads() == 1) {
    kernels().sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}

namespace {
// The count set_blas_threads was given, 1 before any call: not OpenBLAS's own default (every
// core, or OPENBLAS_NUM_THREADS), so that a process which never sets it (a program using the
// library, serve's or predict's classes in a test) takes tessel's kernels and their bits.
std::atomic<int> g_blas_threads{1};
}  // namespace

void set_blas_threads(int n) {
  TESSEL_CHECK(n >= 1, "set_blas_threads: thread count must be >= 1, got ", n);
  openblas_set_num_threads(n);
  g_blas_threads.store(n, std::memory_order_relaxed);
}

int blas_threads() { return g_blas_threads.load(std::memory_order_relaxed); }

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t C,
                    int64_t OC, bool w_t) {
  // Seeding y with the bias and letting sgemm add onto it (beta = 1, which OpenBLAS does not
  // rescale) fuses the bias for free instead of a second pass over y.
  if (b != nullptr) {
    for (int64_t n = 0; n < N; ++n) std::copy(b, b + OC, y + n * OC);
  }
  gemm(false, !w_t, N, OC, C, 1.0f, x, C, w, w_t ? OC : C, b != nullptr ? 1.0f : 0.0f, y, OC);
}

void bias_backward(float* db, const float* dy, int64_t N, int64_t OC) {
  // Row by row so the inner loop runs along contiguous memory and vectorises.
  for (int64_t n = 0; n < N; ++n) {
    const float* row = dy + n * OC;
    for (int64_t o = 0; o < OC; ++o) db[o] += row[o];
  }
}

void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, int64_t N, int64_t C, int64_t OC) {
  // dw[OC,C] += dy^T[OC,N] @ x[N,C]
  if (dw != nullptr) gemm(true, false, OC, C, N, 1.0f, dy, OC, x, C, 1.0f, dw, C);
  if (db != nullptr) bias_backward(db, dy, N, OC);
  // dx[N,C] = dy[N,OC] @ w[OC,C]
  if (dx != nullptr) gemm(false, false, N, C, OC, 1.0f, dy, OC, w, C, 0.0f, dx, C);
}

}  // namespace tessel::ops
