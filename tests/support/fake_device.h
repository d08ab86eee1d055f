// A stand-in CUDA device for tests on a host without a GPU. FakeRuntime keeps "device" memory
// in its own host blocks (poisoned when handed out, counted, each call's stream recorded), so
// the tensor side of the pointer contract is checked; FakeDevice adds a kernel table
// (tessel/ops/device_kernels.h) whose slots run the CPU kernels on those host blocks, each slot
// counting its calls and checking that every pointer it is given is the fake device's memory (a
// host buffer passed to a device kernel, a missed upload, fails the test). Install one per test
// (it installs itself for Device::kCuda and uninstalls in its destructor) from one thread; its
// runtime calls and slots may come from several (ranks as threads share the one fake device).
// It stands in for one GPU or several: each thread has a current GPU (set_fake_gpu, as
// cudaSetDevice; the mock NCCL's set_device calls it), each block belongs to the GPU current on
// the thread that allocated it, and every runtime call and kernel slot checks that the device
// memory it is given is on the calling thread's GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"

namespace tessel::fakes {

class FakeRuntime : public DeviceRuntime {
 public:
  std::string unavailable_reason() const override { return ""; }
  size_t allocation_size(size_t bytes) const override { return (bytes + 1023) / 1024 * 1024; }
  void* allocate(size_t bytes) override;
  void free(void* p, size_t bytes) noexcept override;
  void zero(void* p, size_t bytes, void* stream) override;
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
            void* stream) override;
  // Any pair of float types (f32, bf16, f16), through ops::convert.
  void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
               void* stream) override;

  // Whether [p, p + bytes) lies in one block of this runtime.
  bool owns(const void* p, size_t bytes) const;
  // The GPU of the block holding p; -1 when p is in none.
  int gpu_of(const void* p) const;
  std::map<void*, int> gpus;  // each block's GPU

  std::map<void*, size_t> blocks;
  int64_t in_use = 0;
  int copies = 0;
  int64_t to_host_bytes = 0;  // copied from the device to the host
  std::vector<void*> streams;

  // Ranks as threads: every call above holds it (recursive: copy() asks owns()).
  mutable std::recursive_mutex mu;
};

class FakeDevice {
 public:
  // Installs the runtime and the kernel table for Device::kCuda, standing in for `gpus` GPUs.
  explicit FakeDevice(int gpus = 1);
  ~FakeDevice();  // uninstalls both; every device block must have been freed by then
  FakeDevice(const FakeDevice&) = delete;
  FakeDevice& operator=(const FakeDevice&) = delete;

  // How many times the slot of `op` (its field name in DeviceKernels) ran.
  int calls(const std::string& op) const;
  FakeRuntime& runtime() { return runtime_; }
  int gpu_count() const { return gpus_; }

 private:
  int gpus_;
  FakeRuntime runtime_;
  ops::DeviceKernels kernels_;
  std::map<std::string, int> calls_;
  friend struct FakeSlots;
};

// ---- Several GPUs: this thread's current one, as the CUDA runtime keeps it ----
void set_fake_gpu(int gpu);  // cudaSetDevice
int fake_gpu();              // cudaGetDevice: 0 until set on this thread
int fake_gpu_count();        // cudaGetDeviceCount: the installed FakeDevice's, 1 without one
// The GPU of the installed FakeDevice's block holding p; -1 when none holds it (host memory).
int fake_gpu_of(const void* p);

}  // namespace tessel::fakes
