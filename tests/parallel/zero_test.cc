// ZeRO (zero.stage 0-3) equals single-worker training: fashion_mlp, fashion_cnn and char_gpt
// (their example configs, shortened) after 20 steps on 2, 3 and 4 ranks, with SGD and AdamW,
// clipping and accumulation; deterministic mode gives one worker's bits at every stage and
// worker count, across checkpoint round trips between stages, world sizes and layouts. The
// memory each rank holds follows the stage, measured from its allocations, and a memory limit
// fails naming the category. Ranks that run different blocks get an error naming them.
// zero.shard_size (shard groups with all-reduces across them) equals one worker too, keeps the
// deterministic bits, moves checkpoints and holds what ZeRO over one group holds.
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

using testing::det_config;
using testing::example;
using testing::max_rel_diff;
using testing::train_on;

// Every stage on 2, 3 and 4 ranks against one worker, for the optimizer settings given.
void expect_stages_match_single(const std::string& name, const std::vector<std::string>& keys) {
  const train::Config base = example(name, keys);
  const data::Splits data = data::make_datasets(base.data);
  const auto single = train_on(base, 1, {}, &data);
  ASSERT_EQ(single.summary["steps"], 20);
  for (int stage = 0; stage <= 3; ++stage)
    for (int w : {2, 3, 4}) {
      train::Config cfg = base;
      cfg.parallel.zero_stage = stage;
      const auto multi = train_on(cfg, w, {}, &data);
      EXPECT_LT(max_rel_diff(single.params, multi.params), 1e-5)
          << name << " zero.stage " << stage << " on " << w << " ranks";
      EXPECT_EQ(multi.summary["zero_stage"], stage);
    }
}

TEST(Zero, FashionMlpSgdClipAccumulate) {
  expect_stages_match_single("fashion_mlp", {"train.batch=24", "train.accumulate=2",
                                             "train.clip_norm=0.5", "model.hidden=[64,32]"});
}

TEST(Zero, FashionMlpAdamW) {
  expect_stages_match_single("fashion_mlp", {"train.batch=24", "optim.kind=adamw", "optim.lr=0.001",
                                             "train.clip_norm=1", "model.hidden=[64,32]"});
}

TEST(Zero, FashionCnnSgdClipAccumulate) {
  // A constant lr of 0.002: at the example's 0.05 the first steps are chaotic enough that
  // summing the same gradients in another order moves the weights by 1e-4 after 20 steps (the
  // old binary too), and so does 0.01 once the example's cosine schedule spans its 10 epochs
  // rather than the 20 steps train.max_steps keeps.
  expect_stages_match_single("fashion_cnn",
                             {"train.batch=24", "train.accumulate=2", "train.clip_norm=0.5",
                              "model.channels=[4,8]", "schedule.kind=constant", "optim.lr=0.002"});
}

TEST(Zero, CharGptAdamWClipAccumulate) {
  expect_stages_match_single(
      "char_gpt", {"train.batch=12", "train.accumulate=2", "data.context=16", "model.embed=32"});
}

TEST(Zero, DeterministicBitsAtEveryStageAndWorkerCount) {
  const std::string ref = train_on(det_config(), 1).summary["params_sha256"];
  for (int stage = 0; stage <= 3; ++stage)
    for (int w = 1; w <= 6; ++w) {
      train::Config cfg = det_config();
      cfg.parallel.zero_stage = stage;
      EXPECT_EQ(train_on(cfg, w).summary["params_sha256"], ref)
          << "zero.stage " << stage << " on " << w << " workers";
    }
}

struct Leg {
  int workers;
  std::vector<std::string> keys;
};

// Deterministic legs, each resuming the one before after 5 steps (the last runs to 20): the
// bits of the uninterrupted run.
void expect_legs_end_uninterrupted(const std::string& name, const std::vector<Leg>& legs) {
  const std::string ref = train_on(det_config(), 1).summary["params_sha256"];
  train::RunOptions opts;
  opts.run_dir = testing::test_run_dir(name);
  nlohmann::json last;
  for (size_t i = 0; i < legs.size(); ++i) {
    opts.stop_after = i + 1 < legs.size() ? 5 : 0;
    opts.resume = i == 0 ? "" : opts.run_dir;
    last = train_on(det_config(legs[i].keys), legs[i].workers, opts).summary;
  }
  EXPECT_EQ(last["steps"], 20);
  EXPECT_EQ(last["params_sha256"], ref);
}

