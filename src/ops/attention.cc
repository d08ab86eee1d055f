// Causal multi-head self-attention on GEMMs, one (sequence, head) at a time. Head h of q, k, v
// for token t sits at qkv[b, t, {0, C, 2C} + h*HS .. + HS): each head's q, k and v are [T, HS]
// matrices with leading dimension 3C, so the GEMMs read them in place.
//   forward:  S = scale * Q K^T, P = softmax of each row over its keys t2 <= t, O = P V;
//   backward: dP = dO V^T, dV = P^T dO, dS = P * (dP - rowsum(P * dP)) * scale,
//             dQ = dS K, dK = dS^T Q.
// Causality skips the zeros of P and dS: the forward runs query blocks of kQueryBlock rows
// against the keys up to the block's end and sums P V over key chunks of kKeyChunk at fixed
// positions; the backward forms dP, dS and dQ by the same query blocks, and dV and dK by key
// blocks over the queries from the block's start. A score is the same HS-term sum whatever the
// block, and a chunk of keys is one GEMM pass (kKeyChunk is below the GEMM's K blocking), so a
// row's output is the same sum of the same chunk sums however many queries and keys the call
// has: the KV-cache path (attention_forward_kv) gives the bits of the full forward's rows. A
// skipped product is an exact zero: skipping it changes no sum (at most the sign of a zero sum).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels.h"
#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

constexpr int64_t kQueryBlock = 16;
constexpr int64_t kKeyChunk = 256;

void check_heads(const char* who, int64_t C, int64_t NH) {
  TESSEL_CHECK(NH > 0 && C % NH == 0, who, ": channels must split evenly over heads, got C=", C,
               " NH=", NH, "; pick n_embd divisible by n_head");
}

// Grow-only per-thread buffer (reused across calls: no page faults per call).
float* scratch(int64_t n) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

// One head: queries q[rows, HS] (positions first ..) against keys k and values v [keys, HS]
// (positions 0 ..), leading dimensions ld_q and ld_kv; probabilities into p[rows, ld_p], the
// output into o[rows, HS] (leading dimension ld_o).
void attend(float* o, int64_t ld_o, float* p, int64_t ld_p, const float* q, int64_t ld_q,
            const float* k, const float* v, int64_t ld_kv, int64_t rows, int64_t first,
            int64_t keys, int64_t HS, float scale) {
  gemm(false, true, rows, keys, HS, scale, q, ld_q, k, ld_kv, 0.0f, p, ld_p);
  kernels().causal_softmax(p, rows, ld_p, first, keys);
  for (int64_t c = 0; c < keys; c += kKeyChunk)
    gemm(false, false, rows, HS, std::min(kKeyChunk, keys - c), 1.0f, p + c, ld_p, v + c * ld_kv,
         ld_kv, c == 0 ? 0.0f : 1.0f, o, ld_o);
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
      float* p = att + (b * NH + h) * T * T;
      const float* q = qkv_b + h * HS;
      for (int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, T - t0), keys = t0 + rows;
        float* p_block = p + t0 * T;
        attend(out + (b * T + t0) * C + h * HS, C, p_block, T, q + t0 * C3, C3, q + C, q + 2 * C,
               C3, rows, t0, keys, HS, scale);
        for (int64_t i = 0; i < rows; ++i)
          std::fill(p_block + i * T + keys, p_block + (i + 1) * T, 0.0f);
      }
    }
  }
}

void attention_forward_kv(float* out, const float* qkv, float* k_cache, float* v_cache, int64_t B,
                          int64_t T, int64_t pos, int64_t C, int64_t NH, int64_t Tmax) {
  check_heads("attention_forward_kv", C, NH);
  TESSEL_CHECK(pos >= 0 && T >= 0 && pos + T <= Tmax, "attention_forward_kv: positions [", pos,
               ", ", pos + T, ") pass the cache's ", Tmax);
  const int64_t HS = C / NH, C3 = 3 * C, keys = pos + T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  // Append the new positions' keys and values, then attend over everything up to each query.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* row = qkv + (b * T + t) * C3;
      std::copy(row + C, row + 2 * C, k_cache + (b * Tmax + pos + t) * C);
      std::copy(row + 2 * C, row + C3, v_cache + (b * Tmax + pos + t) * C);
    }
  float* p = scratch(T * keys);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      attend(out + b * T * C + h * HS, C, p, keys, qkv + b * T * C3 + h * HS, C3,
             k_cache + b * Tmax * C + h * HS, v_cache + b * Tmax * C + h * HS, C, T, pos, keys, HS,
             scale);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (dqkv == nullptr) return;
  check_heads("attention_backward", C, NH);
  const int64_t HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  float* ds = scratch(T * T);
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * C3;  // head h's q, k, v at + h * HS, + C, + 2C
    float* dq = dqkv + b * T * C3;
    for (int64_t h = 0; h < NH; ++h, q += HS, dq += HS) {
      const float* p = att + (b * NH + h) * T * T;
      const float* dout_h = dout + b * T * C + h * HS;
      // Query blocks: dP, dS and dQ over the keys up to the block's end (dS is zero after).
      for (int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, T - t0), keys = t0 + rows;
        float* ds_block = ds + t0 * T;
        gemm(false, true, rows, keys, HS, 1.0f, dout_h + t0 * C, C, q + 2 * C, C3, 0.0f, ds_block,
             T);  // dP
        // dS in place of dP, over row t's keys t2 <= t (P is zero after them).
        kernels().causal_softmax_backward(ds_block, p + t0 * T, rows, T, t0, keys, scale);
        gemm(false, false, rows, HS, keys, 1.0f, ds_block, T, q + C, C3, 0.0f, dq + t0 * C3,
             C3);  // dQ
      }
      // Key blocks: dV and dK over the queries from the block's start (P and dS are zero before),
      // whose dS rows the query blocks above wrote up to these keys.
      for (int64_t j0 = 0; j0 < T; j0 += kQueryBlock) {
        const int64_t cols = std::min(kQueryBlock, T - j0), queries = T - j0;
        gemm(true, false, cols, HS, queries, 1.0f, p + j0 * T + j0, T, dout_h + j0 * C, C, 0.0f,
             dq + 2 * C + j0 * C3, C3);  // dV
        gemm(true, false, cols, HS, queries, 1.0f, ds + j0 * T + j0, T, q + j0 * C3, C3, 0.0f,
             dq + C + j0 * C3, C3);  // dK
      }
    }
  }
}

}  // namespace tessel::ops
