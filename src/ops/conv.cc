// Conv2d as im2col + GEMM.
//
// Terms: P = OH*OW output positions per image, K = C*KH*KW taps per output, the column matrix
// col[K, P] holds for each tap row the input value each output position sees. Then
//   y[n] = w[OC, K] @ col,   dw += dy[n] @ col^T,   dcol = w^T @ dy[n] -> col2im -> dx[n].
// Each image is first copied into a zero-padded buffer [C, H+2p, W+2p] so im2col and col2im
// run branch-free, vectorised inner loops (no per-element bounds checks, no tiny memcpy calls).
//
// Images with few output positions are processed in groups of G whose columns sit side by
// side in one [K, G*P] matrix, so a GEMM always has at least kMinColumns columns; the result is
// then staged as [OC, G*P] and scattered to NCHW. Images with P >= kMinColumns (measured: one
// image per GEMM is then as fast as any grouping, and keeps col in L2) go one at a time, with
// GEMMs reading and writing y and dy in place.
//
// Scratch: col [K, G*P], the padded image [C, Hp, Wp], and when G > 1 the stage [OC, G*P].
#include <algorithm>
#include <cstring>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

constexpr int64_t kMinColumns = 256;

void check_shape(const char* who, const Conv2dShape& s) {
  TESSEL_CHECK(s.N >= 0 && s.C > 0 && s.OC > 0 && s.KH > 0 && s.KW > 0 && s.stride > 0 &&
                   s.pad >= 0,
               who, ": bad shape, got N=", s.N, " C=", s.C, " OC=", s.OC, " KH=", s.KH,
               " KW=", s.KW, " stride=", s.stride, " pad=", s.pad);
  TESSEL_CHECK(s.H + 2 * s.pad >= s.KH && s.W + 2 * s.pad >= s.KW, who,
               ": kernel larger than the padded input, got H=", s.H, " W=", s.W, " pad=", s.pad,
               " KH=", s.KH, " KW=", s.KW);
}

// Derived sizes and the scratch layout, shared by forward, backward and the size query.
struct Plan {
  int64_t P, K, G, Hp, Wp;
  int64_t col_floats, pad_floats, stage_floats;

  explicit Plan(const Conv2dShape& s)
      : P(s.OH() * s.OW()),
        K(s.C * s.KH * s.KW),
        G(std::clamp<int64_t>((kMinColumns + P - 1) / P, 1, std::max<int64_t>(s.N, 1))),
        Hp(s.H + 2 * s.pad),
        Wp(s.W + 2 * s.pad),
        col_floats(K * G * P),
        pad_floats(s.pad > 0 ? s.C * Hp * Wp : 0),
        stage_floats(G > 1 ? s.OC * G * P : 0) {}
  int64_t total() const { return col_floats + pad_floats + stage_floats; }
};

// Row copy and row add for the short rows of im2col/col2im (often 7..28 floats), in blocks of
// 8 floats that compile to single vector moves (a fixed-size memcpy is always inlined). Instead
// of a scalar tail, a row ends with one block overlapping the previous one: a copy simply
// rewrites the overlap; an add masks the overlapping lanes out, and loads both blocks before
// storing either so no load waits on a partially overlapping store.
constexpr int64_t kBlock = 8;

inline void copy_row(float* __restrict dst, const float* __restrict src, int64_t n) {
  if (n < kBlock) {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
    return;
  }
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) std::memcpy(dst + i, src + i, sizeof(float) * kBlock);
  if (i < n) std::memcpy(dst + n - kBlock, src + n - kBlock, sizeof(float) * kBlock);
}

inline void add_row(float* __restrict dst, const float* __restrict src, int64_t n) {
  if (n < kBlock) {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    return;
  }
  int64_t i = 0;
  float a[kBlock], b[kBlock];
  for (; i + 2 * kBlock <= n; i += kBlock) {
    std::memcpy(a, dst + i, sizeof a);
    std::memcpy(b, src + i, sizeof b);
    for (int64_t j = 0; j < kBlock; ++j) a[j] += b[j];
    std::memcpy(dst + i, a, sizeof a);
  }
  // n - i is in [8, 16): a last full block at i and a tail block at n - 8 whose first `skip`
  // lanes the full block already covers.
  const int64_t t0 = n - kBlock, skip = i + kBlock - t0;
  float t[kBlock], u[kBlock];
  std::memcpy(a, dst + i, sizeof a);
  std::memcpy(b, src + i, sizeof b);
  std::memcpy(t, dst + t0, sizeof t);
  std::memcpy(u, src + t0, sizeof u);
  for (int64_t j = 0; j < kBlock; ++j) {
    a[j] += b[j];
    t[j] += j >= skip ? u[j] : 0.0f;
  }
  std::memcpy(dst + t0, t, sizeof t);  // first, so the full block's store wins the overlap
  std::memcpy(dst + i, a, sizeof a);
}

