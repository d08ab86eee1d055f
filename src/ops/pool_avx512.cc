// The 2x2, stride 2 max pool of maxpool2d_forward (pool.cc) at the AVX-512 level.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels.h"

namespace tessel::ops::avx512 {

// The 2x2 window with AVX-512, 16 outputs at a time: the 32 inputs under them in each of the
// two input rows are loaded (masked at the row's end) and split into even and odd columns, so
// that the four candidates of the 16 windows sit in four vectors, taken in scan order with
// pool.cc's takes_over rule as mask compares: "not <=" unordered (a NaN candidate wins), unless the
// running maximum is already NaN.
void maxpool_2x2(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W,
                 int64_t OH, int64_t OW) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i w = _mm512_set1_epi32(static_cast<int32_t>(W));
  const float* x_end = x + planes * H * W;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t oh = 0; oh < OH; ++oh) {
      const float* r0 = x + (p * H + 2 * oh) * W;
      const float* r1 = r0 + W;
      for (int64_t ow0 = 0; ow0 < OW; ow0 += 16) {
        const int64_t n = std::min<int64_t>(16, OW - ow0);
        const __mmask16 lo = n >= 8 ? 0xFFFF : static_cast<__mmask16>((1u << (2 * n)) - 1);
        const __mmask16 hi = n <= 8 ? 0 : static_cast<__mmask16>((1u << (2 * n - 16)) - 1);
        const __mmask16 out = static_cast<__mmask16>((1u << n) - 1);
        const float* a = r0 + 2 * ow0;
        const float* b = r1 + 2 * ow0;
        // Plain loads where 32 floats stay inside x (the lanes past the row are never stored):
        // masked loads that miss the cache are slow, and most of these do.
        __m512 a0, a1, b0, b1;
        if (b + 32 <= x_end) {
          a0 = _mm512_loadu_ps(a);
          a1 = _mm512_loadu_ps(a + 16);
          b0 = _mm512_loadu_ps(b);
          b1 = _mm512_loadu_ps(b + 16);
        } else {
          a0 = _mm512_maskz_loadu_ps(lo, a);
          a1 = _mm512_maskz_loadu_ps(hi, a + 16);
          b0 = _mm512_maskz_loadu_ps(lo, b);
          b1 = _mm512_maskz_loadu_ps(hi, b + 16);
        }
        const __m512 cand[3] = {_mm512_permutex2var_ps(a0, odd, a1),
                                _mm512_permutex2var_ps(b0, even, b1),
                                _mm512_permutex2var_ps(b0, odd, b1)};
        const __m512i base =
            _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(2 * oh * W + 2 * ow0)), even);
        const __m512i offs[3] = {_mm512_set1_epi32(1), w,
                                 _mm512_add_epi32(w, _mm512_set1_epi32(1))};
        __m512 best = _mm512_permutex2var_ps(a0, even, a1);
        __m512i at = base;
        for (int c = 0; c < 3; ++c) {
          const __mmask16 take = _mm512_cmp_ps_mask(cand[c], best, _CMP_NLE_UQ) &
                                 _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q);
          best = _mm512_mask_mov_ps(best, take, cand[c]);
          at = _mm512_mask_add_epi32(at, take, base, offs[c]);
        }
        const int64_t o = (p * OH + oh) * OW + ow0;
        _mm512_mask_storeu_ps(y + o, out, best);
        _mm512_mask_storeu_epi32(argmax + o, out, at);
      }
    }
  }
}

}  // namespace tessel::ops::avx512
