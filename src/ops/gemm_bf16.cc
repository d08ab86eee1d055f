// Single-threaded bf16 GEMM on AVX512_BF16, in the layout of the f32 kernel (sgemm_avx512.cc).
//
// `vdpbf16ps acc, a, b` adds a[2l] b[2l] + a[2l+1] b[2l+1] into f32 lane l of acc: it consumes
// the k dimension in *pairs*. Terms: a k-pair is (k, k+1) for even k; a tile is at most kMr x kNr
// (14 x 32) of C, held in 28 zmm f32 accumulators. Per k-pair the micro-kernel loads one row of
// the B micro-panel (32 columns x 2 = 64 bf16, two zmm), broadcasts each tile row's k-pair of A
// (32 bits) and issues two vdpbf16ps per row: twice the multiply-adds of an f32 FMA per lane.
//
// Packing rounds every operand to bf16 (f32 with vcvtne2ps2bf16, f16 through f32 with F16C;
// bf16 is copied) into micro-panels whose pairs sit in adjacent 16-bit halves of a 32-bit word:
//   B micro-panel: pair kp, column j at out[kp * 64 + 2 j] (k-pair major), zero past N;
//     from B rows along j (two rows interleaved 16 bits at a time), or from B columns along k
//     (pairs are adjacent already: a 16 x 16 transpose of 32-bit words).
//   A micro-panel, whichever A's storage copies into without a transpose (ALayout):
//     kRows: a(i, k) at out[i * kKc + k] (rows along k: a plain copy; the pair is 32 bits);
//     kInterleaved: a(i, k) at out[kp * 2 rows + 2 i + (k & 1)] (A columns along i: two
//     columns interleaved).
// An odd K gets a zero k past its end in both operands, so the last pair adds nothing.
// Blocking, tile heights, the transposed product for narrow N and the C update (alpha, beta;
// f32 or 16-bit C, rounded once) follow sgemm_avx512.cc. B is always packed: its pairs must be
// interleaved whatever its storage.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <new>
#include <utility>

#include "gemm_blocking.h"
#include "kernels.h"
#include "simd_avx512.h"

// Compiled only where the compiler targets AVX512_BF16 (src/ops/CMakeLists.txt).
namespace tessel::ops::avx512_bf16 {
namespace {

using avx512::head_mask;
using avx512::transpose16;
using detail::RowTiles;
using detail::Scratch;
using detail::transpose_product;

constexpr int kMr = 14;
constexpr int kNr = 32;
// kc (even): a B micro-panel of kc x 32 bf16 (24 KiB at 384) stays in L1 while the tiles of
// an A block stream from L2.
constexpr int64_t kKc = 384;
constexpr int64_t kMcTiles = 24;
constexpr int64_t kNc = 2048;

using Half = uint16_t;  // a bf16 bit pattern in the packed panels

// Element (r, c) of a strided view is at element r * rs + c * cs of p, of dtype t.
struct View {
  const void* p;
  DType t;
  int64_t rs, cs;
  int64_t offset(int64_t r, int64_t c) const { return r * rs + c * cs; }
  View at(int64_t r, int64_t c) const {
    const size_t bytes = t == DType::kF32 ? 4 : 2;
    return {static_cast<const char*>(p) + offset(r, c) * static_cast<int64_t>(bytes), t, rs, cs};
  }
};

inline __mmask32 mask32(int64_t n) {
  if (n >= 32) return 0xFFFFFFFFu;
  return n <= 0 ? 0 : static_cast<__mmask32>((1u << n) - 1);
}

// 32 elements at element offset `off` of v (lanes past n zero) rounded to bf16, lane l of the
// result holding element off + l.
inline __m512i load32(const View& v, int64_t off, int64_t n) {
  const __mmask32 m = mask32(n);
  if (v.t == DType::kBF16) return _mm512_maskz_loadu_epi16(m, static_cast<const Half*>(v.p) + off);
  __m512 lo, hi;
  if (v.t == DType::kF32) {
    const float* f = static_cast<const float*>(v.p) + off;
    lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m), f);
    hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m >> 16), f + 16);
  } else {  // f16
    const Half* h = static_cast<const Half*>(v.p) + off;
    lo = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(static_cast<__mmask16>(m), h));
    hi = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(static_cast<__mmask16>(m >> 16), h + 16));
  }
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// out[l] (l < 2n) = pair-interleave of rows r0 and r1: r0[0], r1[0], r0[1], r1[1], ...
// lo holds elements 0..15 of each row, hi 16..31.
inline void interleave(__m512i r0, __m512i r1, __m512i* lo, __m512i* hi) {
  alignas(64) static constexpr uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                   37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                   11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                   53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                   27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  *lo = _mm512_permutex2var_epi16(r0, _mm512_load_si512(kLo), r1);
  *hi = _mm512_permutex2var_epi16(r0, _mm512_load_si512(kHi), r1);
}

