// Conv2d: the public entry points, which take the kernel table's direct kernels (one sum order
// at every level: conv_direct_portable.cc, conv_direct_driver.h) where conv2d_direct_supported
// says so, and im2col + GEMM for the other shapes (strides, wide kernels, large padding).
//
// im2col + GEMM.
//
// Terms: P = OH*OW output positions per image, K = C*KH*KW taps per output, the column matrix
// col[K, P] holds for each tap row the input value each output position sees. Then
//   y[n] = w[OC, K] @ col,   dwT[K, OC] += col @ dy[n]^T,   dcol = w^T @ dy[n] -> col2im -> dx[n].
// The weight gradient is accumulated transposed and added to dw once at the end: OpenBLAS runs
// that orientation 10-35% faster than dy @ col^T.
//
// Images go through a zero-padded buffer xpad[C, Hp, Ws] (Hp = H + 2 pad, Ws = W + 2 pad
// rounded up to a whole vector block) so im2col and col2im run branch-free vector loops:
// im2col copies short rows with overlapping block moves; col2im (stride 1) builds each padded
// gradient row in registers from the KW shifted column rows that land on it, with lanes
// outside a column row masked off, and stores it once.
//
// Images with few output positions are processed in groups of G whose columns sit side by
// side in one [K, G*P] matrix, so a GEMM always has at least kMinColumns columns; the result is
// then staged as [OC, G*P] and scattered to NCHW. Images with P >= kMinColumns (measured: one
// image per GEMM is then as fast as any grouping, and keeps col in L2) go one at a time, with
// GEMMs reading and writing y and dy in place.
//
// Scratch: col [K, G*P] with a margin on both sides (the masked col2im loads may address a few
// floats past a row), xpad, dwT [K, OC], and the stage [OC, G*P] (used when G > 1, and for the
// ReLU-masked dy of a fused backward).
#include <algorithm>
#include <bit>
#include <cstring>

#include "conv_impl.h"
#include "kernels.h"
#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"
#include "vec_math.h"

namespace tessel::ops {
namespace {

constexpr int64_t kMinColumns = 256;
constexpr int64_t kBlock = 8;   // floats per vector block in the row helpers
constexpr int64_t kAlign = 16;  // floats: keeps each scratch region 64-byte aligned

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

void check_shape(const char* who, const Conv2dShape& s) {
  TESSEL_CHECK(
      s.N >= 0 && s.C > 0 && s.OC > 0 && s.KH > 0 && s.KW > 0 && s.stride > 0 && s.pad >= 0, who,
      ": bad shape, got N=", s.N, " C=", s.C, " OC=", s.OC, " KH=", s.KH, " KW=", s.KW,
      " stride=", s.stride, " pad=", s.pad);
  TESSEL_CHECK(s.H + 2 * s.pad >= s.KH && s.W + 2 * s.pad >= s.KW, who,
               ": kernel larger than the padded input, got H=", s.H, " W=", s.W, " pad=", s.pad,
               " KH=", s.KH, " KW=", s.KW);
}

// Derived sizes and the scratch layout, shared by forward, backward and the size query.
struct Plan {
  int64_t P, K, G, Hp, Ws, margin;
  int64_t col_floats, pad_floats, dwt_floats, stage_floats;

