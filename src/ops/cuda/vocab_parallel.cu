// Vocab-parallel cross-entropy (tensor parallel; cpu.h's sliced_* steps): each rank holds the
// logits of its classes [lo, lo + C), the first `valid` of them real (the rest pad the
// vocabulary). One block per row, as the fused cross-entropy: the row max, then the sum of
// exponentials and the label's logit, each reduced over the tp group by the caller between
// the launches; the backward recomputes each probability from the group's max and sum, so no
// [N,C] probabilities are kept.
#include "common.cuh"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

constexpr int kThreads = 512;

template <typename T>
__global__ void sliced_row_max_kernel(float* row_max, const T* logits, int64_t C, int64_t valid) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < valid; c += blockDim.x)
    mx = fmaxf(mx, to_f32(logits[r * C + c]));
  mx = detail::block_max(mx, shared);
  if (threadIdx.x == 0) row_max[r] = mx;
}

template <typename T>
__global__ void sliced_exp_sum_kernel(float* sums, float* target, const T* logits,
                                      const int32_t* labels, const float* row_max, int64_t C,
                                      int64_t valid, int64_t lo, int64_t V) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float mx = row_max[r];
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < valid; c += blockDim.x)
    sum += expf(to_f32(logits[r * C + c]) - mx);
  sum = detail::block_sum(sum, shared);
  if (threadIdx.x == 0) {
    const int64_t label = labels[r], local = label - lo;
    sums[r] = sum;
    // A bad label poisons the row on every rank, so the group's sum is NaN too.
    target[r] = (label < 0 || label >= V)       ? NAN
                : (local >= 0 && local < valid) ? to_f32(logits[r * C + local])
                                                : 0.0f;
  }
}

// Each element read and written by one thread, so dlogits may alias logits.
template <typename T>
__global__ void sliced_backward_kernel(T* dlogits, const T* logits, const float* row_max,
                                       const float* sums, const int32_t* labels, int64_t C,
                                       int64_t valid, int64_t lo, float scale) {
  const int64_t r = blockIdx.x;
  const float mx = row_max[r], inv = 1.0f / sums[r];
  const int64_t target = static_cast<int64_t>(labels[r]) - lo;  // outside [0, valid): no one-hot
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float d = c < valid ? expf(to_f32(logits[r * C + c]) - mx) * inv * scale : 0.0f;
    if (c == target) d -= scale;
    dlogits[r * C + c] = from_f32<T>(d);
  }
}

void check_rows(int64_t N, int64_t C, const char* who) {
  TESSEL_CHECK(N >= 0 && N < (int64_t{1} << 31) && C > 0, who,
               ": N must be in [0, 2^31) and C > 0, got N=", N, " C=", C);
}

}  // namespace

void sliced_row_max(float* row_max, const void* logits, int64_t N, int64_t C, int64_t valid,
                    DType t, cudaStream_t s) {
  check_rows(N, C, "cuda sliced_row_max");
  if (N == 0) return;
  detail::dispatch(t, "cuda sliced_row_max", [&](auto tag) {
    using T = decltype(tag);
    sliced_row_max_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
        row_max, static_cast<const T*>(logits), C, valid);
  });
  check_launch("cuda sliced_row_max");
}

void sliced_exp_sum(float* sums, float* target, const void* logits, const int32_t* labels,
                    const float* row_max, int64_t N, int64_t C, int64_t valid, int64_t lo,
                    int64_t V, DType t, cudaStream_t s) {
  check_rows(N, C, "cuda sliced_exp_sum");
  if (N == 0) return;
  detail::dispatch(t, "cuda sliced_exp_sum", [&](auto tag) {
    using T = decltype(tag);
    sliced_exp_sum_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
        sums, target, static_cast<const T*>(logits), labels, row_max, C, valid, lo, V);
  });
  check_launch("cuda sliced_exp_sum");
}

void sliced_cross_entropy_backward(void* dlogits, const void* logits, const float* row_max,
                                   const float* sums, const int32_t* labels, int64_t N, int64_t C,
                                   int64_t valid, int64_t lo, float dloss, DType t,
                                   cudaStream_t s) {
  check_rows(N, C, "cuda sliced_cross_entropy_backward");
  if (dlogits == nullptr || N == 0) return;
  const float scale = dloss / static_cast<float>(N);
  detail::dispatch(t, "cuda sliced_cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    sliced_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
        static_cast<T*>(dlogits), static_cast<const T*>(logits), row_max, sums, labels, C, valid,
        lo, scale);
  });
  check_launch("cuda sliced_cross_entropy_backward");
}

}  // namespace tessel::ops::cuda
