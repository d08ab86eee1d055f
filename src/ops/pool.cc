// Max pooling without padding. argmax holds, per output, the index of the winning input inside
// its own (n, c) plane (h * W + w, as PyTorch's max_pool2d_with_indices), which fits int32 for
// any plane and makes the backward a scatter-add.
#include <algorithm>
#include <cmath>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {

void maxpool2d_forward(float* y, int32_t* argmax, const float* x, int64_t N, int64_t C,
                       int64_t H, int64_t W, int64_t k, int64_t stride) {
  TESSEL_CHECK(k >= 1 && stride >= 1 && H >= k && W >= k,
               "maxpool2d_forward: need 1 <= k <= H, W and stride >= 1, got k=", k,
               " stride=", stride, " H=", H, " W=", W);
  TESSEL_CHECK(H * W <= INT32_MAX, "maxpool2d_forward: plane H*W must fit int32, got ", H * W);
  const int64_t OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
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
            // Strict > keeps the first maximum in scan order; a NaN wins (once) so it
            // propagates to the output as in PyTorch.
            if (v > bv || (std::isnan(v) && !std::isnan(bv))) {
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
  const int64_t OH = (H - k) / stride + 1, OW = (W - k) / stride + 1;
  std::fill(dx, dx + N * C * H * W, 0.0f);
  for (int64_t p = 0; p < N * C; ++p) {
    float* dxp = dx + p * H * W;
    const float* dyp = dy + p * OH * OW;
    const int32_t* ap = argmax + p * OH * OW;
    // += because overlapping windows (stride < k) can pick the same input twice.
    for (int64_t o = 0; o < OH * OW; ++o) dxp[ap[o]] += dyp[o];
  }
}

}  // namespace tessel::ops
