// Private to ops, the vector levels' direct convolution only: the register-blocked tiles
// (conv_direct_driver.h stages each image and calls them), and the prefetcher that streams the
// next image in between tiles. Each level's translation unit (conv_direct_avx2.cc,
// conv_direct_avx512.cc) includes this header and instantiates it with its policy P: the vector
// type and its operations (P::Vec of P::kLanes floats: zero, load, load_head, store_head, set1,
// fmadd, relu, transpose) and how many positions or taps a tile holds in that level's registers
// (P::max_width, P::max_tap_rows). Nothing else differs between levels, so every output's sum
// runs in one order on every level (the portable kernel, conv_direct_portable.cc, spells it out).
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
// gcc must not apply predictive commoning here (CMake turns it off for the files that include
// this): the broadcasts read overlapping windows of an input row, and it would carry values
// from one loop iteration to the next through the stack.
#pragma once

#include <xmmintrin.h>  // _mm_prefetch (baseline x86-64)

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "conv_impl.h"

namespace tessel::ops::detail {
// Internal linkage on purpose: this header is compiled into translation units of different ISA
// levels, and an inline function or template instantiation with external linkage would be one
// symbol that the linker takes from any of them, wider instructions and all. The templates are
// named after their policy (tessel::ops::avx2::..., ::avx512::...); what is not a template is
// always inlined.
namespace {

// Pulls the next image's operands toward L2 while this image computes from cache (a batch of
// activations outgrows L2, and often L3), a few cache lines between tiles: hundreds of
// prefetches in one burst would overflow the misses the core keeps in flight, and most would
// be dropped. Lines for writing are fetched the same way (AMD has no L2 prefetch-for-write),
// which spares the stores a read-for-ownership stall.
class Prefetcher {
 public:
  // The next image's ranges; `steps`: how many step() calls the image will make.
  [[gnu::always_inline]] inline void start(
      std::initializer_list<std::pair<const float*, int64_t>> ranges, int64_t steps) {
    n_ = 0;
    int64_t lines = 0;
    for (const auto& [p, floats] : ranges) {
      if (p == nullptr || floats <= 0 || n_ == kRanges) continue;
      const char* c = reinterpret_cast<const char*>(p);
      r_[n_++] = {c, c + floats * int64_t{sizeof(float)}};
      lines += (floats * int64_t{sizeof(float)} + 63) / 64;
    }
    cur_ = 0;
    per_step_ = std::max<int64_t>(1, (lines + steps - 1) / std::max<int64_t>(steps, 1));
  }
  [[gnu::always_inline]] inline void step() {
    for (int64_t i = 0; i < per_step_ && cur_ < n_; ++i) {
      _mm_prefetch(r_[cur_].p, _MM_HINT_T1);
      r_[cur_].p += 64;
      if (r_[cur_].p >= r_[cur_].end) ++cur_;
    }
  }
  // Whatever is left (an image with fewer steps than planned).
  [[gnu::always_inline]] inline void finish() {
    while (cur_ < n_) step();
  }

