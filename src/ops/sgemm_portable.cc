// The portable f32 GEMM: plain C++ for any x86-64 CPU, and the reference the AVX2 and AVX-512
// kernels are tested against bit for bit. It computes every element of C in the sum order of
// gemm_blocking.h with std::fma (one rounding per multiply-add, as the vector FMAs), so its
// result is the vector kernels' to the bit. Rows go one at a time: per K block, op(B)'s rows of
// that block are copied contiguous once (shared by all rows of C), and a row of partial sums
// runs along them, so every inner loop reads memory in order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "gemm_blocking.h"
#include "kernels.h"

namespace tessel::ops::portable {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t kc_max = detail::sum_block_k(K);
  std::vector<float> block(static_cast<size_t>(kc_max * N)), acc(static_cast<size_t>(N));
  for (int64_t p0 = 0; p0 < K; p0 += kc_max) {
    const int64_t kc = std::min(kc_max, K - p0);
    // block[k * N + j] = op(B)(p0 + k, j)
    for (int64_t k = 0; k < kc; ++k) {
      for (int64_t j = 0; j < N; ++j) {
        block[k * N + j] = trans_b ? B[j * ldb + p0 + k] : B[(p0 + k) * ldb + j];
      }
    }
    const float beta_k = p0 == 0 ? beta : 1.0f;
    for (int64_t i = 0; i < M; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < kc; ++k) {
        const float a = trans_a ? A[(p0 + k) * lda + i] : A[i * lda + p0 + k];
        const float* b = block.data() + k * N;
        for (int64_t j = 0; j < N; ++j) acc[j] = std::fma(a, b[j], acc[j]);
      }
      float* c = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) {
        const float v = alpha * acc[j];
        c[j] = beta_k == 0.0f ? v : std::fma(beta_k, c[j], v);
      }
    }
  }
}

}  // namespace tessel::ops::portable
