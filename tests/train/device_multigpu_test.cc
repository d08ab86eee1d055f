// Several GPUs as threads of one process, proved on the CPU: the fake device stands in for 2 or 4
// GPUs (tests/support/fake_device.h: each thread has a current GPU, each block the GPU it was
// allocated on, and every runtime call and kernel slot fails the test when given another GPU's
// memory), the mock NCCL's device_count and set_device are its (tests/comm/nccl_mock.h). Rank r
// of a run as threads takes GPU r mod the count before its first device allocation, so its
// parameters, buffers and kernels stay on its GPU: fashion_mlp on 4 ranks over 2 GPUs (dp and
// ZeRO-3) gives the CPU ranks' bits and, in deterministic mode, the one-rank run's
// params_sha256; 4 ranks over 4 GPUs share none and take NCCL (the mock refusing two ranks on a
// GPU, as NCCL before 2.30 does); 3 ranks over 2 GPUs share and go through the host; pipeline
// stages and dp x tp on GPUs of their own.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device_ranks_testing.h"
#include "fake_device.h"
#include "nccl_mock.h"
#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/tensor.h"
#include "train_on.h"

namespace tessel::train {
namespace {

using comm::testing::mock_nccl;
using comm::testing::mock_nccl_shares_device;
using tessel::testing::RunResult;

constexpr const char* kShared =
    "staged (ranks share a GPU; NCCL needs 2.30+ and NCCL_MULTI_RANK_GPU_ENABLE=1 for that)";

class MultiGpu : public DeviceRanks {
 public:
  static void SetUpTestSuite() { load(config("cpu")); }

  // fashion_mlp, 6 steps of 64 rows (several buckets each), clipped, AdamW, on `device`.
  static Config config(const std::string& device, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"train.clip_norm=0.5", "ddp.bucket_mb=0.1", "optim.kind=adamw",
                                 "ddp.shared_memory=false"});
    return device_config({.model = "fashion_mlp", .device = device, .steps = 6, .extra = extra});
  }
  // cfg on `workers` device ranks as threads over `gpus` fake GPUs, through the mock NCCL, which
  // lets ranks share a GPU only when `nccl_shares`.
  static RunResult run_on_gpus(const Config& cfg, int workers, int gpus, bool nccl_shares) {
    mock_nccl_shares_device(nccl_shares);
    comm::install_nccl_api(&mock_nccl());
    RunResult r;
    {
      fakes::FakeDevice fake(gpus);
      r = run(cfg, workers);
    }
    comm::install_nccl_api(nullptr);
    return r;
  }
};

void expect_gpus(const RunResult& r, const std::vector<int>& gpus, bool shared) {
  EXPECT_EQ(r.summary["engine"]["gpus"], nlohmann::json(gpus));
  EXPECT_EQ(r.summary["engine"]["gpu_shared"], shared);
}

// The stand-in's checks can fail: a block of GPU 0 handed to the runtime or to a kernel slot on
// a thread whose GPU is 1, and a mock NCCL communicator of GPU 1 given it.
TEST_F(MultiGpu, AnotherGpusMemoryFailsTheTest) {
  fakes::FakeDevice fake(2);
  DeviceScope scope(Device::kCuda, nullptr);
  fakes::set_fake_gpu(0);
  {
    const Tensor x = Tensor::zeros({8}, DType::kF32, Device::kCuda);
    fakes::set_fake_gpu(1);
    const Tensor y = Tensor::zeros({8}, DType::kF32, Device::kCuda);
    EXPECT_EQ(fakes::fake_gpu_of(x.raw()), 0);
    EXPECT_EQ(fakes::fake_gpu_of(y.raw()), 1);
    const ops::DeviceKernels& k = *ops::device_kernels(Device::kCuda);
    EXPECT_NONFATAL_FAILURE(k.relu_forward(y.raw(), x.raw(), 8, DType::kF32, nullptr),
                            "relu_forward on GPU 1 was given GPU 0's memory");
    EXPECT_NONFATAL_FAILURE(fake.runtime().zero(x.raw(), 32, nullptr),
                            "zero on GPU 1 was given GPU 0's memory");
    k.relu_forward(y.raw(), y.raw(), 8, DType::kF32, nullptr);  // its own GPU's: no failure
  }
  fakes::set_fake_gpu(0);
}

// 4 ranks over 2 GPUs: ranks 0 and 2 on GPU 0, 1 and 3 on GPU 1, sharing them; with an NCCL
// that refuses that (before 2.30) their buckets and ZeRO-3's gathers go through the host: the
// CPU ranks' bits, each rank's kernels on its own GPU's memory.
TEST_F(MultiGpu, FourRanksOnTwoGpusTrainAsTheCpuRanks) {
  for (int stage : {0, 3}) {
    SCOPED_TRACE(str("zero.stage=", stage));
    const std::vector<std::string> zero = {str("zero.stage=", stage)};
    const RunResult cpu = run(config("cpu", zero), 4);
    const RunResult cuda = run_on_gpus(config("cuda", zero), 4, 2, false);
    expect_gpus(cuda, {0, 1, 0, 1}, true);
    EXPECT_EQ(cuda.summary["engine"]["device_comm"], kShared);
    expect_same_run(cuda, cpu);
  }
}

