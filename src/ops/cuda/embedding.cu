// Embedding lookup and its deterministic backward. The backward gives every table row to one
// block row (rows are dealt out by id % kParts), and that block walks the ids in order of n:
// each table element is then summed by one thread, in the CPU's order, with no atomics. A warp
// reads 32 ids at once and a ballot keeps the ones of its part, so the walk costs N/32 steps.
// A small table (at most kHeld rows a block: a character vocabulary) is summed in registers,
// loaded from dtable first and stored after the walk: the same additions in the same order,
// without a read-modify-write of global memory per id.
#include "common.cuh"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColumns = 128;  // columns per backward block (its threads, 4 warps)
constexpr int kParts = 64;     // table rows dealt out round-robin to this many block rows
constexpr int kHeld = 4;       // table rows a block may hold in registers

template <typename T>
__global__ void embedding_forward_kernel(T* y, const int32_t* ids, const T* table, int64_t N,
                                         int64_t V, int64_t C, int64_t lo, int64_t rows) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * C;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    const int64_t id = ids[n];
    float v;
    if (id < 0 || id >= V)
      v = NAN;
    else if (id < lo || id >= lo + rows)
      v = 0.0f;
    else
      v = to_f32(table[(id - lo) * C + c]);
    y[i] = from_f32<T>(v);
  }
}

// Block (x, y): columns [x * kColumns, ...), table rows r with r % parts == y, i.e.
// r = y + q parts; with kHold, q < kHeld and row q's sum is held[q].
template <typename T, bool kHold>
__global__ void embedding_backward_kernel(float* dtable, const T* dy, const int32_t* ids, int64_t N,
                                          int64_t C, int64_t lo, int64_t rows, int parts) {
  const int64_t c = blockIdx.x * int64_t{kColumns} + threadIdx.x;
  const int lane = threadIdx.x % 32;
  float held[kHeld] = {};
  if (kHold && c < C)
#pragma unroll
    for (int q = 0; q < kHeld; ++q) {
      const int64_t r = blockIdx.y + int64_t{q} * parts;
      if (r < rows) held[q] = dtable[r * C + c];
    }
  for (int64_t n0 = 0; n0 < N; n0 += 32) {
    const int64_t n = n0 + lane;
    const int64_t r = n < N ? static_cast<int64_t>(ids[n]) - lo : -1;
    const bool mine = r >= 0 && r < rows && r % parts == blockIdx.y;
    unsigned mask = __ballot_sync(0xffffffffu, mine);
    while (mask != 0) {  // the warp's matches, in order of n
      const int k = __ffs(mask) - 1;
      mask &= mask - 1;
      const int64_t rk = __shfl_sync(0xffffffffu, r, k);
      if (c >= C) continue;
      const float v = to_f32(dy[(n0 + k) * C + c]);
      if constexpr (kHold) {
        const int64_t q = rk / parts;
#pragma unroll
        for (int j = 0; j < kHeld; ++j)
          if (j == q) held[j] += v;
      } else {
        dtable[rk * C + c] += v;
      }
    }
  }
  if (kHold && c < C)
#pragma unroll
    for (int q = 0; q < kHeld; ++q) {
      const int64_t r = blockIdx.y + int64_t{q} * parts;
      if (r < rows) dtable[r * C + c] = held[q];
    }
}

}  // namespace

void embedding_forward(void* y, const int32_t* ids, const void* table, int64_t N, int64_t V,
                       int64_t C, int64_t lo, int64_t rows, DType t, cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  if (rows < 0) rows = V;
  detail::dispatch(t, "cuda embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    embedding_forward_kernel<<<detail::grid_for(N * C, kThreads), kThreads, 0, s>>>(
        static_cast<T*>(y), ids, static_cast<const T*>(table), N, V, C, lo, rows);
  });
  check_launch("cuda embedding_forward");
}

void embedding_backward(float* dtable, const void* dy, const int32_t* ids, int64_t N, int64_t C,
                        int64_t lo, int64_t rows, DType t, cudaStream_t s) {
  if (N <= 0 || C <= 0 || rows <= 0) return;
  const int parts = static_cast<int>(rows < kParts ? rows : kParts);
  const dim3 grid(detail::ceil_div(C, kColumns), static_cast<unsigned>(parts));
  detail::dispatch(t, "cuda embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    if (rows <= int64_t{kHeld} * parts)
      embedding_backward_kernel<T, true>
          <<<grid, kColumns, 0, s>>>(dtable, static_cast<const T*>(dy), ids, N, C, lo, rows, parts);
    else
      embedding_backward_kernel<T, false>
          <<<grid, kColumns, 0, s>>>(dtable, static_cast<const T*>(dy), ids, N, C, lo, rows, parts);
  });
  check_launch("cuda embedding_backward");
}

}  // namespace tessel::ops::cuda
