// tessel's single-threaded AVX2 + FMA SGEMM: the micro-kernel and packing of the blocking loops
// in gemm_driver.h (which explains the terms), compiled for AVX2 and run only where the CPU has
// it (isa.cc). A tile is up to kMr x kNr (6 x 16) of C in 12 ymm accumulators: per k one row of
// 16 floats of op(B) in two ymm, each of the tile's op(A) values broadcast, two FMAs per row
// (12 + 2 + 1 of the 16 ymm). Every element's sum runs in gemm_blocking.h's order, so the result
// is the AVX-512 and portable kernels' to the bit.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gemm_driver.h"
#include "kernels.h"
#include "simd_avx2.h"

namespace tessel::ops::avx2 {
namespace {

using detail::a_layout;
using detail::ALayout;
using detail::CElem;
using detail::Elem;
using detail::kSumKc;
using detail::TileOut;
using detail::View;

constexpr int kL = 8;    // floats per ymm
constexpr int kMr = 6;   // 2 x 6 accumulators + 2 rows of B + 1 broadcast = 15 of 16 ymm
constexpr int kNr = 16;  // two ymm per tile row
// kc (kSumKc, 320): a B micro-panel of kc x 16 floats (20 KiB) stays in a 32 KiB L1 while the
// tiles stream their A micro-panels from L2.
constexpr int64_t kKc = kSumKc;
constexpr int64_t kMcTiles = 24;       // 144 rows: an A block of 144 x 320 floats is 180 KiB of L2
constexpr int64_t kNc = 2048;          // a B block of 320 x 2048 floats (2.5 MiB) in L3
constexpr int64_t kDirectBTiles = 24;  // B read in place up to 144 rows

// n (<= kL) consecutive 16-bit values from h, lanes past n zero. Reads no element past n.
inline __m128i load_half(const uint16_t* h, int64_t n) {
  if (n >= kL) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(h));
  alignas(16) uint16_t part[kL] = {};
  for (int64_t i = 0; i < n; ++i) part[i] = h[i];
  return _mm_load_si128(reinterpret_cast<const __m128i*>(part));
}

// n (<= kL) consecutive elements of kind E from element `off` of p as f32 lanes, lanes past n
// zero, each rounded to bf16 unless E is kF32 (Elem). Reads no element past n.
template <Elem E>
__m256 load(const void* p, int64_t off, int64_t n) {
  if constexpr (E == Elem::kF32 || E == Elem::kF32Bf16) {
    const float* f = static_cast<const float*>(p) + off;
    const __m256 v = n >= kL ? _mm256_loadu_ps(f) : _mm256_maskload_ps(f, head_mask(n));
    if constexpr (E == Elem::kF32) return v;
    return _mm256_castsi256_ps(round_to_bf16(v));
  } else {
    const __m128i x = load_half(static_cast<const uint16_t*>(p) + off, n);
    if constexpr (E == Elem::kBf16)
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
    return _mm256_castsi256_ps(round_to_bf16(_mm256_cvtph_ps(x)));
  }
}

// A micro-panel of `rows` rows and kc columns of a (ALayout). Its stores are whole vectors (a
// masked store is microcoded and slow on AMD): a short one writes zeros past its values, which
// the next store overwrites, and past the panel's end into the slack gemm_blocks allocates.
template <Elem E>
void pack_a(const View& a, int rows, int64_t kc, float* out) {
  if (a_layout(a) == ALayout::kRows) {
    for (int i = 0; i < rows; ++i) {
      const int64_t src = a.offset(i, 0);
      float* dst = out + i * kKc;
      for (int64_t k = 0; k < kc; k += kL) _mm256_storeu_ps(dst + k, load<E>(a.p, src + k, kc - k));
    }
    return;
  }
  // Each k's store is overwritten past its `rows` values by the next one, so every k but the
  // last may load a whole vector (a masked load is slow on AMD, and this loop is a weight
  // gradient's whole packing): the values past `rows` lie before element (rows - 1, k + 1) when
  // cs + rows > kL, so the load stays inside the matrix.
  const int64_t whole = a.cs + rows > kL ? kc - 1 : 0;
  int64_t k = 0;
  for (; k < whole; ++k) _mm256_storeu_ps(out + k * rows, load<E>(a.p, a.offset(0, k), kL));
  for (; k < kc; ++k) _mm256_storeu_ps(out + k * rows, load<E>(a.p, a.offset(0, k), rows));
}

// B micro-panel: out[k * kNr + j] = b(k, j) for j < cols <= kNr, zero for cols <= j < kNr.
template <Elem E>
void pack_b(const View& b, int64_t kc, int cols, float* out) {
  if (b.cs == 1) {  // b's rows run along j
    for (int64_t k = 0; k < kc; ++k) {
      _mm256_storeu_ps(out + k * kNr, load<E>(b.p, b.offset(k, 0), cols));
      _mm256_storeu_ps(out + k * kNr + kL,
                       cols > kL ? load<E>(b.p, b.offset(k, kL), cols - kL) : _mm256_setzero_ps());
    }
    return;
  }
  // b's columns run along k: transpose 8 x 8 blocks, each half of the panel on its own.
  for (int64_t k0 = 0; k0 < kc; k0 += kL) {
    const int64_t kt = std::min<int64_t>(kL, kc - k0);
    for (int h = 0; h < kNr; h += kL) {
      __m256 r[kL];
      for (int j = 0; j < kL; ++j)
        r[j] = h + j < cols ? load<E>(b.p, b.offset(k0, h + j), kt) : _mm256_setzero_ps();
      transpose8(r);
      for (int64_t k = 0; k < kt; ++k) _mm256_storeu_ps(out + (k0 + k) * kNr + h, r[k]);
    }
  }
}

// Runs f.template operator()<E>() for the view's element kind E.
template <class F>
void with_elem(Elem e, F f) {
  switch (e) {
    case Elem::kF32:
      return f.template operator()<Elem::kF32>();
    case Elem::kF32Bf16:
      return f.template operator()<Elem::kF32Bf16>();
    case Elem::kBf16:
      return f.template operator()<Elem::kBf16>();
    case Elem::kF16Bf16:
      return f.template operator()<Elem::kF16Bf16>();
  }
}

// n (<= kL) consecutive elements of a C of kind e from element `off` of p, widened exactly.
inline __m256 load_c(const void* p, CElem e, int64_t off, int n) {
  if (e == CElem::kF32) {
    const float* f = static_cast<const float*>(p) + off;
    return n >= kL ? _mm256_loadu_ps(f) : _mm256_maskload_ps(f, head_mask(n));
  }
  const __m128i x = load_half(static_cast<const uint16_t*>(p) + off, n);
  if (e == CElem::kF16) return _mm256_cvtph_ps(x);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
}

// Stores the first n (<= kL) lanes of v as elements of a C of kind e from element `off` of p,
// rounded to nearest even (as ops::convert rounds).
inline void store_c(void* p, CElem e, int64_t off, int n, __m256 v) {
  if (e == CElem::kF32) {
    float* f = static_cast<float*>(p) + off;
    if (n >= kL) return _mm256_storeu_ps(f, v);
    return _mm256_maskstore_ps(f, head_mask(n), v);
  }
  const __m128i x = e == CElem::kF16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : to_bf16(v);
  uint16_t* h = static_cast<uint16_t*>(p) + off;
  if (n >= kL) return _mm_storeu_si128(reinterpret_cast<__m128i*>(h), x);
  alignas(16) uint16_t part[kL];
  _mm_store_si128(reinterpret_cast<__m128i*>(part), x);
  std::memcpy(h, part, static_cast<size_t>(n) * sizeof(uint16_t));
}

// out = alpha * acc + beta * in over the first n (<= kL) lanes (in not read when beta = 0).
inline void update(const void* in, CElem e_in, void* out, CElem e, int64_t off, int n, __m256 acc,
                   __m256 alpha, float beta) {
  if (n <= 0) return;
  __m256 v = _mm256_mul_ps(alpha, acc);
  if (beta != 0.0f) v = _mm256_fmadd_ps(_mm256_set1_ps(beta), load_c(in, e_in, off, n), v);
  store_c(out, e, off, n, v);
}

// The transposed product's tile, stored to tile[R][kNr] (through the stack, so that the
// accumulator registers never have their address taken, which would make gcc store them after
// every FMA), into C's columns: one update of R lanes per tile column.
template <int R>
void store_columns(const float (*tile)[kNr], const TileOut& t) {
  const __m256 alpha = _mm256_set1_ps(t.alpha);
  for (int j = 0; j < t.cols; ++j) {
    alignas(32) float col[kL] = {};
    for (int i = 0; i < R; ++i) col[i] = tile[i][j];
    update(t.c_in, t.e_in, t.c, t.e, j * t.cs, R, _mm256_load_ps(col), alpha, t.beta);
  }
}

// The R x kNr tile C = alpha * (A micro-panel @ B micro-panel) + beta * C.
template <int R, ALayout L>
void micro_kernel(int64_t kc, const float* __restrict a, int64_t lda, const float* __restrict b,
                  int64_t ldb, const TileOut& t) {
  if (t.cs == 1) {  // the first touch of C's rows would otherwise stall the stores
    const int64_t bytes = detail::c_bytes(t.e_in);
    for (int i = 0; i < R; ++i) {
      const char* row = static_cast<const char*>(t.c_in) + i * t.rs * bytes;
      _mm_prefetch(row, _MM_HINT_T0);
      _mm_prefetch(row + (kNr - 1) * bytes, _MM_HINT_T0);
    }
  }
  __m256 acc0[R], acc1[R];
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + kL);
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      const __m256 ai = _mm256_broadcast_ss(L == ALayout::kRows ? a + i * lda : a + i);
      acc0[i] = _mm256_fmadd_ps(ai, b0, acc0[i]);
      acc1[i] = _mm256_fmadd_ps(ai, b1, acc1[i]);
    }
    a += L == ALayout::kRows ? 1 : R;
    b += ldb;
  }
  // C's rows (of any kind) are updated from the registers; C's columns go through the stack.
  if (t.cs != 1) {
    alignas(32) float tile[R][kNr];
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      _mm256_store_ps(tile[i], acc0[i]);
      _mm256_store_ps(tile[i] + kL, acc1[i]);
    }
    store_columns<R>(tile, t);
    return;
  }
  const __m256 alpha = _mm256_set1_ps(t.alpha);
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i) {
    update(t.c_in, t.e_in, t.c, t.e, i * t.rs, std::min(t.cols, kL), acc0[i], alpha, t.beta);
    update(t.c_in, t.e_in, t.c, t.e, i * t.rs + kL, t.cols - kL, acc1[i], alpha, t.beta);
  }
}

