// Fused log-softmax + cross-entropy: one block per row finds the max and the sum of
// exponentials (two reads of the row; vocabularies of 50k columns do not fit in registers),
// keeps only lse = max + log(sum); the backward recomputes each probability from it, so no
// [N,C] probabilities exist unless the caller asks for them.
#include "common.cuh"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 512;

template <typename T>
__global__ void cross_entropy_forward_kernel(float* losses, float* lse, float* probs,
                                             const T* logits, const int32_t* labels, int64_t C) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const T* lr = logits + r * C;
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = fmaxf(mx, to_f32(lr[c]));
  mx = detail::block_max(mx, shared);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += expf(to_f32(lr[c]) - mx);
  sum = detail::block_sum(sum, shared);
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
// so dlogits may alias logits.
template <typename T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const float* lse,
                                              const int32_t* labels, int64_t C, float scale,
                                              int64_t lo) {
  const int64_t r = blockIdx.x;
  const float l = lse[r];
  const int64_t target = static_cast<int64_t>(labels[r]) - lo;  // outside [0, C): no one-hot
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float d = expf(to_f32(logits[r * C + c]) - l) * scale;
    if (c == target) d -= scale;
    dlogits[r * C + c] = from_f32<T>(d);
  }
}

// correct[0] = the rows whose first maximum is the label: one block, each thread a strided set
// of rows (a plain scan, C is read once per row), then an integer tree (exact in any order).
template <typename T>
__global__ void count_correct_kernel(int64_t* correct, const T* logits, const int32_t* labels,
                                     int64_t N, int64_t C) {
  __shared__ int64_t part[kThreads];
  int64_t count = 0;
  for (int64_t r = threadIdx.x; r < N; r += blockDim.x) {
    const T* lr = logits + r * C;
    int64_t best = 0;
    float best_value = to_f32(lr[0]);
    for (int64_t c = 1; c < C; ++c) {  // strict >: the first of tied maxima, as torch.argmax
      const float v = to_f32(lr[c]);
      if (v > best_value) {
        best = c;
        best_value = v;
      }
    }
    count += best == labels[r];
  }
  part[threadIdx.x] = count;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) correct[0] = part[0];
}

}  // namespace

void cross_entropy_forward(float* loss, float* losses, float* lse, float* probs, const void* logits,
                           const int32_t* labels, int64_t N, int64_t C, DType t, cudaStream_t s) {
  TESSEL_CHECK(N > 0 && C > 0, "cuda cross_entropy_forward: N and C must be > 0, got N=", N,
               " C=", C);
  TESSEL_CHECK(N < (int64_t{1} << 31), "cuda cross_entropy_forward: N must be < 2^31, got ", N);
  detail::dispatch(t, "cuda cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
        losses, lse, probs, static_cast<const T*>(logits), labels, C);
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
    cross_entropy_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
        static_cast<T*>(dlogits), static_cast<const T*>(logits), lse, labels, C, scale, lo);
  });
  check_launch("cuda cross_entropy_backward");
}

void count_correct(int64_t* correct, const void* logits, const int32_t* labels, int64_t N,
                   int64_t C, DType t, cudaStream_t s) {
  TESSEL_CHECK(N >= 0 && C > 0, "cuda count_correct: N must be >= 0 and C > 0, got N=", N,
               " C=", C);
  detail::dispatch(t, "cuda count_correct", [&](auto tag) {
    using T = decltype(tag);
    count_correct_kernel<<<1, kThreads, 0, s>>>(correct, static_cast<const T*>(logits), labels, N,
                                                C);
  });
  check_launch("cuda count_correct");
}

}  // namespace tessel::ops::cuda
