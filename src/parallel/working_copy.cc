#include "working_copy.h"

#include <algorithm>

#include "tessel/ops/cpu.h"

namespace tessel::parallel {

WorkingCopy::WorkingCopy(nn::Model& model, const Units& units, DType type)
    : units_(units), type_(type) {
  TESSEL_CHECK(type == DType::kBF16 || type == DType::kF16,
               "working copy: a 16-bit type, got ", dtype_name(type));
  {
    MemoryScope scope(MemCategory::kParameters);
    values_ = Tensor::zeros({std::max<int64_t>(units.span.size(), 1)}, type);
  }
  model.bind_values(units.span, values_);
}

void* WorkingCopy::at(nn::Range r) const {
  return static_cast<char*>(values_.raw()) +
         (r.lo - units_.span.lo) * static_cast<int64_t>(dtype_size(type_));
}

void WorkingCopy::refresh(nn::Range r, const float* src) {
  ops::convert(at(r), type_, src, DType::kF32, r.size());
}

}  // namespace tessel::parallel
