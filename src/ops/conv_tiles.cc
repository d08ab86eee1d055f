// The register-blocked tiles of the direct convolution (see conv_direct.cc for the whole).
//
// Forward and input gradient share one kernel, rows_tile: a tile of RH output rows x RW
// output columns and one lane block of output channels keeps its RH*RW*V accumulators in
// registers while it runs over all input channels c and taps (kh, kw). Per tap it loads the V
// weight vectors and, for each position, broadcasts the one input value that position sees
// (padded row oh + kh, column ow + kw) straight from memory into its FMAs: the input rows are
// read in place, at offsets fixed per tile. The finished tile gets the bias (and the ReLU) and
// is transposed in registers into the NCHW output rows. The input gradient of a stride-1
// convolution is the same computation over dy zero-padded by K - 1 - pad on each side, with
// the kernel flipped in kh and kw and the roles of C and OC swapped.
//
// Weight gradient, dw_tile: dw[oc, c, kh, kw] = sum over images and positions of
// dy[oc, oh, ow] * xpad[c, oh + kh, ow + kw]. A tile is TH tap rows (c, kh) x all KW taps x
// one lane block of output channels. Per position it loads the V vectors of dy (transposed per
// image into dyT[P, OCp], channels along lanes) and broadcasts each tap's input value. The
// accumulators stay in registers over a whole image and wait in dwT[K, OCp] between images;
// dw gets dwT once at the end.
//
// gcc must not apply predictive commoning here (CMake turns it off for this file): the
// broadcasts read overlapping windows of an input row, and it would carry values from one
// loop iteration to the next through the stack.
#include "conv_tiles.h"


#include <array>
#include <utility>

#include "conv_impl.h"

