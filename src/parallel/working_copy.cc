#include "working_copy.h"

#include <algorithm>

#include "tessel/ops/cpu.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

WorkingCopy::WorkingCopy(nn::Model& model, const Units& units, DType type)
    : units_(units), type_(type) {
  TESSEL_CHECK(type == DType::kBF16 || type == DType::kF16, "working copy: a 16-bit type, got ",
               dtype_name(type));
  {
    MemoryScope scope(MemCategory::kParameters);
    values_ = Tensor::zeros({std::max<int64_t>(units.span.size(), 1)}, type, current_device());
  }
  model.bind_values(units.span, values_);
}

void* WorkingCopy::at(nn::Range r) const {
  return static_cast<char*>(values_.raw()) +
         (r.lo - units_.span.lo) * static_cast<int64_t>(dtype_size(type_));
}

void WorkingCopy::refresh(nn::Range r, const float* src) {
  const nn::Range in{std::max(r.lo, units_.span.lo), std::min(r.hi, units_.span.hi)};
  if (in.lo >= in.hi) return;
  if (values_.device() == Device::kCpu)
    ops::convert(at(in), type_, src + (in.lo - r.lo), DType::kF32, in.size());
  else  // src is the device's master values
    device_runtime(values_.device())
        .convert(at(in), type_, src + (in.lo - r.lo), DType::kF32, in.size(), current_stream());
}

}  // namespace tessel::parallel