  explicit Plan(const Conv2dShape& s)
      : P(s.OH() * s.OW()),
        K(s.C * s.KH * s.KW),
        G(std::clamp<int64_t>((kMinColumns + P - 1) / P, 1, std::max<int64_t>(s.N, 1))),
        Hp(s.H + 2 * s.pad),
        Ws(round_up(s.W + 2 * s.pad, kBlock)),
        margin(round_up(s.KW + kBlock, kAlign)),
        col_floats(round_up(K * G * P, kAlign)),
        pad_floats(round_up(s.C * Hp * Ws, kAlign)),
        dwt_floats(round_up(K * s.OC, kAlign)),
        stage_floats(round_up(s.OC * G * P, kAlign)) {}
  int64_t total() const {
    return margin + col_floats + margin + pad_floats + dwt_floats + stage_floats;
  }
};

// The scratch regions of one call.
struct Buffers {
  float *col, *xpad, *dwt, *stage;
  Buffers(float* scratch, const Plan& p)
      : col(scratch + p.margin),
        xpad(col + p.col_floats + p.margin),
        dwt(xpad + p.pad_floats),
        stage(dwt + p.dwt_floats) {}
};

// Copies a row of n floats in blocks that compile to single vector moves (a fixed-size memcpy
// is always inlined), ending with one block overlapping the previous one instead of a scalar
// tail; gcc would otherwise turn the short copies into memcpy calls.
inline void copy_row(float* __restrict dst, const float* __restrict src, int64_t n) {
  if (n < kBlock) {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
    return;
  }
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) std::memcpy(dst + i, src + i, sizeof(float) * kBlock);
  if (i < n) std::memcpy(dst + n - kBlock, src + n - kBlock, sizeof(float) * kBlock);
}

// Copies image x[C,H,W] into the interior of xp[C,Hp,Ws]; the border is zeroed by the caller.
void pad_image(float* xp, const float* x, const Conv2dShape& s, const Plan& p) {
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t h = 0; h < s.H; ++h) {
      copy_row(xp + (c * p.Hp + h + s.pad) * p.Ws + s.pad, x + (c * s.H + h) * s.W, s.W);
    }
  }
}

// Writes image src[C, rows, row_stride] (already padded) into columns [0, P) of col (rows
// (c, kh, kw), leading dimension ld).
void im2col(float* col, int64_t ld, const float* src, int64_t rows, int64_t row_stride,
            const Conv2dShape& s) {
  const int64_t OH = s.OH(), OW = s.OW(), st = s.stride;
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        float* row = col + ((c * s.KH + kh) * s.KW + kw) * ld;
        const float* base = src + (c * rows + kh) * row_stride + kw;
        if (st == 1) {
          for (int64_t oh = 0; oh < OH; ++oh) copy_row(row + oh * OW, base + oh * row_stride, OW);
          continue;
        }
        for (int64_t oh = 0; oh < OH; ++oh) {
          const float* in = base + oh * st * row_stride;
          float* dst = row + oh * OW;
          for (int64_t ow = 0; ow < OW; ++ow) dst[ow] = in[ow * st];
        }
      }
    }
  }
}

// Fills columns [0, P) of col from image xn, through xpad when pad > 0.
void image_to_columns(float* col, int64_t ld, float* xpad, const float* xn, const Conv2dShape& s,
                      const Plan& p) {
  if (s.pad == 0) {
    im2col(col, ld, xn, s.H, s.W, s);
    return;
  }
  pad_image(xpad, xn, s, p);
  im2col(col, ld, xpad, p.Hp, p.Ws, s);
}

// The adjoint of im2col for stride 1: adds columns [0, P) of col into dxp[C,Hp,Ws]. Padded row
// ih of channel c receives, for each kh with oh = ih - kh in range and each kw, column row
// (c, kh, kw) at output row oh shifted right by kw. Each block of kBlock floats of the padded
// row sums its KW shifted inputs in a register, reading whole blocks from the column rows and
// masking the lanes that fall outside [0, OW) (they may hold the neighbouring output row, or
// the scratch margin), then adds to memory once.
void col2im_stride1(float* dxp, const float* col, int64_t ld, const Conv2dShape& s, const Plan& p) {
  const int64_t OH = s.OH(), OW = s.OW();
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      const float* rows = col + (c * s.KH + kh) * s.KW * ld;  // the KW rows of (c, kh)
      for (int64_t oh = 0; oh < OH; ++oh) {
        float* drow = dxp + (c * p.Hp + oh + kh) * p.Ws;
        for (int64_t i0 = 0; i0 < p.Ws; i0 += kBlock) {
          float acc[kBlock];
          std::memcpy(acc, drow + i0, sizeof acc);
          for (int64_t kw = 0; kw < s.KW; ++kw) {
            // Lane l takes column ow = i0 + l - kw of output row oh.
            uint32_t v[kBlock];
            std::memcpy(v, rows + kw * ld + oh * OW + i0 - kw, sizeof v);
            const int32_t lo = static_cast<int32_t>(kw - i0);
            const int32_t hi = static_cast<int32_t>(OW + kw - i0);
            for (int32_t l = 0; l < kBlock; ++l) {
              // Masking by bits, not by multiplying with 0, so a NaN outside the row stays out.
              const uint32_t keep = (l >= lo) & (l < hi) ? ~0u : 0u;
              acc[l] += std::bit_cast<float>(v[l] & keep);
            }
          }
          std::memcpy(drow + i0, acc, sizeof acc);
        }
      }
    }
  }
}

