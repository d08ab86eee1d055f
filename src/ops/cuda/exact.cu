// Deterministic mode's exact sum on the device (tessel/ops/exact.h): a range kept and its
// largest |g| taken in one pass (a block maximum per block, then an atomic maximum over the
// bits: |g| >= 0 orders as its bits, so any order gives the same result), the quantise-and-add into
// int64 sums and the dequantisation, with the CPU loops' roundings: a product by a power of two is
// exact, the conversion to int64 truncates (__double2ll_rz), int64 -> double and double -> float
// round to nearest, and the division is IEEE's.
#include <cmath>

#include "common.cuh"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void collect_kernel(float* kept, float* max, const float* g, int64_t n) {
  __shared__ float shared[32];
  float m = 0.0f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = g[i];
    kept[i] = v;
    const float a = fabsf(v);
    m = fmaxf(m, a != a ? INFINITY : a);  // a NaN makes the maximum +inf
  }
  m = block_max(m, shared);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned*>(max), __float_as_uint(m));
}

__global__ void quantise_kernel(int64_t* acc, const float* g, int64_t n, double scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    acc[i] += __double2ll_rz(__dmul_rn(static_cast<double>(g[i]), scale));
}

__global__ void dequantise_kernel(float* out, const int64_t* sums, int64_t n, double scale) {
  const bool nan = scale != scale;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = nan ? __int_as_float(0x7fc00000)  // the CPU's quiet NaN
                 : __double2float_rn(__ddiv_rn(__ll2double_rn(sums[i]), scale));
}

}  // namespace

void exact_collect(float* kept, float* max, const float* g, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  collect_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(kept, max, g, n);
  check_launch("exact_collect");
}

void exact_quantise(int64_t* acc, const float* g, int64_t n, double scale, cudaStream_t stream) {
  if (n <= 0) return;
  quantise_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(acc, g, n, scale);
  check_launch("exact_quantise");
}

void exact_dequantise(float* out, const int64_t* sums, int64_t n, double scale,
                      cudaStream_t stream) {
  if (n <= 0) return;
  dequantise_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, sums, n, scale);
  check_launch("exact_dequantise");
}

}  // namespace tessel::ops::cuda
