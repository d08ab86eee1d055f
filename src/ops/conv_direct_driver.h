// Private to ops: the direct convolution of the vector levels, stride 1: no column matrix.
// Each level's translation unit (conv_direct_avx2.cc, conv_direct_avx512.cc) includes this
// header and instantiates direct_scratch / direct_forward / direct_backward with its policy P
// (conv_tiles.h lists what a policy provides); the level's vector width and registers change
// which outputs a tile computes together, never the order of any output's sum, so every level
// gives the bits of the portable kernel (conv_direct_portable.cc, which spells the order out).
//
// Terms. Positions are output pixels (oh, ow). A lane block is a run of up to 2 kLanes channels
// that a tile holds in V = 2 vectors per position, or up to kLanes in V = 1 (the last block,
// when kLanes or fewer channels remain); lanes past the channel count compute on zero weights
// and are never stored. Inputs are read zero-padded: x[n] copied into xpad[C, Hp, Wp]
// (Hp = H + 2 pad, Wp = W + 2 pad), so every tap of every position is in bounds and no loop
// branches on the border.
//
// The tiles (conv_tiles.h) do the arithmetic: forward and input gradient share one kernel
// that keeps a tile of positions x one lane block of output channels in registers while it
// broadcasts each input value from the padded rows into the FMAs, and transposes the tile into
// the NCHW output at the end; the input gradient of a stride-1 convolution is that kernel over
// dy zero-padded by K - 1 - pad on each side, with the kernel flipped in kh and kw and C and OC
// swapped. The weight gradient keeps taps x channels in registers over a whole image, reading
// dy transposed per image into dyT[P, OCp] (channels along lanes) and accumulating in
// dwT[K, OCp]; dw gets dwT once at the end.
//
// This header stages each image for them: the input copied into its padded buffer, dy
// transposed (masked by a fused ReLU, or scattered from the gradient of a fused max pool) and
// zero-padded, the weights packed once per call, and the next image prefetched in between.
//
// Every sum runs in one fixed order (taps; positions; images in batch order), so the results
// are the same bits on every run, for any thread count and at every level.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <memory>

#include "conv_impl.h"
#include "conv_tiles.h"

