// Fused log-softmax + cross-entropy: one block per row finds the max and the sum of
// exponentials in one read of the row (an online sum, rescaled when the max grows; 16-byte
// packs where the row allows), keeps only
// lse = max + log(sum); the backward recomputes each probability from it, so no [N,C]
// probabilities exist unless the caller asks for them.
#include "common.cuh"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

constexpr int kThreads = 512;

// A running (max m, sum l of exp(v - m)) and its merge with another: max, and + of two
// products rounded on their own (__fmul_rn: nvcc would otherwise fuse one of them into an FMA,
// a different one in each lane), are commutative, so both lanes of a butterfly step get the
// same bits. A side with m = -inf has l = 0 (adds nothing) or l = NaN (a NaN seen before any
// number), which must reach the result.
struct MaxSum {
  float m, l;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, a.l + b.l};
  return {m, __fadd_rn(__fmul_rn(a.l, a.m == -INFINITY ? 0.0f : expf(a.m - m)),
                       __fmul_rn(b.l, b.m == -INFINITY ? 0.0f : expf(b.m - m)))};
}

// The block's (max, sum) of its threads' ones, in a fixed tree; every thread gets it.
__device__ MaxSum block_max_sum(MaxSum v, MaxSum* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1)
    v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.l, o)});
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : MaxSum{-INFINITY, 0.0f};
  for (int o = 16; o > 0; o >>= 1)
    v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.l, o)});
  return v;
}

// Adds the values v[0..n) of a row to a running (max, sum): the sum rescaled once to the group's
// max, then each exponential added. A NaN makes the sum NaN, and so does +inf (exp(inf - inf),
// as the CPU's softmax); -inf adds nothing.
template <int n>
__device__ __forceinline__ void add_values(MaxSum& ms, const float (&v)[n]) {
  float top = v[0];
#pragma unroll
  for (int i = 1; i < n; ++i) top = fmaxf(top, v[i]);
  if (top > ms.m) {
    ms.l *= expf(ms.m - top);  // 0 from m = -inf (a NaN sum stays NaN)
    ms.m = top;
  }
#pragma unroll
  for (int i = 0; i < n; ++i) ms.l += v[i] == -INFINITY ? 0.0f : expf(v[i] - ms.m);
}

// One block per row. `vec`: the row is read in 16-byte packs (C a multiple of a pack's width,
// logits 16-byte aligned): a pack in flight per thread, not one value, which is what keeps the
// memory busy on a row of 50k classes.
template <typename T>
__global__ void cross_entropy_forward_kernel(float* losses, float* lse, float* probs,
                                             const T* logits, const int32_t* labels, int64_t C,
                                             bool vec) {
  __shared__ MaxSum shared[32];
  constexpr int W = detail::Pack<T>::kWidth;
  const int64_t r = blockIdx.x;
  const T* lr = logits + r * C;
  MaxSum ms{-INFINITY, 0.0f};
  if (vec) {
    for (int64_t k = threadIdx.x; k < C / W; k += blockDim.x) {
      const detail::Pack<T> p = reinterpret_cast<const detail::Pack<T>*>(lr)[k];
      float v[W];
#pragma unroll
      for (int i = 0; i < W; ++i) v[i] = to_f32(p.v[i]);
      add_values(ms, v);
    }
  } else {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float v[1] = {to_f32(lr[c])};
      add_values(ms, v);
    }
  }
  ms = block_max_sum(ms, shared);
  const float mx = ms.m, sum = ms.l;
  const float log_sum = logf(sum);
  if (probs != nullptr) {
    const float inv = 1.0f / sum;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      probs[r * C + c] = expf(to_f32(lr[c]) - mx) * inv;
  }
  if (threadIdx.x == 0) {
    const int32_t label = labels[r];
    // -log softmax[label] = log(sum) - (logit[label] - max); a bad label poisons the row.
    losses[r] = (label >= 0 && label < C) ? log_sum - (to_f32(lr[label]) - mx) : NAN;
    lse[r] = mx + log_sum;
  }
}

// loss[0] = mean of losses[N]: one block, strided f64 partial sums, then a fixed tree.
__global__ void mean_kernel(float* loss, const float* losses, int64_t N) {
  __shared__ double part[1024];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += losses[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) loss[0] = static_cast<float>(part[0] / static_cast<double>(N));
}

// dlogits = (exp(logit - lse) - onehot) * scale; each element read and written by one thread,
// so dlogits may alias logits. `vec`: in 16-byte packs, as the forward.
__device__ __forceinline__ float dlogit(float logit, float lse, int64_t c, int64_t target,
                                        float scale) {
  const float d = expf(logit - lse) * scale;
  return c == target ? d - scale : d;
}

