// Activation offload (train.offload = activations), proved on the CPU with the fake device
// (tests/support/fake_device.h: "device" memory in host blocks whose kernels check that every
// pointer is device memory, so an activation left on the host, or a storage not brought back,
// fails the run; copies on a copy stream run only once an event after them is waited for, so a
// missed wait leaves bytes unwritten and a block freed under a queued copy fails). fashion_mlp,
// fashion_cnn and char_gpt (6 blocks) train on cuda with offload exactly as without: every
// step's loss, params_sha256 and the final checkpoint; every copy of the offload is
// asynchronous, on a copy stream, from pinned host memory and beside kernels (the prefetch);
// the rank's peak of device activation bytes (the memory ledger's, charged by the device
// runtime's allocations) falls by most of what the blocks keep, the pinned host copies show as
// activations_offloaded, and the summary names the offload. On runtime.device = cpu it is
// refused at start (pipelines: device_ppoffload_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
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
  double peak_share;  // the most of none's peak device activation bytes offload may hold
  int lone_copies;    // copies each way a step beside a block that runs no kernel (a flatten)
};

// The model shortened for a test (char_gpt of 6 blocks; fashion_cnn's flatten block's output is
// a view of the block before's), on cuda, with `extra` settings after the test's own.
Config config(const Case& c, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = kOffloadSettings;
  if (std::string(c.model) == "char_gpt") o.push_back("model.layers=6");
  o.insert(o.end(), extra.begin(), extra.end());
  return device_config({.model = c.model, .precision = c.precision, .extra = o});
}

// What a run did on the fake device.
struct DeviceStats {
  std::vector<double> losses;  // every step's, from metrics.jsonl
  int copies = 0;              // synchronous ones
  fakes::FakeRuntime::AsyncCopies to_host, to_device;
  bool async_on_copy_streams = true;  // no async copy on a stream that other work used
  int64_t pinned_peak = 0;
};

// A fresh run of cfg on `workers` ranks sharing a fake device, in test_run_dir(name).
RunResult run(const Config& cfg, int workers, const std::string& name, DeviceStats* stats) {
  const data::Splits data = data::make_datasets(cfg.data);
  fakes::FakeDevice fake;
  RunOptions opts;
  opts.run_dir = test_run_dir(name);
  RunResult r = train_on(cfg, workers, opts, &data);
  const fakes::FakeRuntime& f = fake.runtime();
  stats->losses = step_losses(opts.run_dir);
  stats->copies = f.copies;
  stats->to_host = f.async_to_host;
  stats->to_device = f.async_to_device;
  for (void* s : f.async_streams)
    if (s == nullptr || std::find(f.streams.begin(), f.streams.end(), s) != f.streams.end())
      stats->async_on_copy_streams = false;
  stats->pinned_peak = f.pinned_peak;
  return r;
}

// The copies of an offloading run: none synchronous beyond the run without's, all of them on
// copy streams from pinned memory, every step's out and back, and every one of them beside
// kernels (the copies out run while the next block's forward is queued, the copies back of
// block b - 1 while block b's backward is: the prefetch).
void expect_overlapped_copies(const DeviceStats& kept, const DeviceStats& offload, int steps,
                              int lone_copies) {
  EXPECT_EQ(offload.copies, kept.copies);
  EXPECT_EQ(kept.to_host.queued + kept.to_device.queued, 0);
  EXPECT_TRUE(offload.async_on_copy_streams);
  EXPECT_GE(offload.to_host.queued, steps);
  EXPECT_EQ(offload.to_device.queued, offload.to_host.queued);
  EXPECT_EQ(offload.to_host.overlapped, offload.to_host.queued - steps * lone_copies);
  EXPECT_EQ(offload.to_device.overlapped, offload.to_device.queued - steps * lone_copies);
}

