// The direct convolution at the AVX-512 level: conv_direct_driver.h (staging) and conv_tiles.h
// (tiles) with 16-float zmm vectors. A tile holds its positions x lane block in the 32 zmm:
// V = 2 (32 channels): 14 positions in one row (7 in each of two rows), with 2 weight vectors
// and the broadcast beside them; V = 1: 14 positions in one row, in two rows 12 each, since the
// pair loop's second weight vector would otherwise spill. A weight-gradient tile: TH * KW taps
// of V accumulators each, plus V for dy and one for the broadcast (gcc does not fold it into the
// FMA).
#include "conv_direct_driver.h"
#include "kernels.h"
#include "simd_avx512.h"

namespace tessel::ops::avx512 {
namespace {

struct ConvPolicy {
  using Vec = __m512;
  static constexpr int kLanes = 16;
  static constexpr int max_width(int v, int rh) {
    if (rh == 1) return 14;
    return v == 2 ? 7 : 12;
  }
  static constexpr int max_tap_rows(int v, int kw) { return (v == 2 ? 14 : 28) / kw; }

  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  // Lanes [0, n) (n clamped to [0, 16]); the others read as zero / left alone.
  static Vec load_head(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(head_mask(n), p); }
  static void store_head(float* p, int64_t n, Vec v) { _mm512_mask_storeu_ps(p, head_mask(n), v); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec relu(Vec v) { return _mm512_max_ps(v, _mm512_setzero_ps()); }  // NaN, -0 -> +0
  // v where mask > 0, else +0.
  static Vec keep_positive(Vec v, Vec mask) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mask, _mm512_setzero_ps(), _CMP_GT_OQ), v);
  }
  // v where the lane of `at`, read as an int32, equals pos, else +0.
  static Vec keep_equal(Vec v, Vec at, int32_t pos) {
    return _mm512_maskz_mov_ps(
        _mm512_cmpeq_epi32_mask(_mm512_castps_si512(at), _mm512_set1_epi32(pos)), v);
  }
  static void transpose(Vec r[kLanes]) { transpose16(r); }
};

}  // namespace

int64_t conv_direct_scratch(const Conv2dShape& s, const detail::ConvFusion& f) {
  return detail::direct_scratch<ConvPolicy>(s, f);
}

void conv_direct_forward(float* y, int32_t* argmax, const float* x, const float* w, const float* b,
                         const detail::ConvFusion& f, const Conv2dShape& s, float* scratch) {
  detail::direct_forward<ConvPolicy>(y, argmax, x, w, b, f, s, scratch);
}

void conv_direct_backward(float* dx, float* dw, float* db, const float* dy, const float* y,
                          const int32_t* argmax, const detail::ConvFusion& f, const float* x,
                          const float* w, const Conv2dShape& s, float* scratch) {
  detail::direct_backward<ConvPolicy>(dx, dw, db, dy, y, argmax, f, x, w, s, scratch);
}

}  // namespace tessel::ops::avx512
