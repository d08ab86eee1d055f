// Element types and devices. f32 is the compute type; bf16/f16 are storage types converted
// through f32; i32/i64 hold labels and token ids; u8 raw image bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tessel/core/names.h"

namespace tessel {

enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8 };

// Where a tensor's storage lives (runtime.device): host memory, or the rank's CUDA device
// (tessel/tensor/device.h says how device memory is reached).
enum class Device : uint8_t { kCpu, kCuda };

size_t dtype_size(DType t);
const char* dtype_name(DType t);                 // "f32", "bf16", ...
DType dtype_from_name(const std::string& name);  // throws InvalidArgument naming the valid ones

// Round-to-nearest-even conversions; NaN stays NaN.
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t x);
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t x);

TESSEL_NAMES(Device, "cpu", "cuda");

}  // namespace tessel
