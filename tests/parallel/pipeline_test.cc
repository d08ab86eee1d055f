// Pipeline parallelism equals sequential training: pp = 2 and 4 and dp 2 x pp 2 (ranks as
// threads) end within 1e-5 of one rank after 20 steps for an MLP, a CNN and a GPT whose tied
// LM head sits on another stage than its embedding; deterministic mode gives the same bits;
// interleaved 1F1B and zb-h1 (backwards split into B and W) equal 1f1b and one rank; 1f1b holds
// fewer activations than gpipe, zb-h1 on its first stage as few as 1f1b. The schedules
// themselves: pipeline_schedule_test; bad layouts and partitions: pipeline_layout_test.
#include "tessel/parallel/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "pipeline_testing.h"
#include "tessel/comm/threads.h"
#include "tessel/nn/models.h"
#include "tessel/optim/optimizer.h"
#include "tessel/parallel/engine.h"
#include "tessel/train/trainer.h"
#include "train_on.h"

namespace tessel {
namespace {

// Tiny [1, 8, 8] images whose class is the brightest quadrant: learnable by a small CNN.
class Quadrants final : public data::Dataset {
 public:
  explicit Quadrants(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  std::string name() const override { return "quadrants"; }
  int64_t size() const override { return n_; }
  Shape input_shape() const override { return {1, 8, 8}; }
  DType input_dtype() const override { return DType::kF32; }
  Shape label_shape() const override { return {}; }
  int64_t num_classes() const override { return 4; }
  void get(int64_t index, void* x, int32_t* y) const override {
    float* p = static_cast<float*>(x);
    uint64_t h =
        (seed_ + static_cast<uint64_t>(index)) * 6364136223846793005ull + 1442695040888963407ull;
    const int label = static_cast<int>((h >> 33) % 4);
    for (int i = 0; i < 64; ++i) {
      h = h * 6364136223846793005ull + 1442695040888963407ull;
      const int quadrant = (i / 8 >= 4) * 2 + (i % 8 >= 4);
      p[i] = static_cast<float>((h >> 40) % 1000) / 1000.0f + (quadrant == label ? 0.5f : 0.0f);
    }
    *y = label;
  }

 private:
  int64_t n_;
  uint64_t seed_;
};

// The CNN trains on a small synthetic image set (quadrants), the others on their config's data.
testing::RunResult train_on(const train::Config& cfg, int workers, train::RunOptions opts = {}) {
  data::Splits images;
  if (cfg.model.kind != nn::ModelKind::kCnn) return testing::train_on(cfg, workers, opts);
  images.train = std::make_shared<Quadrants>(320, 1);
  images.test = std::make_shared<Quadrants>(64, 2);
  return testing::train_on(cfg, workers, opts, &images);
}

using testing::config_for;
using testing::max_rel_diff;
using testing::RunResult;

void expect_matches_single(const std::string& model) {
  const RunResult single = train_on(config_for(model), 1);
  ASSERT_EQ(single.summary["steps"], 20);
  struct Case {
    int workers;
    std::vector<std::string> keys;
    std::string layout;
  };
  const std::vector<Case> cases = {
      {2, {"pp.stages=2", "pp.microbatches=4", "pp.schedule=1f1b"}, "pp=2"},
      {2,
       {"pp.stages=2", "pp.microbatches=2", "pp.schedule=gpipe", "pp.partition=round_robin"},
       "pp=2"},
      {4,
       {"pp.stages=4", "pp.microbatches=4", "pp.schedule=gpipe", "pp.partition=uniform"},
       "pp=4"},
      {4, {"pp.stages=4", "pp.microbatches=8", "pp.schedule=1f1b"}, "pp=4"},
      {4, {"pp.stages=2", "pp.microbatches=2", "pp.schedule=1f1b"}, "dp=2 pp=2"}};
  for (const Case& c : cases) {
    const RunResult multi = train_on(config_for(model, c.keys), c.workers);
    ASSERT_EQ(multi.params.size(), single.params.size());
    EXPECT_LT(max_rel_diff(single.params, multi.params), 1e-5) << model << " " << c.layout;
    EXPECT_EQ(multi.summary["layout"], c.layout);
    EXPECT_EQ(multi.summary["steps"], 20);
    EXPECT_NEAR(multi.summary["train_loss"].get<double>(),
                single.summary["train_loss"].get<double>(), 1e-4)
        << model << " " << c.layout;
    EXPECT_NEAR(multi.summary["test_accuracy"].get<double>(),
                single.summary["test_accuracy"].get<double>(), 0.02);
    const auto& stages = multi.summary["ranks"]["pipeline_stages"];
    ASSERT_EQ(stages.size(), static_cast<size_t>(c.workers));
    for (const auto& s : stages) EXPECT_GT(s["forward_seconds"].get<double>(), 0);
    // Every stage sends (activations forward, or gradients back), so every rank's bytes count it.
    for (const auto& r : multi.summary["ranks"]["per_rank"])
      EXPECT_GT(r["comm_bytes"].get<double>(), 0) << r.dump();
  }
}

TEST(Pipeline, MlpMatchesSingleRank) { expect_matches_single("mlp"); }
TEST(Pipeline, CnnMatchesSingleRank) { expect_matches_single("cnn"); }
TEST(Pipeline, GptMatchesSingleRank) { expect_matches_single("gpt"); }

// Trains `model` with `keys` (the model's and the layout's) beside one rank and beside 1f1b
// with the same p and m, then with `schedule` (its keys): within 1e-5 of one rank after 20
// steps (bf16 rounds differently on one rank than across stages, 2.4e-3 measured: 1f1b in
// bf16 is the reference there), and the same train_loss as 1f1b to 1e-5.
void expect_schedule_matches(const std::string& model, int workers,
                             const std::vector<std::string>& keys,
                             const std::vector<std::string>& schedule) {
  std::vector<std::string> model_keys;  // what the single rank runs too
  for (const std::string& k : keys)
    if (k.rfind("model.", 0) == 0 || k.rfind("train.precision", 0) == 0) model_keys.push_back(k);
  const RunResult single = train_on(config_for(model, model_keys), 1);
  std::vector<std::string> all = keys;
  all.push_back("pp.schedule=1f1b");
  const RunResult ofob = train_on(config_for(model, all), workers);
  all.pop_back();
  all.insert(all.end(), schedule.begin(), schedule.end());
  const RunResult run = train_on(config_for(model, all), workers);
  const std::string what =
      model + " " + run.summary["layout"].get<std::string>() + " " + keys.back();
  const bool bf16 = !model_keys.empty() && model_keys.back() == "train.precision=bf16";
  EXPECT_LT(max_rel_diff(single.params, run.params), bf16 ? 1e-2 : 1e-5) << what;
  EXPECT_LT(max_rel_diff(ofob.params, run.params), 1e-5) << what;
  EXPECT_NEAR(run.summary["train_loss"].get<double>(), ofob.summary["train_loss"].get<double>(),
              1e-5)
      << what;
  EXPECT_EQ(run.summary["steps"], 20);
  EXPECT_EQ("pp.schedule=" + run.summary["ranks"]["pipeline_schedule"].get<std::string>(),
            schedule.front());
}

// Interleaved 1F1B (v chunks per stage) at p = 2 and 4, m = 4 and 8, beside dp with ZeRO, tp,
// full recompute and bf16.
TEST(Pipeline, InterleavedMatchesSingleRankAndOneFOneB) {
  struct Case {
    std::string model;
    int workers, v;
    std::vector<std::string> keys;  // the model's and the layout's
  };
  const std::string deep_mlp = "model.hidden=[32,16,16]", deep_gpt = "model.layers=6";
  const std::vector<Case> cases = {
      {"mlp", 2, 2, {"pp.stages=2", "pp.microbatches=4"}},
      {"mlp", 2, 3, {"pp.stages=2", "pp.microbatches=8"}},
      {"mlp", 4, 2, {deep_mlp, "pp.stages=4", "pp.microbatches=8", "pp.partition=uniform"}},
      {"mlp", 4, 2, {"pp.stages=2", "pp.microbatches=2", "zero.stage=2"}},  // dp 2 x pp 2
      {"gpt", 2, 2, {"pp.stages=2", "pp.microbatches=4", "train.precision=bf16"}},
      {"gpt", 4, 2, {deep_gpt, "pp.stages=4", "pp.microbatches=4", "train.recompute=full"}},
      {"gpt", 4, 2, {"pp.stages=2", "pp.microbatches=4", "tp.size=2"}}};  // tp 2 x pp 2
  for (const Case& c : cases)
    expect_schedule_matches(
        c.model, c.workers, c.keys,
        {"pp.schedule=interleaved", "pp.virtual_stages=" + std::to_string(c.v)});
}

// ZB-H1 at p = 2 and 4, m = 4 and 8, beside dp with ZeRO-2, tp (with and without sequence
// parallelism), selective recompute and bf16.
TEST(Pipeline, ZbH1MatchesSingleRankAndOneFOneB) {
  struct Case {
    std::string model;
    int workers;
    std::vector<std::string> keys;  // the model's and the layout's
  };
  const std::vector<Case> cases = {
      {"mlp", 2, {"pp.stages=2", "pp.microbatches=4"}},
      {"mlp", 4, {"model.hidden=[32,16,16]", "pp.stages=4", "pp.microbatches=8"}},
      {"mlp", 4, {"pp.stages=2", "pp.microbatches=2", "zero.stage=2"}},  // dp 2 x pp 2
      {"gpt", 2, {"pp.stages=2", "pp.microbatches=8", "train.precision=bf16"}},
      {"gpt", 4, {"pp.stages=4", "pp.microbatches=4", "train.recompute=selective"}},
      {"gpt", 4, {"pp.stages=2", "pp.microbatches=4", "tp.size=2"}},  // tp 2 x pp 2
      {"gpt", 4, {"pp.stages=2", "pp.microbatches=4", "tp.size=2", "tp.sequence_parallel=true"}}};
  for (const Case& c : cases)
    expect_schedule_matches(c.model, c.workers, c.keys, {"pp.schedule=zb-h1"});
}

TEST(Pipeline, AccumulationAndShortBatchesMatchSingleRank) {
  // Two pieces per step, and 130 training samples in batches of 24: the last batch has 10 rows
  // (5 per replica), which 4 micro-batches cannot divide, so it is cut unevenly.
  const std::vector<std::string> base = {"train.accumulate=2", "data.samples=163",
                                         "train.max_steps=0", "train.epochs=2"};
  const RunResult single = train_on(config_for("mlp", base), 1);
  for (int workers : {2, 4}) {
    std::vector<std::string> keys = base;
    keys.insert(keys.end(), {"pp.stages=2", "pp.microbatches=4"});
    if (workers == 4) keys.back() = "pp.microbatches=2";
    const RunResult multi = train_on(config_for("mlp", keys), workers);
    EXPECT_EQ(multi.summary["steps"], single.summary["steps"]);
    EXPECT_LT(max_rel_diff(single.params, multi.params), 1e-5) << workers << " workers";
  }
}

TEST(Pipeline, TiedTableStaysEqualOnBothStages) {
  // The GPT's embedding (stage 0) and LM head (stage 1) share the token table: after training
  // the head's stage holds the same table as the embedding's.
  const train::Config cfg = config_for("gpt", {"pp.stages=2", "pp.microbatches=2"});
  std::vector<std::vector<float>> table(2);
  const RunResult run = testing::train_on(cfg, 2, {}, nullptr, [&](train::Trainer& t) {
    const nn::Parameter& wte = *t.model().parameters()[0];
    ASSERT_EQ(wte.name, "embed.wte");
    table[static_cast<size_t>(t.engine().rank())].assign(
        wte.value.data<float>(), wte.value.data<float>() + wte.value.numel());
  });
  ASSERT_EQ(table[0].size(), table[1].size());
  const data::Splits data = data::make_datasets(cfg.data);
  nn::ModelSpec spec = cfg.model;
  spec.input_shape = data.train->input_shape();
  spec.num_classes = data.train->num_classes();
  auto fresh = nn::build_model(spec);
  fresh->materialize(cfg.seed);
  const float* init = fresh->values().data<float>() + fresh->offset(0);
  double differ = 0, moved = 0;
  for (size_t i = 0; i < table[0].size(); ++i) {
    differ = std::max(differ, std::fabs(double(table[0][i]) - table[1][i]));
    moved = std::max(moved, std::fabs(double(table[1][i]) - init[i]));
  }
  EXPECT_EQ(differ, 0.0);
  EXPECT_GT(moved, 1e-4);  // the head's copy was updated, not left at its initial value
}

TEST(Pipeline, DeterministicModeIsBitIdentical) {
  // Small buckets (one per block) and one bucket spanning every stage, whose quantisation
  // scale the stages must agree on.
  for (const char* bucket : {"ddp.bucket_mb=0.001", "ddp.bucket_mb=1"})
    for (const char* model : {"mlp", "gpt"}) {
      const std::vector<std::string> det = {"train.deterministic=true", "ddp.micro_shard=4", bucket,
                                            "train.drop_last=true"};
      const RunResult single = train_on(config_for(model, det), 1);
      std::vector<std::string> pp = det;
      pp.push_back("pp.stages=2");
      const RunResult two = train_on(config_for(model, pp), 2);
      EXPECT_EQ(two.summary["params_sha256"], single.summary["params_sha256"]) << model;
      pp.back() = "pp.stages=4";
      pp.push_back("pp.partition=uniform");
      const RunResult four = train_on(config_for(model, pp), 4);
      EXPECT_EQ(four.summary["params_sha256"], single.summary["params_sha256"]) << model;
      pp = det;
      pp.push_back("pp.stages=2");  // 4 ranks: dp 2 x pp 2
      const RunResult grid = train_on(config_for(model, pp), 4);
      EXPECT_EQ(grid.summary["layout"], "dp=2 pp=2");
      EXPECT_EQ(grid.summary["params_sha256"], single.summary["params_sha256"]) << model;
      pp.insert(pp.end(), {"pp.schedule=interleaved", "pp.virtual_stages=2"});
      const RunResult inter = train_on(config_for(model, pp), 2);
      EXPECT_EQ(inter.summary["params_sha256"], single.summary["params_sha256"]) << model;
      pp.resize(pp.size() - 2);
      pp.push_back("pp.schedule=zb-h1");
      const RunResult zb = train_on(config_for(model, pp), 2);
      EXPECT_EQ(zb.summary["params_sha256"], single.summary["params_sha256"]) << model;
    }
}

TEST(Pipeline, ResumedRunMatchesUninterrupted) {
  // Every stage writes its parameters and AdamW state into the checkpoint.
  const train::Config cfg =
      config_for("mlp", {"pp.stages=2", "pp.microbatches=2", "optim.kind=adamw", "optim.lr=0.003"});
  const RunResult whole = train_on(cfg, 4);
  train::RunOptions first;
  first.run_dir = testing::test_run_dir("pp_resume");
  first.stop_after = 9;
  const RunResult part = train_on(cfg, 4, first);
  EXPECT_EQ(part.summary["steps"], 9);
  train::RunOptions second;
  second.resume = first.run_dir;
  const RunResult resumed = train_on(cfg, 4, second);
  EXPECT_EQ(resumed.summary["steps"], 20);
  EXPECT_EQ(resumed.summary["params_sha256"], whole.summary["params_sha256"]);
}

TEST(Pipeline, OneFOneBHoldsLessActivationMemoryThanGpipe) {
  // P = 4, m = 8: gpipe keeps all 8 micro-batches of a stage in flight, 1f1b at most 4 - s,
  // zb-h1 4 until their W -- but after B only what W reads, so that its first stage, where
  // each W follows its B, holds what 1f1b's does: B drops the block's output before it copies
  // the output gradient W reads (with the output still held: 5/4 of 1f1b's peak, one more
  // micro-batch's share, 1920 against 1536 B for mlp, 5120 against 4096 B for gpt).
  auto peak = [](const char* model, const char* schedule) {
    const RunResult r =
        train_on(config_for(model, {"pp.stages=4", "pp.microbatches=8",
                                    std::string("pp.schedule=") + schedule, "train.max_steps=3"}),
                 4);
    return r.summary["ranks"]["pipeline_stages"];
  };
  const auto gpipe = peak("mlp", "gpipe"), ofob = peak("mlp", "1f1b");
  for (int s = 0; s < 4; ++s) {
    EXPECT_LT(ofob[s]["peak_activation_bytes"].get<double>(),
              gpipe[s]["peak_activation_bytes"].get<double>())
        << "stage " << s;
    EXPECT_EQ(gpipe[s]["peak_inflight_microbatches"], 8);
    EXPECT_EQ(ofob[s]["peak_inflight_microbatches"], 4 - s);
  }
  for (const char* model : {"mlp", "gpt"}) {
    const auto zb = peak(model, "zb-h1"), base = peak(model, "1f1b");
    for (int s = 0; s < 4; ++s) EXPECT_EQ(zb[s]["peak_inflight_microbatches"], 4);
    EXPECT_LE(zb[0]["peak_activation_bytes"].get<double>(),
              base[0]["peak_activation_bytes"].get<double>())
        << model;
  }
}

// The test evaluation at an epoch's end (here: the step budget's end inside the epoch) runs
// after the executor dropped training's caches: each rank's peak is training's, the same as
// the run's without a test set (without the release it is the caches plus the evaluation's
// forward). The local executor (pp.stages = 1) and a pipeline's stages alike; the evaluation's
// working set is charged to `other`, not to the activations.
TEST(Pipeline, EvaluationPeaksBelowTraining) {
  for (const int stages : {1, 2}) {
    SCOPED_TRACE(str("pp.stages = ", stages));
    const std::vector<std::string> pp = {str("pp.stages=", stages), "pp.microbatches=2",
                                         "train.max_steps=4", "model.dropout=0"};
    auto with = [&](const char* test_fraction) {
      std::vector<std::string> o = pp;
      o.push_back(str("data.test_fraction=", test_fraction));
      const RunResult r = train_on(config_for("mlp", o), stages);
      return r.summary["ranks"]["per_rank"];
    };
    const auto evaluated = with("0.2"), alone = with("0");
    for (int s = 0; s < stages; ++s) {
      const auto &m = evaluated[s]["memory"], &a = alone[s]["memory"];
      auto peak = [](const nlohmann::json& mem, const char* category) {
        return mem["peak_bytes"][category].get<double>();
      };
      // Up to the pipeline's messages in flight at the peak, which vary with the ranks' timing
      // (a send's copy is dropped once it has gone): 0 or 1536 B here.
      const double comm = std::max(0.0, peak(m, "comm_buffers") - peak(a, "comm_buffers"));
      EXPECT_LE(m["peak_total_bytes"].get<double>(), a["peak_total_bytes"].get<double>() + comm)
          << "rank " << s;
      EXPECT_EQ(peak(m, "activations"), peak(a, "activations"));
      EXPECT_GT(peak(m, "other"), peak(a, "other"));  // the evaluation's working set
    }
  }
}

}  // namespace
}  // namespace tessel
