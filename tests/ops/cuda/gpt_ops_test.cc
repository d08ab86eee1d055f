// The CUDA kernels the GPT adds to the device table, against the CPU ops (f32 to 1e-5, bf16 to
// 1e-2, outputs poisoned with NaN first, accumulated gradients started from random values):
// accumulate (a gradient of type t summed into f32: the position table's) gives the CPU's bits;
// the modern GPT's RMSNorm, rotary positions and SwiGLU. Attention's head size 16 (char_gpt's)
// is among attention_test.cc's cases. Without a device every test skips, saying why.
#include "cuda_test_util.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda::testing {
namespace {

const DType kTypes[] = {DType::kF32, DType::kBF16};
double tol(DType t) { return t == DType::kF32 ? 1e-5 : 1e-2; }
Vec as_type(Vec v, DType t) { return t == DType::kF32 ? v : round_bf16(std::move(v)); }

class CudaGptOps : public Gpu {};

// One row, and 5 rows summed into one (the position table's gradient over 5 sequences).
TEST_F(CudaGptOps, AccumulateIsTheCpusBits) {
  const int64_t n = 10007;
  for (DType t : kTypes)
    for (int64_t count : {1, 5}) {
      const Vec acc = randn(n, 1);
      const Vec x = t == DType::kF32 ? randn(n * count, 2) : round_bf16(randn(n * count, 2));
      Vec want = acc;
      const std::vector<uint16_t> x16 = to_bf16(x);
      ops::accumulate(want.data(),
                      t == DType::kF32 ? static_cast<const void*>(x.data()) : x16.data(), n, t,
                      count);
      DeviceBuffer gacc = upload(acc), gx = upload(x, t);
      accumulate(gacc.as<float>(), gx.get(), n, count, t, nullptr);
      expect_same_bits(download(gacc, n), want, str("accumulate ", dtype_name(t), " x", count));
    }
}

TEST_F(CudaGptOps, RmsNormForwardAndBackwardMatchCpu) {
  for (DType t : kTypes)
    for (const auto& [N, C] : {std::pair<int64_t, int64_t>{37, 771}, {5, 3}, {129, 768}}) {
      const Vec x = as_type(randn(N * C, 1, 2.0f), t), w = as_type(randn(C, 2), t);
      const Vec dy = as_type(randn(N * C, 3), t), dw0 = randn(C, 4);
      Vec y(N * C), rstd(N), dx(N * C), dw = dw0;
      ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C);
      ops::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
      DeviceBuffer gx = upload(x, t), gw = upload(w, t), gdy = upload(dy, t), gdw = upload(dw0);
      DeviceBuffer gy = poisoned(N * C, t), grstd = poisoned(N), gdx = poisoned(N * C, t);
      rmsnorm_forward(gy.get(), grstd.as<float>(), gx.get(), gw.get(), N, C, t, nullptr);
      rmsnorm_backward(gdx.get(), gdw.as<float>(), gdy.get(), gx.get(), gw.get(), grstd.as<float>(),
                       N, C, t, nullptr);
      const std::string tag = str(" ", dtype_name(t), " ", N, "x", C);
      expect_close(download(grstd, N), rstd, 1e-5, "rmsnorm rstd" + tag);  // f32 either way
      expect_close(download(gy, N * C, t), as_type(y, t), tol(t), "rmsnorm y" + tag);
      expect_close(download(gdx, N * C, t), as_type(dx, t), tol(t), "rmsnorm dx" + tag);
      expect_close(download(gdw, C), dw, tol(t), "rmsnorm dw (accumulated)" + tag);
    }
}

// Forward, then backward over the forward's output: the CPU's rotations, and the input again.
TEST_F(CudaGptOps, RotaryMatchesCpu) {
  const int64_t N = 70, C = 96, NH = 3;  // head size 32
  std::vector<int64_t> pos(N);
  for (int64_t i = 0; i < N; ++i) pos[i] = (i * 37) % 1024;
  for (DType t : kTypes) {
    const Vec x = as_type(randn(N * 3 * C, 1), t);
    Vec fwd = x;
    ops::rotary_forward(fwd.data(), pos.data(), N, C, NH);
    DeviceBuffer g = upload(x, t), gpos = upload_ints(pos);
    rotary_forward(g.get(), gpos.as<int64_t>(), N, C, NH, t, nullptr);
    const std::string tag = str(" ", dtype_name(t));
    expect_close(download(g, N * 3 * C, t), as_type(fwd, t), tol(t), "rotary forward" + tag);
    rotary_backward(g.get(), gpos.as<int64_t>(), N, C, NH, t, nullptr);
    expect_close(download(g, N * 3 * C, t), x, t == DType::kF32 ? 1e-5 : 2e-2,
                 "rotary backward of forward" + tag);
  }
}

TEST_F(CudaGptOps, SwigluForwardAndBackwardMatchCpu) {
  const int64_t N = 41, H = 173;
  for (DType t : kTypes) {
    const Vec x = as_type(randn(N * 2 * H, 1, 2.0f), t), dy = as_type(randn(N * H, 2), t);
    Vec y(N * H), dx(N * 2 * H);
    ops::swiglu_forward(y.data(), x.data(), N, H);
    ops::swiglu_backward(dx.data(), dy.data(), x.data(), N, H);
    DeviceBuffer gx = upload(x, t), gdy = upload(dy, t);
    DeviceBuffer gy = poisoned(N * H, t), gdx = poisoned(N * 2 * H, t);
    swiglu_forward(gy.get(), gx.get(), N, H, t, nullptr);
    swiglu_backward(gdx.get(), gdy.get(), gx.get(), N, H, t, nullptr);
    const std::string tag = str(" ", dtype_name(t));
    expect_close(download(gy, N * H, t), as_type(y, t), tol(t), "swiglu y" + tag);
    expect_close(download(gdx, N * 2 * H, t), as_type(dx, t), tol(t), "swiglu dx" + tag);
  }
}

}  // namespace
}  // namespace tessel::ops::cuda::testing
