// Private to ops: small AVX2 helpers shared by the AVX2 translation units (sgemm_avx2.cc,
// conv_direct_avx2.cc, convert_avx2.cc). Only meaningful in a build that targets AVX2.
#pragma once

#ifdef __AVX2__

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace tessel::ops::avx2 {
// Internal linkage on purpose: this header is compiled into translation units of different ISA
// levels, and an inline function or template instantiation with external linkage would be one
// symbol that the linker takes from any of them, wider instructions and all.
namespace {

// Lanes [0, n) of an 8-lane mask (n clamped to [0, 8]), for maskload / maskstore.
inline __m256i head_mask(int64_t n) {
  const int m = static_cast<int>(std::clamp<int64_t>(n, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// f32 lanes rounded to bf16, to nearest even in integer lanes (a NaN stays a quiet NaN): each
// lane's bf16 bit pattern in its high 16 bits, its low 16 bits zero, so that the lane read as
// f32 is the bf16 value widened.
inline __m256i round_to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
  return _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
}

// f32 lanes rounded to bf16 as round_to_bf16 rounds, packed to 8 bf16 values.
inline __m128i to_bf16(__m256 v) {
  const __m256i r = _mm256_srli_epi32(round_to_bf16(v), 16);
  // Pack the 8 lanes to 16 bits (each 128-bit half packs on its own), then gather the halves.
  const __m256i packed = _mm256_packus_epi32(r, r);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// In-register transpose of the 8 x 8 block r[row] lane col -> r[col] lane row.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 2; ++g) {
    u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

}  // namespace
}  // namespace tessel::ops::avx2

#endif  // __AVX2__
