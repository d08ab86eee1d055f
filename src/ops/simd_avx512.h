// Private to ops: small AVX-512 helpers shared by the AVX-512 translation units (sgemm_avx512.cc,
// conv_direct.cc). Only meaningful in a build that targets AVX-512.
#pragma once

#ifdef __AVX512F__

// gcc 12.2 reports the _mm512_undefined_ps placeholder inside its own intrinsics (shuffles,
// masked loads) as (maybe) uninitialized: a false positive, gone in later gcc; the warning
// points into here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

namespace tessel::ops::avx512 {
// Internal linkage on purpose: this header is compiled into translation units of different ISA
// levels, and an inline function or template instantiation with external linkage would be one
// symbol that the linker takes from any of them, wider instructions and all.
namespace {

// Lanes [0, n) of a 16-lane mask, n clamped to [0, 16].
inline __mmask16 head_mask(int64_t n) {
  if (n >= 16) return 0xFFFF;
  return n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
}

// In-register transpose of the 16 x 16 block r[row] lane col -> r[col] lane row: pairs of
// rows interleave into 2 x 2, then 4 x 4 blocks within 128-bit lanes, then whole 128-bit lanes
// move across registers.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4g + c], lane L: column 4L + c of rows 4g .. 4g+3.
  for (int g = 0; g < 4; ++g) {
    r[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 even_lo = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);  // lanes 0, 2
    const __m512 odd_lo = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);   // lanes 1, 3
    const __m512 even_hi = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 odd_hi = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    t[c] = _mm512_shuffle_f32x4(even_lo, even_hi, 0x88);
    t[8 + c] = _mm512_shuffle_f32x4(even_lo, even_hi, 0xDD);
    t[4 + c] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

}  // namespace
}  // namespace tessel::ops::avx512

#endif  // __AVX512F__
