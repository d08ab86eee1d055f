// ops::int8_quantize and int8_dequantize_add at the AVX2 level, the bytes of the portable
// kernels (quantize.cc): 32 elements per step, their 8 Philox4x32-10 blocks computed side by
// side (one block per 32-bit lane; the 32x32->64 products of even and odd lanes by
// _mm256_mul_epu32), transposed to element order, then the same float operations in the same
// order as quantize_int8 (multiply, add, floor, clamp; no FMA). NaN takes the portable path's
// value too: max ignores it, the clamp keeps it, and the int8 is the low byte of the truncated
// int32 (0x80000000: 0), as the scalar conversion leaves it. A chunk's last elements go
// through a zero-padded 32-element buffer.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels.h"
#include "simd_avx2.h"
#include "tessel/core/rng.h"

namespace tessel::ops::avx2 {
namespace {

// The high and low 32 bits of a * b in every 32-bit lane.
inline void mul_hi_lo(__m256i a, __m256i b, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, b);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32));
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// The key of every Philox round (the seed's words plus i Weyl increments) and the stream's
// words, broadcast once per call.
struct PhiloxKeys {
  __m256i k0[10], k1[10], stream_lo, stream_hi;
  PhiloxKeys(uint64_t seed, uint64_t stream) {
    uint32_t a = static_cast<uint32_t>(seed), b = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round, a += kPhiloxWeyl0, b += kPhiloxWeyl1) {
      k0[round] = _mm256_set1_epi32(static_cast<int>(a));
      k1[round] = _mm256_set1_epi32(static_cast<int>(b));
    }
    stream_lo = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream)));
    stream_hi = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream >> 32)));
  }
};

// Philox4x32-10 blocks first .. first + 7 of (seed, stream): the 32 numbers in element order
// (r[0] holds blocks first and first + 1, ...), as 4 x 8 lanes.
void philox8(const PhiloxKeys& key, uint64_t first, __m256i r[4]) {
  const __m256i index = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<int64_t>(first)),
                                         _mm256_setr_epi64x(0, 1, 2, 3));
  const __m256i index_hi = _mm256_add_epi64(index, _mm256_set1_epi64x(4));
  // Lanes 0..7 = blocks first .. first + 7: the low and the high words of each index.
  const __m256i perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256i a = _mm256_permutevar8x32_epi32(index, perm);
  const __m256i b = _mm256_permutevar8x32_epi32(index_hi, perm);
  __m256i c0 = _mm256_permute2x128_si256(a, b, 0x20);
  __m256i c1 = _mm256_permute2x128_si256(a, b, 0x31);
  __m256i c2 = key.stream_lo, c3 = key.stream_hi;
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kPhiloxMul0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(kPhiloxMul1));
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    mul_hi_lo(m0, c0, hi0, lo0);
    mul_hi_lo(m1, c2, hi1, lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), key.k0[round]);
    c1 = lo1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), key.k1[round]);
    c3 = lo0;
  }
  // Transpose: lane k of block j goes to element 4 j + k.
  const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
  const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
  const __m256i b04 = _mm256_unpacklo_epi64(t0, t2), b15 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i b26 = _mm256_unpacklo_epi64(t1, t3), b37 = _mm256_unpackhi_epi64(t1, t3);
  r[0] = _mm256_permute2x128_si256(b04, b15, 0x20);
  r[1] = _mm256_permute2x128_si256(b26, b37, 0x20);
  r[2] = _mm256_permute2x128_si256(b04, b15, 0x31);
  r[3] = _mm256_permute2x128_si256(b26, b37, 0x31);
}

// quantize_int8 on 8 lanes, as int32 lanes holding the int8 in their low byte.
inline __m256i quantize8(__m256 x, __m256 inv, __m256i bits) {
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bits, 8)),
                                 _mm256_set1_ps(1.0f / 16777216.0f));
  __m256 v = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, inv), u));
  // max(lo, v) and min(hi, v) return v where v is NaN, as std::clamp does.
  v = _mm256_min_ps(_mm256_set1_ps(127.0f), _mm256_max_ps(_mm256_set1_ps(-127.0f), v));
  return _mm256_cvttps_epi32(v);
}

// 32 elements from x (the portable kernel's bytes) into q.
inline void quantize32(int8_t* q, const float* x, __m256 inv, const __m256i bits[4]) {
  const __m256i low = _mm256_set1_epi32(0xff);
  __m256i v[4];
  for (int k = 0; k < 4; ++k)
    v[k] = _mm256_and_si256(quantize8(_mm256_loadu_ps(x + 8 * k), inv, bits[k]), low);
  // Low bytes of 32 lanes (packs without saturation: every lane is in [0, 255]), then the
  // 128-bit halves back in order.
  const __m256i w =
      _mm256_packus_epi16(_mm256_packus_epi32(v[0], v[1]), _mm256_packus_epi32(v[2], v[3]));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(w, order));
}

// max |x[i]| over n elements, NaN ignored (the portable max(amax, |x|) keeps amax on NaN).
float absmax(const float* x, int64_t n) {
  const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs), m);
  if (i < n) {
    const __m256 tail = _mm256_maskload_ps(x + i, head_mask(n - i));  // zeros past the end
    m = _mm256_max_ps(_mm256_and_ps(tail, abs), m);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  return *std::max_element(lanes, lanes + 8);
}

}  // namespace

void int8_quantize(int8_t* q, float* scales, const float* x, int64_t n, int64_t chunk,
                   uint64_t seed, uint64_t stream) {
  const PhiloxKeys key(seed, stream);
  __m256i bits[4];
  for (int64_t c = 0, lo = 0; lo < n; ++c, lo += chunk) {
    const int64_t hi = std::min(n, lo + chunk);
    const float amax = absmax(x + lo, hi - lo);
    scales[c] = amax / 127.0f;
    const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    int64_t i = lo;
    for (; i + 32 <= hi; i += 32) {
      philox8(key, static_cast<uint64_t>(i / 4), bits);
      quantize32(q + i, x + i, inv, bits);
    }
    if (i == hi) continue;
    alignas(32) float xs[32] = {};
    alignas(32) int8_t qs[32];
    std::copy(x + i, x + hi, xs);
    philox8(key, static_cast<uint64_t>(i / 4), bits);
    quantize32(qs, xs, inv, bits);
    std::copy(qs, qs + (hi - i), q + i);
  }
}

void int8_dequantize_add(float* acc, const int8_t* q, const float* scales, int64_t n,
                         int64_t chunk) {
  for (int64_t c = 0, lo = 0; lo < n; ++c, lo += chunk) {
    const int64_t hi = std::min(n, lo + chunk);
    const __m256 s = _mm256_set1_ps(scales[c]);
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) {
      const __m256 v = _mm256_cvtepi32_ps(
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i))));
      _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(v, s)));
    }
    if (i == hi) continue;
    int8_t qs[8] = {};  // the last hi - i values, zero-padded
    std::copy(q + i, q + hi, qs);
    const __m256i mask = head_mask(hi - i);
    const __m256 v = _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs))));
    _mm256_maskstore_ps(acc + i, mask,
                        _mm256_add_ps(_mm256_maskload_ps(acc + i, mask), _mm256_mul_ps(v, s)));
  }
}

}  // namespace tessel::ops::avx2