// The adjoint of im2col for any stride: plain scatter-adds into dxp[C,Hp,Ws].
void col2im_strided(float* dxp, const float* col, int64_t ld, const Conv2dShape& s, const Plan& p) {
  const int64_t OH = s.OH(), OW = s.OW(), st = s.stride;
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        const float* row = col + ((c * s.KH + kh) * s.KW + kw) * ld;
        float* base = dxp + (c * p.Hp + kh) * p.Ws + kw;
        for (int64_t oh = 0; oh < OH; ++oh) {
          float* dst = base + oh * st * p.Ws;
          const float* src = row + oh * OW;
          for (int64_t ow = 0; ow < OW; ++ow) dst[ow * st] += src[ow];
        }
      }
    }
  }
}

}  // namespace

namespace detail {

int64_t conv2d_im2col_scratch_floats(const Conv2dShape& s) { return Plan(s).total(); }

void conv2d_im2col_forward(float* y, const float* x, const float* w, const float* b,
                           const Conv2dShape& s, float* scratch) {
  const Plan p(s);
  const Buffers buf(scratch, p);
  const int64_t in_size = s.C * s.H * s.W, out_size = s.OC * p.P;
  std::fill(buf.xpad, buf.xpad + p.pad_floats, 0.0f);  // the border; interiors are overwritten
  for (int64_t n0 = 0; n0 < s.N; n0 += p.G) {
    const int64_t g_count = std::min(p.G, s.N - n0), ld = g_count * p.P;
    for (int64_t g = 0; g < g_count; ++g) {
      image_to_columns(buf.col + g * p.P, ld, buf.xpad, x + (n0 + g) * in_size, s, p);
    }
    if (g_count == 1) {
      // One image: y[n] is already [OC, P]; seed it with the bias and let the GEMM add.
      float* yn = y + n0 * out_size;
      for (int64_t oc = 0; oc < s.OC; ++oc) {
        std::fill(yn + oc * p.P, yn + (oc + 1) * p.P, b != nullptr ? b[oc] : 0.0f);
      }
      gemm(false, false, s.OC, p.P, p.K, 1.0f, w, p.K, buf.col, p.P, 1.0f, yn, p.P);
      continue;
    }
    // stage[OC, g_count*P] = w[OC, K] @ col[K, g_count*P], then scatter to NCHW with the bias.
    gemm(false, false, s.OC, ld, p.K, 1.0f, w, p.K, buf.col, ld, 0.0f, buf.stage, ld);
    for (int64_t g = 0; g < g_count; ++g) {
      float* yn = y + (n0 + g) * out_size;
      for (int64_t oc = 0; oc < s.OC; ++oc) {
        const float* src = buf.stage + oc * ld + g * p.P;
        float* dst = yn + oc * p.P;
        const float bias = b != nullptr ? b[oc] : 0.0f;
        for (int64_t i = 0; i < p.P; ++i) dst[i] = src[i] + bias;
      }
    }
  }
}

void conv2d_im2col_backward(float* dx, float* dw, float* db, const float* dy, const float* relu_y,
                            const float* x, const float* w, const Conv2dShape& s, float* scratch) {
  const Plan p(s);
  const Buffers buf(scratch, p);
  const int64_t in_size = s.C * s.H * s.W, out_size = s.OC * p.P;
  std::fill(buf.col - p.margin, buf.col, 0.0f);  // margins: read by col2im, always masked
  std::fill(buf.col + p.col_floats, buf.col + p.col_floats + p.margin, 0.0f);
  std::fill(buf.xpad, buf.xpad + p.pad_floats, 0.0f);
  std::fill(buf.dwt, buf.dwt + p.dwt_floats, 0.0f);
  for (int64_t n0 = 0; n0 < s.N; n0 += p.G) {
    const int64_t g_count = std::min(p.G, s.N - n0), ld = g_count * p.P;
    // The group's dy as [OC, g_count*P], matching the column layout (and masked by the
    // ReLU's output when fused).
    const float* dyg = dy + n0 * out_size;
    if (g_count > 1 || relu_y != nullptr) {
      for (int64_t g = 0; g < g_count; ++g) {
        for (int64_t oc = 0; oc < s.OC; ++oc) {
          const int64_t at = ((n0 + g) * s.OC + oc) * p.P;
          float* dst = buf.stage + oc * ld + g * p.P;
          if (relu_y == nullptr) {
            std::memcpy(dst, dy + at, static_cast<size_t>(p.P) * sizeof(float));
          } else {
            for (int64_t i = 0; i < p.P; ++i) dst[i] = relu_y[at + i] > 0.0f ? dy[at + i] : 0.0f;
          }
        }
      }
      dyg = buf.stage;
    }
    if (db != nullptr) {
      for (int64_t oc = 0; oc < s.OC; ++oc) db[oc] += detail::sum(dyg + oc * ld, ld);
    }
    for (int64_t g = 0; g < g_count; ++g) {
      image_to_columns(buf.col + g * p.P, ld, buf.xpad, x + (n0 + g) * in_size, s, p);
    }
    // dwT[K, OC] += col[K, ld] @ dyg[OC, ld]^T
    gemm(false, true, p.K, s.OC, ld, 1.0f, buf.col, ld, dyg, ld, 1.0f, buf.dwt, s.OC);
    if (dx == nullptr) continue;
    // dcol[K, ld] = w[OC, K]^T @ dyg[OC, ld], written over the columns it no longer needs.
    gemm(true, false, p.K, ld, s.OC, 1.0f, w, p.K, dyg, ld, 0.0f, buf.col, ld);
    for (int64_t g = 0; g < g_count; ++g) {
      // Accumulate into the zeroed padded buffer, then keep its interior.
      std::fill(buf.xpad, buf.xpad + p.pad_floats, 0.0f);
      if (s.stride == 1) {
        col2im_stride1(buf.xpad, buf.col + g * p.P, ld, s, p);
      } else {
        col2im_strided(buf.xpad, buf.col + g * p.P, ld, s, p);
      }
      float* dxn = dx + (n0 + g) * in_size;
      for (int64_t c = 0; c < s.C; ++c) {
        for (int64_t h = 0; h < s.H; ++h) {
          copy_row(dxn + (c * s.H + h) * s.W, buf.xpad + (c * p.Hp + h + s.pad) * p.Ws + s.pad,
                   s.W);
        }
      }
    }
    // The border now holds the padding's gradient; the next group's pad_image needs zeros.
    std::fill(buf.xpad, buf.xpad + p.pad_floats, 0.0f);
  }
  for (int64_t oc = 0; oc < s.OC; ++oc) {
    for (int64_t k = 0; k < p.K; ++k) dw[oc * p.K + k] += buf.dwt[k * s.OC + oc];
  }
}

int64_t conv_pooled_size(const Conv2dShape& s, const ConvFusion& f) {
  return s.OC * ((s.OH() - f.pool_k) / f.pool_stride + 1) *
         ((s.OW() - f.pool_k) / f.pool_stride + 1);
}

void pool_relu_grad_image(float* dconv, const float* dy, const int32_t* argmax, const float* y,
                          const Conv2dShape& s, int64_t k, int64_t stride) {
  const int64_t plane = s.OH() * s.OW();
  const int64_t pooled = ((s.OH() - k) / stride + 1) * ((s.OW() - k) / stride + 1);
  for (int64_t oc = 0; oc < s.OC; ++oc) {
    float* d = dconv + oc * plane;
    std::fill(d, d + plane, 0.0f);
    const int64_t o0 = oc * pooled;
    // maxpool2d_backward's scatter (+=, windows may overlap), keeping only winners the ReLU
    // passed: relu_backward's mask at a winner is its window's pooled output > 0. The others
    // add +0, masked by bits (a branch on the data would mispredict half the time): that leaves
    // the same bits, since d starts at +0 and no sum of ours turns it into -0.
    for (int64_t o = o0; o < o0 + pooled; ++o) {
      const uint32_t keep = y[o] > 0.0f ? ~0u : 0u;
      d[argmax[o]] += std::bit_cast<float>(std::bit_cast<uint32_t>(dy[o]) & keep);
    }
  }
}

}  // namespace detail

