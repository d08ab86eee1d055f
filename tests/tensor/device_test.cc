// Device tensors through the DeviceRuntime seam (tessel/tensor/device.h), on the CPU: a fake
// runtime (tests/support/fake_device.h) keeps "device" memory in its own host blocks and checks
// that every call comes through it (with the thread's current stream), so the tensor side of the
// pointer contract, the copies, fills and conversions and the ledger's device bytes are tested
// without a GPU. The CUDA runtime itself (its pool) is tested on a GPU in tests/ops/cuda.
#include "tessel/tensor/device.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "fake_device.h"
#include "tessel/core/memory.h"
#include "tessel/tensor/tensor.h"

namespace tessel {
namespace {

class DeviceTensor : public ::testing::Test {
 protected:
  void SetUp() override { install_device_runtime(Device::kCuda, &fake_); }
  void TearDown() override {
    install_device_runtime(Device::kCuda, nullptr);
    EXPECT_TRUE(fake_.blocks.empty()) << "a device block was not given back";
  }
  fakes::FakeRuntime fake_;  // "device" memory: poisoned host blocks of 1 KiB size classes
};

std::vector<float> host_values(const Tensor& t) {
  Tensor h = t.to_device(Device::kCpu);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

TEST_F(DeviceTensor, HostCodeCannotTakeADevicePointer) {
  Tensor d = Tensor::zeros({2, 3}, DType::kF32, Device::kCuda);
  try {
    d.data<float>();
    FAIL() << "data<f32>() of a device tensor did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host code cannot read device memory"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda tensor [2, 3]"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fake_.owns(d.device_data<float>(), d.nbytes()));
  EXPECT_THROW(d.device_data<int32_t>(), Error);  // the dtype still checked
  EXPECT_THROW(Tensor::zeros({2}).device_data<float>(), Error);
}

TEST_F(DeviceTensor, ZeroedCopiedFilledAndConvertedThroughTheRuntime) {
  int stream_tag = 0;
  DeviceScope scope(Device::kCuda, &stream_tag);
  EXPECT_EQ(current_device(), Device::kCuda);
  Tensor d = Tensor::zeros({5}, DType::kF32, Device::kCuda);  // the runtime's block was 0xFF
  EXPECT_EQ(host_values(d), std::vector<float>(5, 0.0f));

  Tensor h = Tensor::empty({5});
  for (int i = 0; i < 5; ++i) h.data<float>()[i] = 1.5f * i;
  d.copy_from(h);  // host -> device
  Tensor c = d.clone();
  EXPECT_EQ(c.device(), Device::kCuda);
  EXPECT_NE(c.raw(), d.raw());
  d.fill_(7.0f);
  EXPECT_EQ(host_values(d), std::vector<float>(5, 7.0f));
  EXPECT_EQ(host_values(c), (std::vector<float>{0.0f, 1.5f, 3.0f, 4.5f, 6.0f}));
  Tensor b = c.to(DType::kBF16);
  EXPECT_EQ(b.device(), Device::kCuda);
  Tensor bh = b.to_device(Device::kCpu);
  EXPECT_EQ(bf16_to_f32(reinterpret_cast<const uint16_t*>(bh.raw())[3]), 4.5f);
  c.view(1, {2}).zero_();
  EXPECT_EQ(host_values(c), (std::vector<float>{0.0f, 0.0f, 0.0f, 4.5f, 6.0f}));
  EXPECT_THROW(Tensor::zeros({5}, DType::kI32, Device::kCuda).fill_(1.0f), Error);  // f32 only
  for (void* s : fake_.streams) EXPECT_EQ(s, &stream_tag);
  EXPECT_GE(fake_.copies, 6);
}

TEST_F(DeviceTensor, LedgerChargesTheRuntimesSizeClassUnderItsCategory) {
  auto ledger = std::make_shared<MemoryLedger>();
  {
    MemoryScope scope(ledger, MemCategory::kParameters);
    Tensor d = Tensor::zeros({300}, DType::kF32, Device::kCuda);  // 1200 bytes -> 2048
    EXPECT_EQ(ledger->current(MemCategory::kParameters), 2048);
    EXPECT_EQ(fake_.in_use, 2048);
    {
      MemoryScope act(MemCategory::kActivations);
      Tensor a = Tensor::zeros({10}, DType::kF32, Device::kCuda);
      EXPECT_EQ(ledger->current(MemCategory::kActivations), 1024);
    }
    EXPECT_EQ(ledger->peak_total(), fake_.in_use + 1024);
  }
  EXPECT_EQ(ledger->total(), 0);
  EXPECT_EQ(fake_.in_use, 0);
}

TEST_F(DeviceTensor, OverTheLimitAllocatesNothingOnTheDevice) {
  auto ledger = std::make_shared<MemoryLedger>(1024);
  MemoryScope scope(ledger, MemCategory::kActivations);
  EXPECT_THROW(Tensor::zeros({300}, DType::kF32, Device::kCuda), MemoryLimitError);
  EXPECT_TRUE(fake_.blocks.empty());
}

// Activation offload's move: the device block and its charge go, with the storage swap_out
// returns, once the copy has read it; the bytes wait on the host, and every view of the storage
// reads them again after swap_in. On the default stream the copies are done at once.
TEST_F(DeviceTensor, SwappedOutStorageGivesItsDeviceMemoryBackAndReturnsTheSameBytes) {
  Tensor h = Tensor::empty({300});
  for (int i = 0; i < 300; ++i) h.data<float>()[i] = 0.5f * static_cast<float>(i);
  auto ledger = std::make_shared<MemoryLedger>();
  MemoryScope scope(ledger, MemCategory::kActivations);
  Tensor d = Tensor::zeros({300}, DType::kF32, Device::kCuda);
  d.copy_from(h);
  const Tensor view = d.view(100, {200});
  void* host = fake_.allocate_pinned(d.storage().bytes());
  std::unique_ptr<Storage> block = d.storage().swap_out(host, current_stream());
  EXPECT_TRUE(d.storage().swapped_out());
  EXPECT_EQ(fake_.in_use, 2048);  // until the block goes
  EXPECT_EQ(ledger->current(MemCategory::kActivations), 2048);
  block.reset();
  EXPECT_EQ(fake_.in_use, 0);
  EXPECT_EQ(ledger->current(MemCategory::kActivations), 0);
  EXPECT_THROW((void)d.storage().swap_out(host, current_stream()), Error);
  d.storage().swap_in(host, current_stream());
  EXPECT_FALSE(d.storage().swapped_out());
  EXPECT_EQ(fake_.in_use, 2048);
  EXPECT_EQ(ledger->current(MemCategory::kActivations), 2048);
  const std::vector<float> back = host_values(view);
  EXPECT_EQ(back, std::vector<float>(h.data<float>() + 100, h.data<float>() + 300));
  EXPECT_THROW(d.storage().swap_in(host, current_stream()), Error);
  fake_.free_pinned(host, d.storage().bytes());
}

// On a stream of the runtime's own the copies wait (lazily, in the fake) until an event after
// them is waited for: the host bytes are not there before, and are after.
TEST_F(DeviceTensor, SwapOutOnACopyStreamIsDoneOnlyAtItsEvent) {
  Tensor h = Tensor::empty({300});
  for (int i = 0; i < 300; ++i) h.data<float>()[i] = static_cast<float>(i);
  Tensor d = Tensor::empty({300}, DType::kF32, Device::kCuda);
  d.copy_from(h);
  void* stream = fake_.create_stream();
  void* done = fake_.create_event();
  auto* host = static_cast<float*>(fake_.allocate_pinned(d.storage().bytes()));
  std::unique_ptr<Storage> block = d.storage().swap_out(host, stream);
  fake_.record_event(done, stream);
  EXPECT_EQ(fake_.async_streams, std::vector<void*>{stream});
  EXPECT_TRUE(fake_.pending(block->data(), block->bytes()));
  EXPECT_NE(host[7], 7.0f);  // still the pinned block's poison
  fake_.event_synchronize(done);
  EXPECT_FALSE(fake_.pending(block->data(), block->bytes()));
  EXPECT_EQ(std::vector<float>(host, host + 300),
            std::vector<float>(h.data<float>(), h.data<float>() + 300));
  block.reset();
  d.storage().swap_in(host, stream);
  fake_.record_event(done, stream);
  fake_.stream_wait(nullptr, done);  // the compute stream's work after this sees the bytes
  EXPECT_EQ(host_values(d), std::vector<float>(h.data<float>(), h.data<float>() + 300));
  fake_.free_pinned(host, d.storage().bytes());
  fake_.destroy_event(done);
  fake_.destroy_stream(stream);
}

// A runtime that fills only the required slots (here the fake's, forwarded) gets the overlap
// slots' defaults: no stream of its own, and every copy_async done when it returns.
class RequiredSlotsOnly final : public DeviceRuntime {
 public:
  explicit RequiredSlotsOnly(fakes::FakeRuntime& f) : f_(f) {}
  std::string unavailable_reason() const override { return ""; }
  size_t allocation_size(size_t bytes) const override { return f_.allocation_size(bytes); }
  void* allocate(size_t bytes) override { return f_.allocate(bytes); }
  void free(void* p, size_t bytes) noexcept override { f_.free(p, bytes); }
  void zero(void* p, size_t bytes, void* s) override { f_.zero(p, bytes, s); }
  void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes, void* s) override {
    f_.copy(dst, dd, src, sd, bytes, s);
  }
  void convert(void* dst, DType dt, const void* src, DType st, int64_t n, void* s) override {
    f_.convert(dst, dt, src, st, n, s);
  }

 private:
  fakes::FakeRuntime& f_;
};

TEST_F(DeviceTensor, WithoutStreamsOfItsOwnARuntimesAsyncCopiesAreDoneAtOnce) {
  RequiredSlotsOnly runtime(fake_);
  install_device_runtime(Device::kCuda, &runtime);
  Tensor h = Tensor::empty({300});
  for (int i = 0; i < 300; ++i) h.data<float>()[i] = static_cast<float>(i);
  Tensor d = Tensor::empty({300}, DType::kF32, Device::kCuda);
  d.copy_from(h);
  void* stream = runtime.create_stream();
  void* done = runtime.create_event();
  EXPECT_EQ(stream, nullptr);
  auto* host = static_cast<float*>(runtime.allocate_pinned(d.storage().bytes()));
  (void)d.storage().swap_out(host, stream);  // the block may go at once
  runtime.record_event(done, stream);
  EXPECT_EQ(std::vector<float>(host, host + 300),
            std::vector<float>(h.data<float>(), h.data<float>() + 300));
  d.storage().swap_in(host, stream);
  runtime.stream_wait(nullptr, done);
  runtime.event_synchronize(done);
  EXPECT_EQ(host_values(d), std::vector<float>(h.data<float>(), h.data<float>() + 300));
  EXPECT_EQ(fake_.copies, 4);  // up, out, back, down: all the runtime's synchronous copy
  runtime.free_pinned(host, d.storage().bytes());
  runtime.destroy_event(done);
  runtime.destroy_stream(stream);
  install_device_runtime(Device::kCuda, &fake_);
}

TEST_F(DeviceTensor, ViewsLiveOnTheDeviceButShareOnlyHostMemory) {
  Tensor t = Tensor::zeros({16}, DType::kF32, Device::kCuda);
  EXPECT_EQ(t.view(12, {4}).device(), Device::kCuda);
  EXPECT_EQ(host_values(t.view(12, {4})), std::vector<float>(4, 0.0f));
  auto keep = std::shared_ptr<void>(std::aligned_alloc(64, 4096), std::free);
  EXPECT_THROW(t.storage().rebind(keep.get(), keep), Error);
}

TEST(DeviceTensorWithoutRuntime, SaysThisBuildHasNoSuchDevice) {
  install_device_runtime(Device::kCuda, nullptr);
  try {
    Tensor::zeros({2}, DType::kF32, Device::kCuda);
    FAIL() << "a cuda tensor without a cuda runtime did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("this tessel was built without cuda"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tessel
