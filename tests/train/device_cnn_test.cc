// The CNN on a device, proved on the CPU: with the fake device (tests/support/fake_device.h),
// fashion_cnn (conv5x5 -> ReLU -> max pool, twice, then two linear layers; SGD with momentum)
// with runtime.device = cuda must train exactly as with runtime.device = cpu, in fp32 and bf16:
// the same losses, accuracies, params_sha256 and final checkpoint. The device composes the
// CPU's fused convolution + ReLU + pool from its convolution, ReLU and pooling slots, which
// must give the fused kernels' bits; every slot checks that its pointers are device memory,
// and host code reading a device tensor throws, so a missed upload or read back fails the run.
// The images are small_images_dir()'s 64 + 32 (each run evaluates its whole test set).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device_ranks_testing.h"
#include "fake_device.h"
#include "train_on.h"

namespace tessel::train {
namespace {

using tessel::testing::RunResult;
using tessel::testing::train_on;

class DeviceCnn : public ::testing::TestWithParam<const char*> {
 protected:
  static void SetUpTestSuite() {
    data_ = new data::Splits(data::make_datasets(config("cpu", "fp32").data));
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }

  // fashion_cnn, 3 steps of 16 images with momentum SGD (an evaluation after), on `device`.
  static Config config(const std::string& device, const std::string& precision) {
    return device_config({.model = "fashion_cnn",
                          .device = device,
                          .precision = precision,
                          .steps = 3,
                          .extra = {"optim.kind=sgd", "optim.momentum=0.9"}});
  }

  static data::Splits* data_;
};

data::Splits* DeviceCnn::data_ = nullptr;

TEST_P(DeviceCnn, TrainsAsTheCpuDoes) {
  const RunResult cpu = train_on(config("cpu", GetParam()), 1, {}, data_);
  fakes::FakeDevice fake;
  const RunResult cuda = train_on(config("cuda", GetParam()), 1, {}, data_);
  for (const char* key :
       {"params_sha256", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "steps"})
    EXPECT_EQ(cuda.summary[key], cpu.summary[key]) << key;
  EXPECT_EQ(cpu.summary["steps"], 3);
  EXPECT_EQ(cuda.params, cpu.params);  // the final checkpoint, read back from the device
  // The convolutions and pools went through the device's table: two layers, three training
  // steps, then the evaluation's forwards.
  EXPECT_GT(fake.calls("conv2d_forward"), 2 * 3);
  EXPECT_GT(fake.calls("maxpool2d_forward"), 2 * 3);
  EXPECT_EQ(fake.calls("conv2d_backward"), 2 * 3);
  EXPECT_EQ(fake.calls("maxpool2d_backward"), 2 * 3);
  for (const char* op : {"relu_forward", "relu_backward", "linear_forward", "linear_backward"})
    EXPECT_GT(fake.calls(op), 0) << op;
  EXPECT_EQ(fake.calls("sgd_step"), 3);
}

INSTANTIATE_TEST_SUITE_P(Precisions, DeviceCnn, ::testing::Values("fp32", "bf16"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace tessel::train