// Copies image x[C,H,W] into the interior of xp[C,Hp,Wp]; the border is zeroed by the caller
// once and never written.
void pad_image(float* xp, const float* x, const Conv2dShape& s, const Plan& p) {
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t h = 0; h < s.H; ++h) {
      const float* src = x + (c * s.H + h) * s.W;
      float* dst = xp + (c * p.Hp + h + s.pad) * p.Wp + s.pad;
      copy_row(dst, src, s.W);
    }
  }
}

// Writes padded image xp[C,Hp,Wp] into columns [0, P) of col (rows (c, kh, kw), leading
// dimension ld). Stride 1, the common case, copies whole output rows.
void im2col(float* col, int64_t ld, const float* xp, const Conv2dShape& s, const Plan& p) {
  const int64_t OH = s.OH(), OW = s.OW(), st = s.stride;
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        float* row = col + ((c * s.KH + kh) * s.KW + kw) * ld;
        const float* base = xp + (c * p.Hp + kh) * p.Wp + kw;
        if (st == 1) {
          for (int64_t oh = 0; oh < OH; ++oh) copy_row(row + oh * OW, base + oh * p.Wp, OW);
          continue;
        }
        for (int64_t oh = 0; oh < OH; ++oh) {
          const float* src = base + oh * st * p.Wp;
          float* dst = row + oh * OW;
          for (int64_t ow = 0; ow < OW; ++ow) dst[ow] = src[ow * st];
        }
      }
    }
  }
}

// The adjoint of im2col: adds columns [0, P) of col into the padded gradient dxp[C,Hp,Wp].
void col2im(float* dxp, const float* col, int64_t ld, const Conv2dShape& s, const Plan& p) {
  const int64_t OH = s.OH(), OW = s.OW(), st = s.stride;
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        const float* row = col + ((c * s.KH + kh) * s.KW + kw) * ld;
        float* base = dxp + (c * p.Hp + kh) * p.Wp + kw;
        if (st == 1) {
          for (int64_t oh = 0; oh < OH; ++oh) add_row(base + oh * p.Wp, row + oh * OW, OW);
          continue;
        }
        for (int64_t oh = 0; oh < OH; ++oh) {
          float* dst = base + oh * st * p.Wp;
          const float* src = row + oh * OW;
          for (int64_t ow = 0; ow < OW; ++ow) dst[ow * st] += src[ow];
        }
      }
    }
  }
}

// Sum with independent partial sums: vectorises without -ffast-math (a single accumulator is
// a serial dependency chain the compiler may not reorder) and loses less precision.
float sum_floats(const float* v, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += v[i + j];
  }
  float total = 0.0f;
  for (; i < n; ++i) total += v[i];
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  return total;
}

// Fills columns [g*P, (g+1)*P) of col from image n, through the padded buffer when pad > 0.
void image_to_columns(float* col, int64_t ld, float* xpad, const float* xn, const Conv2dShape& s,
                      const Plan& p) {
  if (s.pad > 0) {
    pad_image(xpad, xn, s, p);
    im2col(col, ld, xpad, s, p);
  } else {
    im2col(col, ld, xn, s, p);
  }
}

}  // namespace

int64_t conv2d_scratch_floats(const Conv2dShape& s) {
  check_shape("conv2d_scratch_floats", s);
  return Plan(s).total();
}

