// Causal attention (src/ops/attention.cc): finite-difference gradients over one and several
// query blocks, the outputs against a double-precision loop past a key chunk, and the KV-cache
// path giving the bits of the full forward's rows.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "grad_check.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

using testing::expect_grad;
using testing::GradTolerance;
using testing::poisoned;
using testing::randn;
using testing::Vec;
using testing::weighted_sum;

void check_attention_grad(int64_t B, int64_t T, int64_t C, int64_t NH) {
  Vec qkv = randn(B * T * 3 * C, 29), r = randn(B * T * C, 30);
  auto objective = [&] {
    Vec out(B * T * C), att(B * NH * T * T);
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return weighted_sum(r, out);
  };
  Vec out(B * T * C), att(B * NH * T * T), dqkv = poisoned(B * T * 3 * C);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int64_t row = 0; row < B * NH * T; ++row) {
    const int64_t t = row % T;
    double s = 0.0;
    for (int64_t t2 = 0; t2 < T; ++t2) {
      s += att[row * T + t2];
      if (t2 > t) {
        EXPECT_EQ(att[row * T + t2], 0.0f) << "future key visible";
      }
    }
    EXPECT_NEAR(s, 1.0, 1e-6);
  }
  attention_backward(dqkv.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  GradTolerance tol;
  tol.eps = 3e-3;
  expect_grad("attention dqkv", qkv, dqkv, objective, tol);
}

TEST(GradCheck, Attention) { check_attention_grad(2, 5, 8, 2); }

TEST(GradCheck, AttentionOverSeveralQueryBlocks) { check_attention_grad(1, 70, 4, 2); }

// out[b, t, h] from a double-precision loop over the keys t2 <= t.
std::vector<double> reference(const Vec& qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t HS = C / NH, C3 = 3 * C;
  std::vector<double> out(static_cast<size_t>(B * T * C), 0.0), w(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv.data() + (b * T + t) * C3 + h * HS;
        double mx = -INFINITY, total = 0.0;
        for (int64_t j = 0; j <= t; ++j) {
          const float* k = qkv.data() + (b * T + j) * C3 + C + h * HS;
          double s = 0.0;
          for (int64_t i = 0; i < HS; ++i) s += static_cast<double>(q[i]) * k[i];
          w[j] = s / std::sqrt(static_cast<double>(HS));
          mx = std::max(mx, w[j]);
        }
        for (int64_t j = 0; j <= t; ++j) total += (w[j] = std::exp(w[j] - mx));
        for (int64_t j = 0; j <= t; ++j) {
          const float* v = qkv.data() + (b * T + j) * C3 + 2 * C + h * HS;
          for (int64_t i = 0; i < HS; ++i) out[(b * T + t) * C + h * HS + i] += w[j] / total * v[i];
        }
      }
  return out;
}

TEST(Attention, MatchesADoubleLoopPastAKeyChunk) {
  const int64_t B = 2, T = 300, C = 16, NH = 2;
  const Vec qkv = randn(B * T * 3 * C, 31);
  Vec out(B * T * C), att(B * NH * T * T);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  const std::vector<double> want = reference(qkv, B, T, C, NH);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-5) << "element " << i;
}

TEST(Attention, KvCacheGivesTheBitsOfTheFullForward) {
  set_blas_threads(1);  // tessel's own GEMM where the build has it, as predict and serve run
  const int64_t B = 2, T = 300, C = 16, NH = 2;
  const Vec qkv = randn(B * T * 3 * C, 32);
  Vec full(B * T * C), att(B * NH * T * T);
  attention_forward(full.data(), att.data(), qkv.data(), B, T, C, NH);
  // A prompt of 37 positions, then pieces of 1 and 5 until T.
  Vec k_cache(B * T * C), v_cache(B * T * C);
  for (int64_t pos = 0, step = 0; pos < T; ++step) {
    const int64_t n = std::min<int64_t>(pos == 0 ? 37 : (step % 2 ? 1 : 5), T - pos);
    Vec piece(B * n * 3 * C), out(B * n * C);
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(qkv.data() + (b * T + pos) * 3 * C, n * 3 * C, piece.data() + b * n * 3 * C);
    attention_forward_kv(out.data(), piece.data(), k_cache.data(), v_cache.data(), B, n, pos, C, NH,
                         T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n * C; ++i)
        ASSERT_EQ(out[b * n * C + i], full[(b * T + pos) * C + i])
            << "sequence " << b << " position " << pos + i / C;
    pos += n;
  }
}

}  // namespace
}  // namespace tessel::ops
