// Device tensors on CUDA: the caching pool and the DeviceRuntime built on it.
#include "tessel/ops/cuda/runtime.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
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
// (which synchronise the device). One stream per device: a block freed by the host is reused
// by work queued after the work that used it. Everything cached is freed at exit.
class Pool {
 public:
  ~Pool() {
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) cudaFree(p);  // at exit: errors have nobody to report to
  }

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
        check_cuda(e, str("cudaMalloc of ", size, " bytes (device memory of tensors; ",
                          stats_.in_use, " bytes in use): make the model or the batch smaller")
                          .c_str());
      stats_.reserved += static_cast<int64_t>(size);
    }
    stats_.in_use += static_cast<int64_t>(size);
    if (stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
    return p;
  }

  void free(void* p, size_t bytes) noexcept {
    const size_t size = pool_size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use -= static_cast<int64_t>(size);
    free_[size].push_back(p);
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
  void release_cached() {  // mu_ held
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize before freeing cached blocks");
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) check_cuda(cudaFree(p), "cudaFree of a cached block");
      stats_.reserved -= static_cast<int64_t>(size * blocks.size());
      blocks.clear();
    }
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  PoolStats stats_;
};

Pool& pool() {
  static Pool p;  // destroyed at exit, giving the cached blocks back
  return p;
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

class CudaRuntime final : public DeviceRuntime {
 public:
  std::string unavailable_reason() const override { return device_unavailable_reason(); }
  size_t allocation_size(size_t bytes) const override { return pool_size_class(bytes); }
  void* allocate(size_t bytes) override { return pool().allocate(bytes); }
  void free(void* p, size_t bytes) noexcept override { pool().free(p, bytes); }
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

  // ---- Overlap (activation offload): pinned host memory, a copy stream, events ----
  void* allocate_pinned(size_t bytes) override {
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault),
               str("cudaHostAlloc of ", bytes,
                   " bytes (pinned host memory of offloaded activations): free host memory, "
                   "make the batch smaller or set train.offload = none")
                   .c_str());
    return p;
  }
  void free_pinned(void* p, size_t) noexcept override { cudaFreeHost(p); }
  void* create_stream() override {
    cudaStream_t s = nullptr;  // non-blocking: not ordered with the legacy default stream either
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroy_stream(void* stream) noexcept override { cudaStreamDestroy(as_stream(stream)); }
  void* create_event() override {
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void destroy_event(void* event) noexcept override { cudaEventDestroy(as_event(event)); }
  void record_event(void* event, void* stream) override {
    check_cuda(cudaEventRecord(as_event(event), as_stream(stream)), "cudaEventRecord");
  }
  void stream_wait(void* stream, void* event) override {
    check_cuda(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0), "cudaStreamWaitEvent");
  }
  void event_synchronize(void* event) override {
    check_cuda(cudaEventSynchronize(as_event(event)), "cudaEventSynchronize");
  }
  void copy_async(void* dst, Device dst_device, const void* src, Device /*src_device*/,
                  size_t bytes, void* stream) override {
    if (bytes == 0) return;
    const cudaMemcpyKind kind =
        dst_device == Device::kCpu ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, as_stream(stream)),
               "cudaMemcpyAsync between pinned host memory and the device");
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

PoolStats pool_stats() { return pool().stats(); }
void pool_reset_peak() { pool().reset_peak(); }

}  // namespace tessel::ops::cuda
