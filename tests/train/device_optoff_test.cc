// Optimizer offload (train.offload = optimizer | all), proved on the CPU with the fake device
// (tests/support/fake_device.h: "device" memory in host blocks whose kernels check that every
// pointer is device memory, and the same CPU kernels, so an offloaded step must give the same
// bits). fashion_mlp and char_gpt, fp32 and bf16, on one rank and on two with zero.stage 0-3
// train with the optimizer state in host memory exactly as without: every step's loss,
// params_sha256 and the parameters; a run stopped and resumed ends where the uninterrupted one
// does; the rank's device ledger holds no optimizer state and optimizer_offloaded (pinned and
// plain host memory) holds at least what it held; the summary names the offload. On
// runtime.device = cpu and with parameter servers it is refused at start (pipelines:
// device_ppoffload_test).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "device_ranks_testing.h"
#include "fake_device.h"
#include "train_on.h"

namespace tessel::train {
namespace {

using tessel::testing::RunResult;
using tessel::testing::test_run_dir;
using tessel::testing::train_on;

struct Case {
  const char* model;  // examples/<model>.toml
  const char* precision;
};

// The model shortened for a test (char_gpt over a context of 16), on cuda with AdamW, with
// `extra` settings after the test's own.
Config config(const Case& c, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = kOffloadSettings;
  if (std::string(c.model) == "char_gpt") o.push_back("data.context=16");
  o.insert(o.end(), extra.begin(), extra.end());
  return device_config({.model = c.model, .precision = c.precision, .extra = o});
}

struct Outcome {
  RunResult result;
  std::vector<double> losses;
  int64_t pinned_peak = 0;
  int64_t down = 0, up = 0;          // bytes of the copies on copy streams, every rank together
  int waits_with_copies_behind = 0;  // the host went on while copies were in flight
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
  r.down = fake.runtime().async_to_host.bytes;
  r.up = fake.runtime().async_to_device.bytes;
  r.waits_with_copies_behind = fake.runtime().waits_with_copies_behind;
  return r;
}

// What the offloaded step moved and where the f32 master values lived, against the run
// without offload. bf16 (masters on the host only): each step the gradients (4 B) down and the
// 16-bit copy (2 B) up per updated element; the device's parameters fall by the f32 values (4 B
// per held element; ZeRO-3 keeps a 16-bit copy of its shard: 2 B). fp32: the values come down
// with the gradients and go up (8 B and 4 B); the device keeps them.
void expect_moved_only_what_it_must(const Outcome& kept, const Outcome& on, int workers, int stage,
                                    bool bf16) {
  const int64_t arena = static_cast<int64_t>(kept.result.params.size());
  const int64_t steps = 4;
  // Every rank updates the whole arena at stage 0, its shards (the arena between them) above.
  const int64_t updated = stage == 0 ? arena * workers : arena;
  const int64_t elements = on.up / (steps * (bf16 ? 2 : 4));  // updated, every step
  EXPECT_EQ(on.up, elements * steps * (bf16 ? 2 : 4));
  EXPECT_EQ(on.down, elements * steps * (bf16 ? 4 : 8));
  EXPECT_LE(elements, updated);
  EXPECT_GT(elements, updated - 16 * workers);  // the arena's tail pads to 16 elements
  double fell = 0;
  for (int rank = 0; rank < workers; ++rank)
    fell += peak_bytes(kept.result, "parameters", rank) - peak_bytes(on.result, "parameters", rank);
  const double per_element = !bf16 ? 0 : stage == 3 ? 2 : 4;
  const double held = stage == 3 ? arena : arena * workers;
  // The fake device rounds each block up to 1 KiB: one or two blocks per rank.
  EXPECT_GE(fell, per_element * held - 1024.0 * workers);
  EXPECT_LE(fell, per_element * held + 1024.0 * workers);
  // Segment i stepped while later segments' copies were still queued (segments: each unit's
  // shard at stages 1-3, pieces of at most 2^18 elements of the arena at stage 0).
  if (stage > 0 || arena > (int64_t{1} << 18)) {
    EXPECT_GT(on.waits_with_copies_behind, 0);
  }
}

// cfg with and without `offload` on `workers` ranks: the same bits, the optimizer state off
// every rank's device ledger and in optimizer_offloaded.
void expect_same_bits(const Config& kept_cfg, const Config& offload_cfg, int workers,
                      const std::string& offload) {
  const Outcome kept = run(kept_cfg, workers, "optoff_none");
  const Outcome on = run(offload_cfg, workers, "optoff_on");
  if (offload == "optimizer")
    expect_moved_only_what_it_must(kept, on, workers, offload_cfg.parallel.zero_stage,
                                   offload_cfg.parallel.precision != parallel::Precision::kFp32);
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

// The checkpoint of an offloading run holds the same files as one without (the host masters
// are the values written): stopped with offload and resumed without it, or the other way, the
// uninterrupted run's bits -- at stage 0 (the whole arena's masters on the host) and 3 (the
// shard's, a 16-bit copy on the device).
TEST_P(DeviceOptimizerOffload, ResumesWithAndWithoutOffload) {
  const Case c = GetParam();
  for (const char* stage : {"zero.stage=0", "zero.stage=3"}) {
    SCOPED_TRACE(stage);
    const Config without = config(c, {stage});
    const Config with = config(c, {stage, "train.offload=optimizer"});
    const Outcome whole = run(without, 2, "optoff_whole");
    for (const auto& [first_cfg, second_cfg] : {std::pair{&with, &without}, {&without, &with}}) {
      SCOPED_TRACE(first_cfg == &with ? "stopped with offload" : "resumed with offload");
      RunOptions first;
      first.stop_after = 2;
      run(*first_cfg, 2, "optoff_resume", first);
      RunOptions second;
      second.resume = test_run_dir("optoff_resume");
      const Outcome resumed = run(*second_cfg, 2, "optoff_resume", second);
      EXPECT_EQ(resumed.result.summary["steps"], 4);
      EXPECT_EQ(resumed.losses, whole.losses);  // the run folder's metrics: both halves
      EXPECT_EQ(resumed.result.summary["params_sha256"], whole.result.summary["params_sha256"]);
      EXPECT_EQ(resumed.result.params, whole.result.params);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, DeviceOptimizerOffload,
                         ::testing::Values(Case{"fashion_mlp", "fp32"}, Case{"fashion_mlp", "bf16"},
                                           Case{"char_gpt", "fp32"}, Case{"char_gpt", "bf16"}),
                         [](const auto& info) {
                           return str(info.param.model, "_", info.param.precision);
                         });

// Refused at start, naming the keys and what to set instead.
TEST(DeviceOptimizerOffloadRefusals, CpuRanksAndServersAreRefused) {
  const Case c{"fashion_mlp", "fp32"};
  const data::Splits data = data::make_datasets(config(c).data);
  fakes::FakeDevice fake;
  expect_refused(config(c, {"runtime.device=cpu", "train.offload=optimizer"}), data,
                 "runtime.device=cpu",
                 "train.offload = optimizer moves a device rank's optimizer state to host memory, "
                 "got runtime.device = cpu");
  expect_refused(config(c, {"ps.servers=1", "train.offload=optimizer"}), data, "ps.servers=1",
                 "train.offload = optimizer moves a device rank's optimizer state to host memory, "
                 "got ps.servers = 1");
  EXPECT_EQ(fake.calls("linear_forward"), 0);  // refused before any step
}

}  // namespace
}  // namespace tessel::train
