// Conversions between f32 and the 16-bit float types, 16 values at a time where the build
// targets AVX-512 (F16C for f16, AVX512_BF16's vcvtneps2bf16 or the same rounding in integer
// lanes for bf16), else element by element through tessel/tensor/dtype.h.
#include <cstring>

#include "simd_avx512.h"
#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

using Half = uint16_t;

#ifdef __AVX512F__
inline __m512 load_f32(const void* p, DType t, int64_t i, __mmask16 m) {
  if (t == DType::kF32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const Half*>(p) + i);
  if (t == DType::kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m256i to_bf16(__m512 v) {
#ifdef __AVX512BF16__
  return (__m256i)_mm512_cvtneps_pbh(v);
#else
  // Round to nearest even in integer lanes; NaN keeps a quiet NaN.
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
#endif
}

inline void store_f32(void* p, DType t, int64_t i, __mmask16 m, __m512 v) {
  if (t == DType::kF32) return _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
  Half* h = static_cast<Half*>(p) + i;
  if (t == DType::kF16)
    return _mm256_mask_storeu_epi16(h, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  _mm256_mask_storeu_epi16(h, m, to_bf16(v));
}
#else
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
#endif

bool is_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

}  // namespace

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  TESSEL_CHECK(is_float(dst_type) && is_float(src_type), "convert: f32, bf16 or f16 only, got ",
               dtype_name(src_type), " -> ", dtype_name(dst_type));
  if (dst_type == src_type) {
    std::memmove(dst, src, static_cast<size_t>(n) * dtype_size(dst_type));
    return;
  }
#ifdef __AVX512F__
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store_f32(dst, dst_type, i, 0xFFFF, load_f32(src, src_type, i, 0xFFFF));
  if (i < n) {
    const __mmask16 m = detail::head_mask(n - i);
    store_f32(dst, dst_type, i, m, load_f32(src, src_type, i, m));
  }
#else
  for (int64_t i = 0; i < n; ++i) store_one(dst, dst_type, i, load_one(src, src_type, i));
#endif
}

}  // namespace tessel::ops
