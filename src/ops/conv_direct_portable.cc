// The portable direct convolution: plain C++ for any x86-64 CPU, the portable level's path, and
// the reference that the vector kernels (conv_direct_driver.h, at the AVX2 and AVX-512 levels)
// are tested against bit for bit. It computes every output in the vector kernels' order, with
// std::fma (one rounding per multiply-add, as the vector FMAs):
//   - forward: y[oc, oh, ow] starts at the bias (or +0) and takes one FMA per tap (c, kh, kw) in
//     that order, every tap of the zero-padded input included; then the ReLU (max with +0,
//     NaN -> +0) and, when pooling, maxpool2d_forward of the image;
//   - input gradient: the same over dy zero-padded by K - 1 - pad, with the kernel flipped in kh
//     and kw, C and OC swapped, starting at +0;
//   - weight gradient: per (oc, c, kh, kw) one sum from +0 over images in batch order, then
//     positions in order, added to dw at the end;
//   - bias gradient: per image four partial sums (positions p mod 4 while whole groups of four
//     remain, the rest into the first), added as (s0 + s1) + (s2 + s3), then onto db;
//   - the convolution output gradient behind a fused ReLU (dy where y > 0, else +0) or ReLU + max
//     pool (pool_relu_grad_image).
// The loops run over one output plane at a time so that the inner loop reads memory in order.
#include <algorithm>
#include <cmath>

#include "conv_impl.h"
#include "kernels.h"

namespace tessel::ops::portable {
namespace {

using detail::ConvFusion;

// The scratch regions of one call, in floats.
struct Plan {
  int64_t P, K, Hp, Wp, DH, DW;
  int64_t pad_floats, image_floats, dwt_floats;
  explicit Plan(const Conv2dShape& s)
      : P(s.OH() * s.OW()),
        K(s.C * s.KH * s.KW),
        Hp(s.H + 2 * s.pad),
        Wp(s.W + 2 * s.pad),
        DH(s.H + s.KH - 1),
        DW(s.W + s.KW - 1),
        // the padded input, or the padded dy (whichever is larger)
        pad_floats(std::max(s.C * Hp * Wp, s.OC * DH * DW)),
        image_floats(s.OC * P),
        dwt_floats(s.OC * K) {}
  int64_t total() const { return 2 * pad_floats + image_floats + dwt_floats; }
};

// dst[c, r0 + h, q0 + w] = src[c, h, w] over planes of rows x cols; dst planes are dst_rows x
// dst_cols and zero elsewhere.
void pad_planes(float* dst, int64_t dst_rows, int64_t dst_cols, int64_t r0, int64_t q0,
                const float* src, int64_t channels, int64_t rows, int64_t cols) {
  std::fill(dst, dst + channels * dst_rows * dst_cols, 0.0f);
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t h = 0; h < rows; ++h) {
      const float* s = src + (c * rows + h) * cols;
      std::copy(s, s + cols, dst + (c * dst_rows + r0 + h) * dst_cols + q0);
    }
  }
}

// out[o, r, q] = init[o] (or +0) then, for each step (i, a, b) in that order,
// fma(in[i, r + a, q + b], weight(o, i, a, b), out[o, r, q]); in: planes of in_rows x in_cols,
// out: planes of rows x cols.
template <typename Weight>
void correlate(float* out, int64_t O, int64_t rows, int64_t cols, const float* init,
               const float* in, int64_t I, int64_t in_rows, int64_t in_cols, int64_t KH, int64_t KW,
               Weight weight) {
  for (int64_t o = 0; o < O; ++o) {
    float* acc = out + o * rows * cols;
    std::fill(acc, acc + rows * cols, init != nullptr ? init[o] : 0.0f);
    for (int64_t i = 0; i < I; ++i) {
      for (int64_t a = 0; a < KH; ++a) {
        for (int64_t b = 0; b < KW; ++b) {
          const float wv = weight(o, i, a, b);
          for (int64_t r = 0; r < rows; ++r) {
            const float* src = in + (i * in_rows + r + a) * in_cols + b;
            float* dst = acc + r * cols;
            for (int64_t q = 0; q < cols; ++q) dst[q] = std::fma(src[q], wv, dst[q]);
          }
        }
      }
    }
  }
}

// db[oc] += the image's bias gradient, summed as the file comment says.
void add_bias_grad(float* db, const float* dconv, int64_t OC, int64_t P) {
  for (int64_t oc = 0; oc < OC; ++oc) {
    const float* d = dconv + oc * P;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t i = 0;
    for (; i + 4 <= P; i += 4) {
      for (int u = 0; u < 4; ++u) acc[u] += d[i + u];
    }
    for (; i < P; ++i) acc[0] += d[i];
    db[oc] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + db[oc];
  }
}

