// Dropout on the GPU draws the CPU's counter-RNG mask: forward and backward give the CPU op's
// bits, f32 and bf16, for rows of later samples and columns past the first (a tensor-parallel
// slice). Without a device it skips, saying why.
#include "cuda_test_util.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda::testing {
namespace {

class CudaDropout : public Gpu {};

TEST_F(CudaDropout, MasksAreTheCpusBits) {
  const int64_t rows = 33, cols = 1001, step = 12, first_sample = 4097, first_col = 65;
  const uint64_t seed = 0x1234'5678'9abcULL;
  for (DType t : {DType::kF32, DType::kBF16}) {
    const Vec x = t == DType::kF32 ? randn(rows * cols, 1) : round_bf16(randn(rows * cols, 1));
    const std::vector<uint16_t> x16 = to_bf16(x);
    const void* xin = t == DType::kF32 ? static_cast<const void*>(x.data()) : x16.data();
    Vec y(rows * cols);
    std::vector<uint16_t> y16(rows * cols);
    void* yout = t == DType::kF32 ? static_cast<void*>(y.data()) : y16.data();
    ops::dropout_forward(yout, xin, rows, cols, 0.25f, seed, step, first_sample, first_col, t);
    if (t == DType::kBF16)
      for (size_t i = 0; i < y.size(); ++i) y[i] = bf16_to_f32(y16[i]);
    DeviceBuffer gx = upload(x, t), gy = poisoned(rows * cols, t), gdx = poisoned(rows * cols, t);
    dropout_forward(gy.get(), gx.get(), rows, cols, 0.25f, seed, step, first_sample, first_col, t,
                    nullptr);
    dropout_backward(gdx.get(), gx.get(), rows, cols, 0.25f, seed, step, first_sample, first_col, t,
                     nullptr);
    const std::string ty = dtype_name(t);
    expect_same_bits(download(gy, rows * cols, t), y, "dropout forward " + ty);
    expect_same_bits(download(gdx, rows * cols, t), y, "dropout backward (the same mask) " + ty);
  }
}

}  // namespace
}  // namespace tessel::ops::cuda::testing
