// ops::gemm_lowp: the checks, the choice between the kernel table's native bf16 GEMM (gemm_bf16.cc,
// at the avx512_bf16 level) and the f32 path, and the f32 path itself: every operand rounded to
// bf16 and widened back to f32 (so the products are the native kernel's), then the f32 GEMM of
// the level in use. CPUs without bf16 arithmetic keep bf16 storage and messages and compute in
// f32 FMAs, at about the f32 speed. Where the level's GEMM has sgemm_lowp (AVX2) the rounding
// happens while it packs its operands (and a 16-bit C is widened and rounded in its tile
// stores); elsewhere into f32 copies first. The copies (and a 16-bit C's f32 copy) live in
// per-thread buffers reused across calls (a fresh allocation of that size would be fresh pages,
// faulted in on every call).
#include <vector>

#include "gemm_bf16.h"
#include "gemm_blocking.h"
#include "kernels.h"
#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace detail {
namespace {

bool is_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

thread_local Scratch<float> tls_a, tls_b, tls_c;
thread_local Scratch<uint16_t> tls_half;

// op(X) of rows x cols, stored with leading dimension ld, as a dense f32 copy of its stored
// layout (stored rows x stored cols) in `scratch`, each element rounded to bf16.
const float* rounded(ConstMatrix x, int64_t stored_rows, int64_t stored_cols,
                     Scratch<float>& scratch) {
  float* out = scratch.get(stored_rows * stored_cols);
  uint16_t* half = tls_half.get(stored_cols);
  const size_t bytes = dtype_size(x.type);
  for (int64_t r = 0; r < stored_rows; ++r) {
    const void* row = static_cast<const char*>(x.p) + r * x.ld * static_cast<int64_t>(bytes);
    float* dst = out + r * stored_cols;
    // f32 and f16 round to bf16 (through f32, where f16 is exact), then widen: two passes.
    const void* bf16 = x.type == DType::kBF16 ? row : half;
    if (x.type != DType::kBF16) convert(half, DType::kBF16, row, x.type, stored_cols);
    convert(dst, DType::kF32, bf16, DType::kBF16, stored_cols);
  }
  return out;
}

}  // namespace

void gemm_lowp_portable(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        ConstMatrix A, ConstMatrix B, float beta, Matrix C) {
  // Rounded while packed (and a 16-bit C on store) where the level's GEMM can and runs the call
  // (one BLAS thread).
  if (kernels().sgemm_lowp != nullptr && blas_threads() == 1) {
    kernels().sgemm_lowp(trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
    return;
  }
  // Else into copies: C[M,N] (ldc) = alpha * op(A) op(B) + beta_c * C on the rounded operands.
  auto f32_gemm = [&](float beta_c, float* c, int64_t ldc) {
    const float* a = trans_a ? rounded(A, K, M, tls_a) : rounded(A, M, K, tls_a);
    const float* b = trans_b ? rounded(B, N, K, tls_b) : rounded(B, K, N, tls_b);
    gemm(trans_a, trans_b, M, N, K, alpha, a, trans_a ? M : K, b, trans_b ? K : N, beta_c, c, ldc);
  };
  if (C.type == DType::kF32) {
    f32_gemm(beta, static_cast<float*>(C.p), C.ld);
    return;
  }
  // A 16-bit C: widened, updated in f32, rounded once.
  float* c = tls_c.get(M * N);
  const size_t bytes = dtype_size(C.type);
  auto row = [&](int64_t i) {
    return static_cast<char*>(C.p) + i * C.ld * static_cast<int64_t>(bytes);
  };
  if (beta != 0.0f)
    for (int64_t i = 0; i < M; ++i) convert(c + i * N, DType::kF32, row(i), C.type, N);
  f32_gemm(beta, c, N);
  for (int64_t i = 0; i < M; ++i) convert(row(i), C.type, c + i * N, DType::kF32, N);
}

}  // namespace detail

bool gemm_lowp_native() { return kernels().gemm_bf16 != nullptr; }

void gemm_lowp(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               ConstMatrix A, ConstMatrix B, float beta, Matrix C) {
  TESSEL_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_lowp: sizes must be >= 0, got M=", M, " N=", N,
               " K=", K);
  TESSEL_CHECK(detail::is_float(A.type) && detail::is_float(B.type) && detail::is_float(C.type),
               "gemm_lowp: operands must be f32, bf16 or f16, got ", dtype_name(A.type), ", ",
               dtype_name(B.type), ", ", dtype_name(C.type));
  if (M == 0 || N == 0) return;
  TESSEL_CHECK(C.ld >= N && (K == 0 || (A.ld >= (trans_a ? M : K) && B.ld >= (trans_b ? K : N))),
               "gemm_lowp: leading dimension too small, got lda=", A.ld, " ldb=", B.ld,
               " ldc=", C.ld, " for M=", M, " N=", N, " K=", K, " trans_a=", trans_a,
               " trans_b=", trans_b);
  if (K == 0 || alpha == 0.0f) {  // C = beta * C; beta = 0 clears C, even of NaN
    const size_t bytes = dtype_size(C.type);
    std::vector<float> row(static_cast<size_t>(N));
    for (int64_t i = 0; i < M; ++i) {
      void* c = static_cast<char*>(C.p) + i * C.ld * static_cast<int64_t>(bytes);
      if (beta != 0.0f) convert(row.data(), DType::kF32, c, C.type, N);
      for (float& v : row) v = beta == 0.0f ? 0.0f : beta * v;
      convert(c, C.type, row.data(), DType::kF32, N);
    }
    return;
  }
  if (kernels().gemm_bf16 != nullptr) {
    kernels().gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
    return;
  }
  detail::gemm_lowp_portable(trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
}

}  // namespace tessel::ops