namespace {

using detail::ConvFusion;

void check_pool(const char* who, const Conv2dShape& s, int64_t k, int64_t stride) {
  if (k >= 1 && stride >= 1 && s.OH() >= k && s.OW() >= k) return;
  throw InvalidArgument(str(who, ": pool window must fit the convolution's ", s.OH(), "x", s.OW(),
                            " output and stride be >= 1, got k=", k, " stride=", stride,
                            "; use a smaller pool window"));
}

// One image of a batch shape, for the portable fused paths.
Conv2dShape one_image(Conv2dShape s) {
  s.N = 1;
  return s;
}

}  // namespace

namespace detail {

bool conv2d_direct_supported(const Conv2dShape& s) {
  return s.stride == 1 && s.KW <= kDirectMaxKW && s.pad < s.KH && s.pad < s.KW;
}

int64_t conv2d_direct_scratch_floats(const Conv2dShape& s, const ConvFusion& f) {
  TESSEL_CHECK(conv2d_direct_supported(s),
               "conv2d_direct_scratch_floats: unsupported shape, got stride=", s.stride,
               " KW=", s.KW, " pad=", s.pad);
  return kernels().conv_direct_scratch(s, f);
}

void conv2d_direct_forward(float* y, int32_t* argmax, const float* x, const float* w,
                           const float* b, const ConvFusion& f, const Conv2dShape& s,
                           float* scratch) {
  TESSEL_CHECK(conv2d_direct_supported(s),
               "conv2d_direct_forward: unsupported shape, got stride=", s.stride, " KW=", s.KW,
               " pad=", s.pad);
  kernels().conv_direct_forward(y, argmax, x, w, b, f, s, scratch);
}

void conv2d_direct_backward(float* dx, float* dw, float* db, const float* dy, const float* y,
                            const int32_t* argmax, const ConvFusion& f, const float* x,
                            const float* w, const Conv2dShape& s, float* scratch) {
  TESSEL_CHECK(conv2d_direct_supported(s),
               "conv2d_direct_backward: unsupported shape, got stride=", s.stride, " KW=", s.KW,
               " pad=", s.pad);
  kernels().conv_direct_backward(dx, dw, db, dy, y, argmax, f, x, w, s, scratch);
}

}  // namespace detail

