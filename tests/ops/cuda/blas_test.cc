// cuBLASLt GEMMs and the linear layer against the CPU's ops::gemm / gemm_lowp / linear_*.
#include "tessel/ops/cuda/blas.h"

#include "cuda_test_util.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda::testing {
namespace {

constexpr double kF32Tol = 1e-5;
constexpr double kBf16Tol = 1e-2;

struct GemmCase {
  int64_t M, N, K;
};
const GemmCase kGemmCases[] = {{1, 7, 3}, {37, 53, 71}, {128, 96, 1000}, {5, 300, 17}};

class CudaBlas : public Gpu {};

TEST_F(CudaBlas, GemmF32MatchesCpuInEveryTransposeWithTf32Off) {
  Blas blas;
  uint64_t stream = 0;
  for (const GemmCase& c : kGemmCases)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t lda = ta ? c.M : c.K, ldb = tb ? c.K : c.N, ldc = c.N + 3;
        const Vec a = randn(c.M * c.K, ++stream), b = randn(c.K * c.N, ++stream);
        const Vec c0 = randn(c.M * ldc, ++stream);
        for (float beta : {0.0f, 0.5f}) {
          Vec want = beta == 0.0f ? Vec(c0.size(), 0.0f) : c0;
          ops::gemm(ta, tb, c.M, c.N, c.K, 1.5f, a.data(), lda, b.data(), ldb, beta, want.data(),
                    ldc);
          DeviceBuffer da = upload(a), db = upload(b);
          DeviceBuffer dc = beta == 0.0f ? poisoned(c.M * ldc) : upload(c0);
          gemm(blas, nullptr, ta, tb, c.M, c.N, c.K, 1.5f, {da.get(), DType::kF32, lda},
               {db.get(), DType::kF32, ldb}, beta, {dc.get(), DType::kF32, ldc});
          Vec got = download(dc, c.M * ldc);
          if (beta == 0.0f)  // padding columns were never written: compare the matrix only
            for (int64_t i = 0; i < c.M; ++i)
              for (int64_t j = c.N; j < ldc; ++j) got[i * ldc + j] = 0.0f;
          expect_close(
              got, want, kF32Tol,
              str("gemm f32 ", c.M, "x", c.N, "x", c.K, " ta=", ta, " tb=", tb, " beta=", beta));
        }
      }
}

TEST_F(CudaBlas, GemmBf16MatchesCpuLowPrecisionGemm) {
  Blas blas;
  uint64_t stream = 100;
  const GemmCase cases[] = {{64, 96, 128}, {40, 48, 200}, {256, 768, 768}};
  for (const GemmCase& c : cases)
    for (int ta = 0; ta < 2; ++ta)
      for (DType ct : {DType::kBF16, DType::kF32}) {
        const int tb = 1 - ta;
        const int64_t lda = ta ? c.M : c.K, ldb = tb ? c.K : c.N;
        const auto a = to_bf16(randn(c.M * c.K, ++stream)), b = to_bf16(randn(c.K * c.N, ++stream));
        Vec want(c.M * c.N, 0.0f);
        ops::gemm_lowp(ta, tb, c.M, c.N, c.K, 1.0f, {a.data(), DType::kBF16, lda},
                       {b.data(), DType::kBF16, ldb}, 0.0f, {want.data(), DType::kF32, c.N});
        if (ct == DType::kBF16) want = round_bf16(want);
        DeviceBuffer da = upload_ints(a), db = upload_ints(b), dc = poisoned(c.M * c.N, ct);
        gemm(blas, nullptr, ta, tb, c.M, c.N, c.K, 1.0f, {da.get(), DType::kBF16, lda},
             {db.get(), DType::kBF16, ldb}, 0.0f, {dc.get(), ct, c.N});
        expect_close(download(dc, c.M * c.N, ct), want, kBf16Tol,
                     str("gemm bf16 -> ", dtype_name(ct), " ", c.M, "x", c.N, "x", c.K, " ta=", ta,
                         " tb=", tb));
      }
}

TEST_F(CudaBlas, LinearF32ForwardAndBackwardMatchCpu) {
  Blas blas;
  for (bool with_bias : {true, false}) {
    const int64_t N = 67, C = 45, OC = 83;
    const Vec x = randn(N * C, 1), w = randn(OC * C, 2, 0.2f), b = randn(OC, 3);
    const Vec dy = randn(N * OC, 4), dw0 = randn(OC * C, 5), db0 = randn(OC, 6);
    Vec y(N * OC), dx(N * C), dw = dw0, db = db0;
    ops::linear_forward(y.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, N, C, OC);
    ops::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC);
    DeviceBuffer gx = upload(x), gw = upload(w), gb = upload(b), gdy = upload(dy);
    DeviceBuffer gy = poisoned(N * OC), gdx = poisoned(N * C), gdw = upload(dw0), gdb = upload(db0);
    linear_forward(blas, nullptr, gy.get(), gx.get(), gw.get(), with_bias ? gb.get() : nullptr,
                   DType::kF32, N, C, OC);
    linear_backward(blas, nullptr, gdx.get(), gdw.as<float>(), gdb.as<float>(), gdy.get(), gx.get(),
                    gw.get(), DType::kF32, N, C, OC);
    const std::string tag = with_bias ? " (bias)" : " (no bias)";
    expect_close(download(gy, N * OC), y, kF32Tol, "linear f32 y" + tag);
    expect_close(download(gdx, N * C), dx, kF32Tol, "linear f32 dx" + tag);
    expect_close(download(gdw, OC * C), dw, kF32Tol, "linear f32 dw (accumulated)" + tag);
    expect_close(download(gdb, OC), db, kF32Tol, "linear f32 db (accumulated)" + tag);
  }
}

