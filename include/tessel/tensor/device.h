// How tensors reach a device's memory without the tensor library linking the device's runtime.
// A backend (tessel_ops_cuda: ops::cuda::install(), called by the tessel binary at start)
// installs a DeviceRuntime for its device; Storage on that device allocates and frees through
// it (its one allocation site, a caching pool), and Tensor's fills, copies and conversions of
// device tensors go through it. Without one installed, asking for a device tensor is an Error
// saying this build has no such device.
//
// The pointer contract: device memory is read only by device code. Tensor::data<T>() of a
// device tensor throws; device code takes device_data<T>() (or raw()), host code copies to the
// host first (Tensor::to_device(Device::kCpu), copy_from across devices).
//
// A rank owns one device and a current stream, like it owns a current memory ledger
// (core/memory.h): DeviceScope sets them for this thread; the runtime queues work on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tessel/core/memory.h"
#include "tessel/tensor/dtype.h"

namespace tessel {

class Tensor;

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  // "" when the device can be used, else why not (e.g. "no CUDA device: ...").
  virtual std::string unavailable_reason() const = 0;
  // The bytes allocate(bytes) takes from the device (its size class): what the memory ledger
  // is charged, so the ledger's device figures are the allocator's own.
  virtual size_t allocation_size(size_t bytes) const = 0;
  // allocation_size(bytes) bytes of device memory, 256-byte aligned, not initialised; throws
  // (naming the size) when the device has no room.
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* p, size_t bytes) noexcept = 0;  // bytes as given to allocate
  // bytes of device memory at p set to zero, queued on `stream`.
  virtual void zero(void* p, size_t bytes, void* stream) = 0;
  // bytes from src to dst, each on its device (at least one of them this runtime's). A copy
  // from or to the host returns once the host side may be reused or read; device to device is
  // queued on `stream`.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                    void* stream) = 0;
  // n values from src_type to dst_type in device memory (round to nearest even), on `stream`;
  // throws InvalidArgument for a pair of types the device has no conversion for.
  virtual void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
                       void* stream) = 0;

  // ---- Overlap: pinned host memory, streams and events (activation offload) ----
  // What lets a copy run beside the kernels of the rank's stream. Streams and events are
  // opaque handles. Every slot below is optional; its default is that of a runtime without
  // streams of its own -- heap memory, the default stream (null), events always reached,
  // copy_async = copy -- under which every ordering below holds trivially.
  //
  // bytes of page-locked host memory (cudaHostAlloc): what copy_async copies from and to; not
  // initialised, charged to no ledger (the caller charges it); throws when there is no room.
  virtual void* allocate_pinned(size_t bytes);
  virtual void free_pinned(void* p, size_t bytes) noexcept;  // bytes as given
  // A stream ordered with others (the default stream included) only through events. Destroy it
  // once an event after its last work has been reached.
  virtual void* create_stream();
  virtual void destroy_stream(void* stream) noexcept;
  virtual void* create_event();
  virtual void destroy_event(void* event) noexcept;
  // Marks `event` at the end of the work queued on `stream` so far (recording again moves it);
  // an event never recorded counts as reached.
  virtual void record_event(void* event, void* stream);
  // Work queued on `stream` after this call starts once `event`'s mark is reached; the host
  // does not wait.
  virtual void stream_wait(void* stream, void* event);
  // The host waits until `event`'s mark is reached.
  virtual void event_synchronize(void* event);
  // Like copy, between pinned host memory and this device's memory, but queued on `stream`
  // and returning at once: the host side may be read or reused, and the device side freed,
  // only once an event recorded on `stream` after it is reached.
  virtual void copy_async(void* dst, Device dst_device, const void* src, Device src_device,
                          size_t bytes, void* stream);
};

// Makes `runtime` the one of `device` (process wide, before any thread uses it; it must live
// until exit, and every storage of the device is freed through it: replace it, or uninstall it
// with nullptr as tests do, only while no tensor of the device is alive). Device::kCpu has
// none.
void install_device_runtime(Device device, DeviceRuntime* runtime);
// The runtime of `device`; throws Error naming the device and that this build has none.
DeviceRuntime& device_runtime(Device device);

// While alive, this thread's device work goes to `device` on `stream` (null: the device's
// default stream); scopes nest and restore the previous ones.
class DeviceScope {
 public:
  DeviceScope(Device device, void* stream);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device saved_device_;
  void* saved_stream_;
};

Device current_device();  // Device::kCpu outside any DeviceScope
void* current_stream();   // null outside any DeviceScope

// n zeroed values of `type` on `device` (at least one: a rank's share may be empty), charged to
// `category` of this thread's ledger: a rank's flat parameter, gradient or buffer memory.
Tensor flat_zeros(int64_t n, MemCategory category, DType type = DType::kF32,
                  Device device = current_device());

}  // namespace tessel
