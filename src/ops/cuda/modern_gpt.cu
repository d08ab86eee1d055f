// The modern GPT's parts (model.norm = rmsnorm, model.position = rotary, model.mlp = swiglu),
// as src/ops/modern_gpt.cc computes them. RMSNorm: one warp per row for the statistics and dx,
// the weight gradient a column sum (common.cuh's column_sums, as LayerNorm's).
// Rotary: one thread per (row, head of q or k, pair), the angle in f64 as on the CPU. SwiGLU:
// grid-stride loops. Math in f32, one rounding to t per output.
#include "common.cuh"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr double kRotaryBase = 10000.0;
constexpr int kRowsPerBlock = 8;  // RMSNorm: warps per block, one row each
constexpr int kThreads = 256;

template <typename T>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const T* w, int64_t N,
                                       int C) {
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= N) return;
  const T* xr = x + r * C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += 32) sq += to_f32(xr[c]) * to_f32(xr[c]);
  const float s = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + kEps);
  T* yr = y + r * C;
  for (int c = lane; c < C; c += 32) yr[c] = from_f32<T>(to_f32(xr[c]) * s * to_f32(w[c]));
  if (lane == 0) rstd[r] = s;
}

// With xhat = x s and g = w dy:  dx = s (g - xhat mean(g xhat)).
template <typename T>
__global__ void rmsnorm_dx_kernel(T* dx, const T* dy, const T* x, const T* w, const float* rstd,
                                  int64_t N, int C) {
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= N) return;
  const T* xr = x + r * C;
  const T* dyr = dy + r * C;
  const float s = rstd[r];
  float gx_sum = 0.0f;
  for (int c = lane; c < C; c += 32) gx_sum += to_f32(w[c]) * to_f32(dyr[c]) * to_f32(xr[c]) * s;
  const float gx_mean = warp_sum(gx_sum) / static_cast<float>(C);
  T* dxr = dx + r * C;
  for (int c = lane; c < C; c += 32)
    dxr[c] = from_f32<T>(s * (to_f32(w[c]) * to_f32(dyr[c]) - to_f32(xr[c]) * s * gx_mean));
}

// The terms of dw[c] += sum_r x[r,c] rstd[r] dy[r,c] (column_sums).
template <typename T>
struct RmsNormGrad {
  const T *dy, *x;
  const float* rstd;
  int64_t C;
  __device__ void operator()(int64_t r, int64_t c, float (&v)[1]) const {
    v[0] = to_f32(x[r * C + c]) * rstd[r] * to_f32(dy[r * C + c]);
  }
};

// Thread e of N * 2NH * half turns pair i of head h (q's heads, then k's) of row r by
// sign * pos[r] * base^(-2i/hs).
template <typename T>
__global__ void rotary_kernel(T* qkv, const int64_t* pos, int64_t N, int C, int NH, float sign) {
  const int hs = C / NH, half = hs / 2;
  const int64_t total = N * 2 * NH * half;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(e % half);
    const int h = static_cast<int>(e / half % (2 * NH));
    const int64_t r = e / half / (2 * NH);
    const double freq = pow(kRotaryBase, -2.0 * i / hs);
    const double angle = static_cast<double>(pos[r]) * freq;
    const float c = static_cast<float>(cos(angle));
    const float s = sign * static_cast<float>(sin(angle));
    T* a = qkv + r * 3 * C + h * hs + i;
    T* b = a + half;
    const float x0 = to_f32(*a), x1 = to_f32(*b);
    *a = from_f32<T>(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));  // no contraction: the CPU's
    *b = from_f32<T>(__fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
  }
}

__device__ __forceinline__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

template <typename T>
__global__ void swiglu_forward_kernel(T* y, const T* x, int64_t N, int64_t H) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < N * H;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / H, j = e % H;
    const float a = to_f32(x[r * 2 * H + j]), b = to_f32(x[r * 2 * H + H + j]);
    y[e] = from_f32<T>(a * sigmoid(a) * b);
  }
}