namespace tessel::ops::detail {
// Internal linkage on purpose (see conv_tiles.h): every function here is a template named after
// its level's policy.
namespace {

constexpr int64_t kAlign = 16;  // floats: each scratch region starts 64-byte aligned

constexpr int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Channels [first, first + count) of one tile, in v vectors per position.
struct LaneBlock {
  int64_t first;
  int count, v;
};

// Blocks of 2 kLanes channels while more than kLanes remain, then one of <= kLanes. Block b's
// packed data starts at channel `first`, and all blocks together take round_up(channels, kLanes)
// lanes.
template <class P, typename F>
void for_each_block(int64_t channels, F f) {
  constexpr int kL = P::kLanes;
  for (int64_t first = 0; first < channels;) {
    const int v = channels - first > kL ? 2 : 1;
    const int count = static_cast<int>(std::min<int64_t>(channels - first, v * kL));
    f(LaneBlock{first, count, v});
    first += count;
  }
}

// wp[block][k][lane] = get(block first + lane, k), 0 past the block's count: the weight
// vectors of each reduction step k, contiguous.
template <class P, typename Get>
void pack_lanes(float* wp, int64_t channels, int64_t K, Get get) {
  for_each_block<P>(channels, [&](const LaneBlock& b) {
    float* dst = wp + b.first * K;
    const int lanes = b.v * P::kLanes;
    for (int64_t k = 0; k < K; ++k) {
      for (int l = 0; l < lanes; ++l) dst[k * lanes + l] = l < b.count ? get(b.first + l, k) : 0.0f;
    }
  });
}

// ---- Staging ----

// Scratch regions, in floats, each rounded to kAlign.
template <class P>
struct DirectPlan {
  int64_t positions, K, Hp, Wp, DH, DW, OCp;
  int64_t wp_floats, xpad_floats, dypad_floats, dyt_floats, dwt_floats;
  explicit DirectPlan(const Conv2dShape& s)
      : positions(s.OH() * s.OW()),
        K(s.C * s.KH * s.KW),
        Hp(s.H + 2 * s.pad),
        Wp(s.W + 2 * s.pad),
        DH(s.H + s.KH - 1),
        DW(s.W + s.KW - 1),
        OCp(round_up(s.OC, P::kLanes)),
        // Forward: [OCp lanes][C * taps]; input gradient: [Cp lanes][OC * taps].
        wp_floats(
            round_up(std::max(OCp * K, round_up(s.C, P::kLanes) * s.OC * s.KH * s.KW), kAlign)),
        xpad_floats(round_up(s.C * Hp * Wp, kAlign)),
        dypad_floats(round_up(s.OC * DH * DW, kAlign)),
        dyt_floats(round_up(positions * OCp, kAlign)),
        dwt_floats(round_up(K * OCp, kAlign)) {}
  int64_t total() const { return wp_floats + xpad_floats + dypad_floats + dyt_floats + dwt_floats; }
};

// dst[c, r0 + h, q0 + w] = src[c, h, w] (where mask[c, h, w] > 0 when mask is given, else +0)
// for the rows x cols planes of `channels` channels; dst planes are dst_rows x dst_ld.
template <class P>
void copy_into_padded(float* dst, int64_t dst_rows, int64_t dst_ld, int64_t r0, int64_t q0,
                      const float* src, const float* mask, int64_t channels, int64_t rows,
                      int64_t cols) {
  constexpr int kL = P::kLanes;
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t h = 0; h < rows; ++h) {
      const int64_t at = (c * rows + h) * cols;
      float* d = dst + (c * dst_rows + r0 + h) * dst_ld + q0;
      for (int64_t w = 0; w < cols; w += kL) {
        typename P::Vec v = P::load_head(src + at + w, cols - w);
        if (mask != nullptr) v = P::keep_positive(v, P::load_head(mask + at + w, cols - w));
        P::store_head(d + w, cols - w, v);
      }
    }
  }
}

// dyt[p * OCp + oc] = dy[oc * P + p] for one image (where relu_y > 0 when given, else +0), zero
// for OC <= oc < OCp: kLanes x kLanes blocks through registers.
template <class P>
void transpose_dy(float* dyt, const float* dy, const float* relu_y, const Conv2dShape& s,
                  const DirectPlan<P>& p) {
  constexpr int kL = P::kLanes;
  for (int64_t oc0 = 0; oc0 < p.OCp; oc0 += kL) {
    for (int64_t p0 = 0; p0 < p.positions; p0 += kL) {
      const int64_t n = std::min<int64_t>(kL, p.positions - p0);
      typename P::Vec r[kL];
      for (int i = 0; i < kL; ++i) {
        const int64_t at = (oc0 + i) * p.positions + p0;
        if (oc0 + i >= s.OC) {
          r[i] = P::zero();
        } else {
          r[i] = P::load_head(dy + at, n);
          if (relu_y != nullptr) r[i] = P::keep_positive(r[i], P::load_head(relu_y + at, n));
        }
      }
      P::transpose(r);
      for (int64_t i = 0; i < n; ++i) P::store(dyt + (p0 + i) * p.OCp + oc0, r[i]);
    }
  }
}

// Behind a fused ReLU + max pool, one image's convolution output gradient goes straight into
// dyT (and into dypad's interior when dypad is given), scattered from the pooled gradient
// dy[OC, pooled / OC]: what maxpool2d_backward then relu_backward would make of it, and the
// same sums in the same order as pool_relu_grad_image (conv.cc), without the full-resolution
// image and its transpose. pad_at[a]: where plane index a (h * OW + w) sits in a dypad plane.
template <class P>
void scatter_pooled_grad(float* dyt, float* dypad, const int32_t* pad_at, const float* dy,
                         const int32_t* argmax, const float* y, const Conv2dShape& s,
                         const DirectPlan<P>& p, int64_t pooled) {
  std::fill(dyt, dyt + p.positions * p.OCp, 0.0f);
  if (dypad != nullptr) std::fill(dypad, dypad + s.OC * p.DH * p.DW, 0.0f);
  const int64_t per_channel = pooled / s.OC;
  for (int64_t oc = 0; oc < s.OC; ++oc) {
    float* dpad = dypad != nullptr ? dypad + oc * p.DH * p.DW : nullptr;
    for (int64_t o = oc * per_channel; o < (oc + 1) * per_channel; ++o) {
      // dy where the window's output passed the ReLU, else +0 (which keeps the sum's bits, see
      // conv.cc): by bits, so that no branch depends on the data.
      const uint32_t keep = y[o] > 0.0f ? ~0u : 0u;
      const float v = std::bit_cast<float>(std::bit_cast<uint32_t>(dy[o]) & keep);
      const int32_t at = argmax[o];
      dyt[at * p.OCp + oc] += v;
      if (dpad != nullptr) dpad[pad_at[at]] += v;
    }
  }
}

