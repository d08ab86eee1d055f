#include "tessel/tensor/device.h"

#include "tessel/core/error.h"

namespace tessel {
namespace {

constexpr int kDevices = 2;
DeviceRuntime* g_runtimes[kDevices] = {};

thread_local Device t_device = Device::kCpu;
thread_local void* t_stream = nullptr;

}  // namespace

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

}  // namespace tessel