int64_t conv2d_scratch_floats(const Conv2dShape& s) {
  check_shape("conv2d_scratch_floats", s);
  if (on_device()) return 0;  // the device's launchers keep their own workspace
  return detail::conv2d_direct_supported(s) ? detail::conv2d_direct_scratch_floats(s, {})
                                            : detail::conv2d_im2col_scratch_floats(s);
}

void conv2d_forward(float* y, const float* x, const float* w, const float* b, const Conv2dShape& s,
                    float* scratch) {
  check_shape("conv2d_forward", s);
  if (on_device())
    return device_kernel(&DeviceKernels::conv2d_forward, "conv2d_forward")(y, x, w, b, s,
                                                                           current_stream());
  if (detail::conv2d_direct_supported(s)) {
    detail::conv2d_direct_forward(y, nullptr, x, w, b, ConvFusion{}, s, scratch);
    return;
  }
  detail::conv2d_im2col_forward(y, x, w, b, s, scratch);
}

void conv2d_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const Conv2dShape& s, float* scratch) {
  check_shape("conv2d_backward", s);
  if (on_device())
    return device_kernel(&DeviceKernels::conv2d_backward, "conv2d_backward")(dx, dw, db, dy, x, w,
                                                                             s, current_stream());
  if (detail::conv2d_direct_supported(s)) {
    detail::conv2d_direct_backward(dx, dw, db, dy, nullptr, nullptr, ConvFusion{}, x, w, s,
                                   scratch);
    return;
  }
  detail::conv2d_im2col_backward(dx, dw, db, dy, nullptr, x, w, s, scratch);
}

void conv2d_relu_forward(float* y, const float* x, const float* w, const float* b,
                         const Conv2dShape& s, float* scratch) {
  check_shape("conv2d_relu_forward", s);
  if (on_device()) throw_no_device_kernel("conv2d_relu_forward");
  if (detail::conv2d_direct_supported(s)) {
    detail::conv2d_direct_forward(y, nullptr, x, w, b, ConvFusion{true}, s, scratch);
    return;
  }
  detail::conv2d_im2col_forward(y, x, w, b, s, scratch);
  relu_forward(y, y, s.N * s.OC * s.OH() * s.OW());
}