// r[i] = lanes [0, kLanes) of channels oc0 + lane at pooled output j0 + i (i < n), +0 past OC:
// where y > 0, dy, else +0 (scatter_pooled_grad's v), or the argmax's bits when y is null.
template <class P>
void load_pooled_block(typename P::Vec* r, const float* src, const float* y, int64_t per_channel,
                       int64_t OC, int64_t oc0, int64_t j0, int64_t n) {
  for (int i = 0; i < P::kLanes; ++i) {
    const int64_t at = (oc0 + i) * per_channel + j0;
    r[i] = oc0 + i < OC ? P::load_head(src + at, n) : P::zero();
    if (y != nullptr && oc0 + i < OC) r[i] = P::keep_positive(r[i], P::load_head(y + at, n));
  }
  P::transpose(r);
}

// scatter_pooled_grad's dyT for the 2x2 pool of stride 2 (windows that tile the output, so a
// position is in one window at most): each entry written once, a vector of channels at a time,
// without the fill and the scalar scatter. At each position of a window a channel's lane gets
// +0 + v where the position is the channel's argmax, else +0: the scatter's bits.
template <class P>
void tile_pooled_grad_2x2(float* dyt, const float* dy, const int32_t* argmax, const float* y,
                          const Conv2dShape& s, const DirectPlan<P>& p, int64_t pooled) {
  using Vec = typename P::Vec;
  constexpr int kL = P::kLanes;
  const int64_t OH = s.OH(), OW = s.OW(), PW = OW / 2, per_channel = pooled / s.OC;
  for (int64_t h = 0; h < OH; ++h) {  // positions outside every window (an odd last row, column)
    for (int64_t w = h < OH / 2 * 2 ? PW * 2 : 0; w < OW; ++w) {
      std::fill(dyt + (h * OW + w) * p.OCp, dyt + (h * OW + w + 1) * p.OCp, 0.0f);
    }
  }
  // argmax's int32 bits move through the float lanes untouched (loads and shuffles only).
  const float* at = reinterpret_cast<const float*>(argmax);
  const int64_t down = OW * p.OCp;                 // from a position to the one below it in dyT
  for (int64_t oc0 = 0; oc0 < p.OCp; oc0 += kL) {  // kLanes rows of each operand, read in order
    for (int64_t j0 = 0; j0 < per_channel; j0 += kL) {
      const int n = static_cast<int>(std::min<int64_t>(kL, per_channel - j0));
      Vec v[kL], a[kL];
      load_pooled_block<P>(v, dy, y, per_channel, s.OC, oc0, j0, n);
      load_pooled_block<P>(a, at, nullptr, per_channel, s.OC, oc0, j0, n);
      int64_t ph = j0 / PW, pw = j0 % PW;
      for (int i = 0; i < n; ++i) {
        const int64_t c = 2 * (ph * OW + pw);  // the window's top left position
        const int32_t c32 = static_cast<int32_t>(c), below = c32 + static_cast<int32_t>(OW);
        float* d = dyt + c * p.OCp + oc0;
        // +0 + v, then v or +0 at each position: the bits of +0 + (v or +0).
        const Vec g = P::add(P::zero(), v[i]);
        P::store(d, P::keep_equal(g, a[i], c32));
        P::store(d + p.OCp, P::keep_equal(g, a[i], c32 + 1));
        P::store(d + down, P::keep_equal(g, a[i], below));
        P::store(d + down + p.OCp, P::keep_equal(g, a[i], below + 1));
        if (++pw == PW) {
          pw = 0;
          ++ph;
        }
      }
    }
  }
}

