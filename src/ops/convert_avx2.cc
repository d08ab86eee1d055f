// ops::convert at the AVX2 level: 8 values at a time, f16 through F16C, bf16 rounded to nearest
// even in integer lanes (the portable rounding of convert.cc, bit for bit); the last n % 8
// values go through the portable loop.
#include <immintrin.h>

#include <cstdint>

#include "kernels.h"
#include "simd_avx2.h"

namespace tessel::ops::avx2 {
namespace {

using Half = uint16_t;

inline __m256 load8(const void* p, DType t, int64_t i) {
  if (t == DType::kF32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  const __m128i h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const Half*>(p) + i));
  if (t == DType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline void store8(void* p, DType t, int64_t i, __m256 v) {
  if (t == DType::kF32) return _mm256_storeu_ps(static_cast<float*>(p) + i, v);
  auto* h = reinterpret_cast<__m128i*>(static_cast<Half*>(p) + i);
  if (t == DType::kF16) return _mm_storeu_si128(h, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  _mm_storeu_si128(h, to_bf16(v));
}

}  // namespace

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(dst, dst_type, i, load8(src, src_type, i));
  if (i == n) return;
  const size_t dst_bytes = dtype_size(dst_type), src_bytes = dtype_size(src_type);
  portable::convert(static_cast<char*>(dst) + i * dst_bytes, dst_type,
                    static_cast<const char*>(src) + i * src_bytes, src_type, n - i);
}

}  // namespace tessel::ops::avx2
