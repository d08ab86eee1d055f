// Mixed precision and recompute against single-worker fp32 training (docs/mixed_precision.md,
// docs/recompute.md): bf16 and fp16 runs of char_gpt and an MLP on 1 and 3 ranks (zero.stage 0,
// 2 and 3, a pipeline) stay within stated tolerances of fp32 on one worker; deterministic mode
// keeps its bits for every worker count in bf16; bf16 with parameter servers tracks fp32 with
// them; an injected fp16 overflow skips exactly that
// step on every rank; recompute (full, selective) gives the same bits as none (one rank, ZeRO-3,
// a pipeline, tensor parallelism with and without sequence parallelism) and less activation
// memory, measured from the allocations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "tessel/parallel/engine.h"
#include "train_on.h"

namespace tessel {
namespace {

using testing::max_rel_diff;
using testing::train_on;

train::Config gpt(std::vector<std::string> extra) {
  std::vector<std::string> o = {"train.max_steps=12",   "train.prefetch=0",
                                "train.log_every=1000", "checkpoint.every_epochs=0",
                                "ddp.bucket_mb=0.05",   "train.batch=12",
                                "data.context=16",      "model.embed=32",
                                "model.layers=2",       "schedule.warmup_steps=0"};
  o.insert(o.end(), extra.begin(), extra.end());
  return train::load_config(std::string(TESSEL_SOURCE_DIR) + "/examples/char_gpt.toml", o);
}

train::Config mlp(std::vector<std::string> extra) {
  std::vector<std::string> o = {
      "data.kind=synthetic",  "data.samples=600",          "data.features=12",
      "data.classes=4",       "data.test_fraction=0.2",    "train.batch=24",
      "train.max_steps=12",   "train.prefetch=0",          "optim.lr=0.1",
      "model.hidden=[32,16]", "checkpoint.every_epochs=0", "model.kind=mlp",
      "ddp.bucket_mb=0.001"};
  o.insert(o.end(), extra.begin(), extra.end());
  return train::parse_config("", "mixed_test", o);
}

double final_loss(const nlohmann::json& summary) { return summary["test_loss"].get<double>(); }

double peak_activations(const nlohmann::json& summary) {
  return summary["ranks"]["per_rank"][0]["memory"]["peak_bytes"]["activations"].get<double>();
}

// 16-bit runs on 1 and 3 ranks against fp32 on one: parameters within `tol` of the largest
// (relative; measured 0.007 for char_gpt and 0.012 for the MLP after 12 steps), test loss
// within 2% (measured 0.3%).
void expect_tracks_fp32(const train::Config& base, const std::vector<std::string>& layouts,
                        double tol) {
  const data::Splits data = data::make_datasets(base.data);
  const auto ref = train_on(base, 1, {}, &data);
  for (const char* precision : {"bf16", "fp16"})
    for (const std::string& layout : layouts) {
      train::Config cfg = base;
      cfg.parallel.precision = *value_of<parallel::Precision>(precision);
      const int workers = layout == "one" ? 1 : 3;
      if (layout == "zero2") cfg.parallel.zero_stage = 2;
      if (layout == "zero3") cfg.parallel.zero_stage = 3;
      if (layout == "pipeline") cfg.parallel.pp_stages = 3;
      const auto run = train_on(cfg, workers, {}, &data);
      EXPECT_EQ(run.summary["steps"], ref.summary["steps"]);
      const double diff = max_rel_diff(ref.params, run.params);
      std::printf("%s %s %s: parameters %.4f, test loss %.4f of fp32's\n", base.name.c_str(),
                  precision, layout.c_str(), diff,
                  final_loss(run.summary) / final_loss(ref.summary));
      EXPECT_LT(diff, tol) << precision << " " << layout;
      EXPECT_GT(diff, 0) << precision << " " << layout << ": the same bits as fp32";
      EXPECT_NEAR(final_loss(run.summary) / final_loss(ref.summary), 1.0, 0.02)
          << precision << " " << layout;
    }
}

TEST(MixedPrecision, CharGptTracksFp32OnEveryLayout) {
  expect_tracks_fp32(gpt({}), {"one", "dp", "zero2", "zero3", "pipeline"}, 0.02);
}

TEST(MixedPrecision, MlpTracksFp32) {
  expect_tracks_fp32(mlp({"model.dropout=0.1", "optim.momentum=0.9"}), {"one", "zero3"}, 0.03);
}

TEST(MixedPrecision, Bf16WithParameterServersTracksFp32) {
  // 1 server x 2 workers, sync pushes: the workers compute in bf16 from a 16-bit copy of the
  // values they pull (f32 on the servers); against the same servers in fp32, as for data
  // parallelism above (fp16 with servers: ps_test Fp16SkipsAnOverflowingStepEverywhere).
  const train::Config base = mlp({"ps.servers=1", "model.dropout=0.1", "optim.momentum=0.9"});
  const data::Splits data = data::make_datasets(base.data);
  const auto ref = train_on(base, 3, {}, &data);
  train::Config cfg = base;
  cfg.parallel.precision = parallel::Precision::kBf16;
  const auto run = train_on(cfg, 3, {}, &data);
  const double diff = max_rel_diff(ref.params, run.params);
  std::printf("mlp bf16 ps: parameters %.4f, test loss %.4f of fp32's\n", diff,
              final_loss(run.summary) / final_loss(ref.summary));
  EXPECT_EQ(run.summary["steps"], ref.summary["steps"]);
  EXPECT_LT(diff, 0.03);
  EXPECT_GT(diff, 0) << "the same bits as fp32";
  EXPECT_NEAR(final_loss(run.summary) / final_loss(ref.summary), 1.0, 0.02);
}

TEST(MixedPrecision, DeterministicBf16IsBitIdenticalForEveryWorkerCount) {
  const train::Config cfg = gpt({"train.precision=bf16", "train.deterministic=true",
                                 "ddp.micro_shard=2", "train.max_steps=6", "train.drop_last=true"});
  const data::Splits data = data::make_datasets(cfg.data);
  const auto ref = train_on(cfg, 1, {}, &data);
  for (int w : {2, 3, 6}) {
    const auto run = train_on(cfg, w, {}, &data);
    EXPECT_EQ(run.summary["params_sha256"], ref.summary["params_sha256"]) << w << " workers";
  }
}

TEST(MixedPrecision, InjectedOverflowSkipsExactlyThatStepOnEveryRank) {
  // Plain SGD: a skipped step leaves the parameters as they were, so 4 steps with step 3
  // overflowing on rank 1 end where 3 steps without overflows end, bit for bit.
  for (const char* stage : {"zero.stage=0", "zero.stage=3"}) {
    const train::Config clean = mlp({"train.precision=fp16", "train.max_steps=3", stage});
    train::Config injected = mlp({"train.precision=fp16", "train.max_steps=4", stage,
                                  "debug.overflow_steps=[3]", "debug.overflow_rank=1"});
    const auto a = train_on(clean, 3);
    std::vector<int64_t> skipped(3, -1);
    std::vector<float> scales(3, 0);
    const auto b = train_on(injected, 3, {}, nullptr, [&](train::Trainer& t) {
      const optim::LossScaler* s = t.engine().loss_scaler();
      ASSERT_NE(s, nullptr);
      skipped[static_cast<size_t>(t.engine().rank())] = s->skipped();
      scales[static_cast<size_t>(t.engine().rank())] = s->scale();
    });
    EXPECT_EQ(a.params, b.params) << stage;
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(skipped[r], 1) << "rank " << r;
      EXPECT_EQ(scales[r], 32768.0f) << "rank " << r;
    }
    EXPECT_EQ(b.summary["skipped_steps"], 1);
    EXPECT_EQ(b.summary["loss_scale"], 32768.0);
  }
}

TEST(Recompute, SameBitsAsNoneWithLessActivationMemory) {
  for (const char* precision : {"fp32", "bf16"}) {
    const train::Config base =
        gpt({std::string("train.precision=") + precision, "train.max_steps=4", "model.layers=4"});
    const data::Splits data = data::make_datasets(base.data);
    const auto none = train_on(base, 1, {}, &data);
    for (const char* mode : {"full", "selective"}) {
      train::Config cfg = base;
      cfg.parallel.recompute = *value_of<nn::Recompute>(mode);
      const auto run = train_on(cfg, 1, {}, &data);
      EXPECT_EQ(run.summary["params_sha256"], none.summary["params_sha256"])
          << precision << " " << mode;
      EXPECT_LT(peak_activations(run.summary), 0.75 * peak_activations(none.summary))
          << precision << " " << mode;
    }
  }
}

TEST(Recompute, SameResultsUnderZeroThreePipelinesAndTensorParallelism) {
  const train::Config base = gpt({"train.max_steps=4", "model.layers=4"});
  const data::Splits data = data::make_datasets(base.data);
  const std::vector<std::vector<std::string>> layouts = {
      {"zero.stage=3"}, {"pp.stages=2"}, {"tp.size=2"}, {"tp.size=2", "tp.sequence_parallel=true"}};
  for (const std::vector<std::string>& layout : layouts) {
    std::vector<std::string> keys = {"train.max_steps=4", "model.layers=4"};
    keys.insert(keys.end(), layout.begin(), layout.end());
    train::Config cfg = gpt(keys);
    const auto none = train_on(cfg, 2, {}, &data);
    for (const char* mode : {"full", "selective"}) {
      cfg.parallel.recompute = *value_of<nn::Recompute>(mode);
      const auto run = train_on(cfg, 2, {}, &data);
      EXPECT_EQ(run.params, none.params) << layout.back() << " " << mode;
    }
  }
}

TEST(MixedPrecision, BadValuesNameTheKey) {
  EXPECT_THROW(gpt({"train.precision=fp8"}), InvalidArgument);
  EXPECT_THROW(gpt({"train.recompute=some"}), InvalidArgument);
  EXPECT_THROW(gpt({"debug.overflow_steps=[2]"}), InvalidArgument);  // not fp16
}

}  // namespace
}  // namespace tessel