enum class ALayout { kInterleaved, kRows };

ALayout a_layout(const View& a) { return a.cs == 1 ? ALayout::kRows : ALayout::kInterleaved; }

int64_t even(int64_t k) { return (k + 1) & ~int64_t{1}; }

// The A micro-panel of `rows` rows and kc columns of a (see ALayout).
void pack_a(const View& a, int rows, int64_t kc, Half* out) {
  const int64_t kce = even(kc);
  if (a_layout(a) == ALayout::kRows) {
    for (int i = 0; i < rows; ++i) {
      const int64_t row = a.offset(i, 0);
      Half* dst = out + i * kKc;
      for (int64_t k = 0; k < kce; k += 32)
        _mm512_mask_storeu_epi16(dst + k, mask32(kce - k), load32(a, row + k, kc - k));
    }
    return;
  }
  // Columns along i: k-pair kp interleaves columns 2kp and 2kp + 1 of the tile's rows.
  const __mmask32 m = mask32(2 * rows);
  for (int64_t k = 0; k < kc; k += 2) {
    const __m512i c0 = load32(a, a.offset(0, k), rows);
    const __m512i c1 = k + 1 < kc ? load32(a, a.offset(0, k + 1), rows) : _mm512_setzero_si512();
    __m512i lo, hi;
    interleave(c0, c1, &lo, &hi);
    _mm512_mask_storeu_epi16(out + k * rows, m, lo);  // rows <= 14: the low half holds them
  }
}

// The B micro-panel of kc rows and `cols` (<= kNr) columns of b, 64-byte aligned.
void pack_b(const View& b, int64_t kc, int cols, Half* out) {
  if (b.cs == 1) {  // rows along j: interleave rows 2kp and 2kp + 1
    for (int64_t k = 0; k < kc; k += 2) {
      const __m512i r0 = load32(b, b.offset(k, 0), cols);
      const __m512i r1 = k + 1 < kc ? load32(b, b.offset(k + 1, 0), cols) : _mm512_setzero_si512();
      __m512i lo, hi;
      interleave(r0, r1, &lo, &hi);
      _mm512_store_si512(out + k * kNr, lo);
      _mm512_store_si512(out + k * kNr + 32, hi);
    }
    return;
  }
  // Columns along k: column j's pairs are adjacent, so 16 columns x 16 pairs transpose as
  // 32-bit words into 16 rows of pairs.
  const int64_t kce = even(kc);
  for (int64_t k0 = 0; k0 < kce; k0 += 32) {
    const int64_t pairs = std::min<int64_t>(16, (kce - k0) / 2);
    for (int h = 0; h < kNr; h += 16) {
      __m512 r[16];
      for (int j = 0; j < 16; ++j) {
        r[j] = h + j < cols ? _mm512_castsi512_ps(load32(b, b.offset(k0, h + j), kc - k0))
                            : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int64_t p = 0; p < pairs; ++p)
        _mm512_store_ps(reinterpret_cast<float*>(out + (k0 / 2 + p) * 2 * kNr + 2 * h), r[p]);
    }
  }
}

// Where a tile goes: element (i, j) at element i * rs + j * cs of c (cs = 1: C rows; rs = 1:
// the transposed product), columns j < cols stored.
struct TileOut {
  void* c;
  DType t;
  int64_t rs, cs;
  int cols;
  float alpha, beta;  // beta = 0: C is not read
};

