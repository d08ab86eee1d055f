// Private to ops: the blocking loops of tessel's f32 GEMM in the BLIS / GotoBLAS layout, shared
// by the AVX2 and AVX-512 kernels (sgemm_avx2.cc, sgemm_avx512.cc), each of which includes this
// header into its own ISA-specific translation unit and instantiates gemm_run with its policy.
//
// Terms: op(A) is M x K, op(B) is K x N. A tile is a block of at most Mr x Nr of C that the
// micro-kernel holds in vector accumulators while it runs over k: per k it loads one row of Nr
// floats of op(B), broadcasts each of the tile's op(A) values and issues Nr / lanes FMAs per
// tile row. Its operands come packed into contiguous micro-panels: an A micro-panel holds the
// tile's rows of op(A), in whichever of two layouts A's storage copies into without a
// transpose (ALayout); a B micro-panel holds Nr columns of op(B) k-major, zero padded past
// N, transposed in registers when B's columns run along k. Packing takes element strides, so
// one kernel serves all four transpose combinations and any leading dimensions.
//
// M is cut into ceil(M / Mr) tiles of near equal height (128 rows at Mr = 14 -> 8 x 13 + 2 x
// 12 rather than 9 x 14 + 2), since a short tile has too few independent FMA chains.
// Blocking, outermost first:
//   for each N block of <= kNc columns
//     for each K block of sum_block_k(K) (beta applies in the first; later blocks add onto C)
//       pack the op(B) block into B micro-panels (kc x nc, from L2/L3)
//       for each group of <= kMcTiles tiles: pack their A micro-panels (stays in L2)
//         for each B micro-panel (kc x Nr, stays in L1), for each tile: micro-kernel
// Where the policy's kernel takes A's row stride (AVX2) and A is f32 with rows along k, the
// tiles read A in place instead of packing it (their rows are as contiguous either way; the
// copy cost 3-16% on char_gpt's shapes, AVX2).
// The K blocks are the sum order every level shares (gemm_blocking.h), so the result's bits do
// not depend on the level. When few tiles share each B micro-panel and B's rows are
// contiguous, the kernel reads B in place instead (packing would cost about as much as it
// saves).
//
// C may be f32 or (AVX2 policy, gemm_lowp) 16-bit: see CElem.
//
// When N is far from a multiple of Nr while M is not (N = 10 would waste most lanes), the
// product is computed transposed, C^T = op(B)^T op(A)^T: the operands swap roles and the kernel
// stores its tile transposed. Every element's sum is the same either way.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "gemm_blocking.h"

