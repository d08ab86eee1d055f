// The device kernel tables (one per device, installed by its backend) and the lookup the typed
// public ops make through them.
#include "tessel/ops/device_kernels.h"

#include "tessel/core/error.h"
#include "tessel/tensor/device.h"

namespace tessel::ops {
namespace {

constexpr int kDevices = 2;  // Device::kCpu, Device::kCuda

const DeviceKernels* g_tables[kDevices] = {};

}  // namespace

void install_device_kernels(Device device, const DeviceKernels* kernels) {
  TESSEL_CHECK(device != Device::kCpu, "ops: the CPU has no device kernel table");
  g_tables[static_cast<int>(device)] = kernels;
}

const DeviceKernels* device_kernels(Device device) { return g_tables[static_cast<int>(device)]; }

bool on_device() { return current_device() != Device::kCpu; }

void throw_no_device_kernel(const char* op) {
  throw Error(str("ops: ", op, " has no ", name_of(current_device()),
                  " kernel yet, got a call on that device; run this model with runtime.device = "
                  "cpu (docs/gpu.md lists what runs on a GPU)"));
}

const DeviceKernels& current_device_kernels(const char* op) {
  const DeviceKernels* kernels = device_kernels(current_device());
  if (kernels == nullptr) throw_no_device_kernel(op);
  return *kernels;
}

}  // namespace tessel::ops