TEST_F(CudaBlas, LinearBf16ForwardAndBackwardMatchCpuLowPrecision) {
  Blas blas;
  const int64_t N = 61, C = 96, OC = 136;
  const Vec x = round_bf16(randn(N * C, 11)), w = round_bf16(randn(OC * C, 12, 0.2f));
  const Vec b = round_bf16(randn(OC, 13)), dy = round_bf16(randn(N * OC, 14));
  const Vec dw0 = randn(OC * C, 15), db0 = randn(OC, 16);
  const auto xh = to_bf16(x), wh = to_bf16(w), bh = to_bf16(b), dyh = to_bf16(dy);
  std::vector<uint16_t> yh(N * OC), dxh(N * C);
  Vec dw = dw0, db = db0;
  ops::linear_forward(yh.data(), xh.data(), DType::kBF16, wh.data(), bh.data(), DType::kBF16, N, C,
                      OC);
  ops::linear_backward(dxh.data(), DType::kBF16, dw.data(), db.data(), dyh.data(), xh.data(),
                       wh.data(), DType::kBF16, N, C, OC);
  Vec y(yh.size()), dx(dxh.size());
  for (size_t i = 0; i < yh.size(); ++i) y[i] = bf16_to_f32(yh[i]);
  for (size_t i = 0; i < dxh.size(); ++i) dx[i] = bf16_to_f32(dxh[i]);
  const DType t = DType::kBF16;
  DeviceBuffer gx = upload(x, t), gw = upload(w, t), gb = upload(b, t), gdy = upload(dy, t);
  DeviceBuffer gy = poisoned(N * OC, t), gdx = poisoned(N * C, t), gdw = upload(dw0),
               gdb = upload(db0);
  linear_forward(blas, nullptr, gy.get(), gx.get(), gw.get(), gb.get(), t, N, C, OC);
  linear_backward(blas, nullptr, gdx.get(), gdw.as<float>(), gdb.as<float>(), gdy.get(), gx.get(),
                  gw.get(), t, N, C, OC);
  expect_close(download(gy, N * OC, t), y, kBf16Tol, "linear bf16 y");
  expect_close(download(gdx, N * C, t), dx, kBf16Tol, "linear bf16 dx");
  expect_close(download(gdw, OC * C), dw, kBf16Tol, "linear bf16 dw (f32, accumulated)");
  expect_close(download(gdb, OC), db, kBf16Tol, "linear bf16 db (f32, accumulated)");
}

TEST_F(CudaBlas, BiasBackwardAccumulatesColumnSums) {
  for (const auto& [N, OC] : {std::pair<int64_t, int64_t>{1, 1}, {1000, 37}, {33, 3072}}) {
    const Vec dy = randn(N * OC, 21), db0 = randn(OC, 22);
    Vec want = db0;
    ops::bias_backward(want.data(), dy.data(), N, OC);
    DeviceBuffer gdy = upload(dy), gdb = upload(db0);
    bias_backward(gdb.as<float>(), gdy.get(), DType::kF32, N, OC, nullptr);
    expect_close(download(gdb, OC), want, kF32Tol, str("bias_backward f32 ", N, "x", OC));
  }
}

// Host-side checks: they need no device, so they run (and must pass) everywhere.
TEST(CudaErrors, CudaAndCublasCodesBecomeCudaErrorNamingTheCall) {
  try {
    check_cuda(cudaErrorMemoryAllocation, "cudaMalloc of 12 bytes");
    FAIL() << "no throw";
  } catch (const CudaError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cudaMalloc of 12 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaErrorMemoryAllocation"), std::string::npos) << m;
  }
  EXPECT_THROW(check_cublas(/*CUBLAS_STATUS_NOT_SUPPORTED*/ 15, "cublasLtMatmul"), CudaError);
  EXPECT_NO_THROW(check_cuda(cudaSuccess, "nothing"));
  EXPECT_NO_THROW(check_cublas(0, "nothing"));
}

TEST(CudaErrors, UnsupportedShapesAndTypesAreInvalidArguments) {
  // Validation happens on the host, before anything touches the device.
  EXPECT_THROW(attention_forward(nullptr, nullptr, nullptr, 1, 8, 96, 2, DType::kF32, nullptr),
               InvalidArgument);  // head size 48
  EXPECT_THROW(gelu_forward(nullptr, nullptr, 4, DType::kI32, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace tessel::ops::cuda::testing
