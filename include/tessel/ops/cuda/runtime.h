// The CUDA device runtime of tensors (tessel/tensor/device.h): a caching pool over cudaMalloc,
// the one allocation site of device tensors, and their copies, fills and conversions. The
// tessel binary calls install() at start, so that `runtime.device = cuda` finds it; a build
// without CUDA has none, and asking for the device then says so.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessel::ops::cuda {

// Installs the runtime and the kernel table (ops/device_kernels.h) for Device::kCuda (idempotent).
// Probes no device: a host without one learns it from
// device_runtime(Device::kCuda).unavailable_reason() or at the first allocation.
void install();

// A pool's own count of device memory (bytes in its size classes). There is one pool per GPU;
// these are the calling thread's current GPU's (a rank's own, with ranks on several GPUs).
struct PoolStats {
  int64_t in_use = 0;       // handed out and not yet freed
  int64_t peak_in_use = 0;  // the most in_use since start or reset_peak
  int64_t reserved = 0;     // cudaMalloc'd: in use plus cached for reuse
};
PoolStats pool_stats();
void pool_reset_peak();

// The size class of a request: multiples of 512 bytes up to 1 MiB, of 2 MiB above.
size_t pool_size_class(size_t bytes);

}  // namespace tessel::ops::cuda