// c[0..16) = alpha * acc + beta * c over the lanes of `mask`, in C's type.
inline void update(const TileOut& t, int64_t off, __mmask16 mask, __m512 acc) {
  __m512 v = _mm512_mul_ps(_mm512_set1_ps(t.alpha), acc);
  const __m512 beta = _mm512_set1_ps(t.beta);
  if (t.t == DType::kF32) {
    float* c = static_cast<float*>(t.c) + off;
    if (t.beta != 0.0f) v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mask, c), v);
    _mm512_mask_storeu_ps(c, mask, v);
  } else if (t.t == DType::kBF16) {
    Half* c = static_cast<Half*>(t.c) + off;
    if (t.beta != 0.0f) {
      const __m512i old = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, c));
      v = _mm512_fmadd_ps(beta, _mm512_castsi512_ps(_mm512_slli_epi32(old, 16)), v);
    }
    _mm256_mask_storeu_epi16(c, mask, (__m256i)_mm512_cvtneps_pbh(v));
  } else {
    Half* c = static_cast<Half*>(t.c) + off;
    if (t.beta != 0.0f)
      v = _mm512_fmadd_ps(beta, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, c)), v);
    _mm256_mask_storeu_epi16(c, mask, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
}

template <int R>
void store_tile(const __m512* acc0, const __m512* acc1, const TileOut& t) {
  if (t.cs == 1) {
    const __mmask16 lo = head_mask(t.cols), hi = head_mask(t.cols - 16);
    for (int i = 0; i < R; ++i) {
      update(t, i * t.rs, lo, acc0[i]);
      update(t, i * t.rs + 16, hi, acc1[i]);
    }
    return;
  }
  // Transposed product: through the stack, each C row one masked update of R lanes.
  alignas(64) float tile[R][kNr];
  for (int i = 0; i < R; ++i) {
    _mm512_store_ps(tile[i], acc0[i]);
    _mm512_store_ps(tile[i] + 16, acc1[i]);
  }
  const __mmask16 row_mask = head_mask(R);
  for (int h = 0; h < t.cols; h += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < R ? _mm512_load_ps(tile[i] + h) : _mm512_setzero_ps();
    transpose16(r);
    const int n = std::min(16, t.cols - h);
    for (int j = 0; j < n; ++j) update(t, (h + j) * t.cs, row_mask, r[j]);
  }
}

inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }

// The R x kNr tile C = alpha * (A micro-panel @ B micro-panel) + beta * C over `pairs` k-pairs.
template <int R, ALayout L>
void micro_kernel(int64_t pairs, const Half* __restrict a, const Half* __restrict b,
                  const TileOut& t) {
  if (t.cs == 1) {
    // The first touch of C would otherwise stall the stores after the k loop.
    const int64_t elem = t.t == DType::kF32 ? 4 : 2;
    const char* c = static_cast<const char*>(t.c);
    for (int i = 0; i < R; ++i) {
      _mm_prefetch(c + i * t.rs * elem, _MM_HINT_T0);
      _mm_prefetch(c + (i * t.rs + kNr - 1) * elem, _MM_HINT_T0);
    }
  }
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = as_bh(_mm512_load_si512(b)), b1 = as_bh(_mm512_load_si512(b + 32));
#pragma GCC unroll 14
    for (int i = 0; i < R; ++i) {
      int32_t pair;
      std::memcpy(&pair, L == ALayout::kRows ? a + i * kKc : a + 2 * i, sizeof pair);
      const __m512bh ai = as_bh(_mm512_set1_epi32(pair));
      acc0[i] = _mm512_dpbf16_ps(acc0[i], ai, b0);
      acc1[i] = _mm512_dpbf16_ps(acc1[i], ai, b1);
    }
    a += L == ALayout::kRows ? 2 : 2 * R;
    b += 2 * kNr;
  }
  store_tile<R>(acc0, acc1, t);
}

using KernelFn = void (*)(int64_t, const Half*, const Half*, const TileOut&);
template <ALayout L, int... I>
constexpr std::array<KernelFn, kMr + 1> make_kernels(std::integer_sequence<int, I...>) {
  return {nullptr, &micro_kernel<I + 1, L>...};
}
template <ALayout L>
constexpr auto kKernels = make_kernels<L>(std::make_integer_sequence<int, kMr>{});

thread_local Scratch<Half> tls_a, tls_b;
thread_local Scratch<float> tls_c;