class DeviceOffload : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceOffload, TrainsAsWithoutOffloadOnLessDeviceMemory) {
  const Case c = GetParam();
  DeviceStats kept_stats, offload_stats;
  const RunResult kept = run(config(c), 1, str("offload_none_", c.model), &kept_stats);
  const RunResult offload =
      run(config(c, {"train.offload=activations"}), 1, str("offload_on_", c.model), &offload_stats);
  ASSERT_EQ(kept_stats.losses.size(), 4u);
  EXPECT_EQ(offload_stats.losses, kept_stats.losses);  // a copy out and back: the same bits
  EXPECT_EQ(offload.summary["params_sha256"], kept.summary["params_sha256"]);
  EXPECT_EQ(offload.params, kept.params);
  EXPECT_EQ(offload.summary["engine"]["offload"], "activations");
  EXPECT_EQ(kept.summary["engine"]["offload"], "none");
  expect_overlapped_copies(kept_stats, offload_stats, 4, c.lone_copies);

  const double none_peak = peak_bytes(kept, "activations");
  const double offload_peak = peak_bytes(offload, "activations");
  const double host_peak = peak_bytes(offload, "activations_offloaded");
  EXPECT_EQ(peak_bytes(kept, "activations_offloaded"), 0);
  EXPECT_GT(host_peak, 0);
  EXPECT_EQ(host_peak, offload_stats.pinned_peak);  // the host buffers are pinned ones
  // Most of what went to the host is no longer on the device at the peak (nor are the caches'
  // backward buffers, released after each block's backward).
  EXPECT_LE(offload_peak, none_peak - 0.5 * host_peak) << none_peak << " " << host_peak;
  EXPECT_LT(offload_peak, c.peak_share * none_peak) << offload_peak << " of " << none_peak;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DeviceOffload,
    // Measured, training's peaks alone (the evaluation drops the caches and is charged to
    // `other`): 27% of none's peak for char_gpt; 61% for fashion_mlp, whose peak is block 1's
    // backward: the step's input batch (17% of none's peak, not a cache), the caches of block 1
    // and of block 0 (back for the prefetch; 22%) and the gradient in and out (22%) -- only
    // blocks 2-4's caches are away; 65% for fashion_cnn, whose peak is conv1's backward, its
    // 0.96 MiB workspace (mostly the unpooled output) beside the pooled output and indices it
    // keeps.
    ::testing::Values(Case{"fashion_mlp", "fp32", 0.65, 0}, Case{"fashion_cnn", "fp32", 0.7, 2},
                      Case{"char_gpt", "fp32", 0.3, 0}, Case{"char_gpt", "bf16", 0.3, 0}),
    [](const auto& info) { return str(info.param.model, "_", info.param.precision); });

// Two ranks sharing the device: data parallel with the parameters sharded (ZeRO-3: each block's
// parameters gathered for its forward and again for its backward), and tensor parallel (each
// rank's caches hold its cut of the activations): the same as without.
TEST(DeviceOffloadParallel, TwoRanksTrainAsWithout) {
  const Case c{"char_gpt", "fp32", 1, 0};
  for (const std::string layout : {"zero.stage=3", "tp.size=2"}) {
    SCOPED_TRACE(layout);
    DeviceStats kept_stats, offload_stats;
    const RunResult kept = run(config(c, {layout}), 2, "offload_two_none", &kept_stats);
    const RunResult offload =
        run(config(c, {layout, "train.offload=activations"}), 2, "offload_two_on", &offload_stats);
    ASSERT_EQ(kept_stats.losses.size(), 4u);
    EXPECT_EQ(offload_stats.losses, kept_stats.losses);
    EXPECT_EQ(offload.summary["params_sha256"], kept.summary["params_sha256"]);
    expect_overlapped_copies(kept_stats, offload_stats, 2 * 4, 0);
    EXPECT_LT(peak_bytes(offload, "activations"), 0.5 * peak_bytes(kept, "activations"));
  }
}

// Refused at start, naming the keys and what to set instead.
TEST(DeviceOffloadRefusals, CpuRanksAreRefused) {
  const Case c{"fashion_mlp", "fp32", 1, 0};
  const data::Splits data = data::make_datasets(config(c).data);
  fakes::FakeDevice fake;
  expect_refused(config(c, {"runtime.device=cpu", "train.offload=activations"}), data,
                 "runtime.device=cpu",
                 "train.offload = activations moves a device rank's activations to host memory, "
                 "got runtime.device = cpu");
  EXPECT_EQ(fake.calls("linear_forward"), 0);  // refused before any step
}

}  // namespace
}  // namespace tessel::train
