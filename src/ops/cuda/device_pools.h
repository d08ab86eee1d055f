// The caching pools of device memory under the CUDA DeviceRuntime (runtime.cc): one per GPU, over
// a table of the device's own calls (cudaMalloc and friends there; host memory standing in for
// GPUs in tests/ops/device_pools_test.cc), so their rules run without a GPU. A request is served
// by the calling thread's current GPU's pool; a block goes back to the pool it came from,
// whichever thread frees it, and is handed out again only on that GPU. Thread safe: ranks as
// threads allocate and free at once. Internal to tessel_ops_cuda; no CUDA header here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tessel/ops/cuda/runtime.h"

namespace tessel::ops::cuda {

// The device calls the pools make. Every slot is required.
struct RawDevice {
  int (*count)();    // the GPUs this process sees (cudaGetDeviceCount); 0 when it sees none
  int (*current)();  // this thread's GPU (cudaGetDevice); 0 when it cannot tell
  // bytes on the current GPU. Null when that GPU has no room and this is not the last try;
  // otherwise an error throws, naming bytes and the `in_use` bytes of tensors held there.
  void* (*allocate)(size_t bytes, int64_t in_use, bool last_try);
  void (*release)(void* p);  // frees a block of the current GPU (cudaFree); throws
  void (*synchronize)();     // waits for the current GPU's work (cudaDeviceSynchronize); throws
  void (*set_current)(int device);  // makes `device` this thread's GPU (cudaSetDevice); throws
};

// One GPU's pool. Freed blocks are kept by size class (pool_size_class) and handed out again to
// a request of the same class, so a training step's activations reuse the previous step's
// memory without cudaMalloc/cudaFree (which synchronise the device).
class Pool {
 public:
  Pool(const RawDevice& raw, int device) : raw_(raw), device_(device) {}
  ~Pool();  // frees the cached blocks on this pool's GPU (errors have nobody to report to)

  // On this pool's GPU, which must be the calling thread's current one. When the GPU has no
  // room, the cache is given back and the request tried once more.
  void* allocate(size_t bytes);
  // Takes p back if this pool handed it out (from any thread); false if it did not.
  bool free(void* p, size_t bytes) noexcept;
  PoolStats stats();
  void reset_peak();

 private:
  void release_cached();  // mu_ held, on this pool's GPU

  const RawDevice& raw_;
  const int device_;
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::unordered_set<void*> live_;  // handed out, not yet freed
  PoolStats stats_;
};

// The pools of the GPUs the process sees (CUDA_VISIBLE_DEVICES applied), made at first use.
class DevicePools {
 public:
  explicit DevicePools(const RawDevice& raw) : raw_(raw) {}

  Pool& current();  // the calling thread's current GPU's
  // To the pool p came from: the freeing thread's GPU's first (a rank frees its own blocks).
  void free(void* p, size_t bytes) noexcept;

 private:
  const RawDevice& raw_;
  std::once_flag made_;
  std::vector<std::unique_ptr<Pool>> pools_;  // by GPU; fixed once made
};

}  // namespace tessel::ops::cuda
