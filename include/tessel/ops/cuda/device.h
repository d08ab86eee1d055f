// The device side of tessel_ops_cuda that is not a kernel: whether a usable CUDA device is
// present (and if not, why), and DeviceBuffer, the one owner of device memory the kernels'
// tests and benchmarks use. Plain cudaMalloc/cudaFree (never managed memory): the engine's
// caching pool will sit on top of the same call. Not thread-safe per object.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessel::ops::cuda {

// "" when device 0 can be used, else why not, e.g. "no CUDA device: CUDA driver version is
// insufficient for CUDA runtime version" (cudaGetErrorString of the failed probe).
std::string device_unavailable_reason();

// One cudaMalloc'd allocation of `bytes` bytes, freed on destruction. Moves, never copies.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);  // throws CudaError (out of memory names the size)
  ~DeviceBuffer() noexcept;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) {
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }
  // Synchronous copies of a whole prefix (bytes <= this->bytes()), for tests and setup.
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  // Every byte set to `byte` (0xFF poisons floats and bf16 with NaN).
  void fill(int byte);

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tessel::ops::cuda
