// Max pooling without padding, the CPU's rule (pool.cc): a window's first maximum in scan order
// wins, a NaN wins (once). The forward is one thread per output; the backward one thread per
// input, gathering dy over the outputs whose windows hold it and that it won, in increasing
// output order: the sum the CPU's scatter makes, in the same order, without atomics.
#include "common.cuh"
#include "tessel/ops/cuda/conv.h"

namespace tessel::ops::cuda {
namespace {

constexpr int kThreads = 256;

// pool.cc's takes_over: strictly greater, or v a NaN, unless m already is one.
__device__ __forceinline__ bool takes_over(float v, float m) { return !(v <= m) && m == m; }

__global__ void maxpool_forward_kernel(float* y, int32_t* argmax, const float* x, int64_t planes,
                                       int64_t H, int64_t W, int64_t k, int64_t stride, int64_t OH,
                                       int64_t OW) {
  const int64_t n = planes * OH * OW;
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < n;
       o += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = o / (OH * OW), oh = o / OW % OH, ow = o % OW;
    const float* xp = x + p * H * W;
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
    y[o] = bv;
    argmax[o] = static_cast<int32_t>(best);
  }
}

// Output rows (likewise columns) whose windows hold input row h: oh * stride <= h <
// oh * stride + k, i.e. [lo, hi].
__device__ __forceinline__ void windows(int64_t h, int64_t k, int64_t stride, int64_t OH,
                                        int64_t& lo, int64_t& hi) {
  lo = h < k ? 0 : (h - k) / stride + 1;
  hi = h / stride < OH ? h / stride : OH - 1;
}

__global__ void maxpool_backward_kernel(float* dx, const float* dy, const int32_t* argmax,
                                        int64_t planes, int64_t H, int64_t W, int64_t k,
                                        int64_t stride, int64_t OH, int64_t OW) {
  const int64_t n = planes * H * W;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = i / (H * W), h = i / W % H, w = i % W;
    const int32_t at = static_cast<int32_t>(h * W + w);
    int64_t oh0, oh1, ow0, ow1;
    windows(h, k, stride, OH, oh0, oh1);
    windows(w, k, stride, OW, ow0, ow1);
    float acc = 0.0f;
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const int64_t o = (p * OH + oh) * OW + ow;
        if (argmax[o] == at) acc += dy[o];
      }
    dx[i] = acc;
  }
}

void check_pool(const char* who, int64_t H, int64_t W, int64_t k, int64_t stride) {
  TESSEL_CHECK(k >= 1 && stride >= 1 && H >= k && W >= k, who,
               ": need 1 <= k <= H, W and stride >= 1, got k=", k, " stride=", stride, " H=", H,
               " W=", W);
}

}  // namespace

void maxpool2d_forward(float* y, int32_t* argmax, const float* x, int64_t N, int64_t C, int64_t H,
                       int64_t W, int64_t k, int64_t stride, cudaStream_t stream) {
  check_pool("cuda maxpool2d_forward", H, W, k, stride);
  const int64_t OH = (H - k) / stride + 1, OW = (W - k) / stride + 1, n = N * C * OH * OW;
  if (n == 0) return;
  maxpool_forward_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(
      y, argmax, x, N * C, H, W, k, stride, OH, OW);
  check_launch("maxpool_forward_kernel");
}

void maxpool2d_backward(float* dx, const float* dy, const int32_t* argmax, int64_t N, int64_t C,
                        int64_t H, int64_t W, int64_t k, int64_t stride, cudaStream_t stream) {
  check_pool("cuda maxpool2d_backward", H, W, k, stride);
  const int64_t OH = (H - k) / stride + 1, OW = (W - k) / stride + 1, n = N * C * H * W;
  if (n == 0) return;
  maxpool_backward_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(
      dx, dy, argmax, N * C, H, W, k, stride, OH, OW);
  check_launch("maxpool_backward_kernel");
}

}  // namespace tessel::ops::cuda
