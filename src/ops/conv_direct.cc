// Direct convolution, stride 1, with tessel's own AVX-512 kernels: no column matrix.
//
// Terms. Positions are output pixels (oh, ow). A lane block is a run of up to 32 channels that
// a tile holds in V = 2 zmm per position, or up to 16 in V = 1 (the last block, when 16 or
// fewer channels remain); lanes past the channel count compute on zero weights and are never
// stored. Inputs are read zero-padded: x[n] copied into xpad[C, Hp, Wp] (Hp = H + 2 pad,
// Wp = W + 2 pad), so every tap of every position is in bounds and no loop branches on the
// border.
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
// Every sum runs in one fixed order (taps; positions; images in batch order), so the results
// are the same bits on every run and for any thread count.
#include <algorithm>
#include <array>
#include <utility>

#include "conv_impl.h"
#include "tessel/core/error.h"

#ifdef __AVX512F__
#include "simd_avx512.h"
#endif

namespace tessel::ops::detail {

#ifdef __AVX512F__
namespace {

constexpr int kL = 16;          // floats per zmm
constexpr int64_t kAlign = 16;  // floats: each scratch region starts 64-byte aligned

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Channels [first, first + count) of one tile, in v zmm per position.
struct LaneBlock {
  int64_t first;
  int count, v;
};

// Blocks of 32 channels while more than 16 remain, then one of <= 16. Block b's packed data
// starts at channel `first`, and all blocks together take round_up(channels, 16) lanes.
template <typename F>
void for_each_block(int64_t channels, F f) {
  for (int64_t first = 0; first < channels;) {
    const int v = channels - first > kL ? 2 : 1;
    const int count = static_cast<int>(std::min<int64_t>(channels - first, v * kL));
    f(LaneBlock{first, count, v});
    first += count;
  }
}

// wp[block][k][lane] = get(block first + lane, k), 0 past the block's count: the weight
// vectors of each reduction step k, contiguous.
template <typename Get>
void pack_lanes(float* wp, int64_t channels, int64_t K, Get get) {
  for_each_block(channels, [&](const LaneBlock& b) {
    float* dst = wp + b.first * K;
    const int lanes = b.v * kL;
    for (int64_t k = 0; k < K; ++k) {
      for (int l = 0; l < lanes; ++l) dst[k * lanes + l] = l < b.count ? get(b.first + l, k) : 0.0f;
    }
  });
}

// ---- Forward / input gradient ----

// One lane block's work over one image.
struct RowsJob {
  const float* in;  // padded input: channel c, row r, column q at in[c * plane + r * ld + q]
  int64_t plane, ld, C, KH, KW;
  const float* wp;    // the block's packed weights [C * KH * KW][v * 16]
  const float* bias;  // the block's bias [count], or null
  bool relu;
  float* out;  // block channel l, position (oh, ow) at out[l * out_plane + oh * OW + ow]
  int64_t out_plane, OW;
  int count;
};

// Bias, ReLU, and the transpose of one output row of the tile: acc[i] holds position i's
// channels; each channel's RW positions go to its output row with one masked store per 16.
template <int RW>
inline void store_row(const RowsJob& j, const __m512* acc, int v, float* out) {
  const int lanes = std::min(kL, j.count - v * kL);
  for (int i0 = 0; i0 < RW; i0 += kL) {
    __m512 t[kL];
#pragma GCC unroll 16
    for (int i = 0; i < kL; ++i) {
      t[i] = i0 + i < RW ? acc[i0 + i] : _mm512_setzero_ps();
      if (j.relu) t[i] = _mm512_max_ps(t[i], _mm512_setzero_ps());  // NaN -> 0, as relu_forward
    }
    transpose16(t);
    const __mmask16 mask = head_mask(RW - i0);
    float* o = out + v * kL * j.out_plane + i0;
    for (int l = 0; l < lanes; ++l) _mm512_mask_storeu_ps(o + l * j.out_plane, mask, t[l]);
  }
}

// acc0[i] (and acc1[i]) += row[i] * w0 (and w1) for the RW positions of one tile row: one
// broadcast per position, V FMAs each.
template <int V, int RW>
[[gnu::always_inline]] inline void fma_row(__m512* acc0, __m512* acc1, const float* row,
                                           __m512 w0, __m512 w1) {
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
    if (V == 2) init1 = _mm512_maskz_loadu_ps(head_mask(j.count - kL), j.bias + kL);
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
    const int64_t step = j.KW * kL;  // packed floats per tap row
    for (int64_t c = 0; c < j.C; ++c) {
      const float* in = base + c * j.plane;
      const float* wc = j.wp + c * j.KH * step;
      for (int64_t kw = 0; kw < j.KW; ++kw) {
        fma_row<1, RW>(acc0, nullptr, in + kw, _mm512_loadu_ps(wc + kw * kL), none);
      }
      for (int64_t r = 1; r < j.KH; ++r) {
        const float* row = in + r * j.ld;
        const float* wt = wc + r * step;
        for (int64_t kw = 0; kw < j.KW; ++kw) {
          fma_row_pair<RW>(acc0, acc0 + RW, row + kw, _mm512_loadu_ps(wt + kw * kL),
                           _mm512_loadu_ps(wt - step + kw * kL));
        }
      }
      const float* last = in + j.KH * j.ld;
      for (int64_t kw = 0; kw < j.KW; ++kw) {
        fma_row<1, RW>(acc0 + RW, nullptr, last + kw,
                       _mm512_loadu_ps(wc + (j.KH - 1) * step + kw * kL), none);
      }
    }
  } else {
    const float* wk = j.wp;
    for (int64_t c = 0; c < j.C; ++c) {
      for (int64_t kh = 0; kh < j.KH; ++kh) {
        const float* r0 = base + c * j.plane + kh * j.ld;
        for (int64_t kw = 0; kw < j.KW; ++kw) {
          const __m512 w0 = _mm512_loadu_ps(wk);
          const __m512 w1 = V == 2 ? _mm512_loadu_ps(wk + kL) : w0;
#pragma GCC unroll 2
          for (int h = 0; h < RH; ++h) {
            fma_row<V, RW>(acc0 + h * RW, acc1 + (V == 2 ? h * RW : 0), r0 + h * j.ld + kw, w0,
                           w1);
          }
          wk += V * kL;
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
// Widest tile row: V = 2 holds 14 positions of 2 zmm (7 in each of two rows), V = 1 two rows of
// 14 positions of 1 zmm, with 2 weight vectors and the broadcast beside them in the 32 zmm.
constexpr int max_width(int v, int rh) { return v == 2 && rh == 2 ? 7 : v == 1 && rh == 2 ? 12 : 14; }

template <int V, int RH, int... I>
constexpr std::array<RowsFn, 15> make_rows(std::integer_sequence<int, I...>) {
  return {nullptr, &rows_tile<V, RH, I + 1>...};
}
// kRows<V, RH>[RW]: tile of RH rows x RW columns.
template <int V, int RH>
constexpr auto kRows = make_rows<V, RH>(std::make_integer_sequence<int, max_width(V, RH)>{});

// All positions of an output of OH x j.OW for a block of v zmm. V = 1 goes two output rows at a
// time (they share broadcasts); V = 2 one row, or two where rows are at most 7 wide, so that a
// tile keeps enough independent FMA chains. Rows are cut into tiles of near equal width
// (28 columns -> 14 + 14, 30 -> 10 + 10 + 10).
void conv_rows(const RowsJob& j, int v, int64_t OH) {
  const int64_t rh = v == 1 || j.OW <= max_width(2, 2) ? 2 : 1;
  const int64_t max_w = max_width(v, static_cast<int>(rh));
  const auto& group = v == 2 ? (rh == 2 ? kRows<2, 2> : kRows<2, 1>) : kRows<1, 2>;
  const auto& single = v == 2 ? kRows<2, 1> : kRows<1, 1>;  // a last, odd row
  const int64_t tiles = (j.OW + max_w - 1) / max_w, base = j.OW / tiles, extra = j.OW % tiles;
  for (int64_t oh = 0; oh < OH; oh += rh) {
    const auto& kernels = oh + rh <= OH ? group : single;
    int64_t ow0 = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t width = base + (t < extra ? 1 : 0);
      kernels[width](j, oh, ow0);
      ow0 += width;
    }
  }
}

// ---- Weight gradient ----

// One lane block of output channels over one image.
struct DwJob {
  const float* in;  // padded input, as RowsJob::in
  int64_t plane, ld, KH, OH, OW;
  const float* dyt;  // dyT at the block's first channel: position p's channels at dyt + p * ldd
  int64_t ldd;
  float* dwt;  // dwT at the block's first channel: tap t's channels at dwt + t * ldd
};

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
    if constexpr (V == 2) acc1[t] = _mm512_loadu_ps(dst + t * j.ldd + kL);
  }
  const float* d = j.dyt;
  for (int64_t oh = 0; oh < j.OH; ++oh) {
    const float* r[TH];
    for (int h = 0; h < TH; ++h) r[h] = rows[h] + oh * j.ld;
    for (int64_t ow = 0; ow < j.OW; ++ow, d += j.ldd) {
      const __m512 d0 = _mm512_loadu_ps(d);
      const __m512 d1 = V == 2 ? _mm512_loadu_ps(d + kL) : d0;
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
    if constexpr (V == 2) _mm512_storeu_ps(dst + t * j.ldd + kL, acc1[t]);
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

// ---- Staging ----

// Asks for floats [p, p + n) in L2 ahead of use: the next image's operands stream from memory
// (a batch of activations outgrows L2 and often L3) while this image computes from cache.
// `write` fetches the lines for writing, which spares the store a read-for-ownership stall.
void prefetch_l2(const float* p, int64_t n, bool write = false) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t i = 0; i < n * int64_t{sizeof(float)}; i += 64) {
    if (write) {
      _mm_prefetch(c + i, _MM_HINT_ET1);
    } else {
      _mm_prefetch(c + i, _MM_HINT_T1);
    }
  }
}

// Scratch regions, in floats, each rounded to kAlign.
struct DirectPlan {
  int64_t P, K, Hp, Wp, DH, DW, OCp;
  int64_t wp_floats, xpad_floats, dypad_floats, dyt_floats, dwt_floats;
  explicit DirectPlan(const Conv2dShape& s)
      : P(s.OH() * s.OW()),
        K(s.C * s.KH * s.KW),
        Hp(s.H + 2 * s.pad),
        Wp(s.W + 2 * s.pad),
        DH(s.H + s.KH - 1),
        DW(s.W + s.KW - 1),
        OCp(round_up(s.OC, kL)),
        // Forward: [OCp lanes][C * taps]; input gradient: [Cp lanes][OC * taps].
        wp_floats(round_up(std::max(OCp * K, round_up(s.C, kL) * s.OC * s.KH * s.KW), kAlign)),
        xpad_floats(round_up(s.C * Hp * Wp, kAlign)),
        dypad_floats(round_up(s.OC * DH * DW, kAlign)),
        dyt_floats(round_up(P * OCp, kAlign)),
        dwt_floats(round_up(K * OCp, kAlign)) {}
  int64_t total() const {
    return wp_floats + xpad_floats + dypad_floats + dyt_floats + dwt_floats;
  }
};

// dst[c, r0 + h, q0 + w] = src[c, h, w] (times mask[c, h, w] > 0 when mask is given) for the
// rows x cols planes of `channels` channels; dst planes are dst_rows x dst_ld.
void copy_into_padded(float* dst, int64_t dst_rows, int64_t dst_ld, int64_t r0, int64_t q0,
                      const float* src, const float* mask, int64_t channels, int64_t rows,
                      int64_t cols) {
  const __mmask16 tail = head_mask(cols % kL);
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t h = 0; h < rows; ++h) {
      const int64_t at = (c * rows + h) * cols;
      float* d = dst + (c * dst_rows + r0 + h) * dst_ld + q0;
      for (int64_t w = 0; w < cols; w += kL) {
        const __mmask16 m = w + kL <= cols ? __mmask16(0xFFFF) : tail;
        __m512 v = _mm512_maskz_loadu_ps(m, src + at + w);
        if (mask != nullptr) {
          const __m512 y = _mm512_maskz_loadu_ps(m, mask + at + w);
          v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GT_OQ), v);
        }
        _mm512_mask_storeu_ps(d + w, m, v);
      }
    }
  }
}