void conv2d_relu_backward(float* dx, float* dw, float* db, const float* dy, const float* y,
                          const float* x, const float* w, const Conv2dShape& s, float* scratch) {
  check_shape("conv2d_relu_backward", s);
  if (on_device()) throw_no_device_kernel("conv2d_relu_backward");
  if (detail::conv2d_direct_supported(s)) {
    detail::conv2d_direct_backward(dx, dw, db, dy, y, nullptr, ConvFusion{true}, x, w, s, scratch);
    return;
  }
  detail::conv2d_im2col_backward(dx, dw, db, dy, y, x, w, s, scratch);
}

// For the shapes the direct kernels do not take, im2col + GEMM runs the steps image by image
// through a one-image buffer kept after the im2col scratch.
int64_t conv2d_relu_maxpool_scratch_floats(const Conv2dShape& s, int64_t k, int64_t stride) {
  check_shape("conv2d_relu_maxpool_scratch_floats", s);
  check_pool("conv2d_relu_maxpool_scratch_floats", s, k, stride);
  if (on_device()) return detail::conv2d_relu_maxpool_device_floats(s, k, stride);
  if (detail::conv2d_direct_supported(s)) {
    return detail::conv2d_direct_scratch_floats(s, ConvFusion{true, k, stride});
  }
  return detail::conv2d_im2col_scratch_floats(one_image(s)) + s.OC * s.OH() * s.OW();
}

void conv2d_relu_maxpool_forward(float* y, int32_t* argmax, const float* x, const float* w,
                                 const float* b, const Conv2dShape& s, int64_t k, int64_t stride,
                                 float* scratch) {
  check_shape("conv2d_relu_maxpool_forward", s);
  check_pool("conv2d_relu_maxpool_forward", s, k, stride);
  if (on_device())
    return detail::conv2d_relu_maxpool_forward_device(y, argmax, x, w, b, s, k, stride, scratch);
  if (detail::conv2d_direct_supported(s)) {
    detail::conv2d_direct_forward(y, argmax, x, w, b, ConvFusion{true, k, stride}, s, scratch);
    return;
  }
  const Conv2dShape one = one_image(s);
  float* image = scratch + detail::conv2d_im2col_scratch_floats(one);
  const int64_t conv_size = s.OC * s.OH() * s.OW();
  const int64_t pooled = detail::conv_pooled_size(s, ConvFusion{true, k, stride});
  for (int64_t n = 0; n < s.N; ++n) {
    detail::conv2d_im2col_forward(image, x + n * s.C * s.H * s.W, w, b, one, scratch);
    relu_forward(image, image, conv_size);
    maxpool2d_forward(y + n * pooled, argmax + n * pooled, image, 1, s.OC, s.OH(), s.OW(), k,
                      stride);
  }
}

void conv2d_relu_maxpool_backward(float* dx, float* dw, float* db, const float* dy,
                                  const int32_t* argmax, const float* y, const float* x,
                                  const float* w, const Conv2dShape& s, int64_t k, int64_t stride,
                                  float* scratch) {
  check_shape("conv2d_relu_maxpool_backward", s);
  check_pool("conv2d_relu_maxpool_backward", s, k, stride);
  if (on_device())
    return detail::conv2d_relu_maxpool_backward_device(dx, dw, db, dy, argmax, y, x, w, s, k,
                                                       stride, scratch);
  if (detail::conv2d_direct_supported(s)) {
    detail::conv2d_direct_backward(dx, dw, db, dy, y, argmax, ConvFusion{true, k, stride}, x, w, s,
                                   scratch);
    return;
  }
  const Conv2dShape one = one_image(s);
  float* image = scratch + detail::conv2d_im2col_scratch_floats(one);
  const int64_t in_size = s.C * s.H * s.W;
  const int64_t pooled = detail::conv_pooled_size(s, ConvFusion{true, k, stride});
  for (int64_t n = 0; n < s.N; ++n) {
    detail::pool_relu_grad_image(image, dy + n * pooled, argmax + n * pooled, y + n * pooled, s, k,
                                 stride);
    detail::conv2d_im2col_backward(dx != nullptr ? dx + n * in_size : nullptr, dw, db, image,
                                   nullptr, x + n * in_size, w, one, scratch);
  }
}

}  // namespace tessel::ops