// db[oc] += sum over positions of dyT[p, oc], one image: four partial sums (positions
// p mod 4, in order) so that the adds do not wait on each other, then added up in one order.
template <class P>
void add_bias_grad(float* db, const float* dyt, const Conv2dShape& s, const DirectPlan<P>& p) {
  using Vec = typename P::Vec;
  for (int64_t oc0 = 0; oc0 < s.OC; oc0 += P::kLanes) {
    Vec acc[4] = {P::zero(), P::zero(), P::zero(), P::zero()};
    int64_t i = 0;
    for (; i + 4 <= p.positions; i += 4) {
      for (int u = 0; u < 4; ++u) acc[u] = P::add(acc[u], P::load(dyt + (i + u) * p.OCp + oc0));
    }
    for (; i < p.positions; ++i) acc[0] = P::add(acc[0], P::load(dyt + i * p.OCp + oc0));
    const Vec sum = P::add(P::add(acc[0], acc[1]), P::add(acc[2], acc[3]));
    P::store_head(db + oc0, s.OC - oc0, P::add(sum, P::load_head(db + oc0, s.OC - oc0)));
  }
}

// The image's input as the kernels read it: x[n] in place without padding, else its copy in
// xpad (whose border is zero).
template <class P>
RowsJob image_input(float* xpad, const float* xn, const Conv2dShape& s, const DirectPlan<P>& p) {
  RowsJob in{};
  in.in = xn;
  in.plane = s.H * s.W;
  in.ld = s.W;
  if (s.pad > 0) {
    copy_into_padded<P>(xpad, p.Hp, p.Wp, s.pad, s.pad, xn, nullptr, s.C, s.H, s.W);
    in.in = xpad;
    in.plane = p.Hp * p.Wp;
    in.ld = p.Wp;
  }
  return in;
}

// One image's convolution output, for pooling it while it is in cache.
template <class P>
int64_t image_floats(const Conv2dShape& s, const ConvFusion& f) {
  return f.pooled() ? round_up(s.OC * s.OH() * s.OW(), kAlign) : 0;
}

// The arguments of a backward call, and its scratch.
template <class P>
struct BackwardArgs {
  float *dx, *dw, *db;
  const float *dy, *y;
  const int32_t* argmax;
  const ConvFusion& f;
  const float *x, *w;
  const Conv2dShape& s;
  const DirectPlan<P>& p;
  float *wf, *xpad, *dypad;
  int64_t out_size;  // of one image's dy and y (pooled when pooling)
};

// The input gradient of image n: the flipped kernel (wf) over the padded dy. dyn: the image's
// convolution output gradient to pad, or null when dypad's interior is already filled.
template <class P>
void input_gradient(const BackwardArgs<P>& a, int64_t n, const float* dyn, const float* mask,
                    Prefetcher* pf) {
  const Conv2dShape& s = a.s;
  const DirectPlan<P>& p = a.p;
  if (dyn != nullptr) {
    copy_into_padded<P>(a.dypad, p.DH, p.DW, s.KH - 1 - s.pad, s.KW - 1 - s.pad, dyn, mask, s.OC,
                        s.OH(), s.OW());
  }
  for_each_block<P>(s.C, [&](const LaneBlock& blk) {
    RowsJob j{};
    j.in = a.dypad;
    j.plane = p.DH * p.DW;
    j.ld = p.DW;
    j.C = s.OC;
    j.KH = s.KH;
    j.KW = s.KW;
    j.wp = a.wf + blk.first * s.OC * s.KH * s.KW;
    j.out = a.dx + n * s.C * s.H * s.W + blk.first * s.H * s.W;
    j.out_plane = s.H * s.W;
    j.OW = s.W;
    j.count = blk.count;
    j.prefetch = pf;
    conv_rows<P>(j, blk.v, s.H);
  });
}