// C = alpha * op(A) @ op(B) + beta * C over views; C(i, j) is element i * rs_c + j * cs_c.
void run(int64_t M, int64_t N, int64_t K, float alpha, const View& a, const View& b, float beta,
         void* c, DType ct, int64_t rs_c, int64_t cs_c) {
  const RowTiles<kMr> tiles(M);
  const int64_t k_blocks = (K + kKc - 1) / kKc;
  const int64_t kc_max = even((K + k_blocks - 1) / k_blocks);
  const int64_t nc_max = std::min<int64_t>((N + kNr - 1) / kNr * kNr, kNc);
  const ALayout layout = a_layout(a);
  const auto& kernels =
      layout == ALayout::kRows ? kKernels<ALayout::kRows> : kKernels<ALayout::kInterleaved>;
  Half* pa = tls_a.get(std::min(tiles.count, kMcTiles) * kMr * kKc);
  Half* pb = tls_b.get(nc_max * kc_max);
  const size_t c_bytes = ct == DType::kF32 ? 4 : 2;
  for (int64_t j0 = 0; j0 < N; j0 += kNc) {
    const int64_t nc = std::min(kNc, N - j0);
    for (int64_t p0 = 0; p0 < K; p0 += kc_max) {
      const int64_t kc = std::min(kc_max, K - p0), kce = even(kc);
      const float beta_k = p0 == 0 ? beta : 1.0f;
      for (int64_t jr = 0; jr < nc; jr += kNr) {
        const int cols = static_cast<int>(std::min<int64_t>(kNr, nc - jr));
        pack_b(b.at(p0, j0 + jr), kc, cols, pb + jr * kce);
      }
      for (int64_t t0 = 0; t0 < tiles.count; t0 += kMcTiles) {
        const int64_t t1 = std::min(tiles.count, t0 + kMcTiles);
        const int64_t a_row_halves = layout == ALayout::kRows ? kKc : kce;  // per tile row
        Half* dst = pa;
        for (int64_t t = t0; t < t1; ++t) {
          pack_a(a.at(tiles.start(t), p0), tiles.rows(t), kc, dst);
          dst += tiles.rows(t) * a_row_halves;
        }
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          const int cols = static_cast<int>(std::min<int64_t>(kNr, nc - jr));
          const Half* bp = pb + jr * kce;
          const Half* ap = pa;
          for (int64_t t = t0; t < t1; ++t) {
            const int rows = tiles.rows(t);
            const int64_t off = tiles.start(t) * rs_c + (j0 + jr) * cs_c;
            const TileOut out{static_cast<char*>(c) + off * static_cast<int64_t>(c_bytes),
                              ct,
                              rs_c,
                              cs_c,
                              cols,
                              alpha,
                              beta_k};
            kernels[rows](kce / 2, ap, bp, out);
            ap += rows * a_row_halves;
          }
        }
      }
    }
  }
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               ConstMatrix A, ConstMatrix B, float beta, Matrix C) {
  if (C.type != DType::kF32 && K > kKc) {
    // Later K blocks add onto C: keep the partial sums in f32 and round C once at the end.
    float* acc = tls_c.get(M * N);
    gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, B, 0.0f, {acc, DType::kF32, N});
    for (int64_t i = 0; i < M; ++i) {
      const TileOut row{C.p, C.type, 0, 1, 0, 1.0f, beta};
      for (int64_t j = 0; j < N; j += 16) {
        const __mmask16 m = head_mask(N - j);
        update(row, i * C.ld + j, m, _mm512_maskz_loadu_ps(m, acc + i * N + j));
      }
    }
    return;
  }
  const View a{A.p, A.type, trans_a ? 1 : A.ld, trans_a ? A.ld : 1};
  const View b{B.p, B.type, trans_b ? 1 : B.ld, trans_b ? B.ld : 1};
  if (transpose_product<kNr>(M, N)) {
    run(N, M, K, alpha, View{b.p, b.t, b.cs, b.rs}, View{a.p, a.t, a.cs, a.rs}, beta, C.p, C.type,
        1, C.ld);
    return;
  }
  run(M, N, K, alpha, a, b, beta, C.p, C.type, C.ld, 1);
}

}  // namespace tessel::ops::avx512_bf16