// silu(a) = a sg(a); silu'(a) = sg(a) (1 + a (1 - sg(a))).
template <typename T>
__global__ void swiglu_backward_kernel(T* dx, const T* dy, const T* x, int64_t N, int64_t H) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < N * H;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / H, j = e % H;
    const float a = to_f32(x[r * 2 * H + j]), b = to_f32(x[r * 2 * H + H + j]);
    const float g = to_f32(dy[e]), sg = sigmoid(a);
    dx[r * 2 * H + j] = from_f32<T>(g * b * sg * (1.0f + a * (1.0f - sg)));
    dx[r * 2 * H + H + j] = from_f32<T>(g * a * sg);
  }
}

void check_width(int64_t C, const char* who) {
  if (C <= 0 || C > (int64_t{1} << 30))
    throw InvalidArgument(str(who, ": C must be in [1, 2^30], got ", C));
}

void rotate(void* qkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t, float sign,
            cudaStream_t s, const char* who) {
  if (N <= 0) return;
  TESSEL_CHECK(NH > 0 && C % NH == 0 && (C / NH) % 2 == 0 && C < (int64_t{1} << 28), who,
               ": heads must divide C into even head sizes, got C=", C, " NH=", NH);
  detail::dispatch(t, who, [&](auto tag) {
    using T = decltype(tag);
    rotary_kernel<<<detail::grid_for(N * C, kThreads), kThreads, 0, s>>>(
        static_cast<T*>(qkv), pos, N, static_cast<int>(C), static_cast<int>(NH), sign);
  });
  check_launch(who);
}

}  // namespace

void rmsnorm_forward(void* y, float* rstd, const void* x, const void* w, int64_t N, int64_t C,
                     DType t, cudaStream_t s) {
  if (N <= 0) return;
  check_width(C, "cuda rmsnorm_forward");
  detail::dispatch(t, "cuda rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_forward_kernel<<<detail::ceil_div(N, kRowsPerBlock), kRowsPerBlock * 32, 0, s>>>(
        static_cast<T*>(y), rstd, static_cast<const T*>(x), static_cast<const T*>(w), N,
        static_cast<int>(C));
  });
  check_launch("cuda rmsnorm_forward");
}

void rmsnorm_backward(void* dx, float* dw, const void* dy, const void* x, const void* w,
                      const float* rstd, int64_t N, int64_t C, DType t, cudaStream_t s) {
  if (N <= 0) return;
  check_width(C, "cuda rmsnorm_backward");
  detail::dispatch(t, "cuda rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    detail::column_sums<1>(
        {dw}, N, C, RmsNormGrad<T>{static_cast<const T*>(dy), static_cast<const T*>(x), rstd, C}, s,
        "cuda rmsnorm_backward (dw)");
    if (dx != nullptr)
      rmsnorm_dx_kernel<<<detail::ceil_div(N, kRowsPerBlock), kRowsPerBlock * 32, 0, s>>>(
          static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x),
          static_cast<const T*>(w), rstd, N, static_cast<int>(C));
  });
  check_launch("cuda rmsnorm_backward (dx)");
}

void rotary_forward(void* qkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t,
                    cudaStream_t s) {
  rotate(qkv, pos, N, C, NH, t, 1.0f, s, "cuda rotary_forward");
}

void rotary_backward(void* dqkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t,
                     cudaStream_t s) {
  rotate(dqkv, pos, N, C, NH, t, -1.0f, s, "cuda rotary_backward");
}

void swiglu_forward(void* y, const void* x, int64_t N, int64_t H, DType t, cudaStream_t s) {
  if (N <= 0 || H <= 0) return;
  detail::dispatch(t, "cuda swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    swiglu_forward_kernel<<<detail::grid_for(N * H, kThreads), kThreads, 0, s>>>(
        static_cast<T*>(y), static_cast<const T*>(x), N, H);
  });
  check_launch("cuda swiglu_forward");
}

void swiglu_backward(void* dx, const void* dy, const void* x, int64_t N, int64_t H, DType t,
                     cudaStream_t s) {
  if (N <= 0 || H <= 0 || dx == nullptr) return;
  detail::dispatch(t, "cuda swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel<<<detail::grid_for(N * H, kThreads), kThreads, 0, s>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), N, H);
  });
  check_launch("cuda swiglu_backward");
}

}  // namespace tessel::ops::cuda