 private:
  static constexpr int kRanges = 4;
  struct Range {
    const char *p, *end;
  };
  Range r_[kRanges] = {};
  int n_ = 0, cur_ = 0;
  int64_t per_step_ = 1;
};

// One lane block's forward (or input-gradient) work over one image: the block's output
// channels (or the input channels, for the input gradient) in v vectors per position.
struct RowsJob {
  const float* in;  // padded input: channel c, row r, column q at in[c * plane + r * ld + q]
  int64_t plane, ld, C, KH, KW;
  const float* wp;    // the block's packed weights [C * KH * KW][v * kLanes]
  const float* bias;  // the block's bias [count], or null
  bool relu;
  float* out;  // block channel l, position (oh, ow) at out[l * out_plane + oh * OW + ow]
  int64_t out_plane, OW;
  int count;
  Prefetcher* prefetch;  // stepped after each tile, or null
};

// One lane block of output channels over one image.
struct DwJob {
  const float* in;  // padded input, as RowsJob::in
  int64_t plane, ld, KH, OH, OW;
  const float* dyt;  // dyT at the block's first channel: position p's channels at dyt + p * ldd
  int64_t ldd;
  float* dwt;  // dwT at the block's first channel: tap t's channels at dwt + t * ldd
};

// ---- Forward / input gradient ----

// Bias, ReLU, and the transpose of one output row of the tile: acc[i] holds position i's
// channels; each channel's RW positions go to its output row with one masked store per kLanes.
template <class P, int RW>
inline void store_row(const RowsJob& j, const typename P::Vec* acc, int v, float* out) {
  constexpr int kL = P::kLanes;
  const int lanes = std::min(kL, j.count - v * kL);
  for (int i0 = 0; i0 < RW; i0 += kL) {
    typename P::Vec t[kL];
#pragma GCC unroll 16
    for (int i = 0; i < kL; ++i) {
      t[i] = i0 + i < RW ? acc[i0 + i] : P::zero();
      if (j.relu) t[i] = P::relu(t[i]);  // max(t, +0): NaN -> +0, as relu_forward
    }
    P::transpose(t);
    float* o = out + v * kL * j.out_plane + i0;
    for (int l = 0; l < lanes; ++l) P::store_head(o + l * j.out_plane, RW - i0, t[l]);
  }
}

// acc0[i] (and acc1[i]) += row[i] * w0 (and w1) for the RW positions of one tile row: one
// broadcast per position, V FMAs each.
template <class P, int V, int RW>
[[gnu::always_inline]] inline void fma_row(typename P::Vec* acc0, typename P::Vec* acc1,
                                           const float* row, typename P::Vec w0,
                                           typename P::Vec w1) {
#pragma GCC unroll 28
  for (int i = 0; i < RW; ++i) {
    const typename P::Vec a = P::set1(row[i]);
    acc0[i] = P::fmadd(a, w0, acc0[i]);
    if constexpr (V == 2) acc1[i] = P::fmadd(a, w1, acc1[i]);
  }
}

// One input row under a two-row tile of V = 1: position i's value feeds the top row through
// weight wt and the bottom row through wb, two FMAs per broadcast.
template <class P, int RW>
[[gnu::always_inline]] inline void fma_row_pair(typename P::Vec* top, typename P::Vec* bottom,
                                                const float* row, typename P::Vec wt,
                                                typename P::Vec wb) {
#pragma GCC unroll 28
  for (int i = 0; i < RW; ++i) {
    const typename P::Vec a = P::set1(row[i]);
    top[i] = P::fmadd(a, wt, top[i]);
    bottom[i] = P::fmadd(a, wb, bottom[i]);
  }
}

// The RH x RW positions from (oh, ow0) for one lane block of V vectors. Each position's sum
// starts at the bias (or +0) and takes its taps in the order (c, kh, kw), in both branches.
template <class P, int V, int RH, int RW>
void rows_tile(const RowsJob& j, int64_t oh, int64_t ow0) {
  using Vec = typename P::Vec;
  constexpr int kL = P::kLanes;
  constexpr int kP = RH * RW;
  Vec init0 = P::zero(), init1 = P::zero();
  if (j.bias != nullptr) {
    init0 = P::load_head(j.bias, j.count);
    if (V == 2) init1 = P::load_head(j.bias + kL, j.count - kL);
  }
  Vec acc0[kP], acc1[V == 2 ? kP : 1];
#pragma GCC unroll 28
  for (int p = 0; p < kP; ++p) {
    acc0[p] = init0;
    if constexpr (V == 2) acc1[p] = init1;
  }
  const float* base = j.in + oh * j.ld + ow0;
  if constexpr (V == 1 && RH == 2) {
    // Input row r of the window feeds tile row 0 through tap row kh = r and tile row 1
    // through kh = r - 1: half the broadcasts of taking the two rows one by one.
    const Vec none = P::zero();
    const int64_t step = j.KW * kL;  // packed floats per tap row
    for (int64_t c = 0; c < j.C; ++c) {
      const float* in = base + c * j.plane;
      const float* wc = j.wp + c * j.KH * step;
      for (int64_t kw = 0; kw < j.KW; ++kw) {
        fma_row<P, 1, RW>(acc0, nullptr, in + kw, P::load(wc + kw * kL), none);
      }
      for (int64_t r = 1; r < j.KH; ++r) {
        const float* row = in + r * j.ld;
        const float* wt = wc + r * step;
        for (int64_t kw = 0; kw < j.KW; ++kw) {
          fma_row_pair<P, RW>(acc0, acc0 + RW, row + kw, P::load(wt + kw * kL),
                              P::load(wt - step + kw * kL));
        }
      }
      const float* last = in + j.KH * j.ld;
      for (int64_t kw = 0; kw < j.KW; ++kw) {
        fma_row<P, 1, RW>(acc0 + RW, nullptr, last + kw, P::load(wc + (j.KH - 1) * step + kw * kL),
                          none);
      }
    }
  } else {
    const float* wk = j.wp;
    for (int64_t c = 0; c < j.C; ++c) {
      for (int64_t kh = 0; kh < j.KH; ++kh) {
        const float* r0 = base + c * j.plane + kh * j.ld;
        for (int64_t kw = 0; kw < j.KW; ++kw) {
          const Vec w0 = P::load(wk);
          const Vec w1 = V == 2 ? P::load(wk + kL) : w0;
#pragma GCC unroll 2
          for (int h = 0; h < RH; ++h) {
            fma_row<P, V, RW>(acc0 + h * RW, acc1 + (V == 2 ? h * RW : 0), r0 + h * j.ld + kw, w0,
                              w1);
          }
          wk += V * kL;
        }
      }
    }
  }
  for (int h = 0; h < RH; ++h) {
    float* out = j.out + (oh + h) * j.OW + ow0;
    store_row<P, RW>(j, acc0 + h * RW, 0, out);
    if constexpr (V == 2) store_row<P, RW>(j, acc1 + h * RW, 1, out);
  }
}

using RowsFn = void (*)(const RowsJob&, int64_t, int64_t);
constexpr int kMaxRowWidth = 14;  // no level's tile row is wider

template <class P, int V, int RH, int... I>
constexpr std::array<RowsFn, kMaxRowWidth + 1> make_rows(std::integer_sequence<int, I...>) {
  static_assert(P::max_width(V, RH) <= kMaxRowWidth);
  return {nullptr, &rows_tile<P, V, RH, I + 1>...};
}
// kRows<P, V, RH>[RW]: tile of RH rows x RW columns.
template <class P, int V, int RH>
constexpr auto kRows = make_rows<P, V, RH>(std::make_integer_sequence<int, P::max_width(V, RH)>{});

// ---- Weight gradient ----

// Tap rows [row0, row0 + TH) of (c, kh) = (row / KH, row % KH), each with all KW taps. Each
// tap's sum continues from dwT over the image's positions in order.
template <class P, int V, int KW, int TH>
void dw_tile(const DwJob& j, int64_t row0) {
  using Vec = typename P::Vec;
  constexpr int kL = P::kLanes;
  constexpr int kT = TH * KW;
  const float* rows[TH];
  for (int h = 0; h < TH; ++h) {
    rows[h] = j.in + (row0 + h) / j.KH * j.plane + (row0 + h) % j.KH * j.ld;
  }
  float* dst = j.dwt + row0 * KW * j.ldd;
  Vec acc0[kT], acc1[V == 2 ? kT : 1];
#pragma GCC unroll 28
  for (int t = 0; t < kT; ++t) {
    acc0[t] = P::load(dst + t * j.ldd);
    if constexpr (V == 2) acc1[t] = P::load(dst + t * j.ldd + kL);
  }
  const float* d = j.dyt;
  for (int64_t oh = 0; oh < j.OH; ++oh) {
    const float* r[TH];
    for (int h = 0; h < TH; ++h) r[h] = rows[h] + oh * j.ld;
    for (int64_t ow = 0; ow < j.OW; ++ow, d += j.ldd) {
      const Vec d0 = P::load(d);
      const Vec d1 = V == 2 ? P::load(d + kL) : d0;
#pragma GCC unroll 28
      for (int t = 0; t < kT; ++t) {
        const Vec a = P::set1(r[t / KW][ow + t % KW]);
        acc0[t] = P::fmadd(a, d0, acc0[t]);
        if constexpr (V == 2) acc1[t] = P::fmadd(a, d1, acc1[t]);
      }
    }
  }
#pragma GCC unroll 28
  for (int t = 0; t < kT; ++t) {
    P::store(dst + t * j.ldd, acc0[t]);
    if constexpr (V == 2) P::store(dst + t * j.ldd + kL, acc1[t]);
  }
}

using DwFn = void (*)(const DwJob&, int64_t);
constexpr int kMaxTapRows = 8;
// Tap rows per tile: at least one, at most kMaxTapRows, else as many as the level's registers
// hold (P::max_tap_rows).
template <class P>
constexpr int tap_rows(int v, int kw) {
  return std::clamp(P::max_tap_rows(v, kw), 1, kMaxTapRows);
}

template <class P, int V, int KW, int... I>
constexpr std::array<DwFn, kMaxTapRows + 1> make_dw(std::integer_sequence<int, I...>) {
  return {nullptr, &dw_tile<P, V, KW, I + 1>...};
}
template <class P, int V, int... I>
constexpr std::array<std::array<DwFn, kMaxTapRows + 1>, kDirectMaxKW + 1> make_dw_all(
    std::integer_sequence<int, I...>) {
  return {std::array<DwFn, kMaxTapRows + 1>{},
          make_dw<P, V, I + 1>(std::make_integer_sequence<int, tap_rows<P>(V, I + 1)>{})...};
}
// kDw<P, V>[KW][TH]
template <class P, int V>
constexpr auto kDw = make_dw_all<P, V>(std::make_integer_sequence<int, kDirectMaxKW>{});

// How conv_rows covers an output for a block of v vectors: V = 1 goes two output rows at a time
// (they share broadcasts); V = 2 one row, or two where rows fit a two-row tile's width, so that
// a tile keeps enough independent FMA chains. Rows are cut into tiles of near equal width (at
// AVX-512, 28 columns -> 10 + 9 + 9 for V = 1, 30 -> 10 + 10 + 10 for V = 2).
template <class P>
struct RowTiling {
  int64_t rh, max_w, tiles;  // rows per tile, widest tile, tiles per row group
  RowTiling(int v, int64_t OW)
      : rh(v == 1 || OW <= P::max_width(2, 2) ? 2 : 1),
        max_w(P::max_width(v, static_cast<int>(rh))),
        tiles((OW + max_w - 1) / max_w) {}
  int64_t count(int64_t OH) const { return (OH + rh - 1) / rh * tiles; }
};

// Runs every tile of the OH x j.OW output of a lane block of v vectors (v = 1: up to kLanes
// channels, 2: up to 2 kLanes), stepping j.prefetch after each tile.
template <class P>
void conv_rows(const RowsJob& j, int v, int64_t OH) {
  const RowTiling<P> tiling(v, j.OW);
  const int64_t rh = tiling.rh;
  const auto& group = v == 2 ? (rh == 2 ? kRows<P, 2, 2> : kRows<P, 2, 1>) : kRows<P, 1, 2>;
  const auto& single = v == 2 ? kRows<P, 2, 1> : kRows<P, 1, 1>;  // a last, odd row
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

// How many tiles conv_rows runs for that output.
template <class P>
int64_t conv_rows_tiles(int v, int64_t OW, int64_t OH) {
  return RowTiling<P>(v, OW).count(OH);
}

// Adds one image's weight gradient for tap rows [0, tap_rows) (a tap row is (c, kh)) of a lane
// block of v vectors into j.dwt, stepping pf (if not null) after each tile.
template <class P>
void conv_dw(const DwJob& j, int v, int64_t KW, int64_t rows, Prefetcher* pf) {
  const auto& kernels = (v == 2 ? kDw<P, 2> : kDw<P, 1>)[KW];
  const int64_t th = tap_rows<P>(v, static_cast<int>(KW));
  for (int64_t r0 = 0; r0 < rows; r0 += th) {
    kernels[std::min(th, rows - r0)](j, r0);
    if (pf != nullptr) pf->step();
  }
}

// How many tiles conv_dw runs.
template <class P>
int64_t conv_dw_tiles(int v, int64_t KW, int64_t rows) {
  const int64_t th = tap_rows<P>(v, static_cast<int>(KW));
  return (rows + th - 1) / th;
}

}  // namespace
}  // namespace tessel::ops::detail
