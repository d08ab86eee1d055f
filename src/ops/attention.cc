// Causal multi-head self-attention, written as plain loops (llm.c): for each (batch, head,
// query t) a softmax over keys t2 <= t of q.k / sqrt(HS), then a weighted sum of values.
// Head h of q, k, v for token t sits at qkv[b, t, {0, C, 2C} + h*HS .. + HS).
#include <algorithm>
#include <cmath>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"
#include "vec_math.h"

namespace tessel::ops {
namespace {

void check_heads(const char* who, int64_t C, int64_t NH) {
  TESSEL_CHECK(NH > 0 && C % NH == 0, who, ": channels must split evenly over heads, got C=", C,
               " NH=", NH, "; pick n_embd divisible by n_head");
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  check_heads("attention_forward", C, NH);
  const int64_t HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  for (int64_t b = 0; b < B; ++b) {
    const float* qkv_b = qkv + b * T * C3;
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv_b + t * C3 + h * HS;
        float* a = att + ((b * NH + h) * T + t) * T;
        // Scores and their max (for a stable softmax) over the visible keys.
        float mx = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          a[t2] = detail::dot(q, qkv_b + t2 * C3 + C + h * HS, HS) * scale;
          mx = std::max(mx, a[t2]);
        }
        for (int64_t t2 = 0; t2 <= t; ++t2) a[t2] = detail::exp(a[t2] - mx);
        const float inv = 1.0f / detail::sum(a, t + 1);
        for (int64_t t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
        std::fill(a + t + 1, a + T, 0.0f);
        // Weighted sum of the values.
        float* o = out + (b * T + t) * C + h * HS;
        std::fill(o, o + HS, 0.0f);
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv_b + t2 * C3 + 2 * C + h * HS;
          const float w = a[t2];
          for (int64_t i = 0; i < HS; ++i) o[i] += w * v[i];
        }
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (dqkv == nullptr) return;
  check_heads("attention_backward", C, NH);
  const int64_t HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  std::fill(dqkv, dqkv + B * T * C3, 0.0f);
  std::vector<float> datt(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b) {
    const float* qkv_b = qkv + b * T * C3;
    float* dqkv_b = dqkv + b * T * C3;
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const float* a = att + ((b * NH + h) * T + t) * T;
        const float* dout_t = dout + (b * T + t) * C + h * HS;
        // Through the weighted sum: d att[t2] = v[t2] . dout, d v[t2] += att[t2] * dout.
        float weighted = 0.0f;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv_b + t2 * C3 + 2 * C + h * HS;
          float* dv = dqkv_b + t2 * C3 + 2 * C + h * HS;
          datt[t2] = detail::dot(v, dout_t, HS);
          weighted += a[t2] * datt[t2];
          for (int64_t i = 0; i < HS; ++i) dv[i] += a[t2] * dout_t[i];
        }
        // Through the softmax (d score = att * (d att - sum att * d att)) and the scaled dot.
        const float* q = qkv_b + t * C3 + h * HS;
        float* dq = dqkv_b + t * C3 + h * HS;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float ds = a[t2] * (datt[t2] - weighted) * scale;
          const float* k = qkv_b + t2 * C3 + C + h * HS;
          float* dk = dqkv_b + t2 * C3 + C + h * HS;
          for (int64_t i = 0; i < HS; ++i) {
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
          }
        }
      }
    }
  }
}

}  // namespace tessel::ops
