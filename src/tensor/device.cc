#include "tessel/tensor/device.h"

#include <algorithm>
#include <cstdlib>

#include "tessel/core/error.h"
#include "tessel/tensor/tensor.h"

namespace tessel {
namespace {

constexpr int kDevices = 2;
DeviceRuntime* g_runtimes[kDevices] = {};

thread_local Device t_device = Device::kCpu;
thread_local void* t_stream = nullptr;

}  // namespace

// The overlap slots' defaults: a runtime without streams of its own, where every copy is
// done when copy_async returns.
void* DeviceRuntime::allocate_pinned(size_t bytes) {
  constexpr size_t kAlign = 64;
  void* p = std::aligned_alloc(kAlign, (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign);
  if (p == nullptr)
    throw Error(str("device: allocating ", bytes,
                    " bytes of host memory for copies failed: this machine is out of memory; "
                    "make the batch smaller or set train.offload = none"));
  return p;
}
void DeviceRuntime::free_pinned(void* p, size_t) noexcept { std::free(p); }
void* DeviceRuntime::create_stream() { return nullptr; }
void DeviceRuntime::destroy_stream(void*) noexcept {}
void* DeviceRuntime::create_event() { return nullptr; }
void DeviceRuntime::destroy_event(void*) noexcept {}
void DeviceRuntime::record_event(void*, void*) {}
void DeviceRuntime::stream_wait(void*, void*) {}
void DeviceRuntime::event_synchronize(void*) {}
void DeviceRuntime::copy_async(void* dst, Device dst_device, const void* src, Device src_device,
                               size_t bytes, void* stream) {
  copy(dst, dst_device, src, src_device, bytes, stream);
}

void install_device_runtime(Device device, DeviceRuntime* runtime) {
  TESSEL_CHECK(device != Device::kCpu, "device: the cpu has no device runtime");
  g_runtimes[static_cast<int>(device)] = runtime;
}

DeviceRuntime& device_runtime(Device device) {
  DeviceRuntime* runtime = g_runtimes[static_cast<int>(device)];
  if (runtime == nullptr)
    throw Error(str("runtime.device = ", name_of(device), ": this tessel was built without ",
                    name_of(device),
                    " (TESSEL_WITH_CUDA=OFF, or nvcc was not found when it was "
                    "configured); build it where the CUDA toolkit is (docs/gpu.md) or set "
                    "runtime.device = cpu"));
  return *runtime;
}

DeviceScope::DeviceScope(Device device, void* stream)
    : saved_device_(t_device), saved_stream_(t_stream) {
  t_device = device;
  t_stream = stream;
}

DeviceScope::~DeviceScope() {
  t_device = saved_device_;
  t_stream = saved_stream_;
}

Device current_device() { return t_device; }
void* current_stream() { return t_stream; }

Tensor flat_zeros(int64_t n, MemCategory category, DType type, Device device) {
  MemoryScope scope(category);
  return Tensor::zeros({std::max<int64_t>(n, 1)}, type, device);
}

}  // namespace tessel
