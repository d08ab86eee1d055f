// The direct convolution at the AVX2 level: conv_direct_driver.h (staging) and conv_tiles.h
// (tiles) with 8-float ymm vectors, sized for the 16 ymm registers. A tile: V = 2 (16 channels)
// 6 positions in one row (12 accumulators, 2 weight vectors, the broadcast), or 3 in each of
// two rows; V = 1: 14 positions in one row, in two rows 6 each (the pair loop holds two weight
// vectors). A weight-gradient tile: TH * KW taps of V accumulators each, plus V for dy and one
// for the broadcast. Every output's sum runs in the AVX-512 level's order, so both give the
// portable kernel's bits.
#include "conv_direct_driver.h"
#include "kernels.h"
#include "simd_avx2.h"

namespace tessel::ops::avx2 {
namespace {

struct ConvPolicy {
  using Vec = __m256;
  static constexpr int kLanes = 8;
  static constexpr int max_width(int v, int rh) {
    if (v == 2) return rh == 1 ? 6 : 3;
    return rh == 1 ? 14 : 6;
  }
  static constexpr int max_tap_rows(int v, int kw) { return (v == 2 ? 6 : 14) / kw; }

  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  // Lanes [0, n) (n clamped to [0, 8]); the others read as zero / left alone.
  static Vec load_head(const float* p, int64_t n) {
    return n >= kLanes ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, head_mask(n));
  }
  // Without vmaskmovps stores, which AMD cores run as microcode (tens of cycles each): a tile
  // row's tail goes out in 4-, 2- and 1-float pieces (n is a constant where the tiles call this).
  static void store_head(float* p, int64_t n, Vec v) {
    if (n >= kLanes) {
      _mm256_storeu_ps(p, v);
      return;
    }
    __m128 h = _mm256_castps256_ps128(v);
    if (n >= 4) {
      _mm_storeu_ps(p, h);
      h = _mm256_extractf128_ps(v, 1);
      p += 4;
      n -= 4;
    }
    if (n >= 2) {
      _mm_storel_pi(reinterpret_cast<__m64*>(p), h);
      h = _mm_movehl_ps(h, h);
      p += 2;
      n -= 2;
    }
    if (n >= 1) _mm_store_ss(p, h);
  }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec relu(Vec v) { return _mm256_max_ps(v, _mm256_setzero_ps()); }  // NaN, -0 -> +0
  // v where mask > 0, else +0.
  static Vec keep_positive(Vec v, Vec mask) {
    return _mm256_and_ps(_mm256_cmp_ps(mask, _mm256_setzero_ps(), _CMP_GT_OQ), v);
  }
  // v where the lane of `at`, read as an int32, equals pos, else +0.
  static Vec keep_equal(Vec v, Vec at, int32_t pos) {
    const __m256i eq = _mm256_cmpeq_epi32(_mm256_castps_si256(at), _mm256_set1_epi32(pos));
    return _mm256_and_ps(_mm256_castsi256_ps(eq), v);
  }
  static void transpose(Vec r[kLanes]) { transpose8(r); }
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

}  // namespace tessel::ops::avx2
