// Device tensors on CUDA: the caching pool and the DeviceRuntime built on it.
#include "tessel/ops/cuda/runtime.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernel_table.h"
#include "tessel/ops/cuda/check.h"
#include "tessel/ops/cuda/device.h"
#include "tessel/ops/cuda/kernels.h"
#include "tessel/tensor/device.h"

namespace tessel::ops::cuda {
namespace {

// Freed blocks are kept by size class and handed out again to a request of the same class, so a
// training step's activations reuse the previous step's memory without cudaMalloc/cudaFree
// (which synchronise the device). One pool per GPU, one stream per rank: a block freed by the
// host is reused by work queued after the work that used it (ranks sharing a GPU each order
// their own). Everything cached is freed at exit.
class Pool {
 public:
  explicit Pool(int device) : device_(device) {}
  ~Pool() {
    cudaSetDevice(device_);  // at exit: errors have nobody to report to
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) cudaFree(p);
  }

  // On this pool's GPU, which must be the calling thread's current one (cudaMalloc's).
  void* allocate(size_t bytes) {
    const size_t size = pool_size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    void* p = nullptr;
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    } else {
      cudaError_t e = cudaMalloc(&p, size);
      if (e == cudaErrorMemoryAllocation) {  // give the cache back, then try once more
        cudaGetLastError();
        release_cached();
        e = cudaMalloc(&p, size);
      }
      if (e != cudaSuccess)
        check_cuda(e, str("cudaMalloc of ", size, " bytes on GPU ", device_,
                          " (device memory of tensors; ", stats_.in_use,
                          " bytes in use): make the model or the batch smaller")
                          .c_str());
      stats_.reserved += static_cast<int64_t>(size);
    }
    live_.insert(p);
    stats_.in_use += static_cast<int64_t>(size);
    if (stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
    return p;
  }

  // Takes p back if this pool handed it out (from any thread); false if it did not.
  bool free(void* p, size_t bytes) noexcept {
    const size_t size = pool_size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.erase(p) == 0) return false;
    stats_.in_use -= static_cast<int64_t>(size);
    free_[size].push_back(p);
    return true;
  }

  PoolStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_in_use = stats_.in_use;
  }

 private:
  void release_cached() {  // mu_ held, on this pool's GPU
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize before freeing cached blocks");
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) check_cuda(cudaFree(p), "cudaFree of a cached block");
      stats_.reserved -= static_cast<int64_t>(size * blocks.size());
      blocks.clear();
    }
  }

  const int device_;
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::unordered_set<void*> live_;  // handed out, not yet freed
  PoolStats stats_;
};

// The pools of the GPUs this process sees (CUDA_VISIBLE_DEVICES applied), made at first use.
// A rank allocates from its thread's current GPU's pool; a block goes back to the pool it came
// from, whichever thread frees it, and is handed out again only on that GPU.
class Pools {
 public:
  Pool& current() {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    std::call_once(made_, [this] {
      int count = 0;
      check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
      for (int d = 0; d < count; ++d) pools_.push_back(std::make_unique<Pool>(d));
    });
    TESSEL_CHECK(device >= 0 && device < static_cast<int>(pools_.size()),
                 "cuda: the current GPU is not one cudaGetDeviceCount counts, got ", device);
    return *pools_[static_cast<size_t>(device)];
  }

  // The freeing thread's GPU's pool first (a rank frees its own blocks), then the others.
  void free(void* p, size_t bytes) noexcept {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) cudaGetLastError();
    const size_t mine = static_cast<size_t>(device);
    if (mine < pools_.size() && pools_[mine]->free(p, bytes)) return;
    for (const std::unique_ptr<Pool>& pool : pools_)
      if (pool->free(p, bytes)) return;
  }

 private:
  std::once_flag made_;
  std::vector<std::unique_ptr<Pool>> pools_;  // by GPU; fixed once made
};

Pools& pools() {
  static Pools p;  // destroyed at exit, giving the cached blocks back
  return p;
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

class CudaRuntime final : public DeviceRuntime {
 public:
  std::string unavailable_reason() const override { return device_unavailable_reason(); }
  size_t allocation_size(size_t bytes) const override { return pool_size_class(bytes); }
  void* allocate(size_t bytes) override { return pools().current().allocate(bytes); }
  void free(void* p, size_t bytes) noexcept override { pools().free(p, bytes); }
  void zero(void* p, size_t bytes, void* stream) override {
    check_cuda(cudaMemsetAsync(p, 0, bytes, as_stream(stream)), "cudaMemsetAsync of a tensor");
  }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
            void* stream) override {
    if (bytes == 0) return;
    const bool to_host = dst_device == Device::kCpu, from_host = src_device == Device::kCpu;
    const cudaMemcpyKind kind = to_host     ? cudaMemcpyDeviceToHost
                                : from_host ? cudaMemcpyHostToDevice
                                            : cudaMemcpyDeviceToDevice;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, as_stream(stream)),
               "cudaMemcpyAsync of a tensor");
    if (to_host || from_host)  // the host side is read or reused next
      check_cuda(cudaStreamSynchronize(as_stream(stream)),
                 "cudaStreamSynchronize after a host <-> device copy");
  }
  void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
               void* stream) override {
    cuda::convert(dst, dst_type, src, src_type, n, as_stream(stream));
  }
};

}  // namespace

size_t pool_size_class(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20;
  const size_t step = bytes <= (size_t{1} << 20) ? kSmall : kLarge;
  return (std::max<size_t>(bytes, 1) + step - 1) / step * step;
}

void install() {
  static CudaRuntime runtime;
  install_device_runtime(Device::kCuda, &runtime);
  install_device_kernels(Device::kCuda, &kernel_table());
}

PoolStats pool_stats() { return pools().current().stats(); }
void pool_reset_peak() { pools().current().reset_peak(); }

}  // namespace tessel::ops::cuda
