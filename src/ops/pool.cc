// Max pooling without padding. argmax holds, per output, the index of the winning input inside
// its own (n, c) plane (h * W + w, as PyTorch's max_pool2d_with_indices), which fits int32 for
// any plane and makes the backward a scatter-add.
#include <algorithm>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

// Whether v replaces the running maximum m: strictly greater keeps the first maximum in scan
// order; a NaN wins (once), so it propagates to the output as in PyTorch. Written as
// "v > m or v is NaN, unless m is NaN" in the one form gcc vectorises in the 2x2 loop below.
inline bool takes_over(float v, float m) { return !(v <= m) && m == m; }

// The common 2x2, stride 2 window. Rows are short (often 7..14 outputs), so a plain loop would
// spend its time in gcc's scalar remainder, whose NaN-aware compares become unpredictable
// branches on real data. Instead every row is done in chunks of a fixed kChunk outputs, a loop
// gcc vectorises completely. Lanes past a row's end read the next inputs and store garbage
// into the next outputs, which the following rows (processed in order) overwrite; only near
// the end of the tensor, where that would leave the buffers, does a chunk go through local
// copies instead.
constexpr int64_t kChunk = 16;

// Outputs [0, kChunk) from input rows r0 and r1 = r0 + W, r0 at plane index base.
inline void chunk_2x2(float* m, int32_t* at, const float* r0, const float* r1, int32_t base,
                      int32_t w) {
  for (int64_t j = 0; j < kChunk; ++j) {
    const int32_t c = base + static_cast<int32_t>(2 * j);
    float best = r0[2 * j];
    int32_t i = c;
    const float v1 = r0[2 * j + 1], v2 = r1[2 * j], v3 = r1[2 * j + 1];
    const bool t1 = takes_over(v1, best);
    best = t1 ? v1 : best;
    i = t1 ? c + 1 : i;
    const bool t2 = takes_over(v2, best);
    best = t2 ? v2 : best;
    i = t2 ? c + w : i;
    const bool t3 = takes_over(v3, best);
    best = t3 ? v3 : best;
    i = t3 ? c + w + 1 : i;
    m[j] = best;
    at[j] = i;
  }
}

// (Unused in AVX-512 builds, which take pool_2x2_avx512.)
[[maybe_unused]] void pool_2x2(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H,
                               int64_t W, int64_t OH, int64_t OW) {
  const float* x_end = x + planes * H * W;
  const float* y_end = y + planes * OH * OW;
  const int32_t w = static_cast<int32_t>(W);
  for (int64_t p = 0; p < planes; ++p) {
    const float* xp = x + p * H * W;
    for (int64_t oh = 0; oh < OH; ++oh) {
      for (int64_t ow0 = 0; ow0 < OW; ow0 += kChunk) {
        const float* r0 = xp + 2 * oh * W + 2 * ow0;
        const int64_t o = (p * OH + oh) * OW + ow0;
        const int32_t base = static_cast<int32_t>(2 * oh * W + 2 * ow0);
        if (r0 + W + 2 * kChunk <= x_end && y + o + kChunk <= y_end) {
          chunk_2x2(y + o, argmax + o, r0, r0 + W, base, w);
          continue;
        }
        const int64_t n = std::min(kChunk, OW - ow0);
        float top[2 * kChunk] = {}, bottom[2 * kChunk] = {}, m[kChunk];
        int32_t at[kChunk];
        std::copy(r0, r0 + 2 * n, top);
        std::copy(r0 + W, r0 + W + 2 * n, bottom);
        chunk_2x2(m, at, top, bottom, base, w);
        std::copy(m, m + n, y + o);
        std::copy(at, at + n, argmax + o);
      }
    }
  }
}

#ifdef __AVX512F__
// The 2x2 window with AVX-512, 16 outputs at a time: the 32 inputs under them in each of the
// two input rows are loaded (masked at the row's end) and split into even and odd columns, so
// that the four candidates of the 16 windows sit in four vectors, taken in scan order with
// takes_over's rule as mask compares: "not <=" unordered (a NaN candidate wins), unless the
// running maximum is already NaN. The vectorised loop above remains for other builds.
void pool_2x2_avx512(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H,
                     int64_t W, int64_t OH, int64_t OW) {
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
#endif

}  // namespace

void maxpool2d_forward(float* y, int32_t* argmax, const float* x, int64_t N, int64_t C, int64_t H,
                       int64_t W, int64_t k, int64_t stride) {
  TESSEL_CHECK(k >= 1 && stride >= 1 && H >= k && W >= k,
               "maxpool2d_forward: need 1 <= k <= H, W and stride >= 1, got k=", k,
               " stride=", stride, " H=", H, " W=", W);
  TESSEL_CHECK(H * W <= INT32_MAX, "maxpool2d_forward: plane H*W must fit int32, got ", H * W);
  const int64_t OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
  if (k == 2 && stride == 2) {
#ifdef __AVX512F__
    pool_2x2_avx512(y, argmax, x, N * C, H, W, OH, OW);
#else
    pool_2x2(y, argmax, x, N * C, H, W, OH, OW);
#endif
    return;
  }
  for (int64_t p = 0; p < N * C; ++p) {
    const float* xp = x + p * H * W;
    float* yp = y + p * OH * OW;
    int32_t* ap = argmax + p * OH * OW;

    for (int64_t oh = 0; oh < OH; ++oh) {
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t best = oh * stride * W + ow * stride;
        float bv = xp[best];
        for (int64_t i = 0; i < k; ++i) {
          const int64_t row = (oh * stride + i) * W + ow * stride;
          for (int64_t j = 0; j < k; ++j) {
            const float v = xp[row + j];
            if (takes_over(v, bv)) {
              bv = v;
              best = row + j;
            }
          }
        }
        yp[oh * OW + ow] = bv;
        ap[oh * OW + ow] = static_cast<int32_t>(best);
      }
    }
  }
}

void maxpool2d_backward(float* dx, const float* dy, const int32_t* argmax, int64_t N, int64_t C,
                        int64_t H, int64_t W, int64_t k, int64_t stride) {
  if (dx == nullptr) return;
  const int64_t OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
  for (int64_t p = 0; p < N * C; ++p) {
    // Plane by plane, so that the scatter finds the zeroed plane still in L1: a fill of the
    // whole tensor first would stream it through memory twice.
    float* dxp = dx + p * H * W;
    const float* dyp = dy + p * OH * OW;
    const int32_t* ap = argmax + p * OH * OW;
    std::fill(dxp, dxp + H * W, 0.0f);
    // += because overlapping windows (stride < k) can pick the same input twice.
    for (int64_t o = 0; o < OH * OW; ++o) dxp[ap[o]] += dyp[o];
  }
}

}  // namespace tessel::ops
