// Dropout with the CPU's mask (src/ops/dropout.cc), recomputed, never stored: element (r, c) is
// kept when the first word of Philox4x32-10 under key `seed`, counter {first_col + c (2 words),
// stream (2 words)}, stream = mix_stream(kDropout, step, first_sample + r), has its top 24 bits
// scaled to [0, 1) >= p; kept values are x * (1 / (1 - p)) as one f32 multiply. Integer
// arithmetic and one rounding: the CPU's bits. One thread per element (grid-stride); each
// derives its row's stream with tessel::mix_stream's SplitMix64 rounds.
#include "common.cuh"
#include "tessel/core/rng.h"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// uniform(index) of CounterRng(seed, stream): tessel::philox4x32's first word, top 24 bits.
__device__ __forceinline__ float uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0;
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return static_cast<float>(c0 >> 8) * (1.0f / 16777216.0f);
}

// out = in * mask / (1 - p).
template <typename T>
__global__ void dropout_kernel(T* out, const T* in, int64_t rows, int64_t cols, float p,
                               float scale, uint64_t seed, uint64_t step, int64_t first_sample,
                               int64_t first_col) {
  const uint64_t purpose = splitmix64(static_cast<uint64_t>(RngPurpose::kDropout));
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < rows * cols;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / cols, c = e % cols;
    // mix_stream(kDropout, step, first_sample + r)
    const uint64_t stream =
        splitmix64(splitmix64(purpose ^ step) ^ static_cast<uint64_t>(first_sample + r));
    const float u = uniform(seed, stream, static_cast<uint64_t>(first_col + c));
    out[e] = from_f32<T>(u >= p ? __fmul_rn(to_f32(in[e]), scale) : 0.0f);
  }
}

void apply(void* out, const void* in, int64_t rows, int64_t cols, float p, uint64_t seed,
           int64_t step, int64_t first_sample, int64_t first_col, DType t, cudaStream_t s,
           const char* who) {
  if (!(p >= 0.0f && p < 1.0f))
    throw InvalidArgument(str(who, ": dropout probability must be in [0, 1), got ", p));
  if (rows <= 0 || cols <= 0 || out == nullptr) return;
  const float scale = 1.0f / (1.0f - p);
  detail::dispatch(t, who, [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<<<detail::grid_for(rows * cols, kThreads), kThreads, 0, s>>>(
        static_cast<T*>(out), static_cast<const T*>(in), rows, cols, p, scale, seed,
        static_cast<uint64_t>(step), first_sample, first_col);
  });
  check_launch(who);
}

}  // namespace

void dropout_forward(void* y, const void* x, int64_t rows, int64_t cols, float p, uint64_t seed,
                     int64_t step, int64_t first_sample, int64_t first_col, DType t,
                     cudaStream_t s) {
  apply(y, x, rows, cols, p, seed, step, first_sample, first_col, t, s, "cuda dropout_forward");
}

void dropout_backward(void* dx, const void* dy, int64_t rows, int64_t cols, float p, uint64_t seed,
                      int64_t step, int64_t first_sample, int64_t first_col, DType t,
                      cudaStream_t s) {
  apply(dx, dy, rows, cols, p, seed, step, first_sample, first_col, t, s, "cuda dropout_backward");
}

}  // namespace tessel::ops::cuda
