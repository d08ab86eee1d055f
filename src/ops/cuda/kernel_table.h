// Private to ops_cuda: the CUDA kernel table (tessel/ops/device_kernels.h), which install()
// installs for Device::kCuda beside the device runtime.
#pragma once

#include "tessel/ops/device_kernels.h"

namespace tessel::ops::cuda {

const DeviceKernels& kernel_table();

}  // namespace tessel::ops::cuda
