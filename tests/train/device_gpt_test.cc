// The GPT on a device, proved on the CPU: with the fake device (tests/support/fake_device.h:
// "device" memory in host blocks, a kernel table whose slots run the CPU kernels and check that
// every pointer is device memory), char_gpt (shortened: 2 blocks, width 64, context 32) with
// runtime.device = cuda must train exactly as with runtime.device = cpu: the same loss at every
// step, the same evaluation, params_sha256 and final checkpoint, in fp32 and bf16 with AdamW and
// clipping, classic (LayerNorm, learned positions, GELU) and modern (RMSNorm, rotary, SwiGLU).
// The device's attention keeps lse instead of the CPU's probabilities, and the fake's attention
// backward checks that it is handed the forward's output and lse. A run stopped and resumed on
// the device ends where the uninterrupted one does; attention's head sizes without a device
// kernel are refused at start naming the keys.
#include <gtest/gtest.h>

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
  const char* precision;
  bool modern;  // model.norm = rmsnorm, model.position = rotary, model.mlp = swiglu
};

// Shortened char_gpt on `device`, with `extra` settings after the test's own.
Config char_gpt(const std::string& device, Case c, std::vector<std::string> extra = {}) {
  if (c.modern)
    extra.insert(extra.begin(),
                 {"model.norm=rmsnorm", "model.position=rotary", "model.mlp=swiglu"});
  extra.insert(extra.begin(), {"train.log_every=1", "train.clip_norm=0.5"});
  return device_config({.model = "char_gpt",
                        .device = device,
                        .precision = c.precision,
                        .steps = 5,
                        .extra = extra});
}

class DeviceGpt : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    data_ = new data::Splits(data::make_datasets(char_gpt("cpu", {"fp32", false}).data));
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }

  // A fresh run of cfg in test_run_dir(name), its step losses in *losses.
  static RunResult run(const Config& cfg, const std::string& name, std::vector<double>* losses) {
    RunOptions opts;
    opts.run_dir = test_run_dir(name);
    RunResult r = train_on(cfg, 1, opts, data_);
    *losses = step_losses(opts.run_dir);
    return r;
  }

  static data::Splits* data_;
};

data::Splits* DeviceGpt::data_ = nullptr;

TEST_P(DeviceGpt, TrainsAsTheCpuDoes) {
  std::vector<double> cpu_losses, cuda_losses;
  const RunResult cpu =
      run(char_gpt("cpu", GetParam()), str("device_gpt_cpu_", GetParam().modern), &cpu_losses);
  fakes::FakeDevice fake;
  const RunResult cuda =
      run(char_gpt("cuda", GetParam()), str("device_gpt_cuda_", GetParam().modern), &cuda_losses);
  ASSERT_EQ(cpu_losses.size(), 5u);
  EXPECT_EQ(cuda_losses, cpu_losses);
  for (const char* key : {"params_sha256", "train_loss", "test_loss", "test_accuracy", "steps"})
    EXPECT_EQ(cuda.summary[key], cpu.summary[key]) << key;
  EXPECT_EQ(cuda.params, cpu.params);  // the final checkpoint, read back from the device
  // Every layer of the GPT went through the device's table.
  std::vector<std::string> ops = {
      "embedding_forward",      "embedding_backward", "linear_forward", "linear_backward",
      "attention_forward",      "attention_backward", "add_forward",    "cross_entropy_forward",
      "cross_entropy_backward", "sum_squares",        "adamw_step"};
  if (GetParam().modern)
    ops.insert(ops.end(), {"rmsnorm_forward", "rmsnorm_backward", "rotary_forward",
                           "rotary_backward", "swiglu_forward", "swiglu_backward"});
  else
    ops.insert(ops.end(), {"accumulate", "layernorm_forward", "layernorm_backward", "gelu_forward",
                           "gelu_backward"});
  for (const std::string& op : ops) EXPECT_GT(fake.calls(op), 0) << op;
  EXPECT_EQ(fake.calls("attention_backward"), 2 * 5);  // two blocks, five steps
}

// Stopped after 2 steps on the device and resumed there: the uninterrupted CPU run's end.
TEST_P(DeviceGpt, ResumesOnTheDevice) {
  std::vector<double> cpu_losses;
  const RunResult cpu =
      run(char_gpt("cpu", GetParam()), str("device_gpt_cpu_", GetParam().modern), &cpu_losses);
  fakes::FakeDevice fake;
  RunOptions first;
  first.run_dir = test_run_dir("device_gpt_resume");
  first.stop_after = 2;
  train_on(char_gpt("cuda", GetParam()), 1, first, data_);
  RunOptions second;
  second.run_dir = second.resume = first.run_dir;
  const RunResult resumed = train_on(char_gpt("cuda", GetParam()), 1, second, data_);
  EXPECT_EQ(resumed.summary["steps"], 5);
  EXPECT_EQ(resumed.summary["params_sha256"], cpu.summary["params_sha256"]);
  EXPECT_EQ(resumed.params, cpu.params);
}

// Deterministic mode, as scripts/gpu_check's char_gpt rows train: on the device it keeps the
// gradient arena (fixed-order sums), so two runs give the same bits; the CPU's exact integer
// sums are not the device's, so the losses agree to rounding only.
TEST_P(DeviceGpt, DeterministicModeRepeatsOnTheDevice) {
  std::vector<double> cpu_losses, a_losses, b_losses;
  const std::vector<std::string> det = {"train.deterministic=true", "train.drop_last=true"};
  const RunResult cpu = run(char_gpt("cpu", GetParam(), det), "device_gpt_det_cpu", &cpu_losses);
  fakes::FakeDevice fake;
  const RunResult a = run(char_gpt("cuda", GetParam(), det), "device_gpt_det_a", &a_losses);
  const RunResult b = run(char_gpt("cuda", GetParam(), det), "device_gpt_det_b", &b_losses);
  EXPECT_EQ(a.summary["params_sha256"], b.summary["params_sha256"]);
  EXPECT_EQ(a_losses, b_losses);
  ASSERT_EQ(a_losses.size(), cpu_losses.size());
  for (size_t i = 0; i < a_losses.size(); ++i)
    EXPECT_NEAR(a_losses[i], cpu_losses[i], 1e-4 * cpu_losses[i]) << "step " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(Cases, DeviceGpt,
                         ::testing::Values(Case{"fp32", false}, Case{"bf16", false},
                                           Case{"fp32", true}, Case{"bf16", true}),
                         [](const auto& info) {
                           return str(info.param.modern ? "modern_" : "classic_",
                                      info.param.precision);
                         });

// Attention has no device kernel for a head size of 8: refused when the trainer starts, naming
// the keys, before any step.
TEST(DeviceGptRefusals, UnsupportedVariantsAreRefusedAtStart) {
  const data::Splits data = data::make_datasets(char_gpt("cpu", {"fp32", false}).data);
  fakes::FakeDevice fake;
  for (const auto& [setting, key] : std::vector<std::pair<std::string, std::string>>{
           {"model.heads=8", "model.embed / model.heads = 64 / 8"},
           {"model.heads=16", "model.embed / model.heads = 64 / 16"}}) {
    try {
      train_on(char_gpt("cuda", {"fp32", false}, {setting}), 1, {}, &data);
      ADD_FAILURE() << setting << " was not refused on cuda";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("runtime.device = cuda has no kernel for " + key),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(fake.calls("linear_forward"), 0);  // refused before any step
}

}  // namespace
}  // namespace tessel::train
