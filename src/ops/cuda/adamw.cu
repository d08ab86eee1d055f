// The optimizer's device side: one fused AdamW pass over a flat f32 arena (read p, g, m, v;
// write p, m, v and the 16-bit working copy), the same for SGD (p, g and the momentum buffer),
// and the deterministic sum of squares for global norm clipping. Built with -fmad=false
// (CMakeLists.txt): the same roundings as the CPU step.
#include <cmath>

#include "common.cuh"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

constexpr int kThreads = 256;

template <typename W>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v, W* __restrict__ working,
                             int64_t n, AdamWScalars k) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float gi = g[i] * k.gs;
    const float mi = k.b1 * m[i] + k.c1 * gi;
    const float vi = k.b2 * v[i] + k.c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
    const float pi = p[i] * k.decay - k.step_size * (mi / denom);
    p[i] = pi;
    if (working != nullptr) working[i] = detail::from_f32<W>(pi);
  }
}

// The CPU's Sgd::update, one element per thread: the same operations in the same order.
template <typename W>
__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g,
                           float* __restrict__ buf, W* __restrict__ working, int64_t n, SgdStep k) {
  const float neg_lr = -k.lr, mu = k.momentum, wd = k.weight_decay;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float d = g[i] * k.grad_scale + wd * p[i];
    float step = d;
    if (mu != 0.0f) {
      const float b = k.first ? d : mu * buf[i] + d;
      buf[i] = b;
      step = k.nesterov ? d + mu * b : b;
    }
    const float pi = p[i] + neg_lr * step;
    p[i] = pi;
    if (working != nullptr) working[i] = detail::from_f32<W>(pi);
  }
}

// Phase 1: block b sums elements b*kThreads + t + s*(parts*kThreads) for its threads t in f64,
// then a fixed tree; phase 2: one block adds the parts in a fixed tree. The grid never depends
// on the device, so neither does the order.
__global__ void sum_squares_parts_kernel(double* partials, const float* x, int64_t n) {
  __shared__ double part[kThreads];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{kSumSquaresParts} * kThreads) {
    const double xi = x[i];
    acc += xi * xi;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = part[0];
}

__global__ void sum_squares_final_kernel(double* out, const double* partials) {
  __shared__ double part[1024];
  double acc = 0.0;
  for (int i = threadIdx.x; i < kSumSquaresParts; i += 1024) acc += partials[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = 512; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = part[0];
}

}  // namespace

void adamw_step(float* params, const float* grads, float* m, float* v, void* working,
                DType working_type, int64_t n, const AdamWStep& a, cudaStream_t s) {
  TESSEL_CHECK(a.step >= 1, "cuda adamw_step: step counts from 1, got ", a.step);
  if (n <= 0) return;
  const AdamWScalars k = adamw_scalars(a);
  const unsigned grid = detail::grid_for(n, kThreads);
  if (working == nullptr) {
    adamw_kernel<float><<<grid, kThreads, 0, s>>>(params, grads, m, v, nullptr, n, k);
  } else if (working_type == DType::kBF16) {
    adamw_kernel<detail::bf16>
        <<<grid, kThreads, 0, s>>>(params, grads, m, v, static_cast<detail::bf16*>(working), n, k);
  } else {
    throw InvalidArgument(
        str("cuda adamw_step: the working copy must be bf16, got ", dtype_name(working_type)));
  }
  check_launch("cuda adamw_step");
}

void sgd_step(float* params, const float* grads, float* momentum, void* working, DType working_type,
              int64_t n, const SgdStep& k, cudaStream_t s) {
  if (n <= 0) return;
  const unsigned grid = detail::grid_for(n, kThreads);
  if (working == nullptr) {
    sgd_kernel<float><<<grid, kThreads, 0, s>>>(params, grads, momentum, nullptr, n, k);
  } else if (working_type == DType::kBF16) {
    sgd_kernel<detail::bf16><<<grid, kThreads, 0, s>>>(params, grads, momentum,
                                                       static_cast<detail::bf16*>(working), n, k);
  } else {
    throw InvalidArgument(
        str("cuda sgd_step: the working copy must be bf16, got ", dtype_name(working_type)));
  }
  check_launch("cuda sgd_step");
}

void sum_squares(double* out, double* partials, const float* x, int64_t n, cudaStream_t s) {
  sum_squares_parts_kernel<<<kSumSquaresParts, kThreads, 0, s>>>(partials, x, n < 0 ? 0 : n);
  check_launch("cuda sum_squares (parts)");
  sum_squares_final_kernel<<<1, 1024, 0, s>>>(out, partials);
  check_launch("cuda sum_squares (final)");
}

}  // namespace tessel::ops::cuda
