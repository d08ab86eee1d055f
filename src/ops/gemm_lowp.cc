// ops::gemm_lowp: the checks, the choice between tessel's AVX512_BF16 kernel (gemm_bf16.cc) and
// the portable path, and the portable path itself: every operand rounded to bf16 and widened
// back to f32 (so the products are the kernel's), then the f32 GEMM.
#include <vector>

#include "gemm_bf16.h"
#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace detail {
namespace {

bool is_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// op(X) of rows x cols, stored with leading dimension ld, as a dense f32 copy of its stored
// layout (stored rows x stored cols) with each element rounded to bf16.
std::vector<float> rounded(ConstMatrix x, int64_t stored_rows, int64_t stored_cols) {
  std::vector<float> out(static_cast<size_t>(stored_rows * stored_cols));
  std::vector<uint16_t> half(static_cast<size_t>(stored_cols));
  const size_t bytes = dtype_size(x.type);
  for (int64_t r = 0; r < stored_rows; ++r) {
    const void* row = static_cast<const char*>(x.p) + r * x.ld * static_cast<int64_t>(bytes);
    float* dst = out.data() + r * stored_cols;
    convert(dst, DType::kF32, row, x.type, stored_cols);
    convert(half.data(), DType::kBF16, dst, DType::kF32, stored_cols);
    convert(dst, DType::kF32, half.data(), DType::kBF16, stored_cols);
  }
  return out;
}

}  // namespace

void gemm_lowp_portable(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        ConstMatrix A, ConstMatrix B, float beta, Matrix C) {
  const std::vector<float> a = trans_a ? rounded(A, K, M) : rounded(A, M, K);
  const std::vector<float> b = trans_b ? rounded(B, N, K) : rounded(B, K, N);
  if (C.type == DType::kF32) {
    gemm(trans_a, trans_b, M, N, K, alpha, a.data(), trans_a ? M : K, b.data(), trans_b ? K : N,
         beta, static_cast<float*>(C.p), C.ld);
    return;
  }
  // A 16-bit C: widened, updated in f32, rounded once.
  std::vector<float> c(static_cast<size_t>(M * N));
  const size_t bytes = dtype_size(C.type);
  auto row = [&](int64_t i) { return static_cast<char*>(C.p) + i * C.ld * static_cast<int64_t>(bytes); };
  if (beta != 0.0f)
    for (int64_t i = 0; i < M; ++i) convert(c.data() + i * N, DType::kF32, row(i), C.type, N);
  gemm(trans_a, trans_b, M, N, K, alpha, a.data(), trans_a ? M : K, b.data(), trans_b ? K : N, beta,
       c.data(), N);
  for (int64_t i = 0; i < M; ++i) convert(row(i), C.type, c.data() + i * N, DType::kF32, N);
}

}  // namespace detail

bool gemm_lowp_native() { return detail::gemm_bf16_supported(); }

void gemm_lowp(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               ConstMatrix A, ConstMatrix B, float beta, Matrix C) {
  TESSEL_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_lowp: sizes must be >= 0, got M=", M, " N=", N,
               " K=", K);
  TESSEL_CHECK(detail::is_float(A.type) && detail::is_float(B.type) && detail::is_float(C.type),
               "gemm_lowp: operands must be f32, bf16 or f16, got ", dtype_name(A.type), ", ",
               dtype_name(B.type), ", ", dtype_name(C.type));
  if (M == 0 || N == 0) return;
  TESSEL_CHECK(C.ld >= N && (K == 0 || (A.ld >= (trans_a ? M : K) && B.ld >= (trans_b ? K : N))),
               "gemm_lowp: leading dimension too small, got lda=", A.ld, " ldb=", B.ld, " ldc=",
               C.ld, " for M=", M, " N=", N, " K=", K, " trans_a=", trans_a, " trans_b=", trans_b);
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
  if (detail::gemm_bf16_supported()) {
    detail::gemm_bf16_avx512(trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
    return;
  }
  detail::gemm_lowp_portable(trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
}

}  // namespace tessel::ops
