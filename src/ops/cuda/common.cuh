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

// 16 bytes of T, moved as one load or store where every pointer is 16-byte aligned.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kWidth = 16 / sizeof(T);
  T v[kWidth];
};

inline bool aligned16(const void* a, const void* b = nullptr, const void* c = nullptr) {
  return ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
           reinterpret_cast<uintptr_t>(c)) &
          15) == 0;
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

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Blocks for a grid-stride loop over n items with `threads` per block: enough to fill any
// current GPU, a fixed number so results never depend on the device.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

// A device buffer of at least `floats` floats for the calling thread and stream, kept for its
// next calls (grown, never shrunk; device.cc). Work queued on that stream may use it until the
// next call for the same stream queues work after it.
float* stream_scratch(size_t floats, cudaStream_t stream);

// ---- Column sums: out_k[c] += sum over rows r < N of term_k(r, c), k < K, for c < C ----
// Two passes with fixed partitions, so the order of every sum depends on N and C alone: pass 1
// gives each block 32 columns of one part of the rows (parts of kColumnRows rows, at most
// kColumnParts parts), its 8 row lanes summing strided rows, then the 8 in order; pass 2 adds
// each column's parts in order. F is a functor: `void operator()(int64_t r, int64_t c,
// float (&v)[K]) const` sets the K terms of element (r, c).
constexpr int64_t kColumnRows = 256, kColumnParts = 4096;

inline int64_t column_parts(int64_t N) {
  const int64_t parts = (N + kColumnRows - 1) / kColumnRows;
  return parts < 1 ? 1 : (parts > kColumnParts ? kColumnParts : parts);
}

template <int K, typename F>
__global__ void column_parts_kernel(float* part, int64_t N, int64_t C, F term) {
  __shared__ float sh[K][8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x, parts = gridDim.y, p = blockIdx.y;
  const int64_t rows = (N + parts - 1) / parts, r0 = p * rows, r1 = r0 + rows < N ? r0 + rows : N;
  float acc[K] = {};
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      float v[K];
      term(r, c, v);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += v[k];
    }
#pragma unroll
  for (int k = 0; k < K; ++k) sh[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C)
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float sum = sh[k][0][threadIdx.x];
      for (int y = 1; y < 8; ++y) sum += sh[k][y][threadIdx.x];
      part[(k * parts + p) * C + c] = sum;
    }
}

// The K outputs of a column sum (a kernel parameter).
template <int K>
struct ColumnOuts {
  float* p[K];
};

template <int K>
__global__ void column_finish_kernel(ColumnOuts<K> out, const float* part, int64_t parts,
                                     int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float sum = 0.0f;
    for (int64_t p = 0; p < parts; ++p) sum += part[(k * parts + p) * C + c];
    out.p[k][c] += sum;
  }
}

template <int K, typename F>
void column_sums(ColumnOuts<K> out, int64_t N, int64_t C, F term, cudaStream_t s, const char* who) {
  if (N <= 0 || C <= 0) return;
  const int64_t parts = column_parts(N);
  float* part = stream_scratch(static_cast<size_t>(K * parts * C), s);
  column_parts_kernel<K>
      <<<dim3(ceil_div(C, 32), static_cast<unsigned>(parts)), dim3(32, 8), 0, s>>>(part, N, C,
                                                                                   term);
  check_launch(who);
  column_finish_kernel<K><<<ceil_div(C, 256), 256, 0, s>>>(out, part, parts, C);
  check_launch(who);
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

// The helpers above by their short names, in every kernel file.
namespace tessel::ops::cuda {
using detail::aligned16;
using detail::bf16;
using detail::block_max;
using detail::from_f32;
using detail::grid_for;
using detail::Pack;
using detail::to_f32;
using detail::warp_sum;
}  // namespace tessel::ops::cuda
