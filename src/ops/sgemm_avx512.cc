// Single-threaded AVX-512 SGEMM in the BLIS / GotoBLAS layout.
//
// Terms: op(A) is M x K, op(B) is K x N. A tile is a block of at most kMr x kNr (14 x 32) of C
// that the micro-kernel holds in 28 zmm accumulators while it runs over k: per k it loads one
// row of 32 floats of op(B), broadcasts each of the tile's op(A) values and issues two FMAs per
// tile row. Its operands come packed into contiguous micro-panels: an A micro-panel holds the
// tile's rows of op(A), in whichever of two layouts A's storage copies into without a
// transpose (see ALayout); a B micro-panel holds kNr columns of op(B) k-major, zero padded past
// N, transposed in registers when B's columns run along k. Packing takes element strides, so
// one kernel serves all four transpose combinations and any leading dimensions.
//
// M is cut into ceil(M / kMr) tiles of near equal height (128 rows -> 8 x 13 + 2 x 12 rather
// than 9 x 14 + 2), since a short tile has too few independent FMA chains to fill the pipes.
// Blocking, outermost first:
//   for each N block of <= kNc columns
//     for each K block of <= kKc (beta applies in the first; later blocks add onto C)
//       pack the op(B) block into B micro-panels (kc x nc, from L2/L3)
//       for each group of <= kMcTiles tiles: pack their A micro-panels (stays in L2)
//         for each B micro-panel (kc x kNr, stays in L1), for each tile: micro-kernel
// When few tiles share each B micro-panel and B's rows are contiguous, the kernel reads B in
// place instead (packing would cost about as much as it saves).
//
// When N is far from a multiple of kNr while M is not (N = 10 would waste 22 of 32 lanes), the
// product is computed transposed, C^T = op(B)^T op(A)^T: the operands swap roles and the kernel
// stores its tile transposed.
#include "sgemm_avx512.h"

#ifdef __AVX512F__

#include <algorithm>
#include <array>
#include <cstddef>
#include <new>
#include <utility>

#include "gemm_blocking.h"
#include "simd_avx512.h"

namespace tessel::ops::detail {
namespace {

constexpr int kMr = 14;  // 2 x 14 accumulators + 2 rows of B + 1 broadcast = 31 of 32 zmm
constexpr int kNr = 32;  // two zmm per tile row
// kc: a B micro-panel (kc x 32 floats = 40 KiB at kc = 320) stays in the 48 KiB L1 while the
// tiles stream their A micro-panels from L2. Measured flat between 256 and 512.
constexpr int64_t kKc = 320;
constexpr int64_t kMcTiles = 24;  // ~330 rows: an A block of 330 x 320 floats is 40% of L2
constexpr int64_t kNc = 2048;     // a B block of 320 x 2048 floats (2.5 MiB) in L3
// B is read in place for M <= 12 tiles (168 rows), where it measured 5-10% faster than packed.
constexpr int64_t kDirectBTiles = 12;

// Element (r, c) of a strided matrix view is p[r * rs + c * cs]; one of rs, cs is 1.
struct View {
  const float* p;
  int64_t rs, cs;
  const float* at(int64_t r, int64_t c) const { return p + r * rs + c * cs; }
};

// An A micro-panel comes in one of two layouts, whichever packs by plain copies:
//   kInterleaved: a(i, k) at out[k * rows + i], from a matrix whose columns run along i;
//   kRows: a(i, k) at out[i * kKc + k], from a matrix whose rows run along k. The row stride
//   is the constant kKc so that the kernel addresses each row by an immediate offset.
enum class ALayout { kInterleaved, kRows };

ALayout a_layout(const View& a) { return a.cs == 1 ? ALayout::kRows : ALayout::kInterleaved; }

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

// Where a tile goes: its element (i, j) is c[i * rs + j * cs], columns j < cols are stored.
// Either cs = 1 (C rows) or rs = 1 (transposed product, C columns).
struct TileOut {
  float* c;
  int64_t rs, cs;
  int cols;
  float alpha, beta;  // beta = 0: C is not read
};

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
    for (int j = 0; j < n; ++j) update(t.c + (h + j) * t.cs, row_mask, r[j], alpha, t.beta);
  }
}

// The R x kNr tile C = alpha * (A micro-panel @ B micro-panel) + beta * C. Row k of the B
// micro-panel is at b + k * ldb: ldb = kNr when packed, else B's own row stride.
template <int R, ALayout L>
void micro_kernel(int64_t kc, const float* __restrict a, const float* __restrict b, int64_t ldb,
                  const TileOut& t) {
  if (t.cs == 1) {
    // The first touch of C would otherwise stall the stores after the k loop.
    for (int i = 0; i < R; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(t.c + i * t.rs), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(t.c + i * t.rs + kNr - 1), _MM_HINT_T0);
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
    float* row = t.c + i * t.rs;
    update(row, lo, acc0[i], alpha, t.beta);
    update(row + 16, hi, acc1[i], alpha, t.beta);
  }
}

