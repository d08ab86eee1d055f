// Finite-difference gradient checks for the dense kernels (linear, activations,
// cross-entropy, layernorm, embedding, dropout) and the shared backward contracts:
// dx overwritten, parameter gradients accumulated, null dx skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "grad_check.h"
#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

using testing::expect_grad;
using testing::GradTolerance;
using testing::max_rel_diff;
using testing::poisoned;
using testing::randn;
using testing::softmax_rows;
using testing::uniform;
using testing::Vec;
using testing::weighted_sum;

// ---- Linear ----

void check_linear(bool with_bias) {
  const int64_t N = 4, C = 5, OC = 3;
  Vec x = randn(N * C, 1), w = randn(OC * C, 2, 0.5f), b = randn(OC, 3), r = randn(N * OC, 4);
  const float* bp = with_bias ? b.data() : nullptr;
  auto objective = [&] {
    Vec y(N * OC);
    linear_forward(y.data(), x.data(), w.data(), bp, N, C, OC);
    return weighted_sum(r, y);
  };
  Vec dx = poisoned(N * C), dw(OC * C, 0.0f), db(OC, 0.0f);
  linear_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, r.data(), x.data(),
                  w.data(), N, C, OC);
  expect_grad("linear dx", x, dx, objective);
  expect_grad("linear dw", w, dw, objective);
  if (with_bias) expect_grad("linear db", b, db, objective);
}

TEST(GradCheck, LinearWithBias) { check_linear(true); }
TEST(GradCheck, LinearWithoutBias) { check_linear(false); }

TEST(Linear, ForwardMatchesNaiveLoops) {
  const int64_t N = 7, C = 13, OC = 9;
  Vec x = randn(N * C, 5), w = randn(OC * C, 6), b = randn(OC, 7), y(N * OC);
  linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < OC; ++o) {
      double s = b[o];
      for (int64_t c = 0; c < C; ++c) s += static_cast<double>(x[n * C + c]) * w[o * C + c];
      EXPECT_NEAR(y[n * OC + o], s, 1e-5 * (1.0 + std::abs(s)));
    }
  }
}

TEST(Gemm, TransposesAndBeta) {
  // C[2,3] = 2 * A^T @ B^T + 0.5 * C with A stored [K=4, M=2] and B stored [N=3, K=4].
  const int64_t M = 2, N = 3, K = 4;
  Vec A = randn(K * M, 8), B = randn(N * K, 9), C0 = randn(M * N, 10), C = C0;
  gemm(true, true, M, N, K, 2.0f, A.data(), M, B.data(), K, 0.5f, C.data(), N);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(A[k * M + i]) * B[j * K + k];
      EXPECT_NEAR(C[i * N + j], 2.0 * s + 0.5 * C0[i * N + j], 1e-5);
    }
  }
}

TEST(Gemm, EmptySumScalesCAndBadLeadingDimensionThrows) {
  Vec C = {1.0f, 2.0f, 3.0f, 4.0f};
  gemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, C.data(), 2);
  EXPECT_EQ(C, (Vec{0.5f, 1.0f, 1.5f, 2.0f}));
  Vec A(6, 1.0f), B(6, 1.0f);
  // A is [2, 3] row-major, so lda must be at least 3.
  EXPECT_THROW(gemm(false, false, 2, 2, 3, 1.0f, A.data(), 2, B.data(), 2, 0.0f, C.data(), 2),
               Error);
}

TEST(Blas, ThreadCountRoundTrips) {
  const int before = blas_threads();
  set_blas_threads(1);
  EXPECT_EQ(blas_threads(), 1);
  set_blas_threads(before);
  EXPECT_THROW(set_blas_threads(0), Error);
}

// ---- Activations ----

TEST(GradCheck, Relu) {
  const int64_t n = 40;
  // Keep inputs away from the kink at 0 by more than the FD step.
  Vec x = uniform(n, 11, 0.05f, 2.0f), r = randn(n, 12);
  for (int64_t i = 0; i < n; i += 2) x[i] = -x[i];
  auto objective = [&] {
    Vec y(n);
    relu_forward(y.data(), x.data(), n);
    return weighted_sum(r, y);
  };
  Vec y(n), dx = poisoned(n);
  relu_forward(y.data(), x.data(), n);
  relu_backward(dx.data(), r.data(), y.data(), n);
  expect_grad("relu dx", x, dx, objective);
  for (int64_t i = 0; i < n; i += 2) EXPECT_EQ(dx[i], 0.0f) << "negative input " << i;
}