struct Policy {
  static constexpr int kMr = avx2::kMr, kNr = avx2::kNr;
  static constexpr int64_t kMcTiles = avx2::kMcTiles, kNc = avx2::kNc,
                           kDirectBTiles = avx2::kDirectBTiles;
  static constexpr bool kDirectA = true;
  static void pack_a(const View& a, int rows, int64_t kc, float* out) {
    with_elem(a.e, [&]<Elem E>() { avx2::pack_a<E>(a, rows, kc, out); });
  }
  static void pack_b(const View& b, int64_t kc, int cols, float* out) {
    with_elem(b.e, [&]<Elem E>() { avx2::pack_b<E>(b, kc, cols, out); });
  }
  template <int R, ALayout L>
  static constexpr detail::TileKernel tile = &micro_kernel<R, L>;
};

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  detail::gemm_run<Policy>(trans_a, trans_b, M, N, K, alpha, A, Elem::kF32, lda, B, Elem::kF32, ldb,
                           beta, C, CElem::kF32, ldc);
}

void sgemm_lowp(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                ConstMatrix A, ConstMatrix B, float beta, Matrix C) {
  auto elem = [](DType t) {
    return t == DType::kBF16 ? Elem::kBf16 : t == DType::kF16 ? Elem::kF16Bf16 : Elem::kF32Bf16;
  };
  const CElem ec = C.type == DType::kBF16  ? CElem::kBf16
                   : C.type == DType::kF16 ? CElem::kF16
                                           : CElem::kF32;
  detail::gemm_run<Policy>(trans_a, trans_b, M, N, K, alpha, A.p, elem(A.type), A.ld, B.p,
                           elem(B.type), B.ld, beta, C.p, ec, C.ld);
}

}  // namespace tessel::ops::avx2
