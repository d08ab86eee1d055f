// The debug.* fault injections as decorators (src/parallel/fault_injection.h): a sleeping
// gradient sync forwards every call and counts its sleeps; an overflow loss makes the loss
// gradient inf at the listed steps only; slowed blocks take debug.slow_factor times as long
// from debug.slow_from_step on; each is built only for the rank the spec names; a
// debug.slow_rank outside the training ranks is refused naming the key.
#include "../../src/parallel/fault_injection.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/parallel/composition.h"

namespace tessel::parallel {
namespace {

// A gradient sync that records what reaches it.
class CountingSync final : public GradSync {
 public:
  void reduce() override { ++reduces; }
  double sq_norm() override { return 4.0; }
  float* grads(nn::Range r) override { return values + r.lo; }
  void clear() override { ++clears; }
  void take_stats(RankStats& s) override { s.comm_bytes += 1; }
  int reduces = 0, clears = 0;
  float values[4] = {1, 2, 3, 4};
};

// A loss whose backward returns its dloss as a one-element tensor.
class EchoLoss final : public nn::Loss {
 public:
  nn::LossValue forward(const Tensor&, const Tensor&) override { return {}; }
  Tensor backward(float dloss) override {
    Tensor t = Tensor::empty({1});
    t.data<float>()[0] = dloss;
    return t;
  }
};

TEST(FaultInjection, SlowSyncSleepsBeforeEachReductionOnItsRankOnly) {
  ParallelSpec spec;
  spec.slow_rank = 1;
  spec.delay_ms = 20;
  CountingSync inner;
  EXPECT_EQ(slow_sync(spec, 0, inner), nullptr);
  std::unique_ptr<GradSync> slow = slow_sync(spec, 1, inner);
  ASSERT_NE(slow, nullptr);
  const double t0 = now_seconds();
  slow->reduce();
  EXPECT_GE(now_seconds() - t0, 0.019);
  EXPECT_EQ(inner.reduces, 1);
  slow->clear();
  EXPECT_EQ(inner.clears, 1);
  EXPECT_EQ(slow->sq_norm(), 4.0);
  EXPECT_EQ(slow->grads({2, 3}), inner.values + 2);
  RankStats s;
  slow->take_stats(s);
  EXPECT_GE(s.delay_s, 0.019);
  EXPECT_EQ(s.comm_bytes, 1);  // the inner sync's own figures
  spec.delay_ms = 0;
  EXPECT_EQ(slow_sync(spec, 1, inner), nullptr);
}

TEST(FaultInjection, SlowBlocksStretchEachBlockByTheFactorOnItsRankOnlyFromTheirStep) {
  ParallelSpec spec;
  spec.slow_rank = 1;
  spec.slow_factor = 3;
  spec.slow_from_step = 4;
  int64_t step = 3;
  EXPECT_EQ(slow_blocks(spec, 0, step), nullptr);
  std::unique_ptr<BlockHooks> slow = slow_blocks(spec, 1, step);
  ASSERT_NE(slow, nullptr);
  auto two_blocks = [&] {  // the seconds of a forward and a backward block of 10 ms each
    const double t0 = now_seconds();
    for (nn::Phase before : {nn::Phase::kBeforeForward, nn::Phase::kBeforeBackward}) {
      slow->on_block(before, 0, true);
      const double block = now_seconds();
      while (now_seconds() - block < 0.01) {
      }
      slow->on_block(before == nn::Phase::kBeforeForward ? nn::Phase::kAfterForward
                                                         : nn::Phase::kAfterBackward,
                     0, true);
    }
    return now_seconds() - t0;
  };
  EXPECT_LT(two_blocks(), 0.059) << "step 3, before debug.slow_from_step = 4";
  step = 4;
  EXPECT_GE(two_blocks(), 0.059);  // each 3x as long
  spec.slow_factor = 1;
  EXPECT_EQ(slow_blocks(spec, 1, step), nullptr);
}

TEST(FaultInjection, OverflowLossIsInfAtTheListedStepsOnItsRankOnly) {
  ParallelSpec spec;
  spec.precision = Precision::kFp16;
  spec.overflow_steps = {3, 5};
  spec.overflow_rank = 1;
  EchoLoss inner;
  int64_t step = 0;
  EXPECT_EQ(overflow_loss(spec, 0, inner, step), nullptr);
  std::unique_ptr<nn::Loss> loss = overflow_loss(spec, 1, inner, step);
  ASSERT_NE(loss, nullptr);
  for (step = 0; step < 7; ++step) {
    const float g = loss->backward(0.5f).data<float>()[0];
    if (step == 3 || step == 5)
      EXPECT_TRUE(std::isinf(g)) << step;
    else
      EXPECT_EQ(g, 0.5f) << step;
  }
  spec.precision = Precision::kBf16;
  EXPECT_EQ(overflow_loss(spec, 1, inner, step), nullptr);
}

TEST(FaultInjection, SlowRankOutsideTheTrainingRanksIsRefused) {
  ParallelSpec spec;
  spec.slow_rank = 3;
  Layout plain;
  plain.world = plain.dp = 3;
  try {
    compose(spec, plain, false);
    ADD_FAILURE() << "debug.slow_rank = 3 of 3 ranks passed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("debug.slow_rank"), std::string::npos) << e.what();
  }
  Layout ps;
  ps.world = 4;
  ps.servers = 1;
  ps.dp = 3;
  spec.slow_rank = 3;  // the server
  EXPECT_THROW(compose(spec, ps, false), InvalidArgument);
  spec.slow_rank = 2;
  EXPECT_NO_THROW(compose(spec, ps, false));
}

}  // namespace
}  // namespace tessel::parallel
