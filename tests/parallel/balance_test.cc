// ddp.balance (tessel/parallel/balance.h): the deal follows the measured speeds (at least one
// micro-shard each, smoothed, with hysteresis so that noise moves nothing) and its report says
// how much of a straggler's cost it recovers; static deals once
// after its warm-up; the state survives a checkpoint; layouts it cannot deal are refused
// naming the key. Training with a slow rank (debug.slow_factor) and ddp.balance = dynamic gives
// one worker's bits on 2-6 ranks as threads while the deal moves shards to the fast ranks, and a
// resumed run deals as the checkpoint says; a straggler appearing mid-run is absorbed within 20
// steps; without train.deterministic rows are dealt and the parameters match an even split's
// within rounding.
#include "tessel/parallel/balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "tessel/core/error.h"
#include "tessel/train/progress.h"
#include "tessel/train/summary_text.h"
#include "train_on.h"

namespace tessel::parallel {
namespace {

using testing::det_config;
using testing::train_on;

std::vector<int64_t> deal_after(ShardDeal& deal, const std::vector<double>& times, int steps) {
  for (int i = 0; i < steps; ++i) deal.update(times);
  return deal.counts();
}

TEST(ShardDeal, StartsEvenLikeTheLoaderSlices) {
  ShardDeal deal(BalanceMode::kDynamic, 3, 10);
  EXPECT_EQ(deal.counts(), (std::vector<int64_t>{3, 3, 4}));
  EXPECT_EQ(deal.first(0), 0);
  EXPECT_EQ(deal.first(2), 6);
  EXPECT_EQ(deal.str(), "3/3/4");
  EXPECT_TRUE(deal.measuring());
  EXPECT_FALSE(ShardDeal(BalanceMode::kOff, 2, 4).measuring());
}

TEST(ShardDeal, DealsInProportionToSpeedWithAFloorOfOne) {
  ShardDeal deal(BalanceMode::kDynamic, 2, 12);
  EXPECT_EQ(deal_after(deal, {1.0, 2.0}, 5), (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(deal.changes(), 1);
  EXPECT_NEAR(deal.even_s() / deal.predicted_s(), 12.0 / 8.0, 1e-9);
  ShardDeal floor(BalanceMode::kDynamic, 3, 12);  // a rank 100x slower keeps one shard
  EXPECT_EQ(deal_after(floor, {1.0, 1.0, 100.0}, 5), (std::vector<int64_t>{6, 5, 1}));
}

TEST(ShardDeal, FollowsASlowdownWithinAFewStepsAndIgnoresNoise) {
  ShardDeal deal(BalanceMode::kDynamic, 2, 16);
  // +-3% noise around equal speeds: no deal predicts a step 10% shorter.
  for (int i = 0; i < 50; ++i) deal.update({i % 2 ? 1.03 : 0.97, i % 2 ? 0.97 : 1.03});
  EXPECT_EQ(deal.counts(), (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(deal.changes(), 0);
  for (int i = 0; i < 10; ++i)  // rank 1 descheduled for one step in five: nothing moves
    deal.update({1.0, i % 5 == 0 ? 10.0 : 1.0});
  EXPECT_EQ(deal.changes(), 0);
  int steps = 0;
  while (deal.counts()[1] > 6 && steps < 100) deal.update({1.0, 2.0}), ++steps;
  EXPECT_EQ(steps, ShardDeal::kWindow / 2 + 1) << "rank 1 slowed to half speed";
  deal_after(deal, {1.0, 2.0}, 30);
  EXPECT_EQ(deal.counts(), (std::vector<int64_t>{11, 5}));  // 11 x 1 vs 5 x 2: the best split
  const int64_t changes = deal.changes();
  deal_after(deal, {1.0, 2.0}, 30);
  EXPECT_EQ(deal.changes(), changes) << "settled: no oscillation";
}

// Rank 1 at half speed, 32 shards: an even deal takes 16 x 2 = 32, the ideal split 32 / 1.5 =
// 21.33, the deal 22/10 takes 22: it recovers (32 - 22) / (32 - 21.33) of the straggler's cost.
TEST(ShardDeal, ReportSaysHowMuchOfTheStragglersCostTheDealRecovers) {
  ShardDeal deal(BalanceMode::kDynamic, 2, 32);
  EXPECT_EQ(train::balance_text(train::balance_report(deal)), "deal 16/16");
  deal_after(deal, {1.0, 2.0}, 5);
  const nlohmann::json report = train::balance_report(deal);
  EXPECT_NEAR(deal.ideal_s(), 32 / 1.5, 1e-9);
  ASSERT_FALSE(report["straggler"].is_null()) << report;
  EXPECT_EQ(report["straggler"]["rank"], 1);
  EXPECT_NEAR(report["straggler"]["recovered"].get<double>(), 10 / (32 - 32 / 1.5), 1e-9);
  EXPECT_EQ(train::balance_text(report),
            "deal 22/10 straggler rank 1 (x2.00 per shard) absorbed: 94% of its cost recovered, "
            "x1.45 vs an even deal");
  ShardDeal equal(BalanceMode::kDynamic, 2, 32);
  deal_after(equal, {1.0, 1.1}, 5);  // within kStragglerSlowdown: no straggler named
  EXPECT_TRUE(train::balance_report(equal)["straggler"].is_null());
}

TEST(ShardDeal, StaticDealsOnceAfterTheWarmUp) {
  ShardDeal deal(BalanceMode::kStatic, 2, 12);
  deal_after(deal, {1.0, 2.0}, ShardDeal::kWarmupSteps - 1);
  EXPECT_EQ(deal.counts(), (std::vector<int64_t>{6, 6}));
  EXPECT_TRUE(deal.update({1.0, 2.0}));
  EXPECT_EQ(deal.counts(), (std::vector<int64_t>{8, 4}));
  EXPECT_FALSE(deal.measuring());
  EXPECT_FALSE(deal.update({2.0, 1.0}));
  EXPECT_EQ(deal.counts(), (std::vector<int64_t>{8, 4}));
}

TEST(ShardDeal, StateRoundTripsAndAnotherLayoutsIsRefused) {
  ShardDeal deal(BalanceMode::kDynamic, 2, 12);
  deal_after(deal, {1.0, 3.0}, 5);
  ShardDeal back(BalanceMode::kDynamic, 2, 12);
  ASSERT_TRUE(back.load(deal.save()));
  EXPECT_EQ(back.counts(), deal.counts());
  EXPECT_EQ(back.seconds_per_shard(), deal.seconds_per_shard());
  EXPECT_EQ(back.save(), deal.save());
  ShardDeal three(BalanceMode::kDynamic, 3, 12), fixed(BalanceMode::kStatic, 2, 12);
  EXPECT_FALSE(three.load(deal.save()));
  EXPECT_FALSE(fixed.load(deal.save()));
  EXPECT_EQ(three.counts(), (std::vector<int64_t>{4, 4, 4}));
}

TEST(ShardDeal, LayoutsWithoutDealableShardsAreRefusedNamingTheKey) {
  auto refused = [](const std::vector<std::string>& keys, int workers, const std::string& why) {
    std::vector<std::string> all = {"ddp.balance=dynamic"};
    all.insert(all.end(), keys.begin(), keys.end());
    try {
      train_on(det_config(all), workers);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("ddp.balance"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused({"train.deterministic=false", "train.batch=2"}, 3, "raise train.batch");  // rows < ranks
  refused({"zero.stage=3"}, 2, "zero.stage = 3");
  refused({"pp.stages=2"}, 2, "pp.stages");
  refused({"ddp.micro_shard=40"}, 4, "lower ddp.micro_shard");  // 3 shards for 4 ranks
}

// debug.slow_factor = 4 on rank 1: the deal moves shards to the others, and the bits stay one
// worker's on every rank count (5 too: 60 micro-shards per batch dealt unevenly), at zero.stage
// 1 and 2 too, and with a static deal.
TEST(Balance, DynamicKeepsOneWorkersBitsAndShiftsWorkFromTheSlowRank) {
  const std::string ref = train_on(det_config(), 1).summary["params_sha256"];
  for (int w : {2, 3, 4, 5, 6}) {
    const auto run = train_on(
        det_config({"ddp.balance=dynamic", "debug.slow_rank=1", "debug.slow_factor=4"}), w);
    EXPECT_EQ(run.summary["params_sha256"], ref) << w << " workers";
    const nlohmann::json& b = run.summary["balance"];
    ASSERT_EQ(b["shards_per_rank"].size(), static_cast<size_t>(w)) << b;
    EXPECT_LT(b["shards_per_rank"][1], b["shards_per_rank"][0]) << w << " workers: " << b;
    EXPECT_GT(b["speedup_vs_even"].get<double>(), 1.0) << b;
  }
  const auto fixed =
      train_on(det_config({"ddp.balance=static", "debug.slow_rank=0", "debug.slow_factor=4"}), 2);
  EXPECT_EQ(fixed.summary["params_sha256"], ref);
  EXPECT_LT(fixed.summary["balance"]["shards_per_rank"][0],
            fixed.summary["balance"]["shards_per_rank"][1]);
}

// A straggler that appears mid-run (debug.slow_from_step): metrics.jsonl's deal moves shards
// off rank 1 within 20 steps of its slowdown (the median of 5 steps flips after 3), with one
// worker's bits all the same.
TEST(Balance, AStragglerAppearingMidRunIsAbsorbedWithinTwentySteps) {
  const std::vector<std::string> run = {"train.max_steps=34", "train.log_every=1"};
  const std::string ref = train_on(det_config(run), 1).summary["params_sha256"];
  std::vector<std::string> slow = run;
  slow.insert(slow.end(), {"ddp.balance=dynamic", "debug.slow_rank=1", "debug.slow_factor=4",
                           "debug.slow_from_step=12"});
  train::RunOptions opts;
  opts.run_dir = testing::test_run_dir("balance_mid_run");
  EXPECT_EQ(train_on(det_config(slow), 2, opts).summary["params_sha256"], ref);
  std::ifstream in(opts.run_dir + "/metrics.jsonl");
  std::vector<int64_t> before;  // the deal after step 12, the last one at full speed
  int64_t absorbed_at = -1;     // the first record whose deal moved shards off rank 1
  for (std::string line; std::getline(in, line) && absorbed_at < 0;) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r.value("type", "") != "train") continue;
    const auto deal = r["shards_per_rank"].get<std::vector<int64_t>>();
    const int64_t step = r["step"].get<int64_t>();
    if (step == 12) before = deal;
    if (step > 12 && !before.empty() && deal[1] < before[1] && deal[1] < deal[0])
      absorbed_at = step;
  }
  ASSERT_EQ(before.size(), 2u) << "no record of step 12 in " << opts.run_dir;
  ASSERT_GT(absorbed_at, 12) << "the deal never moved shards off the slowed rank";
  EXPECT_LE(absorbed_at - 12, 20);
}

// Without train.deterministic the deal is of rows, each rank's loss gradient weighted by its
// rows: the same parameters as an even split (the all-reduce sums in another order) while
// rows move from the slow rank to the fast ones.
TEST(Balance, RowDealTrainsLikeAnEvenSplitAndShiftsRowsFromTheSlowRank) {
  const std::vector<std::string> nondet = {"train.deterministic=false", "train.log_every=1"};
  std::vector<std::string> slow = nondet;
  slow.insert(slow.end(), {"ddp.balance=dynamic", "debug.slow_rank=1", "debug.slow_factor=4"});
  for (int w : {2, 3}) {
    const auto even = train_on(det_config(nondet), w);
    const auto dealt = train_on(det_config(slow), w);
    ASSERT_EQ(even.params.size(), dealt.params.size());
    double diff = 0;
    for (size_t i = 0; i < even.params.size(); ++i)
      diff = std::max(diff, std::fabs(double(even.params[i]) - dealt.params[i]));
    EXPECT_LT(diff, 1e-5) << w << " workers";
    const nlohmann::json& b = dealt.summary["balance"];
    ASSERT_EQ(b["shards_per_rank"].size(), static_cast<size_t>(w)) << b;
    EXPECT_EQ(b["micro_shards"], 120) << b;  // a shard is a row
    EXPECT_LT(b["shards_per_rank"][1], b["shards_per_rank"][0]) << w << " workers: " << b;
    EXPECT_GT(b["changes"].get<int64_t>(), 0) << b;
  }
}

// A static deal is fixed after its warm-up: a run resumed after it deals what the checkpoint
// holds (an even deal, were it lost), with the uninterrupted run's bits.
TEST(Balance, ResumedRunDealsAsCheckpointed) {
  const train::Config cfg = det_config(
      {"ddp.balance=static", "debug.slow_rank=1", "debug.slow_factor=4", "train.log_every=1"});
  const std::string whole = train_on(cfg, 2).summary["params_sha256"];
  train::RunOptions first;
  first.run_dir = testing::test_run_dir("balance_resume");
  first.stop_after = 12;
  train_on(cfg, 2, first);
  std::ifstream in(first.run_dir + "/checkpoints/step-000012/trainer.json");
  ASSERT_TRUE(in) << "no checkpoint at step 12";
  const nlohmann::json saved = nlohmann::json::parse(in)["balance"];
  ASSERT_NE(saved["shards_per_rank"], nlohmann::json({30, 30})) << saved;
  train::RunOptions rest;
  rest.run_dir = first.run_dir;
  rest.resume = first.run_dir;
  const auto resumed = train_on(cfg, 2, rest);
  EXPECT_EQ(resumed.summary["params_sha256"], whole);
  EXPECT_EQ(resumed.summary["balance"]["shards_per_rank"], saved["shards_per_rank"]);
}

}  // namespace
}  // namespace tessel::parallel