template <typename T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const float* lse,
                                              const int32_t* labels, int64_t C, float scale,
                                              int64_t lo, bool vec) {
  constexpr int W = detail::Pack<T>::kWidth;
  const int64_t r = blockIdx.x;
  const float l = lse[r];
  const int64_t target = static_cast<int64_t>(labels[r]) - lo;  // outside [0, C): no one-hot
  const T* in = logits + r * C;
  T* out = dlogits + r * C;
  if (vec) {
    for (int64_t k = threadIdx.x; k < C / W; k += blockDim.x) {
      const detail::Pack<T> p = reinterpret_cast<const detail::Pack<T>*>(in)[k];
      detail::Pack<T> d;
#pragma unroll
      for (int i = 0; i < W; ++i)
        d.v[i] = from_f32<T>(dlogit(to_f32(p.v[i]), l, k * W + i, target, scale));
      reinterpret_cast<detail::Pack<T>*>(out)[k] = d;
    }
    return;
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    out[c] = from_f32<T>(dlogit(to_f32(in[c]), l, c, target, scale));
}

// The first maximum of a row in scan order, as the CPU's strict > scan: a NaN never wins, except
// at column 0, where nothing then compares greater (the answer is 0). A warp per row, each lane a
// strided run of columns (coalesced); then (value, column) pairs merge, ties to the smaller column.
constexpr int kWarpsPerBlock = 8;

template <typename T>
__device__ int64_t row_first_max(const T* lr, int64_t C, int lane) {
  float best_value = -INFINITY;
  int64_t best = C;  // none yet
  for (int64_t c = lane; c < C; c += 32) {
    const float v = to_f32(lr[c]);
    if (v > best_value || (best == C && v == best_value)) {
      best = c;
      best_value = v;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best_value, off);
    const int64_t oc = __shfl_xor_sync(0xffffffffu, best, off);
    if (oc != C && (best == C || ov > best_value || (ov == best_value && oc < best))) {
      best = oc;
      best_value = ov;
    }
  }
  return (best == C || isnan(to_f32(lr[0]))) ? 0 : best;
}

// correct[0] += the block's rows whose first maximum is the label (correct[0] zeroed before):
// integer sums, exact in any order.
template <typename T>
__global__ void count_correct_kernel(unsigned long long* correct, const T* logits,
                                     const int32_t* labels, int64_t N, int64_t C) {
  __shared__ unsigned hits[kWarpsPerBlock];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t{kWarpsPerBlock} + warp;
  unsigned hit = 0;
  if (r < N) hit = row_first_max(logits + r * C, C, lane) == labels[r];
  if (lane == 0) hits[warp] = hit;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned sum = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) sum += hits[w];
    if (sum != 0) atomicAdd(correct, static_cast<unsigned long long>(sum));
  }
}

}  // namespace

void cross_entropy_forward(float* loss, float* losses, float* lse, float* probs, const void* logits,
                           const int32_t* labels, int64_t N, int64_t C, DType t, cudaStream_t s) {
  TESSEL_CHECK(N > 0 && C > 0, "cuda cross_entropy_forward: N and C must be > 0, got N=", N,
               " C=", C);
  TESSEL_CHECK(N < (int64_t{1} << 31), "cuda cross_entropy_forward: N must be < 2^31, got ", N);
  detail::dispatch(t, "cuda cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = C % detail::Pack<T>::kWidth == 0 && detail::aligned16(logits);
    cross_entropy_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
        losses, lse, probs, static_cast<const T*>(logits), labels, C, vec);
  });
  check_launch("cuda cross_entropy_forward");
  mean_kernel<<<1, 1024, 0, s>>>(loss, losses, N);
  check_launch("cuda cross_entropy_forward (mean)");
}

void cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                            const int32_t* labels, int64_t N, int64_t C, float dloss, int64_t lo,
                            DType t, cudaStream_t s) {
  if (dlogits == nullptr || N <= 0 || C <= 0) return;
  TESSEL_CHECK(N < (int64_t{1} << 31), "cuda cross_entropy_backward: N must be < 2^31, got ", N);
  const float scale = dloss / static_cast<float>(N);
  detail::dispatch(t, "cuda cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = C % detail::Pack<T>::kWidth == 0 && detail::aligned16(dlogits, logits);
    cross_entropy_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
        static_cast<T*>(dlogits), static_cast<const T*>(logits), lse, labels, C, scale, lo, vec);
  });
  check_launch("cuda cross_entropy_backward");
}

void count_correct(int64_t* correct, const void* logits, const int32_t* labels, int64_t N,
                   int64_t C, DType t, cudaStream_t s) {
  TESSEL_CHECK(N >= 0 && C > 0, "cuda count_correct: N must be >= 0 and C > 0, got N=", N,
               " C=", C);
  check_cuda(cudaMemsetAsync(correct, 0, sizeof(int64_t), s), "cuda count_correct (zero)");
  if (N == 0) return;
  detail::dispatch(t, "cuda count_correct", [&](auto tag) {
    using T = decltype(tag);
    count_correct_kernel<<<detail::ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0, s>>>(
        reinterpret_cast<unsigned long long*>(correct), static_cast<const T*>(logits), labels, N,
        C);
  });
  check_launch("cuda count_correct");
}

}  // namespace tessel::ops::cuda