// dy transposed per image into dyT, dw through dwT, and the input gradient.
template <class P>
void backward_images(const BackwardArgs<P>& a, float* dyt, float* dwt, int64_t tiles) {
  const Conv2dShape& s = a.s;
  const DirectPlan<P>& p = a.p;
  const int64_t in_size = s.C * s.H * s.W, OW = s.OW();
  std::fill(dwt, dwt + p.dwt_floats, 0.0f);
  // Pooled, with dx: plane index -> index in a dypad plane. Not a std::vector: its resize would
  // instantiate std::vector<int>::_M_default_append here, at this level's ISA, with external
  // linkage, and the linker may take that copy for every caller (isa_symbols found it at -O1).
  std::unique_ptr<int32_t[]> pad_at;
  if (a.f.pooled() && a.dx != nullptr) {
    pad_at.reset(new int32_t[p.positions]);
    for (int64_t i = 0; i < p.positions; ++i) {
      pad_at[i] =
          static_cast<int32_t>((s.KH - 1 - s.pad + i / OW) * p.DW + s.KW - 1 - s.pad + i % OW);
    }
  }
  Prefetcher pf;
  for (int64_t n = 0; n < s.N; ++n) {
    // Stage the image: its input, and its convolution output gradient (masked by the ReLU, or
    // scattered from the pooled gradient) transposed, and zero-padded for the input gradient.
    const RowsJob in = image_input<P>(a.xpad, a.x + n * in_size, s, p);
    const float* dyn = a.dy + n * a.out_size;
    const float* mask = a.f.relu && !a.f.pooled() ? a.y + n * a.out_size : nullptr;
    if (a.f.pooled()) {
      const int32_t* am = a.argmax + n * a.out_size;
      const float* yn = a.y + n * a.out_size;
      // With dx, the scatter fills dypad in the same pass, which the vector path would need
      // transposes for (measured: conv2's backward no faster that way).
      if (a.f.pool_k == 2 && a.f.pool_stride == 2 && a.dx == nullptr) {
        tile_pooled_grad_2x2<P>(dyt, dyn, am, yn, s, p, a.out_size);
      } else {
        scatter_pooled_grad<P>(dyt, a.dx != nullptr ? a.dypad : nullptr, pad_at.get(), dyn, am, yn,
                               s, p, a.out_size);
      }
    } else {
      transpose_dy<P>(dyt, dyn, mask, s, p);
    }
    const bool next = n + 1 < s.N;
    pf.start({{next ? a.x + (n + 1) * in_size : nullptr, in_size},
              {next ? a.dy + (n + 1) * a.out_size : nullptr, a.out_size},
              {next && a.f.relu ? a.y + (n + 1) * a.out_size : nullptr, a.out_size},
              {next && a.dx != nullptr ? a.dx + (n + 1) * in_size : nullptr, in_size}},
             tiles);
    if (a.db != nullptr) add_bias_grad<P>(a.db, dyt, s, p);
    for_each_block<P>(s.OC, [&](const LaneBlock& blk) {
      const DwJob j{in.in, in.plane,        in.ld, s.KH,           s.OH(),
                    OW,    dyt + blk.first, p.OCp, dwt + blk.first};
      conv_dw<P>(j, blk.v, s.KW, s.C * s.KH, &pf);
    });
    if (a.dx != nullptr) input_gradient<P>(a, n, a.f.pooled() ? nullptr : dyn, mask, &pf);
    pf.finish();
  }
  for (int64_t oc = 0; oc < s.OC; ++oc) {
    for (int64_t k = 0; k < p.K; ++k) a.dw[oc * p.K + k] += dwt[k * p.OCp + oc];
  }
}

// ---- The kernel table's entry points (kernels.h), per level ----

template <class P>
int64_t direct_scratch(const Conv2dShape& s, const ConvFusion& f) {
  return DirectPlan<P>(s).total() + image_floats<P>(s, f);
}

