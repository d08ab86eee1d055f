// Data parallel equals single-worker training: N ranks as threads on the same global batches
// end within 1e-5 of one rank after 20 steps (all-reduced buckets with and without overlap,
// ZeRO-1 in shared memory and by messages); deterministic mode gives the same bits for every
// worker count; accumulation equals the larger batch; diverged parameters are an error.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tessel/comm/threads.h"
#include "tessel/nn/models.h"
#include "tessel/parallel/engine.h"
#include "tessel/train/trainer.h"
#include "train_on.h"

namespace tessel {
namespace {

train::Config small_config(const std::string& model, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {
      "data.kind=synthetic",  "data.samples=600",          "data.features=12",
      "data.classes=4",       "data.test_fraction=0.2",    "train.batch=24",
      "train.max_steps=20",   "train.prefetch=0",          "optim.lr=0.1",
      "model.hidden=[32,16]", "checkpoint.every_epochs=0", "model.kind=" + model};
  o.insert(o.end(), extra.begin(), extra.end());
  return train::parse_config("", "dp_test", o);
}

using testing::max_rel_diff;
using testing::train_on;

double comm_bytes(const nlohmann::json& summary) {
  return summary["ranks"]["per_rank"][0]["comm_bytes"].get<double>();
}

TEST(DataParallel, MatchesSingleRankAfterTwentySteps) {
  // Dropout and momentum: the masks and the optimizer state must not depend on the split.
  // All-reduced buckets on the progress thread and on the compute thread, or summed in shared
  // memory; ZeRO-1 in shared memory and by reduce-scatter + all-gather messages.
  const std::vector<std::pair<std::string, std::vector<std::string>>> variants = {
      {"allreduce", {"zero.stage=0", "ddp.overlap=on"}},
      {"allreduce", {"zero.stage=0", "ddp.overlap=off", "ddp.shared_memory=false"}},
      {"shared_memory", {"zero.stage=0", "ddp.overlap=off"}},
      {"shared_memory", {"zero.stage=1", "ddp.shared_memory=true"}},
      {"reduce_scatter", {"zero.stage=1", "ddp.shared_memory=false", "ddp.overlap=on"}}};
  for (const auto& [sync, v] : variants) {
    std::vector<std::string> keys = {"model.dropout=0.2", "ddp.bucket_mb=0.001"};
    keys.insert(keys.end(), v.begin(), v.end());
    const train::Config cfg = small_config("mlp", keys);
    const auto single = train_on(cfg, 1);
    EXPECT_EQ(single.summary["steps"], 20);
    for (int w : {2, 3, 4}) {
      const auto multi = train_on(cfg, w);
      ASSERT_EQ(multi.params.size(), single.params.size());
      EXPECT_LT(max_rel_diff(single.params, multi.params), 1e-5)
          << w << " workers, " << v[0] << " " << v[1];
      EXPECT_EQ(multi.summary["engine"]["grad_sync"], sync) << v[0] << " " << v[1];
      EXPECT_EQ(multi.summary["world_size"], w);
      EXPECT_EQ(multi.summary["layout"], "dp=" + std::to_string(w));
      EXPECT_GT(comm_bytes(multi.summary), 0);
      EXPECT_NEAR(multi.summary["test_accuracy"].get<double>(),
                  single.summary["test_accuracy"].get<double>(), 0.02);
    }
  }
}

TEST(DataParallel, ZeroOneWithClippingAdamWAndResumeOnAnotherWorkerCount) {
  // Each rank updates its shards: clipping needs the global norm, AdamW's state of the other
  // shards live on other ranks and is written by them into the checkpoint.
  const train::Config cfg = small_config(
      "mlp", {"optim.kind=adamw", "optim.lr=0.01", "train.clip_norm=0.05", "zero.stage=1"});
  const auto single = train_on(cfg, 1);
  const auto multi = train_on(cfg, 3);
  EXPECT_LT(max_rel_diff(single.params, multi.params), 1e-5);
  // Shared memory: each rank reads its shards of the 2 other ranks' gradients a step.
  const double arena_bytes = 4.0 * static_cast<double>(single.params.size());
  EXPECT_NEAR(comm_bytes(multi.summary) / 20, arena_bytes * 2 / 3, 4.0 * 16 * 3 * 4);
  // Messages: a reduce-scatter and an all-gather of every bucket a step.
  train::Config by_messages = cfg;
  by_messages.parallel.shared_memory = false;
  const auto multi_m = train_on(by_messages, 3);
  EXPECT_LT(max_rel_diff(single.params, multi_m.params), 1e-5);
  EXPECT_NEAR(comm_bytes(multi_m.summary) / 20, 2 * arena_bytes, 4.0 * 64);
  // Stop after 7 steps on 3 ranks, resume on 2: still the single-rank trajectory.
  train::RunOptions first;
  first.run_dir = testing::test_run_dir("dp_test_resume");
  first.stop_after = 7;
  train_on(cfg, 3, first);
  train::RunOptions second;
  second.run_dir = first.run_dir;
  second.resume = first.run_dir;
  const auto resumed = train_on(cfg, 2, second);
  EXPECT_EQ(resumed.summary["steps"], 20);
  EXPECT_LT(max_rel_diff(single.params, resumed.params), 1e-5);
}

TEST(DataParallel, UnevenSlicesAndShortLastBatch) {
  // 120 training samples in batches of 7: slices of 2 and 3 rows, and a last batch of one row,
  // which leaves two of three ranks with nothing but the reduction to take part in.
  for (const char* stage : {"zero.stage=0", "zero.stage=1", "zero.stage=2", "zero.stage=3"}) {
    const train::Config cfg = small_config(
        "mlp", {"data.samples=150", "train.batch=7", "train.max_steps=0", "train.epochs=1", stage});
    const auto single = train_on(cfg, 1);
    const auto multi = train_on(cfg, 3);
    EXPECT_LT(max_rel_diff(single.params, multi.params), 1e-5) << stage;
    EXPECT_EQ(single.summary["steps"], 18);
    EXPECT_EQ(multi.summary["steps"], 18);
  }
}

TEST(DataParallel, DeterministicModeIsBitIdenticalForEveryWorkerCount) {
  const train::Config cfg = small_config("mlp", {"train.deterministic=true", "ddp.micro_shard=2",
                                                 "model.dropout=0.1", "train.clip_norm=0.5"});
  const auto ref = train_on(cfg, 1);
  for (int w : {2, 3, 4, 6}) {
    const auto run = train_on(cfg, w);
    EXPECT_EQ(run.summary["params_sha256"], ref.summary["params_sha256"]) << w << " workers";
  }
  // Run after run as well.
  EXPECT_EQ(train_on(cfg, 2).summary["params_sha256"], ref.summary["params_sha256"]);
}

TEST(DataParallel, DeterministicModeRejectsUnevenShards) {
  const train::Config cfg = small_config("mlp", {"train.deterministic=true", "ddp.micro_shard=6"});
  // 24 / 6 = 4 shards cannot be shared by 3 workers.
  EXPECT_THROW(train_on(cfg, 3), InvalidArgument);
}

TEST(DataParallel, AccumulationEqualsTheLargerBatch) {
  for (const char* stage : {"zero.stage=0", "zero.stage=2", "zero.stage=3"}) {
    const auto big =
        train_on(small_config("mlp", {"train.batch=24", "train.max_steps=10", stage}), 1);
    const auto acc = train_on(
        small_config("mlp", {"train.batch=12", "train.accumulate=2", "train.max_steps=10", stage}),
        2);
    EXPECT_EQ(acc.summary["steps"], 10);
    EXPECT_LT(max_rel_diff(big.params, acc.params), 1e-5) << stage;
  }
}

TEST(DataParallel, DivergedParametersAreAnError) {
  const train::Config cfg = small_config("mlp");
  nn::ModelSpec spec = cfg.model;
  spec.input_shape = {12};
  spec.num_classes = 4;
  try {
    comm::run_threads(3, [&](comm::Communicator& c) {
      auto model = nn::build_model(spec);
      parallel::Engine engine(cfg.parallel, cfg.optim, c, std::move(model), c.rank() == 2 ? 99 : 1);
      engine.start();  // rank 2 has another seed
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 2 differ from rank 0"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tessel
