// LayerNorm (llm.c layout): one warp per row for the statistics and dx; the parameter
// gradients are column sums in a fixed order (common.cuh's column_sums).
#include "common.cuh"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowsPerBlock = 8;  // warps per block, one row each

// Two passes over the row (mean, then centred squares), as the CPU: no E[x^2] - E[x]^2
// cancellation. The row is re-read from L1/L2, not kept in registers, so C is unbounded.
template <typename T>
__global__ void layernorm_forward_kernel(T* y, float* mean, float* rstd, const T* x, const T* w,
                                         const T* b, int64_t N, int C) {
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= N) return;
  const T* xr = x + r * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += 32) sum += to_f32(xr[c]);
  const float m = warp_sum(sum) / static_cast<float>(C);
  float sq = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = to_f32(xr[c]) - m;
    sq += d * d;
  }
  const float s = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + kEps);
  T* yr = y + r * C;
  for (int c = lane; c < C; c += 32)
    yr[c] = from_f32<T>((to_f32(xr[c]) - m) * s * to_f32(w[c]) + to_f32(b[c]));
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

// With xhat = (x - m) s and g = w dy:  dx = s (g - mean(g) - xhat mean(g xhat)).
template <typename T>
__global__ void layernorm_dx_kernel(T* dx, const T* dy, const T* x, const T* w, const float* mean,
                                    const float* rstd, int64_t N, int C) {
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= N) return;
  const T* xr = x + r * C;
  const T* dyr = dy + r * C;
  const float m = mean[r], s = rstd[r];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float g = to_f32(w[c]) * to_f32(dyr[c]);
    g_sum += g;
    gx_sum += g * (to_f32(xr[c]) - m) * s;
  }
  const float g_mean = warp_sum(g_sum) / static_cast<float>(C);
  const float gx_mean = warp_sum(gx_sum) / static_cast<float>(C);
  T* dxr = dx + r * C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (to_f32(xr[c]) - m) * s;
    dxr[c] = from_f32<T>(s * (to_f32(w[c]) * to_f32(dyr[c]) - g_mean - xhat * gx_mean));
  }
}

// The terms of dw[c] += sum_r xhat[r,c] dy[r,c] and db[c] += sum_r dy[r,c] (column_sums).
template <typename T>
struct LayerNormGrads {
  const T *dy, *x;
  const float *mean, *rstd;
  int64_t C;
  __device__ void operator()(int64_t r, int64_t c, float (&v)[2]) const {
    const float d = to_f32(dy[r * C + c]);
    v[0] = (to_f32(x[r * C + c]) - mean[r]) * rstd[r] * d;
    v[1] = d;
  }
};

void check_width(int64_t C, const char* who) {
  if (C <= 0 || C > (int64_t{1} << 30))
    throw InvalidArgument(str(who, ": C must be in [1, 2^30], got ", C));
}

}  // namespace

void layernorm_forward(void* y, float* mean, float* rstd, const void* x, const void* w,
                       const void* b, int64_t N, int64_t C, DType t, cudaStream_t s) {
  if (N <= 0) return;
  check_width(C, "cuda layernorm_forward");
  detail::dispatch(t, "cuda layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    layernorm_forward_kernel<<<detail::ceil_div(N, kRowsPerBlock), kRowsPerBlock * 32, 0, s>>>(
        static_cast<T*>(y), mean, rstd, static_cast<const T*>(x), static_cast<const T*>(w),
        static_cast<const T*>(b), N, static_cast<int>(C));
  });
  check_launch("cuda layernorm_forward");
}

void layernorm_backward(void* dx, float* dw, float* db, const void* dy, const void* x,
                        const void* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                        DType t, cudaStream_t s) {
  if (N <= 0) return;
  check_width(C, "cuda layernorm_backward");
  detail::dispatch(t, "cuda layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    detail::column_sums<2>(
        {dw, db}, N, C,
        LayerNormGrads<T>{static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, C}, s,
        "cuda layernorm_backward (dw, db)");
    if (dx != nullptr)
      layernorm_dx_kernel<<<detail::ceil_div(N, kRowsPerBlock), kRowsPerBlock * 32, 0, s>>>(
          static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x),
          static_cast<const T*>(w), mean, rstd, N, static_cast<int>(C));
  });
  check_launch("cuda layernorm_backward (dx)");
}

}  // namespace tessel::ops::cuda