// Deterministic mode on 4 ranks over 2 GPUs, dp and ZeRO-3, through the mock NCCL sharing the
// GPUs (2.30+) and through the host: the one-rank run's params_sha256.
TEST_F(MultiGpu, DeterministicRanksOnTwoGpusGiveTheOneRankRun) {
  const std::vector<std::string> det = {"train.deterministic=true", "ddp.micro_shard=16"};
  const RunResult one = run(config("cpu", det), 1);
  for (int stage : {0, 3})
    for (bool nccl_shares : {true, false}) {
      SCOPED_TRACE(str("zero.stage=", stage, nccl_shares ? " nccl" : " staged"));
      std::vector<std::string> zero = det;
      zero.push_back(str("zero.stage=", stage));
      const RunResult cuda = run_on_gpus(config("cuda", zero), 4, 2, nccl_shares);
      expect_gpus(cuda, {0, 1, 0, 1}, true);
      EXPECT_EQ(cuda.summary["engine"]["device_comm"], nccl_shares ? "nccl" : kShared);
      expect_same_run(cuda, one);
    }
}

// One rank per GPU (2 over 2, 4 over 4): nothing shared, so NCCL, which the mock accepts only
// with each rank's communicator on its own GPU. Two ranks' sums are the CPU's bits (a + b
// either way); four add in the mock's rank order, so their losses agree to rounding.
TEST_F(MultiGpu, RanksOnTheirOwnGpusTakeNccl) {
  for (int stage : {0, 3})
    for (int workers : {2, 4}) {
      SCOPED_TRACE(str("zero.stage=", stage, " ranks=", workers));
      const std::vector<std::string> zero = {str("zero.stage=", stage)};
      const RunResult cpu = run(config("cpu", zero), workers);
      const RunResult cuda = run_on_gpus(config("cuda", zero), workers, workers, false);
      expect_gpus(cuda, workers == 2 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2, 3},
                  false);
      EXPECT_EQ(cuda.summary["engine"]["device_comm"], "nccl");
      if (workers == 2) {
        expect_same_run(cuda, cpu);
      } else {
        const double want = cpu.summary["train_loss"], got = cuda.summary["train_loss"];
        EXPECT_NEAR(got, want, 1e-4 * want);
      }
    }
}

// 3 ranks over 2 GPUs: GPU 0 holds ranks 0 and 2, so they share, and the buckets go through
// the host as on one GPU: the CPU ranks' bits.
TEST_F(MultiGpu, ThreeRanksOnTwoGpusShareThroughTheHost) {
  const RunResult cpu = run(config("cpu"), 3);
  const RunResult cuda = run_on_gpus(config("cuda"), 3, 2, false);
  expect_gpus(cuda, {0, 1, 0}, true);
  EXPECT_EQ(cuda.summary["engine"]["device_comm"], kShared);
  expect_same_run(cuda, cpu);
}

// pp = 2 over 2 GPUs: each stage on its GPU, the link's activations and gradients through NCCL
// between them (a send only moves bytes: the CPU's bits).
TEST_F(MultiGpu, PipelineStagesOnTwoGpus) {
  const std::vector<std::string> pp = {"pp.stages=2", "pp.microbatches=4"};
  const RunResult cpu = run(config("cpu", pp), 2);
  const RunResult cuda = run_on_gpus(config("cuda", pp), 2, 2, false);
  expect_gpus(cuda, {0, 1}, false);
  EXPECT_EQ(cuda.summary["ranks"]["pipeline_device_comm"], "nccl");
  expect_same_run(cuda, cpu);
}

// dp 2 x tp 2 on 4 GPUs: the tp groups' all-reduces of activations and gradients and the dp
// groups' buckets all through NCCL between GPUs (every sum of two ranks: the CPU's bits).
TEST_F(MultiGpu, DataTimesTensorParallelOnFourGpus) {
  const std::vector<std::string> grid = {"tp.size=2"};
  const RunResult cpu = run(config("cpu", grid), 4);
  const RunResult cuda = run_on_gpus(config("cuda", grid), 4, 4, false);
  EXPECT_EQ(cuda.summary["layout"], "dp=2 tp=2");
  expect_gpus(cuda, {0, 1, 2, 3}, false);
  EXPECT_EQ(cuda.summary["engine"]["device_comm"], "nccl");
  EXPECT_EQ(cuda.summary["engine"]["tp_device_comm"], "nccl");
  expect_same_run(cuda, cpu);
}

}  // namespace
}  // namespace tessel::train