template <class P>
void direct_forward(float* y, int32_t* argmax, const float* x, const float* w, const float* b,
                    const ConvFusion& f, const Conv2dShape& s, float* scratch) {
  const DirectPlan<P> p(s);
  float* wp = scratch;
  float* xpad = wp + p.wp_floats;
  float* image = scratch + p.total();  // pooled: one image's convolution output
  pack_lanes<P>(wp, s.OC, p.K, [&](int64_t oc, int64_t k) { return w[oc * p.K + k]; });
  if (s.pad > 0) std::fill(xpad, xpad + p.xpad_floats, 0.0f);  // the border stays zero
  const int64_t in_size = s.C * s.H * s.W;
  const int64_t out_size = f.pooled() ? conv_pooled_size(s, f) : s.OC * p.positions;
  int64_t tiles = 0;
  for_each_block<P>(
      s.OC, [&](const LaneBlock& blk) { tiles += conv_rows_tiles<P>(blk.v, s.OW(), s.OH()); });
  Prefetcher pf;
  for (int64_t n = 0; n < s.N; ++n) {
    const RowsJob in = image_input<P>(xpad, x + n * in_size, s, p);
    const bool next = n + 1 < s.N;
    pf.start({{next ? x + (n + 1) * in_size : nullptr, in_size},
              {next ? y + (n + 1) * out_size : nullptr, out_size}},
             tiles);
    float* out = f.pooled() ? image : y + n * out_size;
    for_each_block<P>(s.OC, [&](const LaneBlock& blk) {
      RowsJob j = in;
      j.C = s.C;
      j.KH = s.KH;
      j.KW = s.KW;
      j.wp = wp + blk.first * p.K;
      j.bias = b != nullptr ? b + blk.first : nullptr;
      j.relu = f.relu;
      j.out = out + blk.first * p.positions;
      j.out_plane = p.positions;
      j.OW = s.OW();
      j.count = blk.count;
      j.prefetch = &pf;
      conv_rows<P>(j, blk.v, s.OH());
    });
    pf.finish();
    if (f.pooled()) {  // pool the image while it is in cache
      maxpool2d_forward(y + n * out_size, argmax + n * out_size, image, 1, s.OC, s.OH(), s.OW(),
                        f.pool_k, f.pool_stride);
    }
  }
}

template <class P>
void direct_backward(float* dx, float* dw, float* db, const float* dy, const float* y,
                     const int32_t* argmax, const ConvFusion& f, const float* x, const float* w,
                     const Conv2dShape& s, float* scratch) {
  const DirectPlan<P> p(s);
  float* wf = scratch;
  float* xpad = wf + p.wp_floats;
  float* dypad = xpad + p.xpad_floats;
  float* dyt = dypad + p.dypad_floats;
  float* dwt = dyt + p.dyt_floats;
  const int64_t taps = s.KH * s.KW;
  if (dx != nullptr) {
    // The input gradient's weights: lanes over c, steps (oc, kh', kw') of the flipped kernel.
    pack_lanes<P>(wf, s.C, s.OC * taps, [&](int64_t c, int64_t k) {
      const int64_t oc = k / taps, kh = s.KH - 1 - k % taps / s.KW, kw = s.KW - 1 - k % s.KW;
      return w[((oc * s.C + c) * s.KH + kh) * s.KW + kw];
    });
    std::fill(dypad, dypad + p.dypad_floats, 0.0f);  // the border stays zero
  }
  if (s.pad > 0) std::fill(xpad, xpad + p.xpad_floats, 0.0f);
  const BackwardArgs<P> a{
      dx,     dw, db,   dy,    y,
      argmax, f,  x,    w,     s,
      p,      wf, xpad, dypad, f.pooled() ? conv_pooled_size(s, f) : s.OC * p.positions};
  int64_t tiles = 0;  // per image, for the prefetcher
  for_each_block<P>(
      s.OC, [&](const LaneBlock& blk) { tiles += conv_dw_tiles<P>(blk.v, s.KW, s.C * s.KH); });
  if (dx != nullptr) {
    for_each_block<P>(s.C,
                      [&](const LaneBlock& blk) { tiles += conv_rows_tiles<P>(blk.v, s.W, s.H); });
  }
  backward_images<P>(a, dyt, dwt, tiles);
}

}  // namespace
}  // namespace tessel::ops::detail