using KernelFn = void (*)(int64_t, const float*, const float*, int64_t, const TileOut&);
// kKernels<L>[R] runs a tile of R rows.
template <ALayout L, int... I>
constexpr std::array<KernelFn, kMr + 1> make_kernels(std::integer_sequence<int, I...>) {
  return {nullptr, &micro_kernel<I + 1, L>...};
}
template <ALayout L>
constexpr auto kKernels = make_kernels<L>(std::make_integer_sequence<int, kMr>{});

thread_local Scratch<float> tls_a, tls_b;

// C = alpha * op(A) @ op(B) + beta * C over views; C(i, j) is c[i * rs_c + j * cs_c].
void run(int64_t M, int64_t N, int64_t K, float alpha, const View& a, const View& b, float beta,
         float* c, int64_t rs_c, int64_t cs_c) {
  const RowTiles<kMr> tiles(M);
  const int64_t k_blocks = (K + kKc - 1) / kKc, kc_max = (K + k_blocks - 1) / k_blocks;
  const int64_t nc_max = std::min<int64_t>((N + kNr - 1) / kNr * kNr, kNc);
  const ALayout layout = a_layout(a);
  const auto& kernels =
      layout == ALayout::kRows ? kKernels<ALayout::kRows> : kKernels<ALayout::kInterleaved>;
  float* pa = tls_a.get(std::min(tiles.count, kMcTiles) * kMr * kKc);
  float* pb = tls_b.get(nc_max * kc_max);
  // Full B micro-panels are read in place (edge panels still need their zero padding).
  const bool direct_b = b.cs == 1 && tiles.count <= kDirectBTiles;
  for (int64_t j0 = 0; j0 < N; j0 += kNc) {
    const int64_t nc = std::min(kNc, N - j0);
    for (int64_t p0 = 0; p0 < K; p0 += kc_max) {
      const int64_t kc = std::min(kc_max, K - p0);
      const float beta_k = p0 == 0 ? beta : 1.0f;
      for (int64_t jr = 0; jr < nc; jr += kNr) {
        const int cols = static_cast<int>(std::min<int64_t>(kNr, nc - jr));
        if (!direct_b || cols < kNr) {
          pack_b(View{b.at(p0, j0 + jr), b.rs, b.cs}, kc, cols, pb + jr * kc);
        }
      }
      for (int64_t t0 = 0; t0 < tiles.count; t0 += kMcTiles) {
        const int64_t t1 = std::min(tiles.count, t0 + kMcTiles);
        const int64_t a_row_floats = layout == ALayout::kRows ? kKc : kc;  // per tile row
        float* dst = pa;
        for (int64_t t = t0; t < t1; ++t) {
          pack_a(View{a.at(tiles.start(t), p0), a.rs, a.cs}, tiles.rows(t), kc, dst);
          dst += tiles.rows(t) * a_row_floats;
        }
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          const int cols = static_cast<int>(std::min<int64_t>(kNr, nc - jr));
          const bool in_place = direct_b && cols == kNr;
          const float* bp = in_place ? b.at(p0, j0 + jr) : pb + jr * kc;
          const int64_t ldb = in_place ? b.rs : kNr;
          const float* ap = pa;
          for (int64_t t = t0; t < t1; ++t) {
            const int rows = tiles.rows(t);
            const TileOut out{
                c + tiles.start(t) * rs_c + (j0 + jr) * cs_c, rs_c, cs_c, cols, alpha, beta_k};
            kernels[rows](kc, ap, bp, ldb, out);
            ap += rows * a_row_floats;
          }
        }
      }
    }
  }
}

}  // namespace

void sgemm_avx512(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) {  // C = beta * C; beta = 0 clears C, even of NaN
    for (int64_t i = 0; i < M; ++i) {
      float* row = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
    }
    return;
  }
  const View a{A, trans_a ? 1 : lda, trans_a ? lda : 1};
  const View b{B, trans_b ? 1 : ldb, trans_b ? ldb : 1};
  if (transpose_product<kNr>(M, N)) {
    run(N, M, K, alpha, View{b.p, b.cs, b.rs}, View{a.p, a.cs, a.rs}, beta, C, 1, ldc);
    return;
  }
  run(M, N, K, alpha, a, b, beta, C, ldc, 1);
}

}  // namespace tessel::ops::detail

#endif  // __AVX512F__
