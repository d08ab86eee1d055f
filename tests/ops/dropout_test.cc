// Dropout's counter-based mask: a pure function of (seed, step, global sample, column), so it
// does not depend on how rows are split; keep rate near 1 - p; kept values scaled by 1/(1-p).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "grad_check.h"
#include "tessel/core/error.h"
#include "tessel/core/rng.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

using testing::randn;
using testing::Vec;

constexpr uint64_t kSeed = 1234;
constexpr int64_t kStep = 17;

TEST(Dropout, MaskIndependentOfRowSplit) {
  const int64_t rows = 8, cols = 37, first = 100;
  const float p = 0.4f;
  Vec x = randn(rows * cols, 1), whole(rows * cols), split(rows * cols);
  dropout_forward(whole.data(), x.data(), rows, cols, p, kSeed, kStep, first);
  // Rows [0, 3) and [3, 8) as two calls, as two ranks or micro-batches would compute them.
  dropout_forward(split.data(), x.data(), 3, cols, p, kSeed, kStep, first);
  dropout_forward(split.data() + 3 * cols, x.data() + 3 * cols, 5, cols, p, kSeed, kStep,
                  first + 3);
  EXPECT_EQ(whole, split);
  // The same holds one row at a time, in reverse order.
  Vec rowwise(rows * cols);
  for (int64_t r = rows - 1; r >= 0; --r) {
    dropout_forward(rowwise.data() + r * cols, x.data() + r * cols, 1, cols, p, kSeed, kStep,
                    first + r);
  }
  EXPECT_EQ(whole, rowwise);
}

TEST(Dropout, MaskIsCounterRngBitForBit) {
  // The kernel evaluates Philox in blocks of columns; it must agree with CounterRng exactly,
  // including the partial last block and large sample indices.
  const int64_t rows = 3, cols = 150, first = (int64_t{1} << 40) + 5;
  const float p = 0.5f;
  Vec x = randn(rows * cols, 5), y(rows * cols);
  dropout_forward(y.data(), x.data(), rows, cols, p, kSeed, kStep, first);
  for (int64_t r = 0; r < rows; ++r) {
    CounterRng rng(kSeed, mix_stream(RngPurpose::kDropout, kStep, first + r));
    for (int64_t c = 0; c < cols; ++c) {
      const float want = rng.uniform(c) >= p ? x[r * cols + c] * (1.0f / (1.0f - p)) : 0.0f;
      ASSERT_EQ(y[r * cols + c], want) << "row " << r << " col " << c;
    }
  }
}

TEST(Dropout, KeepRateAndScaling) {
  const int64_t rows = 64, cols = 500;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    Vec x = randn(rows * cols, 2), y(rows * cols);
    for (auto& v : x) v = std::abs(v) + 0.1f;  // never 0, so y == 0 means dropped
    dropout_forward(y.data(), x.data(), rows, cols, p, kSeed, kStep, 0);
    int64_t kept = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      if (y[i] == 0.0f) continue;
      ++kept;
      EXPECT_FLOAT_EQ(y[i], x[i] / (1.0f - p)) << i;
    }
    // 32000 draws: the standard deviation of the rate is at most 0.0028; allow ~5 sigma.
    const double rate = static_cast<double>(kept) / (rows * cols);
    EXPECT_NEAR(rate, 1.0 - p, 0.015) << "p=" << p;
  }
}

TEST(Dropout, BackwardUsesTheForwardMask) {
  const int64_t rows = 6, cols = 20;
  const float p = 0.3f;
  Vec ones(rows * cols, 1.0f), y(rows * cols), dy = randn(rows * cols, 3), dx(rows * cols);
  dropout_forward(y.data(), ones.data(), rows, cols, p, kSeed, kStep, 40);
  dropout_backward(dx.data(), dy.data(), rows, cols, p, kSeed, kStep, 40);
  for (int64_t i = 0; i < rows * cols; ++i) EXPECT_FLOAT_EQ(dx[i], dy[i] * y[i]) << i;
}

TEST(Dropout, MaskChangesWithStepSeedAndSample) {
  const int64_t cols = 256;
  Vec ones(cols, 1.0f), base(cols), other(cols);
  dropout_forward(base.data(), ones.data(), 1, cols, 0.5f, kSeed, kStep, 7);
  auto differs = [&](uint64_t seed, int64_t step, int64_t sample) {
    dropout_forward(other.data(), ones.data(), 1, cols, 0.5f, seed, step, sample);
    return other != base;
  };
  EXPECT_FALSE(differs(kSeed, kStep, 7));
  EXPECT_TRUE(differs(kSeed + 1, kStep, 7));
  EXPECT_TRUE(differs(kSeed, kStep + 1, 7));
  EXPECT_TRUE(differs(kSeed, kStep, 8));
}

TEST(Dropout, ZeroProbabilityIsIdentityAndBadProbabilityThrows) {
  Vec x = randn(10, 4), y(10);
  dropout_forward(y.data(), x.data(), 2, 5, 0.0f, kSeed, kStep, 0);
  EXPECT_EQ(y, x);
  EXPECT_THROW(dropout_forward(y.data(), x.data(), 2, 5, 1.0f, kSeed, kStep, 0), InvalidArgument);
  EXPECT_THROW(dropout_forward(y.data(), x.data(), 2, 5, -0.1f, kSeed, kStep, 0), InvalidArgument);
  EXPECT_THROW(dropout_backward(y.data(), x.data(), 2, 5, NAN, kSeed, kStep, 0), InvalidArgument);
}

}  // namespace
}  // namespace tessel::ops
