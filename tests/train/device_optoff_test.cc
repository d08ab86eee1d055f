// Optimizer offload (train.offload = optimizer | all), proved on the CPU with the fake device
// (tests/support/fake_device.h: "device" memory in host blocks whose kernels check that every
// pointer is device memory, and the same CPU kernels, so an offloaded step must give the same
// bits). fashion_mlp and char_gpt, fp32 and bf16, on one rank and on two with zero.stage 0-3
// train with the optimizer state in host memory exactly as without: every step's loss,
// params_sha256 and the parameters; a run stopped and resumed ends where the uninterrupted one
// does; the rank's device ledger holds no optimizer state and optimizer_offloaded (pinned and
// plain host memory) holds at least what it held; the summary names the offload. On
// runtime.device = cpu, with parameter servers and in a pipeline it is refused at start.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "device_ranks_testing.h"
#include "fake_device.h"
#include "train_on.h"

namespace tessel::train {
namespace {

using tessel::testing::example;
using tessel::testing::RunResult;
using tessel::testing::test_run_dir;
using tessel::testing::train_on;

struct Case {
  const char* model;  // examples/<model>.toml
  const char* precision;
};

// The model shortened for a test, on cuda with AdamW, with `extra` settings after the test's own.
Config config(const Case& c, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"train.max_steps=4",      "train.log_every=1",
                                "train.drop_last=true",   str("train.precision=", c.precision),
                                "runtime.device=cuda",    "optim.kind=adamw",
                                "schedule.warmup_steps=1"};
  if (std::string(c.model) == "char_gpt")
    o.insert(o.end(), {"model.layers=2", "model.embed=64", "data.context=16", "train.batch=8"});
  else
    o.insert(o.end(), {"train.batch=64", "data.test_fraction=0"});
  o.insert(o.end(), extra.begin(), extra.end());
  return example(c.model, o);
}

// The training loss of every step in run_dir's metrics.jsonl.
std::vector<double> step_losses(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r.value("type", "") == "train") out.push_back(r["loss"].get<double>());
  }
  return out;
}

double peak_bytes(const RunResult& r, const char* category, int rank = 0) {
  return r.summary["ranks"]["per_rank"][rank]["memory"]["peak_bytes"][category].get<double>();
}

struct Outcome {
  RunResult result;
  std::vector<double> losses;
  int64_t pinned_peak = 0;
};

// A fresh run of cfg on `workers` ranks sharing a fake device, in test_run_dir(name).
Outcome run(const Config& cfg, int workers, const std::string& name, RunOptions opts = {}) {
  const data::Splits data = data::make_datasets(cfg.data);
  fakes::FakeDevice fake;
  opts.run_dir = test_run_dir(name);
  Outcome r;
  r.result = train_on(cfg, workers, opts, &data);
  r.losses = step_losses(opts.run_dir);
  r.pinned_peak = fake.runtime().pinned_peak;
  return r;
}

// cfg with and without `offload` on `workers` ranks: the same bits, the optimizer state off
// every rank's device ledger and in optimizer_offloaded.
void expect_same_bits(const Config& kept_cfg, const Config& offload_cfg, int workers,
                      const std::string& offload) {
  const Outcome kept = run(kept_cfg, workers, "optoff_none");
  const Outcome on = run(offload_cfg, workers, "optoff_on");
  ASSERT_EQ(kept.losses.size(), 4u);
  EXPECT_EQ(on.losses, kept.losses);
  EXPECT_EQ(on.result.summary["params_sha256"], kept.result.summary["params_sha256"]);
  EXPECT_EQ(on.result.params, kept.result.params);
  EXPECT_EQ(on.result.summary["engine"]["offload"], offload);
  EXPECT_GT(on.pinned_peak, 0);
  for (int rank = 0; rank < workers; ++rank) {
    SCOPED_TRACE(str("rank ", rank));
    const double state = peak_bytes(kept.result, "optimizer_state", rank);
    EXPECT_GT(state, 0);
    EXPECT_EQ(peak_bytes(kept.result, "optimizer_offloaded", rank), 0);
    EXPECT_EQ(peak_bytes(on.result, "optimizer_state", rank), 0);  // none on the device
    // The moments, plus the pinned gradients and values (and 16-bit copy) staged each step
    // (the device rounds its blocks up: a little under twice the device state).
    EXPECT_GE(peak_bytes(on.result, "optimizer_offloaded", rank), 1.9 * state);
  }
}