// dyt[p * OCp + oc] = dy[oc * P + p] for one image (masked by relu_y > 0 when given), zero for
// OC <= oc < OCp: 16 x 16 blocks through registers.
void transpose_dy(float* dyt, const float* dy, const float* relu_y, const Conv2dShape& s,
                  const DirectPlan& p) {
  for (int64_t oc0 = 0; oc0 < p.OCp; oc0 += kL) {
    for (int64_t p0 = 0; p0 < p.P; p0 += kL) {
      const __mmask16 m = head_mask(p.P - p0);
      __m512 r[kL];
      for (int i = 0; i < kL; ++i) {
        const int64_t at = (oc0 + i) * p.P + p0;
        if (oc0 + i >= s.OC) {
          r[i] = _mm512_setzero_ps();
        } else if (relu_y == nullptr) {
          r[i] = _mm512_maskz_loadu_ps(m, dy + at);
        } else {
          const __mmask16 keep = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, relu_y + at),
                                                         _mm512_setzero_ps(), _CMP_GT_OQ);
          r[i] = _mm512_maskz_loadu_ps(keep, dy + at);
        }
      }
      transpose16(r);
      const int64_t n = std::min<int64_t>(kL, p.P - p0);
      for (int64_t i = 0; i < n; ++i) _mm512_storeu_ps(dyt + (p0 + i) * p.OCp + oc0, r[i]);
    }
  }
}