// ReLU on 16-bit buffers selects the stored bits: the bits of the f32 kernel on the widened
// values, rounded back, for every value a bf16 or f16 can hold but NaN (a NaN input gives +0,
// a NaN gradient stays a NaN).
TEST(Relu, SixteenBitBuffersGiveTheBitsOfTheF32Kernel) {
  const int64_t n = 1 << 16;
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> x(n), dy(n), y(n), dx(n), want(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = static_cast<uint16_t>(i);
      dy[i] = static_cast<uint16_t>(i * 40503 + 7);  // a gradient of every sign and size
    }
    Vec xf(n), yf(n), dyf(n), dxf(n);
    convert(xf.data(), DType::kF32, x.data(), t, n);
    convert(dyf.data(), DType::kF32, dy.data(), t, n);
    relu_forward(yf.data(), xf.data(), n);
    relu_backward(dxf.data(), dyf.data(), yf.data(), n);
    relu_forward(y.data(), x.data(), n, t);
    relu_backward(dx.data(), dy.data(), y.data(), n, t);
    convert(want.data(), t, yf.data(), DType::kF32, n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(y[i], want[i]) << dtype_name(t) << " relu_forward of bits " << i;
    convert(want.data(), t, dxf.data(), DType::kF32, n);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(dxf[i])) {
        ASSERT_TRUE((dx[i] & 0x7fff) > (t == DType::kBF16 ? 0x7f80 : 0x7c00)) << i;
        continue;
      }
      ASSERT_EQ(dx[i], want[i]) << dtype_name(t) << " relu_backward at bits " << i;
    }
  }
}

TEST(GradCheck, Gelu) {
  const int64_t n = 40;
  Vec x = randn(n, 13, 2.0f), r = randn(n, 14);
  auto objective = [&] {
    Vec y(n);
    gelu_forward(y.data(), x.data(), n);
    return weighted_sum(r, y);
  };
  Vec dx = poisoned(n);
  gelu_backward(dx.data(), r.data(), x.data(), n);
  expect_grad("gelu dx", x, dx, objective);
}

TEST(Gelu, MatchesTanhFormulaAtKnownPoints) {
  // Values of 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))) computed in double.
  Vec x = {-3.0f, -1.0f, 0.0f, 0.5f, 2.0f}, y(5);
  gelu_forward(y.data(), x.data(), 5);
  const double expect[] = {-0.0036373920817729943, -0.15880800939172324, 0.0, 0.34571400982514394,
                           1.9545976940871754};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(y[i], expect[i], 1e-6) << "x=" << x[i];
}

TEST(Add, SumsElementwise) {
  Vec a = randn(33, 15), b = randn(33, 16), y(33);
  add_forward(y.data(), a.data(), b.data(), 33);
  for (int i = 0; i < 33; ++i) EXPECT_EQ(y[i], a[i] + b[i]);
}

// ---- Softmax and cross-entropy ----

TEST(Softmax, AccurateOverTheWholeRangeAndPropagatesNan) {
  // exp is evaluated inline (vectorised) rather than by libm: check it against std::exp over
  // the full float range through two-element rows, where softmax = 1 / (1 + e^-d).
  for (float d = -80.0f; d <= 80.0f; d += 0.37f) {
    Vec x = {d, 0.0f}, y(2);
    softmax_rows(y.data(), x.data(), 1, 2);
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(d)));
    EXPECT_NEAR(y[0], want, 1e-6 * want + 1e-30) << "d=" << d;
  }
  const float inf = std::numeric_limits<float>::infinity();
  Vec x = {0.0f, -inf, 1.0f, NAN, 0.0f, 1.0f}, y(6);
  softmax_rows(y.data(), x.data(), 2, 3);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_NEAR(y[0] + y[2], 1.0f, 1e-6);
  EXPECT_TRUE(std::isnan(y[3]) && std::isnan(y[4]) && std::isnan(y[5]));
}

TEST(GradCheck, CrossEntropy) {
  const int64_t N = 5, C = 7;
  const float dloss = 0.7f;
  Vec logits = randn(N * C, 19, 2.0f), probs(N * C);
  std::vector<int32_t> labels = {0, 6, 3, 3, 1};
  auto objective = [&] {
    Vec p(N * C);
    return dloss *
           static_cast<double>(cross_entropy_forward(p.data(), logits.data(), labels.data(), N, C));
  };
  cross_entropy_forward(probs.data(), logits.data(), labels.data(), N, C);
  Vec dlogits = poisoned(N * C);
  cross_entropy_backward(dlogits.data(), probs.data(), labels.data(), N, C, dloss);
  expect_grad("cross_entropy dlogits", logits, dlogits, objective);
}