TEST(Zero, CheckpointsMoveBetweenStagesWorldSizesAndLayouts) {
  // Stage 3 on 4 ranks -> stage 0 on 1 -> stage 2 on 3 -> dp 2 x pp 2.
  expect_legs_end_uninterrupted("zero_roundtrip", {{4, {"zero.stage=3"}},
                                                   {1, {"zero.stage=0"}},
                                                   {3, {"zero.stage=2"}},
                                                   {4, {"zero.stage=1", "pp.stages=2"}}});
}

// Model-state bytes (parameters, gradients, optimizer state) of rank 0 after training.
double model_state_bytes(const nlohmann::json& summary) {
  const auto& b = summary["ranks"]["per_rank"][0]["memory"]["bytes"];
  return b["parameters"].get<double>() + b["gradients"].get<double>() +
         b["optimizer_state"].get<double>();
}

TEST(Zero, MemoryPerRankFollowsTheStage) {
  // AdamW, fp32, 4 ranks: 16 bytes per parameter at stage 0, 8 + 8/N at 1, 4 + 12/N at 2 and
  // 16/N at 3 (plus the gathered units, counted as communication buffers), measured from the
  // allocations. ZeRO-1 in shared memory holds the parameters once per host: 4/N + 4 + 8/N.
  const train::Config base =
      example("char_gpt", {"train.batch=8", "data.context=16", "model.embed=64", "model.layers=4",
                           "train.max_steps=2", "ddp.shared_memory=false"});
  const data::Splits data = data::make_datasets(base.data);
  const double N = 4, per_param[] = {16, 8 + 8 / N, 4 + 12 / N, 16 / N, 4 / N + 4 + 8 / N};
  for (int k = 0; k <= 4; ++k) {
    train::Config cfg = base;
    cfg.parallel.zero_stage = std::min(k, 3);
    cfg.parallel.shared_memory = k == 4;
    if (k == 4) cfg.parallel.zero_stage = 1;
    const auto run = train_on(cfg, 4, {}, &data);
    const double n = run.summary["num_parameters"].get<double>();
    EXPECT_NEAR(model_state_bytes(run.summary) / (per_param[k] * n), 1.0, 0.1)
        << "zero.stage " << cfg.parallel.zero_stage << (k == 4 ? " in shared memory" : "");
  }
}

TEST(Zero, MemoryLimitFailsNamingTheCategoryAndStageThreeFits) {
  // A limit between what a rank needs at stage 3 and at stage 0 (both measured first): stage 0
  // fails at start naming the category, stage 3 trains.
  const train::Config base =
      example("char_gpt", {"train.batch=8", "data.context=16", "model.embed=128", "model.layers=4",
                           "train.max_steps=2"});
  const data::Splits data = data::make_datasets(base.data);
  auto peak = [&](int stage) {
    train::Config cfg = base;
    cfg.parallel.zero_stage = stage;
    const auto run = train_on(cfg, 4, {}, &data);
    return run.summary["ranks"]["per_rank"][0]["memory"]["peak_total_bytes"].get<double>();
  };
  const double p3 = peak(3), p0 = peak(0);
  ASSERT_LT(p3, 0.8 * p0);
  train::Config cfg = base;
  cfg.parallel.memory_limit_mb = static_cast<int64_t>((p3 + p0) / 2 / (1 << 20)) + 1;
  try {
    train_on(cfg, 4, {}, &data);
    FAIL() << "stage 0 fit in " << cfg.parallel.memory_limit_mb << " MiB";
  } catch (const MemoryLimitError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("runtime.memory_limit_mb"), std::string::npos) << what;
    EXPECT_NE(what.find("zero.stage"), std::string::npos) << what;
    EXPECT_NE(what.find("optimizer_state"), std::string::npos) << what;
  }
  cfg.parallel.zero_stage = 3;
  EXPECT_EQ(train_on(cfg, 4, {}, &data).summary["steps"], 2);
}

