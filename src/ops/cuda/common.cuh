// Private helpers of the CUDA kernels: f32/bf16 loads and stores, warp and block sums in a
// fixed order, launch geometry and the dtype dispatch. Every sum here has one order for a given
// shape, whatever the device: no atomics, no dependence on the SM count.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tessel/core/error.h"
#include "tessel/ops/cuda/check.h"
#include "tessel/tensor/dtype.h"

namespace tessel::ops::cuda::detail {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// Butterfly sum over the 32 lanes: every lane ends with the same value, in the same order.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, <= 1024); every thread gets it.
// `shared` holds 32 floats. Ends with a barrier, so `shared` can be reused right after.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  v = warp_max(v);
  __syncthreads();
  return v;
}

// Column sums in a block of 32 x 32 threads: `part[y][x]` holds thread (x, y)'s partial sum of
// column x; a fixed tree over y (deterministic); returns column x's sum (valid in row y = 0).
__device__ __forceinline__ float column_tree_sum(float (&part)[32][33], float acc) {
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  for (int stride = 16; stride > 0; stride >>= 1) {
    if (threadIdx.y < stride)
      part[threadIdx.y][threadIdx.x] += part[threadIdx.y + stride][threadIdx.x];
    __syncthreads();
  }
  return part[0][threadIdx.x];
}

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Blocks for a grid-stride loop over n items with `threads` per block: enough to fill any
// current GPU, a fixed number so results never depend on the device.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

// Calls f(float{}) or f(bf16{}) for t; InvalidArgument naming `who` otherwise.
template <typename F>
void dispatch(DType t, const char* who, F&& f) {
  switch (t) {
    case DType::kF32:
      f(float{});
      return;
    case DType::kBF16:
      f(bf16{});
      return;
    default:
      throw InvalidArgument(str(who, ": activations must be f32 or bf16, got ", dtype_name(t),
                                "; convert them first (cuda::convert)"));
  }
}

}  // namespace tessel::ops::cuda::detail