class DeviceOptimizerOffload : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceOptimizerOffload, OneRankTrainsAsWithout) {
  const Case c = GetParam();
  expect_same_bits(config(c), config(c, {"train.offload=optimizer"}), 1, "optimizer");
}

TEST_P(DeviceOptimizerOffload, TwoRanksWithZeroTrainAsWithout) {
  const Case c = GetParam();
  for (const char* stage : {"zero.stage=0", "zero.stage=1", "zero.stage=2", "zero.stage=3"}) {
    SCOPED_TRACE(stage);
    expect_same_bits(config(c, {stage}), config(c, {stage, "train.offload=optimizer"}), 2,
                     "optimizer");
  }
}

// train.offload = all: the activations and the optimizer state both in host memory.
TEST_P(DeviceOptimizerOffload, AllOffloadsBothAsWithout) {
  const Case c = GetParam();
  expect_same_bits(config(c), config(c, {"train.offload=all"}), 1, "all");
}

// Stopped after 2 steps and resumed (the moments read back into host memory): the
// uninterrupted offloading run's bits.
TEST_P(DeviceOptimizerOffload, ResumesAsTheUninterruptedRun) {
  const Case c = GetParam();
  const Config cfg = config(c, {"train.offload=optimizer", "zero.stage=1"});
  const Outcome whole = run(cfg, 2, "optoff_whole");
  RunOptions first;
  first.stop_after = 2;
  run(cfg, 2, "optoff_resume", first);
  RunOptions second;
  second.resume = test_run_dir("optoff_resume");
  const Outcome resumed = run(cfg, 2, "optoff_resume", second);
  EXPECT_EQ(resumed.result.summary["steps"], 4);
  EXPECT_EQ(resumed.result.summary["params_sha256"], whole.result.summary["params_sha256"]);
  EXPECT_EQ(resumed.result.params, whole.result.params);
}

INSTANTIATE_TEST_SUITE_P(Cases, DeviceOptimizerOffload,
                         ::testing::Values(Case{"fashion_mlp", "fp32"}, Case{"fashion_mlp", "bf16"},
                                           Case{"char_gpt", "fp32"}, Case{"char_gpt", "bf16"}),
                         [](const auto& info) {
                           return str(info.param.model, "_", info.param.precision);
                         });

// Refused at start, naming the keys and what to set instead.
TEST(DeviceOptimizerOffloadRefusals, CpuRanksServersAndPipelinesAreRefused) {
  const Case c{"fashion_mlp", "fp32"};
  const data::Splits data = data::make_datasets(config(c).data);
  fakes::FakeDevice fake;
  for (const auto& [settings, expected] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"runtime.device=cpu"},
            "train.offload = optimizer moves a device rank's optimizer state to host memory, got "
            "runtime.device = cpu"},
           {{"ps.servers=1"},
            "train.offload = optimizer moves a device rank's optimizer state to host memory, got "
            "ps.servers = 1"},
           {{"pp.stages=2"},
            "train.offload = optimizer runs in the local executor only, got pp.stages = 2"}}) {
    std::vector<std::string> s = settings;
    s.push_back("train.offload=optimizer");
    expect_refused(config(c, s), data, settings[0], expected);
  }
  EXPECT_EQ(fake.calls("linear_forward"), 0);  // refused before any step
}

}  // namespace
}  // namespace tessel::train