TEST(Zero, RanksRunningOtherBlocksFailNamingThem) {
  // Two ranks at stage 3: after a first step together, rank 1 runs an extra forward. Its
  // gather meets rank 0's next collective: an error, not a hang, naming the unit's blocks.
  const train::Config cfg = det_config({"train.deterministic=false", "zero.stage=3"});
  nn::ModelSpec spec = cfg.model;
  spec.input_shape = {12};
  spec.num_classes = 4;
  try {
    comm::run_threads(2, [&](comm::Communicator& c) {
      auto model = nn::build_model(spec);
      parallel::Engine engine(cfg.parallel, cfg.optim, c, std::move(model), 1);
      engine.start();
      const parallel::Piece piece{Tensor::zeros({4, 12}), Tensor::zeros({4}, DType::kI32),
                                  nn::Context{true, 1, 0, 0}, 0.5, true};
      for (int step = 0; step < 2; ++step) {
        engine.train_piece(piece);
        if (step == 1 && c.rank() == 1) engine.train_piece(piece);
        engine.step(0.1f, 0, step);
      }
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("blocks fc"), std::string::npos) << what;
  }
}

// ---- zero.shard_size: hierarchical sharding ----

TEST(Zero, ShardGroupsEqualSingleWorker) {
  // 4 ranks as 2 shard groups of 2 at stages 1-3 (stage 3 also with the progress thread and
  // prefetch, and as the dp groups of a dp 4 x pp 2 pipeline): one worker's parameters after 20
  // steps; the shards' all-reduces across the groups are counted apart from the bytes inside a
  // group.
  const std::vector<std::string> base = {"train.batch=24",      "train.accumulate=2",
                                         "optim.kind=adamw",    "optim.lr=0.001",
                                         "train.clip_norm=0.5", "model.hidden=[64,32]"};
  const data::Splits data = data::make_datasets(example("fashion_mlp", base).data);
  const auto single = train_on(example("fashion_mlp", base), 1, {}, &data);
  const std::vector<Leg> legs = {{4, {"zero.stage=1"}},
                                 {4, {"zero.stage=2"}},
                                 {4, {"zero.stage=3"}},
                                 {4, {"zero.stage=3", "ddp.overlap=on"}},
                                 {8, {"zero.stage=3", "pp.stages=2"}}};
  for (const Leg& leg : legs) {
    std::vector<std::string> keys = base;
    keys.push_back("zero.shard_size=2");
    keys.insert(keys.end(), leg.keys.begin(), leg.keys.end());
    const auto multi = train_on(example("fashion_mlp", keys), leg.workers, {}, &data);
    const std::string what = leg.keys.back() + ", 2 groups of 2";
    EXPECT_LT(max_rel_diff(single.params, multi.params), 1e-5) << what;
    EXPECT_EQ(multi.summary["layout"], leg.workers == 8 ? "dp=4 pp=2 shard=2" : "dp=4 shard=2")
        << what;
    EXPECT_EQ(multi.summary["engine"]["shard_group"], 2) << what;
    EXPECT_EQ(multi.summary["engine"]["replica_groups"], 2) << what;
    EXPECT_EQ(multi.summary["ranks"]["zero_shard_size"], 2) << what;
    for (const auto& r : multi.summary["ranks"]["per_rank"]) {
      const double across = r["comm_bytes_across_groups"], all = r["comm_bytes"];
      EXPECT_GT(across, 0) << what;
      EXPECT_LT(across, all) << what;
    }
  }
}

TEST(Zero, ShardGroupsKeepDeterministicBits) {
  // The exact sum runs over the whole dp group: 2 groups of 2 at every stage, 3 of 2 and 2 of
  // 3, and a pipeline's dp groups (dp 4 x pp 2) give one worker's bits; with tensor
  // parallelism (dp 4 x tp 2), tp 2's. ZeRO-3 in a pipeline (also without groups) trains on
  // after each epoch's evaluation, whose gathered units it holds until training resumes.
  const std::string ref = train_on(det_config(), 1).summary["params_sha256"];
  std::vector<Leg> cases = {{6, {"zero.stage=3", "zero.shard_size=3"}},
                            {6, {"zero.stage=2", "zero.shard_size=2"}},
                            {8, {"zero.stage=2", "zero.shard_size=2", "pp.stages=2"}},
                            {8, {"zero.stage=3", "zero.shard_size=2", "pp.stages=2"}},
                            {4, {"zero.stage=3", "pp.stages=2"}}};
  for (int stage = 1; stage <= 3; ++stage)
    cases.push_back({4, {"zero.stage=" + std::to_string(stage), "zero.shard_size=2"}});
  for (const Leg& c : cases)
    EXPECT_EQ(train_on(det_config(c.keys), c.workers).summary["params_sha256"], ref)
        << c.keys[0] << " " << c.keys[1] << " " << c.keys.back() << " on " << c.workers
        << " workers";
  // Tensor parallelism has its own bits (its cut sums), the same for any dp group.
  const std::string tp = train_on(det_config({"tp.size=2"}), 2).summary["params_sha256"];
  EXPECT_EQ(train_on(det_config({"tp.size=2", "zero.stage=3", "zero.shard_size=2"}), 8)
                .summary["params_sha256"],
            tp)
      << "dp 4 x tp 2, zero.stage 3 in 2 groups of 2";
}

TEST(Zero, ShardGroupCheckpointsMoveToOtherLayouts) {
  // Only the first group writes its shards: 2 groups of 2 (stage 3) -> stage 2 on 3 ranks ->
  // 3 groups of 2 (stage 1).
  expect_legs_end_uninterrupted("zero_groups_roundtrip",
                                {{4, {"zero.stage=3", "zero.shard_size=2"}},
                                 {3, {"zero.stage=2"}},
                                 {6, {"zero.stage=1", "zero.shard_size=2"}}});
}

TEST(Zero, ShardGroupsHoldWhatZeroThreeOverTheGroupHolds) {
  // Stage 3 on 4 ranks in 2 groups of 2 holds per rank the model state of stage 3 on 2 ranks
  // (16/2 bytes per parameter), measured from the ranks' allocations.
  const train::Config base =
      example("char_gpt", {"train.batch=8", "data.context=16", "model.embed=64", "model.layers=4",
                           "train.max_steps=2", "zero.stage=3"});
  const data::Splits data = data::make_datasets(base.data);
  train::Config grouped = base;
  grouped.parallel.zero_shard_size = 2;
  const auto two = train_on(base, 2, {}, &data), groups = train_on(grouped, 4, {}, &data);
  const double n = two.summary["num_parameters"].get<double>();
  EXPECT_NEAR(model_state_bytes(groups.summary) / model_state_bytes(two.summary), 1.0, 0.01);
  EXPECT_NEAR(model_state_bytes(groups.summary) / (16.0 / 2 * n), 1.0, 0.1);
}

TEST(Zero, ShardSizeThatCannotRunFailsNamingTheKeys) {
  auto error = [](int stage, int k, int world, const std::string& kind = "none") {
    parallel::ParallelSpec spec;
    spec.zero_stage = stage;
    spec.zero_shard_size = k;
    spec.compress.kind = *value_of<parallel::CompressKind>(kind);
    try {
      parallel::compose(spec, parallel::Layout::resolve(spec, world), false);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto expect = [](const std::string& what, const std::string& part) {
    EXPECT_NE(what.find("zero.shard_size = "), std::string::npos) << what;
    EXPECT_NE(what.find(part), std::string::npos) << what;
  };
  expect(error(3, 3, 4), "does not divide the dp size 4");
  expect(error(3, 8, 4), "does not divide the dp size 4");
  expect(error(0, 2, 4), "set zero.stage = 1, 2 or 3");
  expect(error(2, 1, 4), "plain data parallelism");
  expect(error(2, -2, 4), "must be >= 0");
  expect(error(2, 2, 4, "int8"), "compress.kind = int8");
  EXPECT_EQ(error(2, 2, 4), "no error");
  const parallel::ParallelSpec whole;  // zero.shard_size = 0: the whole dp group
  EXPECT_EQ(parallel::Layout::resolve(whole, 4).shard, 4);
  // The same through a config, at start.
  train::Config cfg = det_config({"zero.stage=3", "zero.shard_size=3"});
  EXPECT_THROW(train_on(cfg, 4), InvalidArgument);
}

}  // namespace
}  // namespace tessel
