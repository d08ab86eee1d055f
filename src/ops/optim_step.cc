// The CPU's optimizer steps (optim_step.h). The per-step scalars are computed once per call
// outside the loops, so that the loops vectorise; the loops run over parts of a few thousand
// elements, each followed by the rewrite of its working copy while its new values are in L1.
#include "tessel/ops/optim_step.h"

#include <algorithm>
#include <cmath>

#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

// Runs update(offset, count) over parts of [0, n), each followed by the rewrite of its part of
// the working copy (if any) from params.
template <typename F>
void for_parts(const float* params, void* working, DType working_type, int64_t n, F update) {
  constexpr int64_t kPart = 2048;
  const int64_t half = static_cast<int64_t>(dtype_size(working_type));
  for (int64_t i = 0; i < n; i += kPart) {
    const int64_t m = std::min(kPart, n - i);
    update(i, m);
    if (working != nullptr)
      convert(static_cast<char*>(working) + i * half, working_type, params + i, DType::kF32, m);
  }
}

void adamw_part(float* __restrict p, const float* __restrict g, float* __restrict m,
                float* __restrict v, int64_t n, const AdamWScalars& k) {
  const float b1 = k.b1, b2 = k.b2, c1 = k.c1, c2 = k.c2, eps = k.eps;
  const float step_size = k.step_size, bc2_sqrt = k.bc2_sqrt, decay = k.decay, gs = k.gs;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * gs;
    const float mi = b1 * m[i] + c1 * gi;
    const float vi = b2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
  }
}

void sgd_part(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n,
              const SgdStep& k) {
  const float wd = k.weight_decay, mu = k.momentum, neg_lr = -k.lr, gs = k.grad_scale;
  if (mu == 0.0f) {
    for (int64_t i = 0; i < n; ++i) p[i] += neg_lr * (g[i] * gs + wd * p[i]);
  } else if (k.first) {
    // PyTorch seeds the buffer with the first gradient instead of decaying a zero buffer.
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] * gs + wd * p[i];
      buf[i] = d;
      p[i] += neg_lr * (k.nesterov ? d + mu * d : d);
    }
  } else if (k.nesterov) {
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] * gs + wd * p[i];
      const float b = mu * buf[i] + d;
      buf[i] = b;
      p[i] += neg_lr * (d + mu * b);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] * gs + wd * p[i];
      const float b = mu * buf[i] + d;
      buf[i] = b;
      p[i] += neg_lr * b;
    }
  }
}

}  // namespace

void adamw_step(float* params, const float* grads, float* m, float* v, void* working,
                DType working_type, int64_t n, const AdamWStep& k) {
  const AdamWScalars c = adamw_scalars(k);
  for_parts(params, working, working_type, n, [&](int64_t i, int64_t count) {
    adamw_part(params + i, grads + i, m + i, v + i, count, c);
  });
}

void sgd_step(float* params, const float* grads, float* momentum, void* working, DType working_type,
              int64_t n, const SgdStep& k) {
  for_parts(params, working, working_type, n, [&](int64_t i, int64_t count) {
    sgd_part(params + i, grads + i, momentum + i, count, k);
  });
}

}  // namespace tessel::ops
