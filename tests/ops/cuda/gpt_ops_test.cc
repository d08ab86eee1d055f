// The CUDA kernels the GPT adds to the device table, against the CPU ops: accumulate (a
// gradient of type t summed into f32: the position table's) gives the CPU's bits. Attention's
// head size 16 (char_gpt's) is among attention_test.cc's cases. Without a device it skips.
#include "cuda_test_util.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda::testing {
namespace {

class CudaGptOps : public Gpu {};

TEST_F(CudaGptOps, AccumulateIsTheCpusBits) {
  const int64_t n = 10007;
  for (DType t : {DType::kF32, DType::kBF16}) {
    const Vec acc = randn(n, 1), x = t == DType::kF32 ? randn(n, 2) : round_bf16(randn(n, 2));
    Vec want = acc;
    const std::vector<uint16_t> x16 = to_bf16(x);
    ops::accumulate(want.data(), t == DType::kF32 ? static_cast<const void*>(x.data()) : x16.data(),
                    n, t);
    DeviceBuffer gacc = upload(acc), gx = upload(x, t);
    accumulate(gacc.as<float>(), gx.get(), n, t, nullptr);
    expect_same_bits(download(gacc, n), want, str("accumulate ", dtype_name(t)));
  }
}

}  // namespace
}  // namespace tessel::ops::cuda::testing
