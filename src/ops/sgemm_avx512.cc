// tessel's single-threaded AVX-512 SGEMM: the micro-kernel and packing of the blocking loops in
// gemm_driver.h (which explains the terms), compiled for AVX-512 and run only where the CPU has
// it (isa.cc). A tile is up to kMr x kNr (14 x 32) of C in 28 zmm accumulators: per k one row of
// 32 floats of op(B) in two zmm, each of the tile's op(A) values broadcast, two FMAs per row.
#include <algorithm>
#include <cstddef>
#include <new>

#include "gemm_driver.h"
#include "kernels.h"
#include "simd_avx512.h"

namespace tessel::ops::avx512 {
namespace {

using detail::a_layout;
using detail::ALayout;
using detail::kSumKc;
using detail::TileOut;
using detail::View;

constexpr int kMr = 14;  // 2 x 14 accumulators + 2 rows of B + 1 broadcast = 31 of 32 zmm
constexpr int kNr = 32;  // two zmm per tile row
// kc (detail::kSumKc, 320): a B micro-panel (kc x 32 floats = 40 KiB) stays in the 48 KiB L1
// while the tiles stream their A micro-panels from L2. Measured flat between 256 and 512.
constexpr int64_t kKc = kSumKc;
constexpr int64_t kMcTiles = 24;  // ~330 rows: an A block of 330 x 320 floats is 40% of L2
constexpr int64_t kNc = 2048;     // a B block of 320 x 2048 floats (2.5 MiB) in L3
// B is read in place for M <= 12 tiles (168 rows), where it measured 5-10% faster than packed.
constexpr int64_t kDirectBTiles = 12;

void pack_a(const View& a, int rows, int64_t kc, float* out) {
  if (a_layout(a) == ALayout::kRows) {
    // Inline copies: a memcpy call per row costs more than the row when kc is small.
    const __mmask16 tail = head_mask(kc % 16);
    for (int i = 0; i < rows; ++i) {
      const float* src = a.at(i, 0);
      float* dst = out + i * kKc;
      int64_t k = 0;
      for (; k + 16 <= kc; k += 16) _mm512_storeu_ps(dst + k, _mm512_loadu_ps(src + k));
      if (k < kc) _mm512_mask_storeu_ps(dst + k, tail, _mm512_maskz_loadu_ps(tail, src + k));
    }
    return;
  }
  const __mmask16 row_mask = head_mask(rows);
  for (int64_t k = 0; k < kc; ++k) {
    _mm512_mask_storeu_ps(out + k * rows, row_mask, _mm512_maskz_loadu_ps(row_mask, a.at(0, k)));
  }
}

// B micro-panel, 64-byte aligned: out[k * kNr + j] = b(k, j) for j < cols <= kNr, zero for
// cols <= j < kNr.
void pack_b(const View& b, int64_t kc, int cols, float* out) {
  if (b.cs == 1) {  // b's rows run along j: two masked loads per k
    const __mmask16 lo = head_mask(cols), hi = head_mask(cols - 16);
    for (int64_t k = 0; k < kc; ++k) {
      const float* src = b.at(k, 0);
      _mm512_store_ps(out + k * kNr, _mm512_maskz_loadu_ps(lo, src));
      _mm512_store_ps(out + k * kNr + 16, _mm512_maskz_loadu_ps(hi, src + 16));
    }
    return;
  }
  // b's columns run along k: transpose 16 x 16 blocks, each half of the panel on its own.
  for (int64_t k0 = 0; k0 < kc; k0 += 16) {
    const int64_t kt = std::min<int64_t>(16, kc - k0);
    const __mmask16 k_mask = head_mask(kt);
    for (int h = 0; h < kNr; h += 16) {
      if (h >= cols) {
        for (int64_t k = 0; k < kt; ++k) {
          _mm512_store_ps(out + (k0 + k) * kNr + h, _mm512_setzero_ps());
        }
        continue;
      }
      __m512 r[16];
      for (int j = 0; j < 16; ++j) {
        r[j] = h + j < cols ? _mm512_maskz_loadu_ps(k_mask, b.at(k0, h + j)) : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int64_t k = 0; k < kt; ++k) _mm512_store_ps(out + (k0 + k) * kNr + h, r[k]);
    }
  }
}

// c = alpha * acc + beta * c over the lanes of `mask`.
inline void update(float* c, __mmask16 mask, __m512 acc, __m512 alpha, float beta) {
  __m512 v = _mm512_mul_ps(alpha, acc);
  if (beta != 0.0f) v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mask, c), v);
  _mm512_mask_storeu_ps(c, mask, v);
}