// db[oc] += sum over positions of dyT[p, oc], one image: four partial sums (positions
// p mod 4, in order) so that the adds do not wait on each other, then added up in one order.
void add_bias_grad(float* db, const float* dyt, const Conv2dShape& s, const DirectPlan& p) {
  for (int64_t oc0 = 0; oc0 < s.OC; oc0 += kL) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 4 <= p.P; i += 4) {
      for (int u = 0; u < 4; ++u) {
        acc[u] = _mm512_add_ps(acc[u], _mm512_loadu_ps(dyt + (i + u) * p.OCp + oc0));
      }
    }
    for (; i < p.P; ++i) acc[0] = _mm512_add_ps(acc[0], _mm512_loadu_ps(dyt + i * p.OCp + oc0));
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    const __mmask16 m = head_mask(s.OC - oc0);
    _mm512_mask_storeu_ps(db + oc0, m, _mm512_add_ps(sum, _mm512_maskz_loadu_ps(m, db + oc0)));
  }
}

// The image's input as the kernels read it: x[n] in place without padding, else its copy in
// xpad (whose border is zero).
RowsJob image_input(float* xpad, const float* xn, const Conv2dShape& s, const DirectPlan& p) {
  RowsJob in{};
  in.in = xn;
  in.plane = s.H * s.W;
  in.ld = s.W;
  if (s.pad > 0) {
    copy_into_padded(xpad, p.Hp, p.Wp, s.pad, s.pad, xn, nullptr, s.C, s.H, s.W);
    in.in = xpad;
    in.plane = p.Hp * p.Wp;
    in.ld = p.Wp;
  }
  return in;
}

