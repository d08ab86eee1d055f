// Device tensors on CUDA (tessel/ops/cuda/runtime.h): host <-> device copies, fills and
// conversions of Tensor through the installed runtime, the caching pool's reuse, and the memory
// ledger's device bytes equal to the pool's own count. Without a device the GPU tests skip,
// saying why, and a device tensor fails with a CudaError instead of crashing.
#include "tessel/ops/cuda/runtime.h"

#include <cuda_runtime_api.h>

#include <memory>

#include "cuda_test_util.h"
#include "tessel/core/memory.h"
#include "tessel/tensor/device.h"
#include "tessel/tensor/tensor.h"

namespace tessel::ops::cuda::testing {
namespace {

class CudaRuntime : public Gpu {
 protected:
  void SetUp() override {
    Gpu::SetUp();
    install();
  }
};

Tensor host_tensor(const Vec& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

Vec host_values(const Tensor& t) {
  Tensor h = t.to_device(Device::kCpu);
  return Vec(h.data<float>(), h.data<float>() + h.numel());
}

TEST_F(CudaRuntime, DeviceTensorsCopyFillAndConvert) {
  cudaStream_t stream;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  {
    DeviceScope scope(Device::kCuda, stream);
    const Vec x = randn(1001, 41);
    Tensor d = host_tensor(x).to_device(Device::kCuda);
    EXPECT_THROW(d.data<float>(), Error);  // the pointer contract
    EXPECT_EQ(host_values(d), x);
    Tensor c = d.clone();
    d.fill_(3.0f);
    EXPECT_EQ(host_values(d), Vec(x.size(), 3.0f));
    EXPECT_EQ(host_values(c), x);
    Tensor b = c.to(DType::kBF16).to_device(Device::kCpu);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(reinterpret_cast<const uint16_t*>(b.raw())[i], f32_to_bf16(x[i])) << i;
    c.view(10, {20}).zero_();
    const Vec got = host_values(c);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], i >= 10 && i < 30 ? 0.0f : x[i]) << i;
    EXPECT_EQ(host_values(Tensor::zeros({77}, DType::kF32, Device::kCuda)), Vec(77, 0.0f));
  }
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

TEST_F(CudaRuntime, LedgerCountsWhatThePoolHandsOutAndFreedBlocksAreReused) {
  const PoolStats before = pool_stats();
  pool_reset_peak();
  auto ledger = std::make_shared<MemoryLedger>();
  {
    MemoryScope scope(ledger, MemCategory::kParameters);
    Tensor p = Tensor::zeros({3 << 20}, DType::kF32, Device::kCuda);  // 12 MiB: 2 MiB classes
    MemoryScope act(MemCategory::kActivations);
    for (int step = 0; step < 3; ++step) {  // the same activations every step: one cudaMalloc
      Tensor a = Tensor::zeros({1000, 37}, DType::kBF16, Device::kCuda);
      Tensor g = Tensor::zeros({5}, DType::kF32, Device::kCuda);
      EXPECT_EQ(ledger->total(), pool_stats().in_use - before.in_use);
    }
    EXPECT_EQ(ledger->current(MemCategory::kParameters), 12 << 20);
    EXPECT_EQ(ledger->peak(MemCategory::kActivations),
              static_cast<int64_t>(pool_size_class(74000) + pool_size_class(64)));
  }
  const PoolStats after = pool_stats();
  EXPECT_EQ(ledger->total(), 0);
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(ledger->peak_total(), after.peak_in_use - before.in_use);
  EXPECT_LE(after.reserved - before.reserved, ledger->peak_total());  // reused, not re-malloced
}

TEST(CudaPool, SizeClasses) {
  EXPECT_EQ(pool_size_class(0), 512u);
  EXPECT_EQ(pool_size_class(1), 512u);
  EXPECT_EQ(pool_size_class(513), 1024u);
  EXPECT_EQ(pool_size_class(1 << 20), size_t{1} << 20);
  EXPECT_EQ(pool_size_class((1 << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(pool_size_class((5 << 20) + 3), size_t{6} << 20);
}

// Where there is no device (CI, this host), a cuda tensor is a CudaError naming the call, not a
// crash; the start check (parallel::check_device) reports device_unavailable_reason first.
TEST(CudaRuntimeWithoutDevice, ADeviceTensorIsAnErrorNamingTheCall) {
  const std::string why = device_unavailable_reason();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is present";
  install();
  EXPECT_EQ(device_runtime(Device::kCuda).unavailable_reason(), why);
  try {
    Tensor::zeros({4}, DType::kF32, Device::kCuda);
    FAIL() << "a cuda tensor without a device did not throw";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc of 512 bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel::ops::cuda::testing