// Tile of the transposed product: transpose the accumulators through the stack so that each
// C row takes one masked update of R lanes.
template <int R>
void store_transposed(const __m512* acc0, const __m512* acc1, const TileOut& t) {
  alignas(64) float tile[R][kNr];
  for (int i = 0; i < R; ++i) {
    _mm512_store_ps(tile[i], acc0[i]);
    _mm512_store_ps(tile[i] + 16, acc1[i]);
  }
  const __m512 alpha = _mm512_set1_ps(t.alpha);
  const __mmask16 row_mask = head_mask(R);
  for (int h = 0; h < t.cols; h += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < R ? _mm512_load_ps(tile[i] + h) : _mm512_setzero_ps();
    transpose16(r);
    const int n = std::min(16, t.cols - h);
    for (int j = 0; j < n; ++j)
      update(static_cast<float*>(t.c) + (h + j) * t.cs, row_mask, r[j], alpha, t.beta);
  }
}

// The R x kNr tile C = alpha * (A micro-panel @ B micro-panel) + beta * C, C f32 (ops::gemm's:
// t.c is t.c_in). Row k of the B micro-panel is at b + k * ldb: ldb = kNr when packed, else B's
// own row stride.
template <int R, ALayout L>
void micro_kernel(int64_t kc, const float* __restrict a, int64_t /*lda: kKc, packed*/,
                  const float* __restrict b, int64_t ldb, const TileOut& t) {
  if (t.cs == 1) {
    // The first touch of C would otherwise stall the stores after the k loop.
    for (int i = 0; i < R; ++i) {
      const float* row = static_cast<const float*>(t.c) + i * t.rs;
      _mm_prefetch(reinterpret_cast<const char*>(row), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + kNr - 1), _MM_HINT_T0);
    }
  }
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 14
    for (int i = 0; i < R; ++i) {
      const __m512 ai = _mm512_set1_ps(L == ALayout::kRows ? a[i * kKc] : a[i]);
      acc0[i] = _mm512_fmadd_ps(ai, b0, acc0[i]);
      acc1[i] = _mm512_fmadd_ps(ai, b1, acc1[i]);
    }
    a += L == ALayout::kRows ? 1 : R;
    b += ldb;
  }
  if (t.cs != 1) {
    store_transposed<R>(acc0, acc1, t);
    return;
  }
  const __m512 alpha = _mm512_set1_ps(t.alpha);
  const __mmask16 lo = head_mask(t.cols), hi = head_mask(t.cols - 16);
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i) {
    float* row = static_cast<float*>(t.c) + i * t.rs;
    update(row, lo, acc0[i], alpha, t.beta);
    update(row + 16, hi, acc1[i], alpha, t.beta);
  }
}

struct Policy {
  static constexpr int kMr = avx512::kMr, kNr = avx512::kNr;
  static constexpr int64_t kMcTiles = avx512::kMcTiles, kNc = avx512::kNc,
                           kDirectBTiles = avx512::kDirectBTiles;
  static constexpr bool kDirectA = false;  // its kernel takes A packed (lda = kKc)
  static void pack_a(const View& a, int rows, int64_t kc, float* out) {
    avx512::pack_a(a, rows, kc, out);
  }
  static void pack_b(const View& b, int64_t kc, int cols, float* out) {
    avx512::pack_b(b, kc, cols, out);
  }
  template <int R, ALayout L>
  static constexpr detail::TileKernel tile = &micro_kernel<R, L>;
};

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  detail::gemm_run<Policy>(trans_a, trans_b, M, N, K, alpha, A, detail::Elem::kF32, lda, B,
                           detail::Elem::kF32, ldb, beta, C, detail::CElem::kF32, ldc);
}

}  // namespace tessel::ops::avx512
