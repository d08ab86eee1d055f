// Tensor parallelism (tp.size > 1, Megatron's column/row cuts, optional sequence parallelism)
// equals single-worker training: fashion_mlp and char_gpt (their example configs, shortened)
// after 20 steps, alone and composed with data parallelism, ZeRO and pipelines; deterministic
// mode gives the same bits at every data-parallel size for a fixed tp; each block sends exactly
// the collectives Megatron's scheme needs; checkpoints move between tp sizes and layouts; bad
// layouts fail naming what to change.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tessel/train/evaluator.h"
#include "tessel/train/trainer.h"
#include "train_on.h"

namespace tessel {
namespace {

using testing::det_config;
using testing::example;
using testing::max_rel_diff;
using testing::train_on;

struct Leg {
  int workers;
  std::vector<std::string> keys;
};

// Each leg against one worker (of the keys' precision), parameters within `tol` of the largest.
void expect_match_single(const std::string& name, const std::vector<std::string>& keys,
                         const std::vector<Leg>& legs, double tol = 1e-5) {
  const train::Config base = example(name, keys);
  const data::Splits data = data::make_datasets(base.data);
  const auto single = train_on(base, 1, {}, &data);
  ASSERT_EQ(single.summary["steps"], base.train.max_steps);
  for (const Leg& leg : legs) {
    std::vector<std::string> all = keys;
    all.insert(all.end(), leg.keys.begin(), leg.keys.end());
    const auto multi = train_on(example(name, all), leg.workers, {}, &data);
    std::string what;
    for (const auto& k : leg.keys) what += k + " ";
    const double diff = max_rel_diff(single.params, multi.params);
    if (tol > 1e-5)
      std::printf("%s %son %d ranks: %.2g\n", name.c_str(), what.c_str(), leg.workers, diff);
    EXPECT_LT(diff, tol) << name << " " << what << "on " << leg.workers << " ranks";
    EXPECT_EQ(multi.summary["steps"], base.train.max_steps);
  }
}

TEST(TensorParallel, CharGptMatchesOneWorker) {
  expect_match_single("char_gpt",
                      {"train.batch=12", "train.accumulate=2", "data.context=16", "model.embed=32"},
                      {{2, {"tp.size=2"}},
                       {4, {"tp.size=4"}},
                       {2, {"tp.size=2", "tp.sequence_parallel=true"}},
                       {4, {"tp.size=4", "tp.sequence_parallel=true"}},
                       {4, {"tp.size=2", "zero.stage=1"}},
                       {4, {"tp.size=2", "zero.stage=2", "tp.sequence_parallel=true"}},
                       {4, {"tp.size=2", "zero.stage=3"}},
                       {4, {"tp.size=2", "pp.stages=2"}},
                       {8, {"tp.size=2", "pp.stages=2", "tp.sequence_parallel=true"}}});
}

TEST(TensorParallel, FashionMlpMatchesOneWorker) {
  expect_match_single("fashion_mlp",
                      {"train.batch=24", "train.clip_norm=0.5", "model.hidden=[64,32]"},
                      {{2, {"tp.size=2"}},
                       {4, {"tp.size=4"}},
                       {4, {"tp.size=2", "zero.stage=1"}},
                       {6, {"tp.size=2", "zero.stage=3"}}});
}

// 16-bit cuts (activations and their collectives in the precision's type, f32 accumulation)
// against one worker of that precision after 8 steps, within the composition walk's tolerances
// (bf16 5e-2, fp16 2e-3; measured: char_gpt bf16 5.5e-4, fp16 2e-4, fashion_mlp bf16 0.024);
// sequence parallelism and ZeRO over the dp axis too.
TEST(TensorParallel, SixteenBitMatchesOneWorkerOfItsPrecision) {
  const std::vector<std::string> gpt = {"train.batch=12", "data.context=16", "model.embed=32",
                                        "train.max_steps=8"};
  std::vector<std::string> bf16 = gpt, fp16 = gpt;
  bf16.push_back("train.precision=bf16");
  fp16.push_back("train.precision=fp16");
  expect_match_single(
      "char_gpt", bf16,
      {{2, {"tp.size=2"}}, {4, {"tp.size=2", "zero.stage=1", "tp.sequence_parallel=true"}}}, 5e-2);
  expect_match_single("char_gpt", fp16, {{2, {"tp.size=2", "tp.sequence_parallel=true"}}}, 2e-3);
  expect_match_single(
      "fashion_mlp",
      {"train.batch=24", "model.hidden=[64,32]", "train.precision=bf16", "train.max_steps=8"},
      {{4, {"tp.size=2", "zero.stage=2"}}}, 5e-2);
}

// fp16's overflow check spans the tp group: an inf on one rank of tp 2 x dp 2 skips the step on
// every rank (plain SGD: 4 steps with step 3 skipped end where 3 clean steps end, bit for bit).
TEST(TensorParallel, Fp16OverflowOnOneRankSkipsTheStepOnEveryRank) {
  const std::vector<std::string> keys = {
      "train.batch=24",   "model.hidden=[64,32]",   "train.precision=fp16",   "tp.size=2",
      "optim.momentum=0", "schedule.kind=constant", "schedule.warmup_steps=0"};
  std::vector<std::string> clean = keys, injected = keys;
  clean.push_back("train.max_steps=3");
  for (const char* k : {"train.max_steps=4", "debug.overflow_steps=[3]", "debug.overflow_rank=1"})
    injected.push_back(k);
  const auto a = train_on(example("fashion_mlp", clean), 4);
  const auto b = train_on(example("fashion_mlp", injected), 4);
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(b.summary["skipped_steps"], 1);
}

// calls of `op` in `where` of a block's (or "outside"'s) counters; 0 when absent.
int64_t calls(const nlohmann::json& counters, const std::string& block, const std::string& where,
              const std::string& op) {
  const auto b = counters.find(block);
  if (b == counters.end() || !b->contains(where) || !(*b)[where].contains(op)) return 0;
  return (*b)[where][op]["calls"].get<int64_t>();
}

// Per step: a transformer block's 2 all-reduces in forward (after attention and after the MLP)
// and 2 in backward (before qkv and before the MLP's first layer); the loss's 3 all-reduces
// (max, target logit, sum of exponentials); nothing else in a block.
TEST(TensorParallel, EachBlockSendsMegatronsCollectives) {
  const int steps = 4;
  const std::vector<std::string> keys = {"train.batch=8",     "data.context=16", "model.embed=32",
                                         "train.max_steps=4", "train.epochs=1",  "tp.size=2"};
  const auto run = train_on(example("char_gpt", keys), 2);
  const nlohmann::json& c = run.summary["tensor_parallel"];
  for (const std::string block : {"block0", "block1"}) {
    EXPECT_EQ(calls(c, block, "forward", "all_reduce"), 2 * steps) << c.dump();
    EXPECT_EQ(calls(c, block, "backward", "all_reduce"), 2 * steps) << c.dump();
    EXPECT_EQ(c[block]["forward"].size(), 1u) << c.dump();
    EXPECT_EQ(c[block]["backward"].size(), 1u) << c.dump();
    // Each carries the whole [B, T, C] activation: 8 x 16 x 32 floats.
    EXPECT_EQ(c[block]["forward"]["all_reduce"]["bytes"].get<double>(),
              2.0 * steps * 8 * 16 * 32 * 4);
  }
  EXPECT_EQ(calls(c, "outside", "forward", "all_reduce"), 3 * steps) << c.dump();
  EXPECT_EQ(c["outside"]["forward"]["all_reduce"]["bytes"].get<double>(), 3.0 * steps * 8 * 16 * 4);
  EXPECT_EQ(calls(c, "embed", "forward", "all_reduce"), steps);  // the vocab-parallel lookup
  EXPECT_EQ(calls(c, "head", "backward", "all_reduce"), steps);  // the head's input gradient
}

// In bf16 the activations' all-reduces carry 16-bit values: half the bytes of f32's; the
// loss's row statistics stay f32.
TEST(TensorParallel, Bf16CollectivesCarryHalfTheBytes) {
  const int steps = 2;
  const std::vector<std::string> keys = {"train.batch=8",       "data.context=16", "model.embed=32",
                                         "train.max_steps=2",   "train.epochs=1",  "tp.size=2",
                                         "train.precision=bf16"};
  const nlohmann::json c = train_on(example("char_gpt", keys), 2).summary["tensor_parallel"];
  EXPECT_EQ(c["block0"]["forward"]["all_reduce"]["bytes"].get<double>(),
            2.0 * steps * 8 * 16 * 32 * 2);
  EXPECT_EQ(c["block0"]["backward"]["all_reduce"]["bytes"].get<double>(),
            2.0 * steps * 8 * 16 * 32 * 2);
  EXPECT_EQ(c["outside"]["forward"]["all_reduce"]["bytes"].get<double>(), 3.0 * steps * 8 * 16 * 4);
}

// With sequence parallelism each all-reduce becomes an all-gather and a reduce-scatter: per
// block 2 all-gathers and 2 reduce-scatters in forward, 2 reduce-scatters and 2 all-gathers in
// backward, plus 2 all-gathers in backward that gather the column-cut layers' inputs again
// (kept 1/t per rank); the step sums the whole parameters' gradients once.
TEST(TensorParallel, SequenceParallelTradesEachAllReduceForGatherAndScatter) {
  const int steps = 4;
  const std::vector<std::string> keys = {
      "train.batch=8",  "data.context=16", "model.embed=32",           "train.max_steps=4",
      "train.epochs=1", "tp.size=2",       "tp.sequence_parallel=true"};
  const auto run = train_on(example("char_gpt", keys), 2);
  const nlohmann::json& c = run.summary["tensor_parallel"];
  for (const std::string block : {"block0", "block1"}) {
    EXPECT_EQ(calls(c, block, "forward", "all_gather"), 2 * steps) << c.dump();
    EXPECT_EQ(calls(c, block, "forward", "reduce_scatter"), 2 * steps) << c.dump();
    EXPECT_EQ(calls(c, block, "backward", "all_gather"), 4 * steps) << c.dump();
    EXPECT_EQ(calls(c, block, "backward", "reduce_scatter"), 2 * steps) << c.dump();
    EXPECT_EQ(calls(c, block, "forward", "all_reduce") + calls(c, block, "backward", "all_reduce"),
              0);
  }
  EXPECT_EQ(calls(c, "outside", "forward", "all_reduce"), 3 * steps) << c.dump();
  EXPECT_EQ(calls(c, "outside", "step", "all_reduce"), steps) << c.dump();
}

double peak_activation_bytes(const nlohmann::json& summary) {
  return summary["ranks"]["per_rank"][0]["memory"]["peak_bytes"]["activations"].get<double>();
}

// A rank of tp = 2 with sequence parallelism keeps half the activations of one worker (within
// 15%), measured from the allocations.
TEST(TensorParallel, SequenceParallelHalvesActivationMemory) {
  const std::vector<std::string> keys = {"train.max_steps=3", "train.epochs=1"};
  const data::Splits data = data::make_datasets(example("char_gpt", keys).data);
  const double one =
      peak_activation_bytes(train_on(example("char_gpt", keys), 1, {}, &data).summary);
  std::vector<std::string> sp = keys;
  sp.insert(sp.end(), {"tp.size=2", "tp.sequence_parallel=true"});
  const double half =
      peak_activation_bytes(train_on(example("char_gpt", sp), 2, {}, &data).summary);
  EXPECT_NEAR(half / one, 0.5, 0.5 * 0.15) << "one worker " << one << " bytes, tp=2 " << half;
}

// For a fixed tp (and pp), the bits do not depend on the data-parallel size or ZeRO stage.
TEST(TensorParallel, DeterministicBitsAtEveryDataParallelSize) {
  for (int tp : {2, 4}) {
    const std::string t = "tp.size=" + std::to_string(tp);
    const std::string ref = train_on(det_config({t}), tp).summary["params_sha256"];
    for (int dp : {2, 3})
      for (int stage : {0, 2}) {
        const auto s = train_on(det_config({t, "zero.stage=" + std::to_string(stage)}), tp * dp);
        EXPECT_EQ(s.summary["params_sha256"], ref) << t << " dp " << dp << " stage " << stage;
      }
  }
  // bf16 too (the bits differ between tp sizes, as in f32).
  const auto bf16 = det_config({"tp.size=2", "train.precision=bf16"});
  EXPECT_EQ(train_on(bf16, 4).summary["params_sha256"], train_on(bf16, 2).summary["params_sha256"]);
  const std::string pp =
      train_on(det_config({"tp.size=2", "pp.stages=2"}), 4).summary["params_sha256"];
  EXPECT_EQ(train_on(det_config({"tp.size=2", "pp.stages=2"}), 8).summary["params_sha256"], pp);
}

// A tp = 4 checkpoint evaluates on one worker (the whole model) and resumes on dp 2 x tp 2;
// the result is one worker's uninterrupted run.
TEST(TensorParallel, CheckpointsAreLayoutFree) {
  const std::vector<std::string> keys = {"train.batch=12", "data.context=16", "model.embed=32"};
  const train::Config base = example("char_gpt", keys);
  const data::Splits data = data::make_datasets(base.data);
  const auto single = train_on(base, 1, {}, &data);
  train::RunOptions opts;
  opts.run_dir = testing::test_run_dir("tp_roundtrip");
  opts.stop_after = 10;
  std::vector<std::string> tp4 = keys, tp2 = keys;
  tp4.push_back("tp.size=4");
  tp2.push_back("tp.size=2");
  train_on(example("char_gpt", tp4), 4, opts, &data);
  train::Evaluator one(base, opts.run_dir);
  const train::EvalResult e = one.evaluate(*one.datasets().test);
  EXPECT_TRUE(std::isfinite(e.loss) && e.loss > 0 && e.loss < 5) << e.loss;
  train::RunOptions half = opts;
  half.stop_after = 0;
  half.resume = opts.run_dir;
  const auto resumed = train_on(example("char_gpt", tp2), 4, half, &data);
  EXPECT_EQ(resumed.summary["steps"], 20);
  EXPECT_LT(max_rel_diff(single.params, resumed.params), 1e-5);
}

// Bad layouts fail at start naming the key and a value that works.
void expect_fails(const std::string& name, int workers, const std::vector<std::string>& keys,
                  const std::vector<std::string>& words) {
  try {
    train_on(example(name, keys), workers);
    ADD_FAILURE() << name << " on " << workers << " ranks trained";
  } catch (const Error& e) {
    for (const std::string& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what() << " lacks " << w;
  }
}

TEST(TensorParallel, BadLayoutsNameTheKeyAndAValidValue) {
  expect_fails("char_gpt", 3, {"tp.size=3"}, {"model.heads = 4", "tp.size", "multiple of 3"});
  expect_fails("fashion_mlp", 4, {"tp.size=4", "model.hidden=[30,64]"},
               {"model.hidden[0] = 30", "tp.size = 4"});
  expect_fails("char_gpt", 3, {"tp.size=2"}, {"tp.size = 2", "multiple of 2", "e.g. 4"});
  expect_fails("char_gpt", 2, {"tp.size=2", "tp.sequence_parallel=true", "data.context=15"},
               {"data.context", "multiple of 2"});
  expect_fails("char_gpt", 1, {"tp.sequence_parallel=true"}, {"tp.size > 1"});
  expect_fails("fashion_cnn", 2, {"tp.size=2"}, {"tp.size"});
}

}  // namespace
}  // namespace tessel
