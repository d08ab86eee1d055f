// Data parallel equals single-worker training: N ranks as threads on the same global batches
// end within 1e-5 of one rank after 20 steps; deterministic mode gives the same bits for every
// worker count; accumulation equals the larger batch; diverged parameters are an error.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tessel/comm/threads.h"
#include "tessel/parallel/data_parallel.h"
#include "tessel/train/trainer.h"
#include "train_on.h"

namespace tessel {
namespace {

train::Config small_config(const std::string& model, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"data.kind=synthetic", "data.samples=600", "data.features=12",
                                "data.classes=4", "data.test_fraction=0.2", "train.batch=24",
                                "train.max_steps=20", "train.prefetch=0", "optim.lr=0.1",
                                "model.hidden=[32,16]", "checkpoint.every_epochs=0",
                                "model.kind=" + model};
  o.insert(o.end(), extra.begin(), extra.end());
  return train::parse_config("", "dp_test", o);
}

// Rank 0's parameters and summary after training `cfg` on `workers` thread ranks.
std::pair<std::vector<float>, nlohmann::json> train_on(const train::Config& cfg, int workers,
                                                       train::RunOptions opts = {}) {
  testing::RunResult r = testing::train_on(cfg, workers, opts);
  return {r.params, r.summary};
}

using testing::max_rel_diff;

TEST(DataParallel, MatchesSingleRankAfterTwentySteps) {
  // Dropout and momentum: the masks and the optimizer state must not depend on the split.
  // Overlapped all-reduce; sharded step in shared memory; sharded step by messages.
  for (const char* shared : {"ddp.shared_memory=true", "ddp.shared_memory=false"})
  for (const char* overlap : {"ddp.overlap=on", "ddp.overlap=off"}) {
  if (std::string(overlap) == "ddp.overlap=on" && std::string(shared) == "ddp.shared_memory=false")
    continue;
  train::Config cfg =
      small_config("mlp", {"model.dropout=0.2", "ddp.bucket_mb=0.001", overlap, shared});
  auto [single, s1] = train_on(cfg, 1);
  EXPECT_EQ(s1["steps"], 20);
  for (int w : {2, 3, 4}) {
    auto [multi, sw] = train_on(cfg, w);
    ASSERT_EQ(multi.size(), single.size());
    EXPECT_LT(max_rel_diff(single, multi), 1e-5) << w << " workers";
    EXPECT_EQ(sw["world_size"], w);
    EXPECT_EQ(sw["layout"], "dp=" + std::to_string(w));
    EXPECT_GT(sw["ranks"]["buckets"].get<int>(), 1);  // several buckets
    EXPECT_EQ(sw["ranks"]["overlap"].get<bool>(), std::string(overlap) == "ddp.overlap=on");
    EXPECT_EQ(sw["ranks"]["shared_memory"].get<bool>(),
              std::string(overlap) == "ddp.overlap=off" &&
                  std::string(shared) == "ddp.shared_memory=true");
    EXPECT_NEAR(sw["test_accuracy"].get<double>(), s1["test_accuracy"].get<double>(), 0.02);
  }
  }
}

TEST(DataParallel, ShardedStepWithClippingAdamWAndResumeOnAnotherWorkerCount) {
  // Without overlap each rank updates its shard: clipping needs the global norm, AdamW's state
  // of the other shards is stale until consolidated for the checkpoint.
  train::Config cfg = small_config("mlp", {"optim.kind=adamw", "optim.lr=0.01",
                                           "train.clip_norm=0.05", "ddp.overlap=off"});
  auto [single, s1] = train_on(cfg, 1);
  auto [multi, s3] = train_on(cfg, 3);
  EXPECT_LT(max_rel_diff(single, multi), 1e-5);
  // Shared memory: each rank reads its shard of the 2 other ranks' gradients a step.
  const double arena_bytes = 4.0 * static_cast<double>(single.size());
  EXPECT_TRUE(s3["ranks"]["shared_memory"].get<bool>());
  EXPECT_NEAR(s3["ranks"]["allreduce_bytes_per_rank"].get<double>() / 20, arena_bytes * 2 / 3,
              4.0 * 16 * 3);  // shard bounds fall on 64-byte lines
  // Messages: one gradient's bytes a step, same trajectory.
  train::Config by_messages = cfg;
  by_messages.parallel.shared_memory = false;
  auto [multi_m, s3m] = train_on(by_messages, 3);
  EXPECT_LT(max_rel_diff(single, multi_m), 1e-5);
  EXPECT_FALSE(s3m["ranks"]["shared_memory"].get<bool>());
  EXPECT_NEAR(s3m["ranks"]["allreduce_bytes_per_rank"].get<double>() / 20, arena_bytes, 1.0);
  // Stop after 7 steps on 3 ranks, resume on 2: still the single-rank trajectory.
  train::RunOptions first;
  first.run_dir = ::testing::TempDir() + "/dp_test_resume";
  first.stop_after = 7;
  train_on(cfg, 3, first);
  train::RunOptions second;
  second.run_dir = first.run_dir;
  second.resume = first.run_dir;
  auto [resumed, s2] = train_on(cfg, 2, second);
  EXPECT_EQ(s2["steps"], 20);
  EXPECT_LT(max_rel_diff(single, resumed), 1e-5);
}

TEST(DataParallel, UnevenSlicesAndShortLastBatch) {
  // 120 training samples in batches of 7: slices of 2 and 3 rows, and a last batch of one row,
  // which leaves two of three ranks with nothing but the reduction to take part in.
  train::Config cfg = small_config("mlp", {"data.samples=150", "train.batch=7",
                                           "train.max_steps=0", "train.epochs=1"});
  auto [single, s1] = train_on(cfg, 1);
  auto [multi, s3] = train_on(cfg, 3);
  EXPECT_LT(max_rel_diff(single, multi), 1e-5);
  EXPECT_EQ(s1["steps"], 18);
  EXPECT_EQ(s3["steps"], 18);
}

TEST(DataParallel, DeterministicModeIsBitIdenticalForEveryWorkerCount) {
  train::Config cfg = small_config("mlp", {"train.deterministic=true", "ddp.micro_shard=2",
                                           "model.dropout=0.1", "train.clip_norm=0.5"});
  auto [ref, s1] = train_on(cfg, 1);
  for (int w : {2, 3, 4, 6}) {
    auto [p, s] = train_on(cfg, w);
    EXPECT_EQ(s["params_sha256"], s1["params_sha256"]) << w << " workers";
  }
  // Run after run as well.
  EXPECT_EQ(train_on(cfg, 2).second["params_sha256"], s1["params_sha256"]);
}

TEST(DataParallel, DeterministicModeRejectsUnevenShards) {
  train::Config cfg = small_config("mlp", {"train.deterministic=true", "ddp.micro_shard=6"});
  // 24 / 6 = 4 shards cannot be shared by 3 workers.
  EXPECT_THROW(train_on(cfg, 3), InvalidArgument);
}

TEST(DataParallel, AccumulationEqualsTheLargerBatch) {
  auto [big, s1] = train_on(small_config("mlp", {"train.batch=24", "train.max_steps=10"}), 1);
  auto [acc, s2] = train_on(
      small_config("mlp", {"train.batch=12", "train.accumulate=2", "train.max_steps=10"}), 2);
  EXPECT_EQ(s2["steps"], 10);
  EXPECT_LT(max_rel_diff(big, acc), 1e-5);
}

TEST(DataParallel, DivergedParametersAreAnError) {
  train::Config cfg = small_config("mlp");
  nn::ModelSpec spec = cfg.model;
  spec.input_shape = {12};
  spec.num_classes = 4;
  try {
    comm::run_threads(3, [&](comm::Communicator& c) {
      auto model = nn::build_model(spec, c.rank() == 2 ? 99 : 1);  // rank 2 has another seed
      parallel::DataParallel dp(cfg.parallel, &c, *model);
      dp.on_start();
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 2 differ from rank 0"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tessel
