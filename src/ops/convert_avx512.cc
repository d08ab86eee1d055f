// ops::convert at the AVX-512 level: 16 values at a time, f16 through F16C, bf16 rounded to
// nearest even in integer lanes (the portable rounding of convert.cc, bit for bit).
#include <cstdint>

#include "kernels.h"
#include "simd_avx512.h"

namespace tessel::ops::avx512 {
namespace {

using Half = uint16_t;

inline __m512 load_f32(const void* p, DType t, int64_t i, __mmask16 m) {
  if (t == DType::kF32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const Half*>(p) + i);
  if (t == DType::kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Round to nearest even in integer lanes; NaN keeps a quiet NaN.
inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

inline void store_f32(void* p, DType t, int64_t i, __mmask16 m, __m512 v) {
  if (t == DType::kF32) return _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
  Half* h = static_cast<Half*>(p) + i;
  if (t == DType::kF16)
    return _mm256_mask_storeu_epi16(h, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  _mm256_mask_storeu_epi16(h, m, to_bf16(v));
}

}  // namespace

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store_f32(dst, dst_type, i, 0xFFFF, load_f32(src, src_type, i, 0xFFFF));
  if (i < n) {
    const __mmask16 m = head_mask(n - i);
    store_f32(dst, dst_type, i, m, load_f32(src, src_type, i, m));
  }
}

}  // namespace tessel::ops::avx512
