// The config-stated models under the parallel layouts: a sequential stack (read from TOML as an
// array of tables) trained with data, tensor and pipeline parallelism and ZeRO equals one worker;
// the modern GPT (examples/char_gpt_modern.toml, shortened) with tp = 2, pp = 2, their compositions
// and recompute equals one worker, and its bf16 run tracks fp32. A layer tensor parallelism
// cannot cut through is refused naming it. A stack of text layers trains to char_gpt's bits and
// matches one worker under data, pipeline and tensor parallelism.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "../parallel/train_on.h"
#include "tessel/config/config.h"

namespace tessel {
namespace {

using testing::example;
using testing::max_rel_diff;
using testing::train_on;

// Each layout of `legs` (workers, keys) against one worker on the same data, after 20 steps.
void expect_match_single(const train::Config& base,
                         const std::vector<std::pair<int, std::vector<std::string>>>& legs,
                         const std::function<train::Config(std::vector<std::string>)>& with) {
  const data::Splits data = data::make_datasets(base.data);
  const auto single = train_on(base, 1, {}, &data);
  ASSERT_EQ(single.summary["steps"], 20);
  for (const auto& [workers, keys] : legs) {
    std::string what;
    for (const auto& k : keys) what += k + " ";
    const auto multi = train_on(with(keys), workers, {}, &data);
    EXPECT_LT(max_rel_diff(single.params, multi.params), 1e-5) << what;
    EXPECT_NEAR(multi.summary["train_loss"].get<double>(),
                single.summary["train_loss"].get<double>(), 1e-4)
        << what;
  }
}

const char* kStack =
    "model.stack=[{type = \"linear\", out = 32}, {type = \"gelu\"}, {type = \"dropout\", p = "
    "0.1}, {type = \"layernorm\"}, {type = \"linear\", out = 16}, {type = \"relu\"}, "
    "{type = \"linear\"}]";

train::Config sequential(std::vector<std::string> extra) {
  std::vector<std::string> o = {"data.kind=synthetic",
                                "data.samples=600",
                                "data.features=12",
                                "data.classes=4",
                                "data.test_fraction=0.2",
                                "train.batch=24",
                                "train.max_steps=20",
                                "train.prefetch=0",
                                "optim.lr=0.1",
                                "model.kind=sequential",
                                kStack,
                                "checkpoint.every_epochs=0",
                                "ddp.bucket_mb=0.001",
                                "train.clip_norm=0.5"};
  o.insert(o.end(), extra.begin(), extra.end());
  return train::parse_config("", "seq_test", o);
}

TEST(SequentialParallel, DataZeroAndPipelineMatchOneWorker) {
  expect_match_single(sequential({}),
                      {{2, {}},
                       {3, {"zero.stage=2"}},
                       {2, {"zero.stage=3"}},
                       {2, {"pp.stages=2", "pp.microbatches=4"}},
                       {4, {"pp.stages=2", "pp.microbatches=2", "pp.schedule=1f1b"}}},
                      sequential);
}

// Linear layers cut column then row as the mlp's (a dropout inside a cut keyed by its global
// feature), the last one the row partner of an odd column-cut one.
const char* kTpStack =
    "model.stack=[{type = \"linear\", out = 32}, {type = \"gelu\"}, {type = \"dropout\", p = "
    "0.1}, {type = \"linear\", out = 16}, {type = \"layernorm\"}, {type = \"linear\", out = 8}, "
    "{type = \"relu\"}, {type = \"linear\"}]";

train::Config sequential_tp(std::vector<std::string> extra) {
  extra.insert(extra.begin(), kTpStack);
  return sequential(extra);
}

TEST(SequentialParallel, TensorParallelMatchesOneWorker) {
  expect_match_single(sequential_tp({}),
                      {{2, {"tp.size=2"}}, {4, {"tp.size=2", "zero.stage=1"}}, {4, {"tp.size=4"}}},
                      sequential_tp);
}

// A layer other than relu, gelu or dropout between a column-cut linear layer and its row
// partner is refused naming both.
TEST(SequentialParallel, TensorParallelismRefusesALayerInsideACut) {
  try {
    train_on(sequential({"tp.size=2"}), 2);
    ADD_FAILURE() << "a layernorm inside a column cut was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("model.stack[3] (layernorm) after the column-cut "
                                         "model.stack[0]"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("tp.size = 1"), std::string::npos) << e.what();
  }
}

// The example's [[model.stack]] tables read back as the same stack when printed and parsed
// again (tessel config, --resume), and a bad entry names its index.
TEST(SequentialParallel, StackReadsFromTomlTables) {
  const train::Config c = example("fashion_sequential", {});
  ASSERT_EQ(c.model.stack.size(), 10u);
  EXPECT_EQ(c.model.stack[0].type, "conv");
  EXPECT_EQ(c.model.stack[0].args,
            (std::vector<std::pair<std::string, double>>{{"channels", 16}, {"kernel", 5}}));
  const train::Config again =
      train::parse_config("", "again", {"model.stack=" + nn::stack_toml(c.model.stack)});
  EXPECT_EQ(nn::stack_toml(again.model.stack), nn::stack_toml(c.model.stack));
  for (const auto& [set, want] : std::vector<std::pair<std::string, std::string>>{
           {"model.stack=[{type = \"relu\"}, 3]", "model.stack[1] must be a table"},
           {"model.stack=[{out = 3}]", "model.stack[0] has no type"},
           {"model.stack=[{type = \"linear\", out = \"x\"}]",
            "model.stack[0].out must be a number"}}) {
    try {
      train::parse_config("", "bad", {set});
      ADD_FAILURE() << set;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

// data.task = multilabel (a CSV of 12 features and 3 label columns, each label a sign of a
// linear map of them): the sequential stack with K = 3 sigmoid outputs, its [B, 3] label
// batches dealt, sharded and sent down a pipeline, equals one worker.
train::Config multilabel(std::vector<std::string> extra) {
  const std::string path = ::testing::TempDir() + "/tessel_multilabel.csv";
  std::ofstream out(path);
  for (int f = 0; f < 12; ++f) out << "f" << f << ",";
  out << "tag_a,tag_b,tag_c\n";
  uint64_t state = 12345;
  auto uniform = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5;
  };
  for (int r = 0; r < 240; ++r) {
    double x[12], label[3] = {0, 0, 0};
    for (int f = 0; f < 12; ++f) {
      x[f] = uniform();
      for (int k = 0; k < 3; ++k) label[k] += x[f] * ((f * 7 + k * 5) % 5 - 2);
      out << x[f] << ",";
    }
    out << (label[0] > 0) << "," << (label[1] > 0) << "," << (label[2] > 0) << "\n";
  }
  extra.insert(extra.begin(),
               {"data.kind=csv", "data.path=" + path, "data.task=multilabel", "data.target=tag_*"});
  return sequential(extra);
}

TEST(MultilabelParallel, DataZeroAndPipelineMatchOneWorker) {
  expect_match_single(multilabel({}),
                      {{2, {}}, {2, {"zero.stage=2"}}, {2, {"pp.stages=2", "pp.microbatches=4"}}},
                      multilabel);
}

std::vector<std::string> modern_keys(std::vector<std::string> extra) {
  std::vector<std::string> o = {"train.batch=12", "train.accumulate=2", "data.context=16",
                                "model.embed=32"};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

train::Config modern(std::vector<std::string> extra) {
  return example("char_gpt_modern", modern_keys(std::move(extra)));
}

TEST(ModernGptParallel, LayoutsAndRecomputeMatchOneWorker) {
  expect_match_single(modern({}),
                      {{1, {"train.recompute=full"}},
                       {1, {"train.recompute=selective"}},
                       {2, {"tp.size=2"}},
                       {2, {"pp.stages=2", "pp.microbatches=2"}},
                       {2, {"tp.size=2", "tp.sequence_parallel=true"}},
                       {4, {"tp.size=2", "pp.stages=2"}},
                       {4, {"tp.size=2", "zero.stage=3"}}},
                      modern);
}

// SwiGLU's hidden width must split over the tp group: 128 units for embed 48 over 3 ranks do not.
TEST(ModernGptParallel, SwigluWidthThatDoesNotSplitIsRefused) {
  try {
    train_on(modern({"tp.size=3", "model.heads=3", "model.embed=48"}), 3);
    ADD_FAILURE() << "tp.size = 3 was accepted for 128 SwiGLU units";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("128 hidden units"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tp.size = 3"), std::string::npos) << e.what();
  }
}

// bf16 activations and GEMMs: parameters within 2% of fp32's after 20 steps, test loss within 2%.
TEST(ModernGptParallel, Bf16TracksFp32) {
  const train::Config base = modern({});
  const data::Splits data = data::make_datasets(base.data);
  const auto ref = train_on(base, 1, {}, &data);
  const auto run = train_on(modern({"train.precision=bf16"}), 1, {}, &data);
  const double diff = max_rel_diff(ref.params, run.params);
  EXPECT_GT(diff, 0);
  EXPECT_LT(diff, 0.02);
  EXPECT_NEAR(run.summary["test_loss"].get<double>() / ref.summary["test_loss"].get<double>(), 1.0,
              0.02);
}

// char_gpt (shortened as the modern one) layer by layer: 2 blocks of 4 heads, width 32.
const char* kTextStack =
    "model.stack=[{type = \"embedding\", channels = 32}, {type = \"transformer\", heads = 4}, "
    "{type = \"transformer\", heads = 4}, {type = \"lm_head\"}]";

train::Config char_gpt(std::vector<std::string> extra) {
  return example("char_gpt", modern_keys(std::move(extra)));
}

train::Config text_stack(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"model.kind=sequential", kTextStack});
  return char_gpt(std::move(extra));
}

TEST(TextStackParallel, TrainsToCharGptsParameters) {
  // The example states char_gpt.toml's model: the same parameters for the same seed.
  nn::ModelSpec gpt_spec = example("char_gpt", {}).model,
                stack_spec = example("char_gpt_sequential", {}).model;
  for (nn::ModelSpec* s : {&gpt_spec, &stack_spec}) {
    s->input_shape = {64};
    s->num_classes = 97;
  }
  auto a = nn::build_model(gpt_spec), b = nn::build_model(stack_spec);
  a->materialize(1);
  b->materialize(1);
  ASSERT_EQ(a->values().numel(), b->values().numel());
  EXPECT_EQ(std::memcmp(a->values().raw(), b->values().raw(), a->values().nbytes()), 0);
  const data::Splits data = data::make_datasets(char_gpt({}).data);
  for (int workers : {1, 2}) {
    const std::vector<std::string> keys = {"train.deterministic=true", "ddp.micro_shard=2",
                                           "train.drop_last=true"};
    const auto gpt = train_on(char_gpt(keys), workers, {}, &data);
    const auto stack = train_on(text_stack(keys), workers, {}, &data);
    ASSERT_EQ(stack.summary["steps"], 20);
    EXPECT_EQ(stack.summary["params_sha256"], gpt.summary["params_sha256"]) << workers;
    EXPECT_EQ(stack.summary["test_loss"], gpt.summary["test_loss"]) << workers;
  }
}

// Feature data for a stack of text layers is refused at start, naming the data it needs.
TEST(TextStackParallel, FeatureDataIsRefused) {
  try {
    train_on(sequential({kTextStack}), 1);
    ADD_FAILURE() << "a text stack trained on features";
  } catch (const InvalidArgument& e) {
    for (const char* part : {"sequential reads token ids", "data.kind = 'synthetic'", "'tokens'"})
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// Tensor parallelism cuts the blocks' heads and the vocabulary (the vocabulary-parallel loss).
TEST(TextStackParallel, LayoutsMatchOneWorker) {
  expect_match_single(text_stack({}),
                      {{2, {}},
                       {2, {"pp.stages=2", "pp.microbatches=2"}},
                       {2, {"tp.size=2"}},
                       {2, {"tp.size=2", "tp.sequence_parallel=true"}}},
                      text_stack);
}

}  // namespace
}  // namespace tessel