TEST(CrossEntropy, HugeLogitsStayFinite) {
  Vec logits = {1000.0f, -1000.0f, 0.0f, -1000.0f, 1000.0f, 0.0f}, probs(6);
  std::vector<int32_t> labels = {1, 1};  // first row confidently wrong, second right
  const float loss = cross_entropy_forward(probs.data(), logits.data(), labels.data(), 2, 3);
  EXPECT_NEAR(loss, 1000.0f, 1e-2);  // (2000 + 0) / 2
  EXPECT_NEAR(probs[0], 1.0f, 1e-6);
}

TEST(CrossEntropy, BadLabelThrowsNamingIt) {
  Vec logits(6, 0.0f), probs(6);
  std::vector<int32_t> labels = {0, 3};
  try {
    cross_entropy_forward(probs.data(), logits.data(), labels.data(), 2, 3);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("got 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0, 3)"), std::string::npos) << msg;
  }
  labels = {-1, 0};
  EXPECT_THROW(cross_entropy_forward(probs.data(), logits.data(), labels.data(), 2, 3),
               InvalidArgument);
}

TEST(CrossEntropy, BackwardOfASliceLeavesOtherSlicesLabelsOut) {
  // Classes [0, 2) of 4 on the first rank of a tensor-parallel pair: row 1's label 3 lies in
  // the other rank's slice and adds nothing here (a debug-only check once threw on it).
  const Vec probs = {0.25f, 0.25f, 0.5f, 0.5f};
  const std::vector<int32_t> labels = {1, 3};
  Vec dlogits(4);
  cross_entropy_backward(dlogits.data(), probs.data(), labels.data(), 2, 2, 1.0f, 0);
  EXPECT_EQ(dlogits, (Vec{0.125f, 0.125f - 0.5f, 0.25f, 0.25f}));
  cross_entropy_backward(dlogits.data(), probs.data(), labels.data(), 2, 2, 1.0f, 2);
  EXPECT_EQ(dlogits, (Vec{0.125f, 0.125f, 0.25f, 0.25f - 0.5f}));
}

TEST(CountCorrect, FirstMaximumWinsTies) {
  Vec logits = {1, 3, 3,   // tie between 1 and 2 -> 1
                5, 5, 0,   // tie between 0 and 1 -> 0
                0, 1, 2};  // 2
  std::vector<int32_t> labels = {1, 1, 2};
  EXPECT_EQ(count_correct(logits.data(), labels.data(), 3, 3), 2);
  labels = {2, 0, 0};
  EXPECT_EQ(count_correct(logits.data(), labels.data(), 3, 3), 1);
}

// ---- LayerNorm ----

TEST(GradCheck, LayerNorm) {
  const int64_t N = 3, C = 8;
  Vec x = randn(N * C, 21, 1.5f), w = randn(C, 22), b = randn(C, 23), r = randn(N * C, 24);
  for (int64_t i = 0; i < C; ++i) x[i] += 3.0f;  // a row with a large mean
  auto objective = [&] {
    Vec y(N * C), mean(N), rstd(N);
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return weighted_sum(r, y);
  };
  Vec y(N * C), mean(N), rstd(N), dx = poisoned(N * C), dw(C, 0.0f), db(C, 0.0f);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  GradTolerance tol;
  tol.eps = 3e-3;  // layernorm is curved (rstd); a smaller step keeps truncation error low
  expect_grad("layernorm dx", x, dx, objective, tol);
  expect_grad("layernorm dw", w, dw, objective);
  expect_grad("layernorm db", b, db, objective);
}

// ---- Embedding ----

TEST(GradCheck, Embedding) {
  const int64_t V = 7, C = 4, N = 6;
  std::vector<int32_t> ids = {3, 0, 3, 6, 1, 3};  // id 3 three times: gradients must add
  Vec table = randn(V * C, 25), r = randn(N * C, 26);
  auto objective = [&] {
    Vec y(N * C);
    embedding_forward(y.data(), ids.data(), table.data(), N, V, C);
    return weighted_sum(r, y);
  };
  Vec dtable(V * C, 0.0f);
  embedding_backward(dtable.data(), r.data(), ids.data(), N, C, 0, V, DType::kF32);
  expect_grad("embedding dtable", table, dtable, objective);
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dtable[2 * C + c], 0.0f) << "unused row";
}

TEST(Embedding, BadIdThrowsNamingIt) {
  Vec table(8, 1.0f), y(4);
  std::vector<int32_t> ids = {1, 4};
  try {
    embedding_forward(y.data(), ids.data(), table.data(), 2, 4, 2);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("got 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0, 4)"), std::string::npos) << msg;
  }
}

// ---- Dropout (its mask is fixed for a given seed, step and sample) ----