// dwt[oc, (c, kh, kw)] += sum over positions of xpad[c, oh + kh, ow + kw] * dconv[oc, oh, ow].
void add_weight_grad(float* dwt, const float* xpad, const float* dconv, const Conv2dShape& s,
                     const Plan& p) {
  const int64_t OH = s.OH(), OW = s.OW();
  for (int64_t oc = 0; oc < s.OC; ++oc) {
    const float* d = dconv + oc * p.P;
    for (int64_t k = 0; k < p.K; ++k) {
      const int64_t c = k / (s.KH * s.KW), kh = k / s.KW % s.KH, kw = k % s.KW;
      float acc = dwt[oc * p.K + k];
      for (int64_t oh = 0; oh < OH; ++oh) {
        const float* x = xpad + (c * p.Hp + oh + kh) * p.Wp + kw;
        for (int64_t ow = 0; ow < OW; ++ow) acc = std::fma(x[ow], d[oh * OW + ow], acc);
      }
      dwt[oc * p.K + k] = acc;
    }
  }
}

}  // namespace

int64_t conv_direct_scratch(const Conv2dShape& s, const ConvFusion& f) {
  (void)f;  // the pooled forward's image has a region of its own either way
  return Plan(s).total();
}

void conv_direct_forward(float* y, int32_t* argmax, const float* x, const float* w, const float* b,
                         const ConvFusion& f, const Conv2dShape& s, float* scratch) {
  const Plan p(s);
  float* xpad = scratch;
  float* image = xpad + 2 * p.pad_floats;  // pooled: one image's convolution output
  const int64_t in_size = s.C * s.H * s.W,
                out_size = f.pooled() ? detail::conv_pooled_size(s, f) : s.OC * p.P;
  for (int64_t n = 0; n < s.N; ++n) {
    pad_planes(xpad, p.Hp, p.Wp, s.pad, s.pad, x + n * in_size, s.C, s.H, s.W);
    float* out = f.pooled() ? image : y + n * out_size;
    correlate(out, s.OC, s.OH(), s.OW(), b, xpad, s.C, p.Hp, p.Wp, s.KH, s.KW,
              [&](int64_t oc, int64_t c, int64_t kh, int64_t kw) {
                return w[((oc * s.C + c) * s.KH + kh) * s.KW + kw];
              });
    if (f.relu) {
      for (int64_t i = 0; i < s.OC * p.P; ++i) out[i] = out[i] > 0.0f ? out[i] : 0.0f;
    }
    if (f.pooled()) {
      maxpool2d_forward(y + n * out_size, argmax + n * out_size, image, 1, s.OC, s.OH(), s.OW(),
                        f.pool_k, f.pool_stride);
    }
  }
}

void conv_direct_backward(float* dx, float* dw, float* db, const float* dy, const float* y,
                          const int32_t* argmax, const ConvFusion& f, const float* x,
                          const float* w, const Conv2dShape& s, float* scratch) {
  const Plan p(s);
  float* xpad = scratch;
  float* dypad = xpad + p.pad_floats;
  float* dconv = dypad + p.pad_floats;
  float* dwt = dconv + p.image_floats;
  std::fill(dwt, dwt + p.dwt_floats, 0.0f);
  const int64_t in_size = s.C * s.H * s.W, conv_size = s.OC * p.P;
  const int64_t out_size = f.pooled() ? detail::conv_pooled_size(s, f) : conv_size;
  for (int64_t n = 0; n < s.N; ++n) {
    // The image's convolution output gradient.
    const float* dyn = dy + n * out_size;
    if (f.pooled()) {
      detail::pool_relu_grad_image(dconv, dyn, argmax + n * out_size, y + n * out_size, s, f.pool_k,
                                   f.pool_stride);
    } else if (f.relu) {
      const float* yn = y + n * out_size;
      for (int64_t i = 0; i < conv_size; ++i) dconv[i] = yn[i] > 0.0f ? dyn[i] : 0.0f;
    } else {
      std::copy(dyn, dyn + conv_size, dconv);
    }
    if (db != nullptr) add_bias_grad(db, dconv, s.OC, p.P);
    pad_planes(xpad, p.Hp, p.Wp, s.pad, s.pad, x + n * in_size, s.C, s.H, s.W);
    add_weight_grad(dwt, xpad, dconv, s, p);
    if (dx == nullptr) continue;
    pad_planes(dypad, p.DH, p.DW, s.KH - 1 - s.pad, s.KW - 1 - s.pad, dconv, s.OC, s.OH(), s.OW());
    correlate(dx + n * in_size, s.C, s.H, s.W, nullptr, dypad, s.OC, p.DH, p.DW, s.KH, s.KW,
              [&](int64_t c, int64_t oc, int64_t kh, int64_t kw) {
                return w[((oc * s.C + c) * s.KH + s.KH - 1 - kh) * s.KW + s.KW - 1 - kw];
              });
  }
  for (int64_t i = 0; i < p.dwt_floats; ++i) dw[i] += dwt[i];
}

}  // namespace tessel::ops::portable
