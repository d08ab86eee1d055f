// The engine on a device, proved on the CPU: with the fake device (tests/support/fake_device.h:
// "device" memory in host blocks, a kernel table whose slots run the CPU kernels), fashion_mlp
// with runtime.device = cuda must train exactly as with runtime.device = cpu: the same losses,
// accuracies, params_sha256 and final checkpoint, in fp32 and bf16, with SGD and AdamW and
// clipping, and with dropout (the CPU's masks). Host code that reads device memory through a tensor
// throws (data<T>() of a device tensor), and every slot checks that its pointers are device memory,
// so a missed upload or read back fails the run; the slots' call counts show the work went through
// the table. A run stopped and resumed on the device ends where the uninterrupted one does.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device_ranks_testing.h"
#include "fake_device.h"
#include "train_on.h"

namespace tessel::train {
namespace {

using tessel::testing::example;
using tessel::testing::RunResult;
using tessel::testing::train_on;

struct Case {
  const char* precision;
  const char* optim;
};

class DeviceTrain : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    data_ = new data::Splits(data::make_datasets(example("fashion_mlp", {}).data));
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }

  // fashion_mlp, 6 steps of 64 rows (an evaluation after), clipped to a norm the gradients
  // exceed, on `device`, with `extra` settings.
  Config config(const std::string& device, std::vector<std::string> extra = {}) const {
    const Case c = GetParam();
    extra.insert(extra.begin(), {str("optim.kind=", c.optim), "train.clip_norm=0.5"});
    return device_config({.model = "fashion_mlp",
                          .device = device,
                          .precision = c.precision,
                          .steps = 6,
                          .extra = extra});
  }

  static data::Splits* data_;
};

data::Splits* DeviceTrain::data_ = nullptr;

TEST_P(DeviceTrain, TrainsAsTheCpuDoes) {
  const RunResult cpu = train_on(config("cpu"), 1, {}, data_);
  fakes::FakeDevice fake;
  const RunResult cuda = train_on(config("cuda"), 1, {}, data_);
  for (const char* key :
       {"params_sha256", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "steps"})
    EXPECT_EQ(cuda.summary[key], cpu.summary[key]) << key;
  EXPECT_EQ(cuda.params, cpu.params);  // the final checkpoint, read back from the device
  // The work went through the device's table: every layer, the loss, the norm, the optimizer.
  const std::string step = str(GetParam().optim == std::string("sgd") ? "sgd" : "adamw", "_step");
  for (const std::string& op :
       {std::string("linear_forward"), std::string("linear_backward"), std::string("relu_forward"),
        std::string("relu_backward"), std::string("cross_entropy_forward"),
        std::string("cross_entropy_backward"), std::string("count_correct"),
        std::string("sum_squares"), step})
    EXPECT_GT(fake.calls(op), 0) << op;
  EXPECT_EQ(fake.calls(step), 6);  // one segment (one unit), six steps
}

// Stopped after 3 steps on the device and resumed there (values and optimizer state read back
// into the checkpoint, then uploaded again): the uninterrupted CPU run's parameters.
TEST_P(DeviceTrain, ResumesOnTheDevice) {
  const RunResult cpu = train_on(config("cpu"), 1, {}, data_);
  fakes::FakeDevice fake;
  RunOptions first;
  first.run_dir = tessel::testing::test_run_dir("device_train_resume");
  first.stop_after = 3;
  train_on(config("cuda"), 1, first, data_);
  RunOptions second;
  second.run_dir = second.resume = first.run_dir;
  const RunResult resumed = train_on(config("cuda"), 1, second, data_);
  EXPECT_EQ(resumed.summary["steps"], 6);
  EXPECT_EQ(resumed.summary["params_sha256"], cpu.summary["params_sha256"]);
  EXPECT_EQ(resumed.params, cpu.params);
}

// Deterministic mode (as scripts/gpu_check's equivalence runs train): on the device too the
// micro-shards' gradients are summed exactly, on the host as on the CPU (exact_sum.h), so with
// the CPU's kernels the device run is the CPU's bits, and twice the same.
TEST_P(DeviceTrain, DeterministicModeSumsAsTheCpuDoes) {
  const RunResult cpu = train_on(config("cpu", {"train.deterministic=true"}), 1, {}, data_);
  fakes::FakeDevice fake;
  const RunResult a = train_on(config("cuda", {"train.deterministic=true"}), 1, {}, data_);
  const RunResult b = train_on(config("cuda", {"train.deterministic=true"}), 1, {}, data_);
  EXPECT_EQ(a.summary["params_sha256"], b.summary["params_sha256"]);
  EXPECT_EQ(a.summary["engine"]["grad_sync"], "exact");
  EXPECT_EQ(a.summary["params_sha256"], cpu.summary["params_sha256"]);
  EXPECT_EQ(a.params, cpu.params);
}

// Dropout on the device draws the CPU's counter-RNG masks: the same bits with model.dropout.
TEST_P(DeviceTrain, TrainsWithDropoutAsTheCpuDoes) {
  const RunResult cpu = train_on(config("cpu", {"model.dropout=0.2"}), 1, {}, data_);
  fakes::FakeDevice fake;
  const RunResult cuda = train_on(config("cuda", {"model.dropout=0.2"}), 1, {}, data_);
  EXPECT_EQ(cuda.summary["params_sha256"], cpu.summary["params_sha256"]);
  EXPECT_EQ(cuda.summary["train_loss"], cpu.summary["train_loss"]);
  EXPECT_EQ(cuda.params, cpu.params);
  EXPECT_GT(fake.calls("dropout_forward"), 0);
  EXPECT_GT(fake.calls("dropout_backward"), 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, DeviceTrain,
                         ::testing::Values(Case{"fp32", "sgd"}, Case{"fp32", "adamw"},
                                           Case{"bf16", "sgd"}, Case{"bf16", "adamw"}),
                         [](const auto& info) {
                           return str(info.param.precision, "_", info.param.optim);
                         });

}  // namespace
}  // namespace tessel::train
