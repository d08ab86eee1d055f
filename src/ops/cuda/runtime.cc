// Device tensors on CUDA: the DeviceRuntime over the caching pools (device_pools.h).
#include "tessel/ops/cuda/runtime.h"

#include <cuda_runtime_api.h>

#include "device_pools.h"
#include "kernel_table.h"
#include "tessel/ops/cuda/check.h"
#include "tessel/ops/cuda/device.h"
#include "tessel/ops/cuda/kernels.h"
#include "tessel/tensor/device.h"

namespace tessel::ops::cuda {
namespace {

// The CUDA runtime's calls under the caching pools (device_pools.h).
const RawDevice kCudaMemory = {
    .count =
        [] {
          int count = 0;
          if (cudaGetDeviceCount(&count) == cudaSuccess) return count;
          cudaGetLastError();  // no device: the first cudaMalloc says why
          return 0;
        },
    .current =
        [] {
          int device = 0;
          if (cudaGetDevice(&device) == cudaSuccess) return device;
          cudaGetLastError();
          return 0;
        },
    .allocate =
        [](size_t bytes, int64_t in_use, bool last_try) {
          void* p = nullptr;
          const cudaError_t e = cudaMalloc(&p, bytes);
          if (e == cudaErrorMemoryAllocation && !last_try) {
            cudaGetLastError();
            return static_cast<void*>(nullptr);
          }
          int device = 0;
          if (e != cudaSuccess && cudaGetDevice(&device) != cudaSuccess) cudaGetLastError();
          check_cuda(e, str("cudaMalloc of ", bytes, " bytes on GPU ", device,
                            " (device memory of tensors; ", in_use,
                            " bytes in use): make the model or the batch smaller")
                            .c_str());
          return p;
        },
    .release = [](void* p) { check_cuda(cudaFree(p), "cudaFree of a cached block"); },
    .synchronize =
        [] {
          check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize before freeing cached blocks");
        },
    .set_current = [](int device) { check_cuda(cudaSetDevice(device), "cudaSetDevice"); },
};

DevicePools& pools() {
  static DevicePools p(kCudaMemory);  // destroyed at exit, giving the cached blocks back
  return p;
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

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

void install() {
  static CudaRuntime runtime;
  install_device_runtime(Device::kCuda, &runtime);
  install_device_kernels(Device::kCuda, &kernel_table());
}

PoolStats pool_stats() { return pools().current().stats(); }
void pool_reset_peak() { pools().current().reset_peak(); }

}  // namespace tessel::ops::cuda
