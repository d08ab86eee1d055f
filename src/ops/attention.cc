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

// One query against n keys and values (rows k + j * stride, v + j * stride, j < n): the
// scores into a[0, n), softmaxed, and their weighted sum of the values into o[0, HS).
void attend(float* o, float* a, const float* q, const float* k, const float* v, int64_t stride,
            int64_t n, int64_t HS, float scale) {
  // Scores and their max (for a stable softmax) over the visible keys.
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    a[j] = detail::dot(q, k + j * stride, HS) * scale;
    mx = std::max(mx, a[j]);
  }
  for (int64_t j = 0; j < n; ++j) a[j] = detail::exp(a[j] - mx);
  const float inv = 1.0f / detail::sum(a, n);
  for (int64_t j = 0; j < n; ++j) a[j] *= inv;
  // Weighted sum of the values.
  std::fill(o, o + HS, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = v + j * stride;
    const float w = a[j];
    for (int64_t i = 0; i < HS; ++i) o[i] += w * vj[i];
  }
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
        float* a = att + ((b * NH + h) * T + t) * T;
        attend(out + (b * T + t) * C + h * HS, a, qkv_b + t * C3 + h * HS, qkv_b + C + h * HS,
               qkv_b + 2 * C + h * HS, C3, t + 1, HS, scale);
        std::fill(a + t + 1, a + T, 0.0f);
      }
    }
  }
}

void attention_forward_kv(float* out, const float* qkv, float* k_cache, float* v_cache,
                          int64_t B, int64_t T, int64_t pos, int64_t C, int64_t NH,
                          int64_t Tmax) {
  check_heads("attention_forward_kv", C, NH);
  TESSEL_CHECK(pos >= 0 && T >= 0 && pos + T <= Tmax, "attention_forward_kv: positions [", pos,
               ", ", pos + T, ") pass the cache's ", Tmax);
  const int64_t HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  // Append the new positions' keys and values, then attend over everything up to each query.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* row = qkv + (b * T + t) * C3;
      std::copy(row + C, row + 2 * C, k_cache + (b * Tmax + pos + t) * C);
      std::copy(row + 2 * C, row + C3, v_cache + (b * Tmax + pos + t) * C);
    }
  std::vector<float> scores(static_cast<size_t>(pos + T));
  for (int64_t b = 0; b < B; ++b) {
    const float* k_b = k_cache + b * Tmax * C;
    const float* v_b = v_cache + b * Tmax * C;
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t)
        attend(out + (b * T + t) * C + h * HS, scores.data(), qkv + (b * T + t) * C3 + h * HS,
               k_b + h * HS, v_b + h * HS, C, pos + t + 1, HS, scale);
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