namespace tessel::ops::avx512 {
namespace {

// ---- Forward / input gradient ----

// Bias, ReLU, and the transpose of one output row of the tile: acc[i] holds position i's
// channels; each channel's RW positions go to its output row with one masked store per 16.
template <int RW>
inline void store_row(const RowsJob& j, const __m512* acc, int v, float* out) {
  const int lanes = std::min(kLanes, j.count - v * kLanes);
  for (int i0 = 0; i0 < RW; i0 += kLanes) {
    __m512 t[kLanes];
#pragma GCC unroll 16
    for (int i = 0; i < kLanes; ++i) {
      t[i] = i0 + i < RW ? acc[i0 + i] : _mm512_setzero_ps();
      if (j.relu) t[i] = _mm512_max_ps(t[i], _mm512_setzero_ps());  // NaN -> 0, as relu_forward
    }
    transpose16(t);
    const __mmask16 mask = head_mask(RW - i0);
    float* o = out + v * kLanes * j.out_plane + i0;
    for (int l = 0; l < lanes; ++l) _mm512_mask_storeu_ps(o + l * j.out_plane, mask, t[l]);
  }
}

// acc0[i] (and acc1[i]) += row[i] * w0 (and w1) for the RW positions of one tile row: one
// broadcast per position, V FMAs each.
template <int V, int RW>
[[gnu::always_inline]] inline void fma_row(__m512* acc0, __m512* acc1, const float* row, __m512 w0,
                                           __m512 w1) {
#pragma GCC unroll 28
  for (int i = 0; i < RW; ++i) {
    const __m512 a = _mm512_set1_ps(row[i]);
    acc0[i] = _mm512_fmadd_ps(a, w0, acc0[i]);
    if constexpr (V == 2) acc1[i] = _mm512_fmadd_ps(a, w1, acc1[i]);
  }
}

// One input row under a two-row tile of V = 1: position i's value feeds the top row through
// weight wt and the bottom row through wb, two FMAs per broadcast.
template <int RW>
[[gnu::always_inline]] inline void fma_row_pair(__m512* top, __m512* bottom, const float* row,
                                                __m512 wt, __m512 wb) {
#pragma GCC unroll 28
  for (int i = 0; i < RW; ++i) {
    const __m512 a = _mm512_set1_ps(row[i]);
    top[i] = _mm512_fmadd_ps(a, wt, top[i]);
    bottom[i] = _mm512_fmadd_ps(a, wb, bottom[i]);
  }
}

// The RH x RW positions from (oh, ow0) for one lane block of V zmm.
template <int V, int RH, int RW>
void rows_tile(const RowsJob& j, int64_t oh, int64_t ow0) {
  constexpr int kP = RH * RW;
  __m512 init0 = _mm512_setzero_ps(), init1 = _mm512_setzero_ps();
  if (j.bias != nullptr) {
    init0 = _mm512_maskz_loadu_ps(head_mask(j.count), j.bias);
    if (V == 2) init1 = _mm512_maskz_loadu_ps(head_mask(j.count - kLanes), j.bias + kLanes);
  }
  __m512 acc0[kP], acc1[V == 2 ? kP : 1];
#pragma GCC unroll 28
  for (int p = 0; p < kP; ++p) {
    acc0[p] = init0;
    if constexpr (V == 2) acc1[p] = init1;
  }
  const float* base = j.in + oh * j.ld + ow0;
  if constexpr (V == 1 && RH == 2) {
    // Input row r of the window feeds tile row 0 through tap row kh = r and tile row 1
    // through kh = r - 1: half the broadcasts of taking the two rows one by one.
    const __m512 none = _mm512_setzero_ps();
    const int64_t step = j.KW * kLanes;  // packed floats per tap row
    for (int64_t c = 0; c < j.C; ++c) {
      const float* in = base + c * j.plane;
      const float* wc = j.wp + c * j.KH * step;
      for (int64_t kw = 0; kw < j.KW; ++kw) {
        fma_row<1, RW>(acc0, nullptr, in + kw, _mm512_loadu_ps(wc + kw * kLanes), none);
      }
      for (int64_t r = 1; r < j.KH; ++r) {
        const float* row = in + r * j.ld;
        const float* wt = wc + r * step;
        for (int64_t kw = 0; kw < j.KW; ++kw) {
          fma_row_pair<RW>(acc0, acc0 + RW, row + kw, _mm512_loadu_ps(wt + kw * kLanes),
                           _mm512_loadu_ps(wt - step + kw * kLanes));
        }
      }
      const float* last = in + j.KH * j.ld;
      for (int64_t kw = 0; kw < j.KW; ++kw) {
        fma_row<1, RW>(acc0 + RW, nullptr, last + kw,
                       _mm512_loadu_ps(wc + (j.KH - 1) * step + kw * kLanes), none);
      }
    }
  } else {
    const float* wk = j.wp;
    for (int64_t c = 0; c < j.C; ++c) {
      for (int64_t kh = 0; kh < j.KH; ++kh) {
        const float* r0 = base + c * j.plane + kh * j.ld;
        for (int64_t kw = 0; kw < j.KW; ++kw) {
          const __m512 w0 = _mm512_loadu_ps(wk);
          const __m512 w1 = V == 2 ? _mm512_loadu_ps(wk + kLanes) : w0;
#pragma GCC unroll 2
          for (int h = 0; h < RH; ++h) {
            fma_row<V, RW>(acc0 + h * RW, acc1 + (V == 2 ? h * RW : 0), r0 + h * j.ld + kw, w0, w1);
          }
          wk += V * kLanes;
        }
      }
    }
  }
  for (int h = 0; h < RH; ++h) {
    float* out = j.out + (oh + h) * j.OW + ow0;
    store_row<RW>(j, acc0 + h * RW, 0, out);
    if constexpr (V == 2) store_row<RW>(j, acc1 + h * RW, 1, out);
  }
}

using RowsFn = void (*)(const RowsJob&, int64_t, int64_t);
// Widest tile row. V = 2: 14 positions of 2 zmm in one row (7 in each of two rows), with 2
// weight vectors and the broadcast beside them in the 32 zmm. V = 1: 14 positions in one row;
// in two rows 12 each, since the pair loop's second weight vector would otherwise spill.
constexpr int max_width(int v, int rh) {
  if (rh == 1) return 14;
  return v == 2 ? 7 : 12;
}

template <int V, int RH, int... I>
constexpr std::array<RowsFn, 15> make_rows(std::integer_sequence<int, I...>) {
  return {nullptr, &rows_tile<V, RH, I + 1>...};
}
// kRows<V, RH>[RW]: tile of RH rows x RW columns.
template <int V, int RH>
constexpr auto kRows = make_rows<V, RH>(std::make_integer_sequence<int, max_width(V, RH)>{});

// ---- Weight gradient ----

// Tap rows [row0, row0 + TH) of (c, kh) = (row / KH, row % KH), each with all KW taps.
template <int V, int KW, int TH>
void dw_tile(const DwJob& j, int64_t row0) {
  constexpr int kT = TH * KW;
  const float* rows[TH];
  for (int h = 0; h < TH; ++h) {
    rows[h] = j.in + (row0 + h) / j.KH * j.plane + (row0 + h) % j.KH * j.ld;
  }
  float* dst = j.dwt + row0 * KW * j.ldd;
  __m512 acc0[kT], acc1[V == 2 ? kT : 1];
#pragma GCC unroll 28
  for (int t = 0; t < kT; ++t) {
    acc0[t] = _mm512_loadu_ps(dst + t * j.ldd);
    if constexpr (V == 2) acc1[t] = _mm512_loadu_ps(dst + t * j.ldd + kLanes);
  }
  const float* d = j.dyt;
  for (int64_t oh = 0; oh < j.OH; ++oh) {
    const float* r[TH];
    for (int h = 0; h < TH; ++h) r[h] = rows[h] + oh * j.ld;
    for (int64_t ow = 0; ow < j.OW; ++ow, d += j.ldd) {
      const __m512 d0 = _mm512_loadu_ps(d);
      const __m512 d1 = V == 2 ? _mm512_loadu_ps(d + kLanes) : d0;
#pragma GCC unroll 28
      for (int t = 0; t < kT; ++t) {
        const __m512 a = _mm512_set1_ps(r[t / KW][ow + t % KW]);
        acc0[t] = _mm512_fmadd_ps(a, d0, acc0[t]);
        if constexpr (V == 2) acc1[t] = _mm512_fmadd_ps(a, d1, acc1[t]);
      }
    }
  }
#pragma GCC unroll 28
  for (int t = 0; t < kT; ++t) {
    _mm512_storeu_ps(dst + t * j.ldd, acc0[t]);
    if constexpr (V == 2) _mm512_storeu_ps(dst + t * j.ldd + kLanes, acc1[t]);
  }
}

using DwFn = void (*)(const DwJob&, int64_t);
constexpr int kMaxTapRows = 8;
// Tap rows per tile: TH * KW taps of V accumulators each, plus V for dy and one for the
// broadcast (gcc does not fold it into the FMA) fit the 32 zmm.
constexpr int max_tap_rows(int v, int kw) { return std::min(kMaxTapRows, (v == 2 ? 14 : 28) / kw); }

template <int V, int KW, int... I>
constexpr std::array<DwFn, kMaxTapRows + 1> make_dw(std::integer_sequence<int, I...>) {
  return {nullptr, &dw_tile<V, KW, I + 1>...};
}
template <int V, int... I>
constexpr std::array<std::array<DwFn, kMaxTapRows + 1>, kDirectMaxKW + 1> make_dw_all(
    std::integer_sequence<int, I...>) {
  return {std::array<DwFn, kMaxTapRows + 1>{},
          make_dw<V, I + 1>(std::make_integer_sequence<int, max_tap_rows(V, I + 1)>{})...};
}
// kDw<V>[KW][TH]
template <int V>
constexpr auto kDw = make_dw_all<V>(std::make_integer_sequence<int, kDirectMaxKW>{});

// How conv_rows covers an output for a block of v zmm: V = 1 goes two output rows at a time
// (they share broadcasts); V = 2 one row, or two where rows are at most 7 wide, so that a tile
// keeps enough independent FMA chains. Rows are cut into tiles of near equal width (28 columns
// -> 10 + 9 + 9 for V = 1, 30 -> 10 + 10 + 10 for V = 2).
struct RowTiling {
  int64_t rh, max_w, tiles;  // rows per tile, widest tile, tiles per row group
  RowTiling(int v, int64_t OW)
      : rh(v == 1 || OW <= max_width(2, 2) ? 2 : 1),
        max_w(max_width(v, static_cast<int>(rh))),
        tiles((OW + max_w - 1) / max_w) {}
  int64_t count(int64_t OH) const { return (OH + rh - 1) / rh * tiles; }
};

}  // namespace

void conv_rows(const RowsJob& j, int v, int64_t OH) {
  const RowTiling tiling(v, j.OW);
  const int64_t rh = tiling.rh;
  const auto& group = v == 2 ? (rh == 2 ? kRows<2, 2> : kRows<2, 1>) : kRows<1, 2>;
  const auto& single = v == 2 ? kRows<2, 1> : kRows<1, 1>;  // a last, odd row
  const int64_t tiles = tiling.tiles, base = j.OW / tiles, extra = j.OW % tiles;
  for (int64_t oh = 0; oh < OH; oh += rh) {
    const auto& kernels = oh + rh <= OH ? group : single;
    int64_t ow0 = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t width = base + (t < extra ? 1 : 0);
      kernels[width](j, oh, ow0);
      ow0 += width;
      if (j.prefetch != nullptr) j.prefetch->step();
    }
  }
}

int64_t conv_rows_tiles(int v, int64_t OW, int64_t OH) { return RowTiling(v, OW).count(OH); }

void conv_dw(const DwJob& j, int v, int64_t KW, int64_t tap_rows, Prefetcher* pf) {
  const auto& kernels = (v == 2 ? kDw<2> : kDw<1>)[KW];
  const int64_t th = max_tap_rows(v, static_cast<int>(KW));
  for (int64_t r0 = 0; r0 < tap_rows; r0 += th) {
    kernels[std::min(th, tap_rows - r0)](j, r0);
    if (pf != nullptr) pf->step();
  }
}

int64_t conv_dw_tiles(int v, int64_t KW, int64_t tap_rows) {
  const int64_t th = max_tap_rows(v, static_cast<int>(KW));
  return (tap_rows + th - 1) / th;
}

}  // namespace tessel::ops::avx512