int64_t pooled_size(const Conv2dShape& s, const ConvFusion& f) {
  return s.OC * ((s.OH() - f.pool_k) / f.pool_stride + 1) *
         ((s.OW() - f.pool_k) / f.pool_stride + 1);
}

}  // namespace

bool conv2d_direct_supported(const Conv2dShape& s) {
  return s.stride == 1 && s.KW <= kDirectMaxKW && s.pad < s.KH && s.pad < s.KW;
}

int64_t conv2d_direct_scratch_floats(const Conv2dShape& s, const ConvFusion& f) {
  const DirectPlan p(s);
  return p.total() + (f.pooled() ? round_up(s.OC * p.P, kAlign) : 0);
}

void conv2d_direct_forward(float* y, int32_t* argmax, const float* x, const float* w,
                           const float* b, const ConvFusion& f, const Conv2dShape& s,
                           float* scratch) {
  TESSEL_CHECK(conv2d_direct_supported(s), "conv2d_direct_forward: unsupported shape, got stride=",
               s.stride, " KW=", s.KW, " pad=", s.pad);
  const DirectPlan p(s);
  float* wp = scratch;
  float* xpad = wp + p.wp_floats;
  float* image = scratch + p.total();  // pooled: one image's convolution output
  pack_lanes(wp, s.OC, p.K, [&](int64_t oc, int64_t k) { return w[oc * p.K + k]; });
  if (s.pad > 0) std::fill(xpad, xpad + p.xpad_floats, 0.0f);  // the border stays zero
  const int64_t in_size = s.C * s.H * s.W, out_size = f.pooled() ? pooled_size(s, f) : s.OC * p.P;
  for (int64_t n = 0; n < s.N; ++n) {
    const RowsJob in = image_input(xpad, x + n * in_size, s, p);
    if (n + 1 < s.N) {
      prefetch_l2(x + (n + 1) * in_size, in_size);
      prefetch_l2(y + (n + 1) * out_size, out_size, true);
    }
    float* out = f.pooled() ? image : y + n * out_size;
    for_each_block(s.OC, [&](const LaneBlock& blk) {
      const RowsJob j{in.in, in.plane, in.ld, s.C, s.KH, s.KW, wp + blk.first * p.K,
                      b != nullptr ? b + blk.first : nullptr, f.relu, out + blk.first * p.P,
                      p.P, s.OW(), blk.count};
      conv_rows(j, blk.v, s.OH());
    });
    if (f.pooled()) {  // pool the image while it is in cache
      maxpool2d_forward(y + n * out_size, argmax + n * out_size, image, 1, s.OC, s.OH(), s.OW(),
                        f.pool_k, f.pool_stride);
    }
  }
}