void conv2d_forward(float* y, const float* x, const float* w, const float* b,
                    const Conv2dShape& s, float* scratch) {
  check_shape("conv2d_forward", s);
  const Plan p(s);
  const int64_t in_size = s.C * s.H * s.W, out_size = s.OC * p.P;
  float* col = scratch;
  float* xpad = col + p.col_floats;
  float* stage = xpad + p.pad_floats;
  std::fill(xpad, xpad + p.pad_floats, 0.0f);  // the border; interiors are overwritten
  for (int64_t n0 = 0; n0 < s.N; n0 += p.G) {
    const int64_t g_count = std::min(p.G, s.N - n0), ld = g_count * p.P;
    for (int64_t g = 0; g < g_count; ++g) {
      image_to_columns(col + g * p.P, ld, xpad, x + (n0 + g) * in_size, s, p);
    }
    if (g_count == 1) {
      // One image: y[n] is already [OC, P]; seed it with the bias and let the GEMM add.
      float* yn = y + n0 * out_size;
      for (int64_t oc = 0; oc < s.OC; ++oc) {
        std::fill(yn + oc * p.P, yn + (oc + 1) * p.P, b != nullptr ? b[oc] : 0.0f);
      }
      gemm(false, false, s.OC, p.P, p.K, 1.0f, w, p.K, col, p.P, 1.0f, yn, p.P);
      continue;
    }
    // stage[OC, g_count*P] = w[OC, K] @ col[K, g_count*P], then scatter to NCHW with the bias.
    gemm(false, false, s.OC, ld, p.K, 1.0f, w, p.K, col, ld, 0.0f, stage, ld);
    for (int64_t g = 0; g < g_count; ++g) {
      float* yn = y + (n0 + g) * out_size;
      for (int64_t oc = 0; oc < s.OC; ++oc) {
        const float* src = stage + oc * ld + g * p.P;
        float* dst = yn + oc * p.P;
        const float bias = b != nullptr ? b[oc] : 0.0f;
        for (int64_t i = 0; i < p.P; ++i) dst[i] = src[i] + bias;
      }
    }
  }
}

void conv2d_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const Conv2dShape& s, float* scratch) {
  check_shape("conv2d_backward", s);
  const Plan p(s);
  const int64_t in_size = s.C * s.H * s.W, out_size = s.OC * p.P;
  float* col = scratch;
  float* xpad = col + p.col_floats;
  float* stage = xpad + p.pad_floats;
  std::fill(xpad, xpad + p.pad_floats, 0.0f);
  for (int64_t n0 = 0; n0 < s.N; n0 += p.G) {
    const int64_t g_count = std::min(p.G, s.N - n0), ld = g_count * p.P;
    // The group's dy as [OC, g_count*P], matching the column layout.
    const float* dyg = dy + n0 * out_size;
    if (g_count > 1) {
      for (int64_t g = 0; g < g_count; ++g) {
        for (int64_t oc = 0; oc < s.OC; ++oc) {
          std::memcpy(stage + oc * ld + g * p.P, dy + ((n0 + g) * s.OC + oc) * p.P,
                      static_cast<size_t>(p.P) * sizeof(float));
        }
      }
      dyg = stage;
    }
    if (db != nullptr) {
      for (int64_t oc = 0; oc < s.OC; ++oc) db[oc] += sum_floats(dyg + oc * ld, ld);
    }
    for (int64_t g = 0; g < g_count; ++g) {
      image_to_columns(col + g * p.P, ld, xpad, x + (n0 + g) * in_size, s, p);
    }
    // dw[OC, K] += dyg[OC, ld] @ col[K, ld]^T
    gemm(false, true, s.OC, p.K, ld, 1.0f, dyg, ld, col, ld, 1.0f, dw, p.K);
    if (dx == nullptr) continue;
    // dcol[K, ld] = w[OC, K]^T @ dyg[OC, ld], written over the columns it no longer needs.
    gemm(true, false, p.K, ld, s.OC, 1.0f, w, p.K, dyg, ld, 0.0f, col, ld);
    for (int64_t g = 0; g < g_count; ++g) {
      float* dxn = dx + (n0 + g) * in_size;
      if (s.pad == 0) {
        std::fill(dxn, dxn + in_size, 0.0f);
        col2im(dxn, col + g * p.P, ld, s, p);
        continue;
      }
      // Accumulate into the padded buffer, then keep its interior. Its border collects the
      // gradient of the zero padding, so it is re-zeroed here and for the next pad_image.
      std::fill(xpad, xpad + p.pad_floats, 0.0f);
      col2im(xpad, col + g * p.P, ld, s, p);
      for (int64_t c = 0; c < s.C; ++c) {
        for (int64_t h = 0; h < s.H; ++h) {
          const float* src = xpad + (c * p.Hp + h + s.pad) * p.Wp + s.pad;
          std::copy(src, src + s.W, dxn + (c * s.H + h) * s.W);
        }
      }
    }
    std::fill(xpad, xpad + p.pad_floats, 0.0f);
  }
}

}  // namespace tessel::ops
