// Offload in pipelines on device ranks (train.offload with pp.stages = 2), proved on the CPU
// with the stand-in device (tests/support/fake_device.h: "device" memory in host blocks whose
// kernels refuse host pointers; copies on a copy stream run only once an event after them is
// waited for, so a missed wait leaves bytes unwritten and a block freed under a queued copy
// fails). fashion_mlp and char_gpt (its LM head tied to the embedding on the other stage) train
// under gpipe and 1f1b, fp32 and bf16, with each micro-batch's activations in pinned host memory
// between its forward and its backward exactly as without: every step's loss, params_sha256
// and the parameters; each stage's peak of device activation bytes stays under a bound measured
// for its schedule (1f1b's at the floors docs/gpu.md explains), the pinned copies show as
// activations_offloaded, and every copy back overlaps kernels (the prefetch). dp 2 x pp 2 too,
// and the optimizer offloaded per stage. zb-h1 with activation offload is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "device_ranks_testing.h"
#include "train_on.h"

namespace tessel::train {
namespace {

using tessel::testing::RunResult;
using tessel::testing::test_run_dir;
using tessel::testing::train_on;

struct Case {
  const char* model;  // examples/<model>.toml
  const char* precision;
  const char* schedule;
  // The most of none's peak device activation bytes offload may hold, per stage (measured
  // below, with some room).
  double peak_share[2];
};

// The model shortened for a test (char_gpt of 4 blocks in batches of 16), on cuda, pp = 2 with 4
// micro-batches, `extra` last.
Config config(const Case& c, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = kOffloadSettings;
  o.insert(o.end(), {"pp.stages=2", "pp.microbatches=4", str("pp.schedule=", c.schedule),
                     "ddp.shared_memory=false"});
  if (std::string(c.model) == "char_gpt") o.insert(o.end(), {"model.layers=4", "train.batch=16"});
  o.insert(o.end(), extra.begin(), extra.end());
  return device_config({.model = c.model, .precision = c.precision, .extra = o});
}

// What a run did on the stand-in device.
struct Outcome {
  RunResult result;
  std::vector<double> losses;
  fakes::FakeRuntime::AsyncCopies to_host, to_device;
  bool async_on_copy_streams = true;  // no async copy on a stream that other work used
  int copies = 0;                     // synchronous ones
};

// A fresh run of cfg on `workers` ranks sharing a stand-in device, in test_run_dir(name).
Outcome run(const Config& cfg, int workers, const std::string& name) {
  const data::Splits data = data::make_datasets(cfg.data);
  fakes::FakeDevice fake;
  RunOptions opts;
  opts.run_dir = test_run_dir(name);
  Outcome o;
  o.result = train_on(cfg, workers, opts, &data);
  const fakes::FakeRuntime& f = fake.runtime();
  o.losses = step_losses(opts.run_dir);
  o.to_host = f.async_to_host;
  o.to_device = f.async_to_device;
  o.copies = f.copies;
  for (void* s : f.async_streams)
    if (s == nullptr || std::find(f.streams.begin(), f.streams.end(), s) != f.streams.end())
      o.async_on_copy_streams = false;
  return o;
}

// The same bits with offload as without.
void expect_same_run(const Outcome& got, const Outcome& want) {
  ASSERT_EQ(want.losses.size(), 4u);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.result.summary["params_sha256"], want.result.summary["params_sha256"]);
  EXPECT_EQ(got.result.params, want.result.params);
}

// Every copy of the activation offload asynchronous, on copy streams, each byte out and back,
// and every one beside kernels (a copy out while the next block's forward or the next task
// runs; a copy back while a later block's backward or the task before runs: the prefetches).
void expect_overlapped_copies(const Outcome& kept, const Outcome& offload) {
  EXPECT_EQ(offload.copies, kept.copies);
  EXPECT_EQ(kept.to_host.queued + kept.to_device.queued, 0);
  EXPECT_TRUE(offload.async_on_copy_streams);
  EXPECT_GT(offload.to_host.queued, 0);
  EXPECT_EQ(offload.to_device.queued, offload.to_host.queued);
  EXPECT_EQ(offload.to_host.overlapped, offload.to_host.queued);
  EXPECT_EQ(offload.to_device.overlapped, offload.to_device.queued);
}

class DevicePpOffload : public ::testing::TestWithParam<Case> {};

TEST_P(DevicePpOffload, StagesTrainAsWithoutOnLessDeviceMemory) {
  const Case c = GetParam();
  const std::string name = str(c.model, "_", c.precision, "_", c.schedule);
  const Outcome kept = run(config(c), 2, "ppoffload_none_" + name);
  const Outcome offload = run(config(c, {"train.offload=activations"}), 2, "ppoffload_" + name);
  expect_same_run(offload, kept);
  EXPECT_EQ(offload.result.summary["engine"]["offload"], "activations");
  expect_overlapped_copies(kept, offload);
  for (int stage = 0; stage < 2; ++stage) {
    SCOPED_TRACE(str("stage ", stage));
    const double none_peak = peak_bytes(kept.result, "activations", stage);
    const double offload_peak = peak_bytes(offload.result, "activations", stage);
    const double host_peak = peak_bytes(offload.result, "activations_offloaded", stage);
    EXPECT_EQ(peak_bytes(kept.result, "activations_offloaded", stage), 0);
    EXPECT_GT(host_peak, 0);
    EXPECT_LE(offload_peak, c.peak_share[stage] * none_peak)
        << offload_peak << " of " << none_peak << ", " << host_peak << " offloaded";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, DevicePpOffload,
                         // Measured, training's peak alone (the evaluation releases the
                         // caches first; stage 0, stage 1; fp32 and bf16 within 1%): fashion_mlp
                         // (stages of 1 and 4 blocks) gpipe 75%, 33%, 1f1b 100%, 61%; char_gpt
                         // (4 transformer blocks, 3 a stage) gpipe 51%, 34%, 1f1b 67%, 76%.
                         // 1f1b's floors (docs/gpu.md): fashion_mlp's stage 0 holds two
                         // micro-batches' one-block caches with or without offload; stage 1 and
                         // char_gpt's stage 0 peak in a block's backward with the block below
                         // coming back (and on stage 0 the other micro-batch's last block going
                         // out). Seen failing: the shared scratch kept (1f1b 99%, 99% on stage
                         // 1; char_gpt 84% on stage 0), each block's own cache kept until the
                         // next block's forward (char_gpt 84% on stage 0).
                         ::testing::Values(Case{"fashion_mlp", "fp32", "gpipe", {0.8, 0.4}},
                                           Case{"fashion_mlp", "bf16", "gpipe", {0.8, 0.4}},
                                           Case{"fashion_mlp", "fp32", "1f1b", {1, 0.65}},
                                           Case{"fashion_mlp", "bf16", "1f1b", {1, 0.65}},
                                           Case{"char_gpt", "fp32", "gpipe", {0.55, 0.4}},
                                           Case{"char_gpt", "bf16", "gpipe", {0.55, 0.4}},
                                           Case{"char_gpt", "fp32", "1f1b", {0.72, 0.8}},
                                           Case{"char_gpt", "bf16", "1f1b", {0.72, 0.8}}),
                         [](const auto& info) {
                           return str(info.param.model, "_", info.param.precision, "_",
                                      info.param.schedule);
                         });

// Two chunks per stage (interleaved 1F1B): each chunk's micro-batches go out and come back as
// one stage's do.
TEST(DevicePpOffloadInterleaved, TrainsAsWithout) {
  for (const Case& c : {Case{"fashion_mlp", "fp32", "interleaved", {1, 1}},
                        Case{"char_gpt", "bf16", "interleaved", {1, 1}}}) {
    SCOPED_TRACE(c.model);
    const std::vector<std::string> v = {"pp.virtual_stages=2"};
    const Outcome kept = run(config(c, v), 2, "ppoffload_interleaved_none");
    std::vector<std::string> on = v;
    on.push_back("train.offload=activations");
    const Outcome offload = run(config(c, on), 2, "ppoffload_interleaved");
    expect_same_run(offload, kept);
    expect_overlapped_copies(kept, offload);
    for (int stage = 0; stage < 2; ++stage)
      EXPECT_LT(peak_bytes(offload.result, "activations", stage),
                peak_bytes(kept.result, "activations", stage));
  }
}

// dp 2 x pp 2 on four ranks: each replica's stages offload, the dp groups reduce as without,
// and each rank's training peak stays under its stage's 1f1b bound (rank r is stage r % 2,
// Layout::coord; measured 100%, 61%, as on two ranks at half the micro-batch rows).
TEST(DevicePpOffloadGrid, DataTimesPipelineTrainsAsWithout) {
  const Case c{"fashion_mlp", "fp32", "1f1b", {1, 0.65}};
  const Outcome kept = run(config(c, {"ddp.bucket_mb=0.1"}), 4, "ppoffload_grid_none");
  const Outcome offload =
      run(config(c, {"ddp.bucket_mb=0.1", "train.offload=activations"}), 4, "ppoffload_grid");
  EXPECT_EQ(offload.result.summary["layout"], "dp=2 pp=2");
  expect_same_run(offload, kept);
  expect_overlapped_copies(kept, offload);
  for (int rank = 0; rank < 4; ++rank) {
    const double none_peak = peak_bytes(kept.result, "activations", rank);
    const double offload_peak = peak_bytes(offload.result, "activations", rank);
    EXPECT_LE(offload_peak, c.peak_share[rank % 2] * none_peak) << "rank " << rank;
  }
}

// The optimizer offloaded per stage (each stage's arena its own OffloadedOptimizer), alone and
// with the activations: the same bits, no optimizer state on the device.
TEST(DevicePpOffloadOptimizer, StagesStepOnTheHostAsWithout) {
  const Case c{"char_gpt", "bf16", "1f1b", {1, 1}};
  const Outcome kept = run(config(c), 2, "ppoffload_optimizer_none");
  for (const char* what : {"optimizer", "all"}) {
    SCOPED_TRACE(what);
    const Outcome offload = run(config(c, {str("train.offload=", what)}), 2, "ppoffload_opt");
    expect_same_run(offload, kept);
    EXPECT_EQ(offload.result.summary["engine"]["offload"], what);
    for (int stage = 0; stage < 2; ++stage) {
      EXPECT_GT(peak_bytes(kept.result, "optimizer_state", stage), 0);
      EXPECT_EQ(peak_bytes(offload.result, "optimizer_state", stage), 0);
      EXPECT_GE(peak_bytes(offload.result, "optimizer_offloaded", stage),
                peak_bytes(kept.result, "optimizer_state", stage));
    }
  }
}

// zb-h1's W tasks read the caches after their B: refused with activation offload, naming the
// keys and what to set instead.
TEST(DevicePpOffloadRefusals, ZeroBubbleIsRefused) {
  const Case c{"fashion_mlp", "fp32", "zb-h1", {1, 1}};
  const data::Splits data = data::make_datasets(config(c).data);
  fakes::FakeDevice fake;
  try {
    train_on(config(c, {"train.offload=activations"}), 2, {}, &data);
    ADD_FAILURE() << "not refused";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train.offload = activations moves each micro-batch's caches between its "
                        "forward and its backward, got pp.schedule = zb-h1"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("set pp.schedule = 1f1b or train.offload = none"), std::string::npos)
        << what;
  }
  EXPECT_EQ(fake.calls("linear_forward"), 0);  // refused before any step
}

}  // namespace
}  // namespace tessel::train