void conv2d_direct_backward(float* dx, float* dw, float* db, const float* dy, const float* y,
                            const int32_t* argmax, const ConvFusion& f, const float* x,
                            const float* w, const Conv2dShape& s, float* scratch) {
  TESSEL_CHECK(conv2d_direct_supported(s), "conv2d_direct_backward: unsupported shape, got stride=",
               s.stride, " KW=", s.KW, " pad=", s.pad);
  const DirectPlan p(s);
  float* wf = scratch;
  float* xpad = wf + p.wp_floats;
  float* dypad = xpad + p.xpad_floats;
  float* dyt = dypad + p.dypad_floats;
  float* dwt = dyt + p.dyt_floats;
  float* image = scratch + p.total();  // pooled: one image's convolution output gradient
  const int64_t taps = s.KH * s.KW, OH = s.OH(), OW = s.OW();
  if (dx != nullptr) {
    // The input gradient's weights: lanes over c, steps (oc, kh', kw') of the flipped kernel.
    pack_lanes(wf, s.C, s.OC * taps, [&](int64_t c, int64_t k) {
      const int64_t oc = k / taps, kh = s.KH - 1 - k % taps / s.KW, kw = s.KW - 1 - k % s.KW;
      return w[((oc * s.C + c) * s.KH + kh) * s.KW + kw];
    });
  }
  if (s.pad > 0) std::fill(xpad, xpad + p.xpad_floats, 0.0f);  // borders stay zero
  if (dx != nullptr) std::fill(dypad, dypad + p.dypad_floats, 0.0f);
  std::fill(dwt, dwt + p.dwt_floats, 0.0f);
  const int64_t in_size = s.C * s.H * s.W;
  const int64_t out_size = f.pooled() ? pooled_size(s, f) : s.OC * p.P;  // of dy and y
  for (int64_t n = 0; n < s.N; ++n) {
    // Stage the image: its input, and its convolution output gradient (masked by the ReLU,
    // built from the pooled gradient) transposed, then zero-padded for the input gradient.
    const RowsJob in = image_input(xpad, x + n * in_size, s, p);
    const float* dyn = dy + n * out_size;
    const float* mask = f.relu && !f.pooled() ? y + n * out_size : nullptr;
    if (f.pooled()) {
      pool_relu_grad_image(image, dyn, argmax + n * out_size, y + n * out_size, s, f.pool_k,
                           f.pool_stride);
      dyn = image;
    }
    transpose_dy(dyt, dyn, mask, s, p);
    if (n + 1 < s.N) {
      prefetch_l2(x + (n + 1) * in_size, in_size);
      prefetch_l2(dy + (n + 1) * out_size, out_size);
      if (f.relu) prefetch_l2(y + (n + 1) * out_size, out_size);
      if (dx != nullptr) prefetch_l2(dx + (n + 1) * in_size, in_size, true);
    }
    if (db != nullptr) add_bias_grad(db, dyt, s, p);
    // Weight gradient into dwT.
    for_each_block(s.OC, [&](const LaneBlock& blk) {
      const DwJob j{in.in, in.plane, in.ld, s.KH, OH, OW, dyt + blk.first, p.OCp, dwt + blk.first};
      const auto& kernels = (blk.v == 2 ? kDw<2> : kDw<1>)[s.KW];
      const int64_t rows = s.C * s.KH, th = max_tap_rows(blk.v, static_cast<int>(s.KW));
      for (int64_t r0 = 0; r0 < rows; r0 += th) kernels[std::min(th, rows - r0)](j, r0);
    });
    if (dx == nullptr) continue;
    // Input gradient: the flipped kernel over the padded dy.
    copy_into_padded(dypad, p.DH, p.DW, s.KH - 1 - s.pad, s.KW - 1 - s.pad, dyn, mask, s.OC, OH,
                     OW);
    for_each_block(s.C, [&](const LaneBlock& blk) {
      const RowsJob j{dypad, p.DH * p.DW, p.DW, s.OC, s.KH, s.KW, wf + blk.first * s.OC * taps,
                      nullptr, false, dx + n * in_size + blk.first * s.H * s.W, s.H * s.W, s.W,
                      blk.count};
      conv_rows(j, blk.v, s.H);
    });
  }
  for (int64_t oc = 0; oc < s.OC; ++oc) {
    for (int64_t k = 0; k < p.K; ++k) dw[oc * p.K + k] += dwt[k * p.OCp + oc];
  }
}

#else  // no AVX-512: conv.cc always takes the im2col path

bool conv2d_direct_supported(const Conv2dShape&) { return false; }
int64_t conv2d_direct_scratch_floats(const Conv2dShape&, const ConvFusion&) { return 0; }
void conv2d_direct_forward(float*, int32_t*, const float*, const float*, const float*,
                           const ConvFusion&, const Conv2dShape&, float*) {
  TESSEL_CHECK(false, "conv2d_direct_forward: this build does not target AVX-512");
}
void conv2d_direct_backward(float*, float*, float*, const float*, const float*, const int32_t*,
                            const ConvFusion&, const float*, const float*, const Conv2dShape&,
                            float*) {
  TESSEL_CHECK(false, "conv2d_direct_backward: this build does not target AVX-512");
}

#endif  // __AVX512F__

}  // namespace tessel::ops::detail