namespace tessel::ops::detail {
// Internal linkage on purpose: this header is compiled into translation units of different ISA
// levels, and an inline function or template instantiation with external linkage would be one
// symbol that the linker takes from any of them, wider instructions and all.
namespace {

// How a view's elements become the f32 values the kernel multiplies: kF32 as they are (ops::gemm);
// the others are gemm_lowp's operands, each rounded to bf16 while packing (f32 and f16 to
// nearest even, in integer lanes as ops::convert rounds; bf16 widened exactly). Only the AVX2
// policy packs those; the kernel and the sum order are the same for every kind.
enum class Elem { kF32, kF32Bf16, kBf16, kF16Bf16 };

// Element (r, c) of a strided matrix view is element r * rs + c * cs of p; one of rs, cs is 1.
struct View {
  const void* p;
  int64_t rs, cs;
  Elem e = Elem::kF32;
  int64_t offset(int64_t r, int64_t c) const { return r * rs + c * cs; }
  // Element (r, c) of an f32 view.
  const float* at(int64_t r, int64_t c) const {
    return static_cast<const float*>(p) + offset(r, c);
  }
  // The view whose element (0, 0) is this one's (r, c).
  View from(int64_t r, int64_t c) const {
    const int64_t bytes = e == Elem::kF32 || e == Elem::kF32Bf16 ? 4 : 2;
    return {static_cast<const char*>(p) + offset(r, c) * bytes, rs, cs, e};
  }
  View transposed() const { return {p, cs, rs, e}; }
};

// An A micro-panel comes in one of two layouts, whichever packs by plain copies:
//   kInterleaved: a(i, k) at out[k * rows + i], from a matrix whose columns run along i;
//   kRows: a(i, k) at out[i * kSumKc + k], from a matrix whose rows run along k. The row
//   stride is the constant kSumKc so that the kernel addresses each row by an immediate offset.
enum class ALayout { kInterleaved, kRows };

inline ALayout a_layout(const View& a) {
  return a.cs == 1 ? ALayout::kRows : ALayout::kInterleaved;
}

// How C's elements are stored: f32, or gemm_lowp's 16-bit C (AVX2 policy only), which the
// tile widens to f32 when beta reads it and rounds to nearest even when it stores it (as
// ops::convert rounds).
enum class CElem { kF32, kBf16, kF16 };

inline int64_t c_bytes(CElem e) { return e == CElem::kF32 ? 4 : 2; }

// Element `off` of a C buffer of kind e.
inline void* c_at(void* p, CElem e, int64_t off) {
  return static_cast<char*>(p) + off * c_bytes(e);
}

// Where a tile goes: its element (i, j) is element i * rs + j * cs of c (stored as kind e),
// columns j < cols are stored; beta scales element i * rs + j * cs of c_in (kind e_in, read only
// when beta != 0), which is c itself except while a 16-bit C waits in f32 staging between K
// blocks. Either cs = 1 (C rows) or rs = 1 (transposed product, C columns).
struct TileOut {
  void* c;
  const void* c_in;
  int64_t rs, cs;
  int cols;
  float alpha, beta;  // beta = 0: C is not read
  CElem e = CElem::kF32, e_in = CElem::kF32;
};

// The micro-kernel of a tile of `rows` rows; row k of the B micro-panel is at b + k * ldb; in
// layout kRows row i of the A micro-panel is at a + i * lda (kSumKc packed; A's own row stride
// where the policy reads A in place).
using TileKernel = void (*)(int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb,
                            const TileOut& t);

// An ISA's policy P: kMr, kNr, kMcTiles, kNc, kDirectBTiles, kDirectA, pack_a, pack_b, and the
// micro-kernel of a tile of R rows in layout L as P::tile<R, L> (a TileKernel).

// The micro-kernels of P by layout and tile height: tile_kernel<P>(layout, rows).
template <class P, ALayout L, int... I>
constexpr std::array<TileKernel, P::kMr + 1> tile_kernels(std::integer_sequence<int, I...>) {
  return {nullptr, P::template tile<I + 1, L>...};
}
template <class P>
TileKernel tile_kernel(ALayout layout, int rows) {
  static constexpr auto kRows =
      tile_kernels<P, ALayout::kRows>(std::make_integer_sequence<int, P::kMr>{});
  static constexpr auto kInterleaved =
      tile_kernels<P, ALayout::kInterleaved>(std::make_integer_sequence<int, P::kMr>{});
  return layout == ALayout::kRows ? kRows[rows] : kInterleaved[rows];
}

// C's storage: element (i, j) at element i * rs + j * cs of p, of kind e.
struct CView {
  void* p;
  int64_t rs, cs;
  CElem e;
};

// C = alpha * op(A) @ op(B) + beta * C over views. A 16-bit C is rounded once, when its sum is
// complete: with several K blocks the partial sums wait in f32 staging laid out as C (so the
// bits are those of an f32 C widened from it, updated and rounded: gemm_lowp's portable path).
template <class P>
void gemm_blocks(int64_t M, int64_t N, int64_t K, float alpha, const View& a, const View& b,
                 float beta, const CView& c) {
  static thread_local Scratch<float> tls_a, tls_b, tls_c;
  const RowTiles<P::kMr> tiles(M);
  const int64_t kc_max = sum_block_k(K);
  const int64_t nc_max = std::min<int64_t>((N + P::kNr - 1) / P::kNr * P::kNr, P::kNc);
  const ALayout layout = a_layout(a);
  // kPackSlack: pack_a may write one vector of zeros past the last panel of a group.
  constexpr int64_t kPackSlack = 16;
  float* pa = tls_a.get(std::min(tiles.count, P::kMcTiles) * P::kMr * kSumKc + kPackSlack);
  float* pb = tls_b.get(nc_max * kc_max);
  const bool staged = c.e != CElem::kF32 && K > kc_max;
  float* staging = staged ? tls_c.get((M - 1) * c.rs + (N - 1) * c.cs + 1) : nullptr;
  // Full B micro-panels are read in place (edge panels still need their zero padding); so are
  // f32 A rows along k where the policy's kernel takes their stride (P::kDirectA).
  const bool direct_b = b.cs == 1 && b.e == Elem::kF32 && tiles.count <= P::kDirectBTiles;
  const bool direct_a = P::kDirectA && layout == ALayout::kRows && a.e == Elem::kF32;
  for (int64_t j0 = 0; j0 < N; j0 += P::kNc) {
    const int64_t nc = std::min(P::kNc, N - j0);
    for (int64_t p0 = 0; p0 < K; p0 += kc_max) {
      const int64_t kc = std::min(kc_max, K - p0);
      const float beta_k = p0 == 0 ? beta : 1.0f;
      // This K block reads C (first) or the staging, and writes C (last) or the staging.
      const CView in = staged && p0 > 0 ? CView{staging, c.rs, c.cs, CElem::kF32} : c;
      const CView out = staged && p0 + kc < K ? CView{staging, c.rs, c.cs, CElem::kF32} : c;
      for (int64_t jr = 0; jr < nc; jr += P::kNr) {
        const int cols = static_cast<int>(std::min<int64_t>(P::kNr, nc - jr));
        if (!direct_b || cols < P::kNr) {
          P::pack_b(b.from(p0, j0 + jr), kc, cols, pb + jr * kc);
        }
      }
      for (int64_t t0 = 0; t0 < tiles.count; t0 += P::kMcTiles) {
        const int64_t t1 = std::min(tiles.count, t0 + P::kMcTiles);
        const int64_t a_row_floats = layout == ALayout::kRows ? kSumKc : kc;  // per tile row
        float* dst = pa;
        for (int64_t t = t0; t < t1 && !direct_a; ++t) {
          P::pack_a(a.from(tiles.start(t), p0), tiles.rows(t), kc, dst);
          dst += tiles.rows(t) * a_row_floats;
        }
        for (int64_t jr = 0; jr < nc; jr += P::kNr) {
          const int cols = static_cast<int>(std::min<int64_t>(P::kNr, nc - jr));
          const bool in_place = direct_b && cols == P::kNr;
          const float* bp = in_place ? b.at(p0, j0 + jr) : pb + jr * kc;
          const int64_t ldb = in_place ? b.rs : P::kNr;
          const float* ap = pa;
          for (int64_t t = t0; t < t1; ++t) {
            const int rows = tiles.rows(t);
            if (direct_a) ap = a.at(tiles.start(t), p0);
            const int64_t off = tiles.start(t) * c.rs + (j0 + jr) * c.cs;
            void* to = c_at(out.p, out.e, off);
            const void* from = c_at(in.p, in.e, off);
            const TileOut tile{to, from, c.rs, c.cs, cols, alpha, beta_k, out.e, in.e};
            tile_kernel<P>(layout, rows)(kc, ap, direct_a ? a.rs : kSumKc, bp, ldb, tile);
            ap += rows * a_row_floats;
          }
        }
      }
    }
  }
}

// ops::gemm's contract for K > 0 and alpha != 0 (the caller handles the rest), over row-major
// A and B of element kinds ea and eb and C of kind ec.
template <class P>
void gemm_run(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const void* A, Elem ea, int64_t lda, const void* B, Elem eb, int64_t ldb, float beta,
              void* C, CElem ec, int64_t ldc) {
  const View a{A, trans_a ? 1 : lda, trans_a ? lda : 1, ea};
  const View b{B, trans_b ? 1 : ldb, trans_b ? ldb : 1, eb};
  if (transpose_product<P::kNr>(M, N)) {
    gemm_blocks<P>(N, M, K, alpha, b.transposed(), a.transposed(), beta, {C, 1, ldc, ec});
    return;
  }
  gemm_blocks<P>(M, N, K, alpha, a, b, beta, {C, ldc, 1, ec});
}

}  // namespace
}  // namespace tessel::ops::detail
