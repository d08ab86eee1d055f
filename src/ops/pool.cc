// Max pooling without padding. argmax holds, per output, the index of the winning input inside
// its own (n, c) plane (h * W + w, as PyTorch's max_pool2d_with_indices), which fits int32 for
// any plane and makes the backward a scatter-add.
#include <algorithm>

#include "kernels.h"
#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"

namespace tessel::ops {
namespace {

// Whether v replaces the running maximum m: strictly greater keeps the first maximum in scan
// order; a NaN wins (once), so it propagates to the output as in PyTorch. Written as
// "v > m or v is NaN, unless m is NaN" in the one form gcc vectorises in the 2x2 loop below.
inline bool takes_over(float v, float m) { return !(v <= m) && m == m; }

// The common 2x2, stride 2 window. Rows are short (often 7..14 outputs), so a plain loop would
// spend its time in gcc's scalar remainder, whose NaN-aware compares become unpredictable
// branches on real data. Instead every row is done in chunks of a fixed kChunk outputs, a loop
// gcc vectorises completely. Lanes past a row's end read the next inputs and store garbage
// into the next outputs, which the following rows (processed in order) overwrite; only near
// the end of the tensor, where that would leave the buffers, does a chunk go through local
// copies instead.
constexpr int64_t kChunk = 16;

// Outputs [0, kChunk) from input rows r0 and r1 = r0 + W, r0 at plane index base.
inline void chunk_2x2(float* m, int32_t* at, const float* r0, const float* r1, int32_t base,
                      int32_t w) {
  for (int64_t j = 0; j < kChunk; ++j) {
    const int32_t c = base + static_cast<int32_t>(2 * j);
    float best = r0[2 * j];
    int32_t i = c;
    const float v1 = r0[2 * j + 1], v2 = r1[2 * j], v3 = r1[2 * j + 1];
    const bool t1 = takes_over(v1, best);
    best = t1 ? v1 : best;
    i = t1 ? c + 1 : i;
    const bool t2 = takes_over(v2, best);
    best = t2 ? v2 : best;
    i = t2 ? c + w : i;
    const bool t3 = takes_over(v3, best);
    best = t3 ? v3 : best;
    i = t3 ? c + w + 1 : i;
    m[j] = best;
    at[j] = i;
  }
}

}  // namespace

// The portable 2x2 pool (the AVX2 and AVX-512 levels have their own, pool_avx2.cc and
// pool_avx512.cc).
void portable::maxpool_2x2(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H,
                           int64_t W, int64_t OH, int64_t OW) {
  const float* x_end = x + planes * H * W;
  const float* y_end = y + planes * OH * OW;
  const int32_t w = static_cast<int32_t>(W);
  for (int64_t p = 0; p < planes; ++p) {
    const float* xp = x + p * H * W;
    for (int64_t oh = 0; oh < OH; ++oh) {
      for (int64_t ow0 = 0; ow0 < OW; ow0 += kChunk) {
        const float* r0 = xp + 2 * oh * W + 2 * ow0;
        const int64_t o = (p * OH + oh) * OW + ow0;
        const int32_t base = static_cast<int32_t>(2 * oh * W + 2 * ow0);
        if (r0 + W + 2 * kChunk <= x_end && y + o + kChunk <= y_end) {
          chunk_2x2(y + o, argmax + o, r0, r0 + W, base, w);
          continue;
        }
        const int64_t n = std::min(kChunk, OW - ow0);
        float top[2 * kChunk] = {}, bottom[2 * kChunk] = {}, m[kChunk];
        int32_t at[kChunk];
        std::copy(r0, r0 + 2 * n, top);
        std::copy(r0 + W, r0 + W + 2 * n, bottom);
        chunk_2x2(m, at, top, bottom, base, w);
        std::copy(m, m + n, y + o);
        std::copy(at, at + n, argmax + o);
      }
    }
  }
}

void maxpool2d_forward(float* y, int32_t* argmax, const float* x, int64_t N, int64_t C, int64_t H,
                       int64_t W, int64_t k, int64_t stride) {
  TESSEL_CHECK(k >= 1 && stride >= 1 && H >= k && W >= k,
               "maxpool2d_forward: need 1 <= k <= H, W and stride >= 1, got k=", k,
               " stride=", stride, " H=", H, " W=", W);
  TESSEL_CHECK(H * W <= INT32_MAX, "maxpool2d_forward: plane H*W must fit int32, got ", H * W);
  if (on_device())
    return device_kernel(&DeviceKernels::maxpool2d_forward, "maxpool2d_forward")(
        y, argmax, x, N, C, H, W, k, stride, current_stream());
  const int64_t OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
  if (k == 2 && stride == 2) {
    kernels().maxpool_2x2(y, argmax, x, N * C, H, W, OH, OW);
    return;
  }
  for (int64_t p = 0; p < N * C; ++p) {
    const float* xp = x + p * H * W;
    float* yp = y + p * OH * OW;
    int32_t* ap = argmax + p * OH * OW;

    for (int64_t oh = 0; oh < OH; ++oh) {
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t best = oh * stride * W + ow * stride;
        float bv = xp[best];
        for (int64_t i = 0; i < k; ++i) {
          const int64_t row = (oh * stride + i) * W + ow * stride;
          for (int64_t j = 0; j < k; ++j) {
            const float v = xp[row + j];
            if (takes_over(v, bv)) {
              bv = v;
              best = row + j;
            }
          }
        }
        yp[oh * OW + ow] = bv;
        ap[oh * OW + ow] = static_cast<int32_t>(best);
      }
    }
  }
}

void maxpool2d_backward(float* dx, const float* dy, const int32_t* argmax, int64_t N, int64_t C,
                        int64_t H, int64_t W, int64_t k, int64_t stride) {
  if (dx == nullptr) return;
  if (on_device())
    return device_kernel(&DeviceKernels::maxpool2d_backward, "maxpool2d_backward")(
        dx, dy, argmax, N, C, H, W, k, stride, current_stream());
  const int64_t OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
  for (int64_t p = 0; p < N * C; ++p) {
    // Plane by plane, so that the scatter finds the zeroed plane still in L1: a fill of the
    // whole tensor first would stream it through memory twice.
    float* dxp = dx + p * H * W;
    const float* dyp = dy + p * OH * OW;
    const int32_t* ap = argmax + p * OH * OW;
    std::fill(dxp, dxp + H * W, 0.0f);
    // += because overlapping windows (stride < k) can pick the same input twice.
    for (int64_t o = 0; o < OH * OW; ++o) dxp[ap[o]] += dyp[o];
  }
}

}  // namespace tessel::ops
