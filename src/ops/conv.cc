// Conv2d as im2col + GEMM. Images are processed in groups of G: the group's im2col columns sit
// side by side in one [C*KH*KW, G*OH*OW] matrix so a single large GEMM serves G images (small
// per-image GEMMs leave OpenBLAS far from peak). The GEMM result is [OC, G*OH*OW] and is then
// scattered to the NCHW output. Scratch per group: the column matrix plus that [OC, G*OH*OW]
// staging matrix; G is chosen so the column matrix stays around the size of the L2 cache.
#include <algorithm>
#include <cstring>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

// Target size of one group's column matrix, in floats (1 MiB).
constexpr int64_t kColTargetFloats = int64_t{1} << 18;

void check_shape(const char* who, const Conv2dShape& s) {
  TESSEL_CHECK(s.N >= 0 && s.C > 0 && s.OC > 0 && s.KH > 0 && s.KW > 0 && s.stride > 0 &&
                   s.pad >= 0,
               who, ": bad shape, got N=", s.N, " C=", s.C, " OC=", s.OC, " KH=", s.KH,
               " KW=", s.KW, " stride=", s.stride, " pad=", s.pad);
  TESSEL_CHECK(s.H + 2 * s.pad >= s.KH && s.W + 2 * s.pad >= s.KW, who,
               ": kernel larger than the padded input, got H=", s.H, " W=", s.W, " pad=", s.pad,
               " KH=", s.KH, " KW=", s.KW);
}

int64_t group_size(const Conv2dShape& s) {
  const int64_t per_image = s.C * s.KH * s.KW * s.OH() * s.OW();
  return std::clamp<int64_t>(kColTargetFloats / std::max<int64_t>(per_image, 1), 1,
                             std::max<int64_t>(s.N, 1));
}

// First output column ow whose input column ow*stride - pad + k lies at or after 0, and the
// first one whose input column lies at or after `limit`.
inline int64_t first_ow_at_least(int64_t limit, int64_t k, const Conv2dShape& s, int64_t OW) {
  const int64_t num = limit + s.pad - k;  // need ow * stride >= num
  const int64_t ow = num <= 0 ? 0 : (num + s.stride - 1) / s.stride;
  return std::min(ow, OW);
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

// Writes image x[C,H,W] into columns [0, OH*OW) of col, whose rows are (c, kh, kw) and have
// leading dimension ld. Padding reads as zero.
void im2col(float* col, int64_t ld, const float* x, const Conv2dShape& s) {
  const int64_t OH = s.OH(), OW = s.OW();
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        float* row = col + ((c * s.KH + kh) * s.KW + kw) * ld;
        const int64_t lo = first_ow_at_least(0, kw, s, OW);
        const int64_t hi = std::max(lo, first_ow_at_least(s.W, kw, s, OW));
        for (int64_t oh = 0; oh < OH; ++oh) {
          float* dst = row + oh * OW;
          const int64_t ih = oh * s.stride - s.pad + kh;
          if (ih < 0 || ih >= s.H) {
            std::fill(dst, dst + OW, 0.0f);
            continue;
          }
          // Input column of output column ow is ow * stride + iw0, inside [0, W) for [lo, hi).
          const float* src = x + (c * s.H + ih) * s.W;
          const int64_t iw0 = kw - s.pad;
          std::fill(dst, dst + lo, 0.0f);
          if (s.stride == 1) {
            if (hi > lo) std::memcpy(dst + lo, src + lo + iw0, static_cast<size_t>(hi - lo) * 4);
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * s.stride + iw0];
          }
          std::fill(dst + hi, dst + OW, 0.0f);
        }
      }
    }
  }
}

// The adjoint of im2col: adds columns [0, OH*OW) of col back into dx[C,H,W] (not zeroed here).
void col2im(float* dx, const float* col, int64_t ld, const Conv2dShape& s) {
  const int64_t OH = s.OH(), OW = s.OW();
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        const float* row = col + ((c * s.KH + kh) * s.KW + kw) * ld;
        const int64_t lo = first_ow_at_least(0, kw, s, OW);
        const int64_t hi = std::max(lo, first_ow_at_least(s.W, kw, s, OW));
        for (int64_t oh = 0; oh < OH; ++oh) {
          const int64_t ih = oh * s.stride - s.pad + kh;
          if (ih < 0 || ih >= s.H) continue;
          const float* srcrow = row + oh * OW;
          float* dst = dx + (c * s.H + ih) * s.W;
          const int64_t iw0 = kw - s.pad;
          if (s.stride == 1) {
            for (int64_t ow = lo; ow < hi; ++ow) dst[ow + iw0] += srcrow[ow];
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) dst[ow * s.stride + iw0] += srcrow[ow];
          }
        }
      }
    }
  }
}

}  // namespace

