// The 2x2, stride 2 max pool of maxpool2d_forward (pool.cc) at the AVX2 level.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels.h"
#include "simd_avx2.h"

namespace tessel::ops::avx2 {
namespace {

// The even and odd floats of the 16 at p (lo = p[0..8), hi = p[8..16)), each in order.
inline void deinterleave(__m256 lo, __m256 hi, __m256* even, __m256* odd) {
  // Per 128-bit half: (lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6); the 64-bit permute puts them in order.
  const __m256 e = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
  const __m256 o = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
  *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}

}  // namespace

// The 2x2 window with AVX2, 8 outputs at a time: the 16 inputs under them in each of the two
// input rows are loaded and split into even and odd columns, so that the four candidates of the
// 8 windows sit in four vectors, taken in scan order with pool.cc's takes_over rule as compares:
// "not <=" unordered (a NaN candidate wins), unless the running maximum is already NaN. As in
// pool.cc, a chunk past a row's end reads the next inputs and stores garbage into the next
// outputs, which the following rows (processed in order) overwrite; only near the end of x or
// y do loads and stores take masks.
void maxpool_2x2(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W,
                 int64_t OH, int64_t OW) {
  const __m256i even_at = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i offs[3] = {_mm256_set1_epi32(1), _mm256_set1_epi32(static_cast<int32_t>(W)),
                           _mm256_set1_epi32(static_cast<int32_t>(W + 1))};
  const float* x_end = x + planes * H * W;
  const float* y_end = y + planes * OH * OW;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t oh = 0; oh < OH; ++oh) {
      const float* r0 = x + (p * H + 2 * oh) * W;
      const float* r1 = r0 + W;
      for (int64_t ow0 = 0; ow0 < OW; ow0 += 8) {
        const int64_t n = std::min<int64_t>(8, OW - ow0);
        const float* a = r0 + 2 * ow0;
        const float* b = r1 + 2 * ow0;
        __m256 a0, a1, b0, b1;
        if (b + 16 <= x_end) {
          a0 = _mm256_loadu_ps(a);
          a1 = _mm256_loadu_ps(a + 8);
          b0 = _mm256_loadu_ps(b);
          b1 = _mm256_loadu_ps(b + 8);
        } else {
          const __m256i lo = head_mask(2 * n), hi = head_mask(2 * n - 8);
          a0 = _mm256_maskload_ps(a, lo);
          a1 = _mm256_maskload_ps(a + 8, hi);
          b0 = _mm256_maskload_ps(b, lo);
          b1 = _mm256_maskload_ps(b + 8, hi);
        }
        __m256 best, cand[3];
        deinterleave(a0, a1, &best, &cand[0]);
        deinterleave(b0, b1, &cand[1], &cand[2]);
        const __m256i base = _mm256_add_epi32(
            _mm256_set1_epi32(static_cast<int32_t>(2 * oh * W + 2 * ow0)), even_at);
        __m256i at = base;
        for (int c = 0; c < 3; ++c) {
          const __m256 take = _mm256_and_ps(_mm256_cmp_ps(cand[c], best, _CMP_NLE_UQ),
                                            _mm256_cmp_ps(best, best, _CMP_ORD_Q));
          best = _mm256_blendv_ps(best, cand[c], take);
          at = _mm256_blendv_epi8(at, _mm256_add_epi32(base, offs[c]), _mm256_castps_si256(take));
        }
        float* yo = y + (p * OH + oh) * OW + ow0;
        int32_t* ao = argmax + (yo - y);
        if (yo + 8 <= y_end) {
          _mm256_storeu_ps(yo, best);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(ao), at);
        } else {
          const __m256i out = head_mask(n);
          _mm256_maskstore_ps(yo, out, best);
          _mm256_maskstore_epi32(ao, out, at);
        }
      }
    }
  }
}

}  // namespace tessel::ops::avx2