TEST(GradCheck, Dropout) {
  const int64_t rows = 4, cols = 10;
  const float p = 0.3f;
  Vec x = randn(rows * cols, 27), r = randn(rows * cols, 28);
  auto objective = [&] {
    Vec y(rows * cols);
    dropout_forward(y.data(), x.data(), rows, cols, p, 99, 5, 12);
    return weighted_sum(r, y);
  };
  Vec dx = poisoned(rows * cols);
  dropout_backward(dx.data(), r.data(), rows, cols, p, 99, 5, 12);
  expect_grad("dropout dx", x, dx, objective);
}

// ---- Backward contracts: parameter gradients accumulate, a null dx is skipped ----

TEST(Contracts, LinearAccumulatesAndSkipsNullDx) {
  const int64_t N = 6, C = 5, OC = 4;
  Vec x = randn(N * C, 71), w = randn(OC * C, 72), dy = randn(N * OC, 73);
  Vec dx(N * C), dw1(OC * C, 0.0f), db1(OC, 0.0f);
  linear_backward(dx.data(), dw1.data(), db1.data(), dy.data(), x.data(), w.data(), N, C, OC);
  // Twice into zeroed buffers: double (up to rounding, the sums run in another order).
  Vec dw2(OC * C, 0.0f), db2(OC, 0.0f);
  for (int rep = 0; rep < 2; ++rep) {
    linear_backward(nullptr, dw2.data(), db2.data(), dy.data(), x.data(), w.data(), N, C, OC);
  }
  for (auto& v : dw1) v *= 2.0f;
  for (auto& v : db1) v *= 2.0f;
  EXPECT_LT(max_rel_diff(dw2, dw1), 1e-6);
  EXPECT_LT(max_rel_diff(db2, db1), 1e-6);
  // A null db leaves the weight gradient alone.
  Vec dw3(OC * C, 0.0f);
  linear_backward(nullptr, dw3.data(), nullptr, dy.data(), x.data(), w.data(), N, C, OC);
  for (auto& v : dw3) v *= 2.0f;
  EXPECT_EQ(dw3, dw1);
}

TEST(Contracts, LayerNormAccumulatesAndSkipsNullDx) {
  const int64_t N = 4, C = 9;
  Vec x = randn(N * C, 74), w = randn(C, 75), b = randn(C, 76), dy = randn(N * C, 77);
  Vec y(N * C), mean(N), rstd(N);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  Vec dx1(N * C), dw1(C, 0.0f), db1(C, 0.0f), dw2(C, 0.0f), db2(C, 0.0f);
  layernorm_backward(dx1.data(), dw1.data(), db1.data(), dy.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  for (int rep = 0; rep < 2; ++rep) {
    layernorm_backward(nullptr, dw2.data(), db2.data(), dy.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), N, C);
  }
  for (auto& v : dw1) v *= 2.0f;
  for (auto& v : db1) v *= 2.0f;
  EXPECT_LT(max_rel_diff(dw2, dw1), 1e-6);
  EXPECT_LT(max_rel_diff(db2, db1), 1e-6);
}

TEST(Contracts, EmbeddingAccumulates) {
  const int64_t N = 5, C = 3;
  std::vector<int32_t> ids = {1, 0, 1, 2, 0};
  Vec dy = randn(N * C, 78), d1(3 * C, 0.0f), d2(3 * C, 0.0f);
  embedding_backward(d1.data(), dy.data(), ids.data(), N, C, 0, 3, DType::kF32);
  for (int rep = 0; rep < 2; ++rep)
    embedding_backward(d2.data(), dy.data(), ids.data(), N, C, 0, 3, DType::kF32);
  for (auto& v : d1) v *= 2.0f;
  EXPECT_LT(max_rel_diff(d2, d1), 1e-6);
}

TEST(Contracts, NullDxIsSkippedByEveryBackward) {
  // None of these may touch memory through a null dx; reaching the end is the assertion,
  // and under ASan any write through it would be reported.
  const int64_t n = 8;
  Vec a = randn(n, 79), b = randn(n, 80), y(n);
  std::vector<int32_t> labels = {0, 1}, argmax(2, 0);
  relu_backward(nullptr, a.data(), b.data(), n);
  gelu_backward(nullptr, a.data(), b.data(), n);
  cross_entropy_backward(nullptr, a.data(), labels.data(), 2, 4, 1.0f);
  dropout_backward(nullptr, a.data(), 2, 4, 0.5f, 1, 2, 3);
  maxpool2d_backward(nullptr, a.data(), argmax.data(), 1, 2, 2, 2, 2, 2);
  Vec qkv = randn(2 * 3 * 2, 81), att(2 * 2);
  attention_forward(y.data(), att.data(), qkv.data(), 1, 2, 2, 1);
  attention_backward(nullptr, y.data(), qkv.data(), att.data(), 1, 2, 2, 1);
  EXPECT_EQ(a, randn(n, 79)) << "inputs must be left alone";
}

}  // namespace
}  // namespace tessel::ops
