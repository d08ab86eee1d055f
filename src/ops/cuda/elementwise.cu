// Elementwise kernels (ReLU, GELU, the residual add, f32 <-> bf16, the f32 accumulation of a
// gradient) and the bias gradient, a column sum. Grid-stride loops over n; math in f32; one
// rounding to t per output.
#include "common.cuh"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

using detail::bf16;
using detail::column_tree_sum;
using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

// y = op(x) elementwise; F maps one f32 to one f32.
template <typename T, typename F>
__global__ void map_kernel(T* y, const T* x, int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = from_f32<T>(f(to_f32(x[i])));
}

// y = op(a, b) elementwise.
template <typename T, typename F>
__global__ void zip_kernel(T* y, const T* a, const T* b, int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = from_f32<T>(f(to_f32(a[i]), to_f32(b[i])));
}

template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = from_f32<D>(to_f32(src[i]));
}

struct Relu {
  __device__ float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};
struct ReluGrad {  // (dy, y)
  __device__ float operator()(float dy, float y) const { return y > 0.0f ? dy : 0.0f; }
};
struct Gelu {
  __device__ float operator()(float v) const {
    const float u = kGeluScale * (v + kGeluCube * v * v * v);
    return 0.5f * v * (1.0f + tanhf(u));
  }
};
struct GeluGrad {  // (dy, x)
  __device__ float operator()(float dy, float v) const {
    const float u = kGeluScale * (v + kGeluCube * v * v * v);
    const float t = tanhf(u);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCube * v * v);
    return dy * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <typename F>
void map(void* y, const void* x, int64_t n, DType t, cudaStream_t s, const char* who, F f) {
  if (n <= 0) return;
  detail::dispatch(t, who, [&](auto tag) {
    using T = decltype(tag);
    map_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(y),
                                                                  static_cast<const T*>(x), n, f);
  });
  check_launch(who);
}

template <typename F>
void zip(void* y, const void* a, const void* b, int64_t n, DType t, cudaStream_t s, const char* who,
         F f) {
  if (n <= 0) return;
  detail::dispatch(t, who, [&](auto tag) {
    using T = decltype(tag);
    zip_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(
        static_cast<T*>(y), static_cast<const T*>(a), static_cast<const T*>(b), n, f);
  });
  check_launch(who);
}

template <typename T>
__global__ void accumulate_kernel(float* acc, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    acc[i] += to_f32(x[i]);
}

// db[c] += sum over r of dy[r, c]. A block owns 32 columns: lane x reads column c, the 32 row
// lanes y take rows y, y + 32, ... (coalesced 32-column rows), then a fixed tree over y.
// Deterministic without a second pass; enough parallelism for OC >= a few thousand.
template <typename T>
__global__ void bias_backward_kernel(float* db, const T* dy, int64_t N, int64_t OC) {
  __shared__ float part[32][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  float acc = 0.0f;
  if (c < OC)
    for (int64_t r = threadIdx.y; r < N; r += 32) acc += to_f32(dy[r * OC + c]);
  const float sum = column_tree_sum(part, acc);
  if (threadIdx.y == 0 && c < OC) db[c] += sum;
}

}  // namespace

void relu_forward(void* y, const void* x, int64_t n, DType t, cudaStream_t s) {
  map(y, x, n, t, s, "cuda relu_forward", Relu{});
}

void relu_backward(void* dx, const void* dy, const void* y, int64_t n, DType t, cudaStream_t s) {
  if (dx != nullptr) zip(dx, dy, y, n, t, s, "cuda relu_backward", ReluGrad{});
}

void gelu_forward(void* y, const void* x, int64_t n, DType t, cudaStream_t s) {
  map(y, x, n, t, s, "cuda gelu_forward", Gelu{});
}

void gelu_backward(void* dx, const void* dy, const void* x, int64_t n, DType t, cudaStream_t s) {
  if (dx != nullptr) zip(dx, dy, x, n, t, s, "cuda gelu_backward", GeluGrad{});
}

void add_forward(void* y, const void* a, const void* b, int64_t n, DType t, cudaStream_t s) {
  zip(y, a, b, n, t, s, "cuda add_forward", Add{});
}

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
             cudaStream_t s) {
  if (n <= 0) return;
  detail::dispatch(dst_type, "cuda convert", [&](auto dtag) {
    detail::dispatch(src_type, "cuda convert", [&](auto stag) {
      using D = decltype(dtag);
      using S = decltype(stag);
      convert_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(
          static_cast<D*>(dst), static_cast<const S*>(src), n);
    });
  });
  check_launch("cuda convert");
}

void accumulate(float* acc, const void* x, int64_t n, DType t, cudaStream_t s) {
  if (n <= 0) return;
  detail::dispatch(t, "cuda accumulate", [&](auto tag) {
    using T = decltype(tag);
    accumulate_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(
        acc, static_cast<const T*>(x), n);
  });
  check_launch("cuda accumulate");
}

void bias_backward(float* db, const void* dy, DType t, int64_t N, int64_t OC, cudaStream_t s) {
  if (N <= 0 || OC <= 0) return;
  detail::dispatch(t, "cuda bias_backward", [&](auto tag) {
    using T = decltype(tag);
    bias_backward_kernel<<<detail::ceil_div(OC, 32), dim3(32, 32), 0, s>>>(
        db, static_cast<const T*>(dy), N, OC);
  });
  check_launch("cuda bias_backward");
}

}  // namespace tessel::ops::cuda
