// ops::convert: the checks, and the portable conversions element by element through
// tessel/tensor/dtype.h (round to nearest even; NaN stays a quiet NaN). The AVX2 and AVX-512
// levels convert 8 or 16 values at a time with the same rounding (convert_avx2.cc,
// convert_avx512.cc), so every level gives the same bits.
#include <cstring>

#include "kernels.h"
#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

using Half = uint16_t;

bool is_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

float load_one(const void* p, DType t, int64_t i) {
  if (t == DType::kF32) return static_cast<const float*>(p)[i];
  const Half h = static_cast<const Half*>(p)[i];
  return t == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
}

void store_one(void* p, DType t, int64_t i, float v) {
  if (t == DType::kF32) {
    static_cast<float*>(p)[i] = v;
    return;
  }
  static_cast<Half*>(p)[i] = t == DType::kF16 ? f32_to_f16(v) : f32_to_bf16(v);
}

}  // namespace

void portable::convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_one(dst, dst_type, i, load_one(src, src_type, i));
}

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  TESSEL_CHECK(is_float(dst_type) && is_float(src_type), "convert: f32, bf16 or f16 only, got ",
               dtype_name(src_type), " -> ", dtype_name(dst_type));
  if (dst_type == src_type) {
    std::memmove(dst, src, static_cast<size_t>(n) * dtype_size(dst_type));
    return;
  }
  kernels().convert(dst, dst_type, src, src_type, n);
}

}  // namespace tessel::ops
