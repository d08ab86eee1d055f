// Elementwise kernels (ReLU, GELU, the residual add, f32 <-> bf16, the f32 accumulation of a
// gradient) and the bias gradient, a column sum. Grid-stride loops over n; math in f32; one
// rounding to t per output.
#include "common.cuh"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

// y = op(x) elementwise; F maps one f32 to one f32. Packs (common.cuh) when every pointer is
// 16-byte aligned (`vec`), the rest one by one; each element is computed alike either way.
template <typename T, typename F>
__global__ void map_kernel(T* y, const T* x, int64_t n, bool vec, F f) {
  constexpr int W = Pack<T>::kWidth;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x, packs = vec ? n / W : 0;
  for (int64_t k = first; k < packs; k += stride) {
    const Pack<T> in = reinterpret_cast<const Pack<T>*>(x)[k];
    Pack<T> out;
#pragma unroll
    for (int q = 0; q < W; ++q) out.v[q] = from_f32<T>(f(to_f32(in.v[q])));
    reinterpret_cast<Pack<T>*>(y)[k] = out;
  }
  for (int64_t i = packs * W + first; i < n; i += stride) y[i] = from_f32<T>(f(to_f32(x[i])));
}

// y = op(a, b) elementwise, b repeating every `period` elements (a period of n: no repeat);
// with `vec`, period is n or a multiple of the pack width.
template <typename T, typename F>
__global__ void zip_kernel(T* y, const T* a, const T* b, int64_t n, int64_t period, bool vec, F f) {
  constexpr int W = Pack<T>::kWidth;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x, packs = vec ? n / W : 0;
  for (int64_t k = first; k < packs; k += stride) {
    const Pack<T> pa = reinterpret_cast<const Pack<T>*>(a)[k];
    const Pack<T> pb = reinterpret_cast<const Pack<T>*>(b)[k % (period / W)];
    Pack<T> out;
#pragma unroll
    for (int q = 0; q < W; ++q) out.v[q] = from_f32<T>(f(to_f32(pa.v[q]), to_f32(pb.v[q])));
    reinterpret_cast<Pack<T>*>(y)[k] = out;
  }
  for (int64_t i = packs * W + first; i < n; i += stride)
    y[i] = from_f32<T>(f(to_f32(a[i]), to_f32(b[i % period])));
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
    map_kernel<<<detail::grid_for(n / Pack<T>::kWidth + 1, kThreads), kThreads, 0, s>>>(
        static_cast<T*>(y), static_cast<const T*>(x), n, aligned16(y, x), f);
  });
  check_launch(who);
}

// y = f(a, b) over n elements, b of `period` elements repeating (period = n: none).
template <typename F>
void zip(void* y, const void* a, const void* b, int64_t n, DType t, cudaStream_t s, const char* who,
         F f, int64_t period = 0) {
  if (n <= 0) return;
  if (period <= 0) period = n;
  detail::dispatch(t, who, [&](auto tag) {
    using T = decltype(tag);
    // Packs of b stay whole when b does not repeat (pack k < n / W is b's pack k) or repeats
    // every whole number of packs.
    const bool vec = aligned16(y, a, b) && (period == n || period % Pack<T>::kWidth == 0);
    zip_kernel<<<detail::grid_for(n / Pack<T>::kWidth + 1, kThreads), kThreads, 0, s>>>(
        static_cast<T*>(y), static_cast<const T*>(a), static_cast<const T*>(b), n, period, vec, f);
  });
  check_launch(who);
}

// acc[i] += x[k n + i] for k in order: the sum of each element as count launches would give.
template <typename T>
__global__ void accumulate_kernel(float* acc, const T* x, int64_t n, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float sum = acc[i];
    for (int64_t k = 0; k < count; ++k) sum += to_f32(x[k * n + i]);
    acc[i] = sum;
  }
}

// The terms of db[c] += sum over r of dy[r, c] (column_sums).
template <typename T>
struct BiasGrad {
  const T* dy;
  int64_t OC;
  __device__ void operator()(int64_t r, int64_t c, float (&v)[1]) const {
    v[0] = to_f32(dy[r * OC + c]);
  }
};

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

void add_forward(void* y, const void* a, const void* b, int64_t n, int64_t count, DType t,
                 cudaStream_t s) {
  if (count > 0) zip(y, a, b, n * count, t, s, "cuda add_forward", Add{}, n);
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

void accumulate(float* acc, const void* x, int64_t n, int64_t count, DType t, cudaStream_t s) {
  if (n <= 0 || count <= 0) return;
  detail::dispatch(t, "cuda accumulate", [&](auto tag) {
    using T = decltype(tag);
    accumulate_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(
        acc, static_cast<const T*>(x), n, count);
  });
  check_launch("cuda accumulate");
}

void bias_backward(float* db, const void* dy, DType t, int64_t N, int64_t OC, cudaStream_t s) {
  if (N <= 0 || OC <= 0) return;
  detail::dispatch(t, "cuda bias_backward", [&](auto tag) {
    using T = decltype(tag);
    detail::column_sums<1>({db}, N, OC, BiasGrad<T>{static_cast<const T*>(dy), OC}, s,
                           "cuda bias_backward");
  });
}

}  // namespace tessel::ops::cuda
