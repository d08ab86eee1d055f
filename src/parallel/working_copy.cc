#include "working_copy.h"

#include <algorithm>
#include <vector>

#include "tessel/ops/cpu.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

WorkingCopy::WorkingCopy(nn::Model& model, const Units& units, DType type)
    : units_(units), type_(type) {
  TESSEL_CHECK(type == DType::kBF16 || type == DType::kF16, "working copy: a 16-bit type, got ",
               dtype_name(type));
  values_ = flat_zeros(units.span.size(), MemCategory::kParameters, type);
  model.bind_values(units.span, values_);
}

void* WorkingCopy::at(nn::Range r) const {
  return static_cast<char*>(values_.raw()) +
         (r.lo - units_.span.lo) * static_cast<int64_t>(dtype_size(type_));
}

void WorkingCopy::refresh(nn::Range r, const float* src, Device from) {
  const nn::Range in{std::max(r.lo, units_.span.lo), std::min(r.hi, units_.span.hi)};
  if (in.lo >= in.hi) return;
  src += in.lo - r.lo;
  const Device to = values_.device();
  if (to == Device::kCpu) {
    ops::convert(at(in), type_, src, DType::kF32, in.size());
  } else if (from == to) {
    device_runtime(to).convert(at(in), type_, src, DType::kF32, in.size(), current_stream());
  } else {  // masters on the host: rounded there, the 16-bit values go up
    std::vector<char> host(static_cast<size_t>(in.size()) * dtype_size(type_));
    ops::convert(host.data(), type_, src, DType::kF32, in.size());
    device_runtime(to).copy(at(in), to, host.data(), Device::kCpu, host.size(), current_stream());
  }
}

}  // namespace tessel::parallel
