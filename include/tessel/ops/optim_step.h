// The optimizer steps as kernels over a run of n parameters of a flat f32 arena, with their
// per-step arguments: the CPU's here (tessel::optim's Sgd and AdamW call them part by part),
// a device's in its kernel table (device_kernels.h), the same f32 operations in the same order
// (no contraction) on both, so that a device step gives the CPU's bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "tessel/tensor/dtype.h"

namespace tessel::ops {

// One AdamW step (torch.optim.AdamW: decoupled decay, bias correction by the 1-based step)
// reading grads * grad_scale; m and v are the state.
struct AdamWStep {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step = 1;  // t, counting from 1
  float grad_scale = 1.0f;
};
// Its per-step scalars, in double as PyTorch computes them in Python, then rounded once to f32;
// the CPU's and a device's kernels take the same.
struct AdamWScalars {
  float b1, b2, c1, c2, eps, step_size, bc2_sqrt, decay, gs;
};
inline AdamWScalars adamw_scalars(const AdamWStep& a) {
  const double t = static_cast<double>(a.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), t);
  return {a.beta1,
          a.beta2,
          1.0f - a.beta1,
          1.0f - a.beta2,
          a.eps,
          static_cast<float>(static_cast<double>(a.lr) / bc1),
          static_cast<float>(std::sqrt(bc2)),
          static_cast<float>(1.0 - static_cast<double>(a.lr) * a.weight_decay),
          a.grad_scale};
}
// One SGD step (torch.optim.SGD, dampening 0): d = grads * grad_scale + weight_decay * params;
// with momentum mu > 0 the buffer becomes d on the first step and mu * buf + d after; params -=
// lr * (buf, or d + mu * buf with nesterov; d without momentum).
struct SgdStep {
  float lr = 0.01f, momentum = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
  bool first = true;  // the first step: the momentum buffer is seeded, not decayed
  float grad_scale = 1.0f;
};
// A device's sum of squares runs in this many f64 partial sums, then one (a fixed order).
constexpr int kSumSquaresParts = 528;  // a multiple of 132 (the H100/H200 SM count)

// working (null: none) receives the new parameters as working_type (bf16 or f16; round to
// nearest even), the 16-bit copy the next forward reads.
void adamw_step(float* params, const float* grads, float* m, float* v, void* working,
                DType working_type, int64_t n, const AdamWStep& k);
void sgd_step(float* params, const float* grads, float* momentum, void* working, DType working_type,
              int64_t n, const SgdStep& k);

}  // namespace tessel::ops