int64_t conv2d_scratch_floats(const Conv2dShape& s) {
  check_shape("conv2d_scratch_floats", s);
  const int64_t G = group_size(s);
  return G * (s.C * s.KH * s.KW + s.OC) * s.OH() * s.OW();
}

void conv2d_forward(float* y, const float* x, const float* w, const float* b,
                    const Conv2dShape& s, float* scratch) {
  check_shape("conv2d_forward", s);
  const int64_t OHW = s.OH() * s.OW(), K = s.C * s.KH * s.KW, G = group_size(s);
  const int64_t in_size = s.C * s.H * s.W, out_size = s.OC * OHW;
  for (int64_t n0 = 0; n0 < s.N; n0 += G) {
    const int64_t g_count = std::min(G, s.N - n0), ld = g_count * OHW;
    float* col = scratch;
    float* stage = scratch + K * ld;
    for (int64_t g = 0; g < g_count; ++g) im2col(col + g * OHW, ld, x + (n0 + g) * in_size, s);
    // stage[OC, g_count*OHW] = w[OC, K] @ col[K, g_count*OHW]
    gemm(false, false, s.OC, ld, K, 1.0f, w, K, col, ld, 0.0f, stage, ld);
    for (int64_t g = 0; g < g_count; ++g) {
      float* yn = y + (n0 + g) * out_size;
      for (int64_t oc = 0; oc < s.OC; ++oc) {
        const float* src = stage + oc * ld + g * OHW;
        float* dst = yn + oc * OHW;
        const float bias = b != nullptr ? b[oc] : 0.0f;
        for (int64_t i = 0; i < OHW; ++i) dst[i] = src[i] + bias;
      }
    }
  }
}

void conv2d_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const Conv2dShape& s, float* scratch) {
  check_shape("conv2d_backward", s);
  const int64_t OHW = s.OH() * s.OW(), K = s.C * s.KH * s.KW, G = group_size(s);
  const int64_t in_size = s.C * s.H * s.W, out_size = s.OC * OHW;
  if (dx != nullptr) std::fill(dx, dx + s.N * in_size, 0.0f);
  for (int64_t n0 = 0; n0 < s.N; n0 += G) {
    const int64_t g_count = std::min(G, s.N - n0), ld = g_count * OHW;
    float* col = scratch;
    float* dyg = scratch + K * ld;
    // Gather the group's dy into [OC, g_count*OHW] to match the column layout.
    for (int64_t g = 0; g < g_count; ++g) {
      const float* dyn = dy + (n0 + g) * out_size;
      for (int64_t oc = 0; oc < s.OC; ++oc) {
        std::memcpy(dyg + oc * ld + g * OHW, dyn + oc * OHW, static_cast<size_t>(OHW) * 4);
      }
    }
    if (db != nullptr) {
      for (int64_t oc = 0; oc < s.OC; ++oc) {
        db[oc] += sum_floats(dyg + oc * ld, ld);
      }
    }
    for (int64_t g = 0; g < g_count; ++g) im2col(col + g * OHW, ld, x + (n0 + g) * in_size, s);
    // dw[OC, K] += dyg[OC, ld] @ col[K, ld]^T
    gemm(false, true, s.OC, K, ld, 1.0f, dyg, ld, col, ld, 1.0f, dw, K);
    if (dx == nullptr) continue;
    // dcol[K, ld] = w[OC, K]^T @ dyg[OC, ld], written over the columns it no longer needs.
    gemm(true, false, K, ld, s.OC, 1.0f, w, K, dyg, ld, 0.0f, col, ld);
    for (int64_t g = 0; g < g_count; ++g) col2im(dx + (n0 + g) * in_size, col + g * OHW, ld, s);
  }
}

}  // namespace tessel::ops
