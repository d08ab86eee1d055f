// Pipeline parallel on device ranks, proved on the CPU: fashion_mlp and char_gpt (shortened,
// its LM head tied to the embedding's table on the other stage) with runtime.device = cuda on
// ranks as threads over the fake device (tests/support/fake_device.h: "device" memory in host
// blocks, kernel slots that run the CPU kernels and refuse host pointers) must train as the
// same layout on the CPU: pp = 2 under gpipe and 1f1b, fp32 and bf16, each boundary's
// activations and gradients (and the tied table's gradient) moving through the link's
// DeviceCollectives, staged (copies through the host: no NCCL installed) or the mock NCCL
// (tests/comm/nccl_mock.h). A send only moves bytes, so every run is the CPU's bits; dp 2 x pp 2
// too (two ranks' sums are a + b either way). Deterministic mode gives the one-rank CPU run's
// parameters for pp = 2 and dp 2 x pp 2.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device_ranks_testing.h"
#include "fake_device.h"
#include "nccl_mock.h"
#include "tessel/comm/staged_collectives.h"
#include "tessel/comm/threads.h"
#include "tessel/tensor/device.h"
#include "train_on.h"

namespace tessel::train {
namespace {

using comm::testing::mock_nccl;
using tessel::testing::RunResult;

constexpr const char* kStaged = "staged (no NCCL in this build)";

class DevicePp : public DeviceRanks {
 public:
  static void SetUpTestSuite() { load(mlp("cpu"), gpt("cpu")); }

  // fashion_mlp, 6 steps of 64 rows, clipped, on `device`.
  static Config mlp(const std::string& device, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"train.clip_norm=0.5", "ddp.bucket_mb=0.1"});
    return device_config({.model = "fashion_mlp", .device = device, .steps = 6, .extra = extra});
  }
  // char_gpt shortened (2 blocks, width 64, context 32), 4 steps of 8 rows, AdamW, clipped,
  // then evaluated (forward only through the links).
  static Config gpt(const std::string& device, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), "train.clip_norm=0.5");
    return device_config({.model = "char_gpt", .device = device, .extra = extra});
  }
};

// The evaluation's loss is the same bits where the layouts are (other dp sizes add the
// replicas' test losses in another order).
void expect_same_run(const RunResult& got, const RunResult& want, bool same_layout = true) {
  train::expect_same_run(got, want);
  const double test = got.summary.value("test_loss", 0.0);
  const double test_want = want.summary.value("test_loss", 0.0);
  if (same_layout) {
    EXPECT_EQ(test, test_want);
  } else {
    EXPECT_NEAR(test, test_want, 1e-6 * test_want);
  }
}

// Which path the pipeline's links took on the device.
void expect_links(const RunResult& r, bool nccl) {
  EXPECT_EQ(r.summary["ranks"]["pipeline_device_comm"], nccl ? "nccl" : kStaged);
}

// pp = 2 under each schedule (its settings) in each precision, staged and through the mock
// NCCL: the CPU's bits.
void pipeline_as_on_the_cpu(const std::string& model,
                            const std::vector<std::vector<std::string>>& schedules,
                            const std::vector<std::string>& precisions = {"fp32", "bf16"}) {
  auto config = [&](const std::string& device, const std::vector<std::string>& extra) {
    return model == "gpt" ? DevicePp::gpt(device, extra) : DevicePp::mlp(device, extra);
  };
  for (const std::vector<std::string>& schedule : schedules)
    for (const std::string& precision : precisions) {
      std::vector<std::string> pp = {"pp.stages=2", "pp.microbatches=4",
                                     str("train.precision=", precision)};
      pp.insert(pp.end(), schedule.begin(), schedule.end());
      const RunResult cpu = DevicePp::run(config("cpu", pp), 2);
      for (bool nccl : {false, true}) {
        SCOPED_TRACE(str(model, " ", schedule[0], " ", precision, nccl ? " nccl" : " staged"));
        const RunResult cuda = DevicePp::run_on_device(config("cuda", pp), 2, nccl);
        EXPECT_EQ(cuda.summary["layout"], "pp=2");
        expect_links(cuda, nccl);
        expect_same_run(cuda, cpu);
      }
    }
}

const std::vector<std::vector<std::string>> kGpipeAnd1f1b = {{"pp.schedule=gpipe"},
                                                             {"pp.schedule=1f1b"}};
// Interleaved 1F1B (two chunks per stage: more links) and zb-h1 (backwards split into B and
// W; the tied table's gradient sent once, with the last W).
const std::vector<std::vector<std::string>> kInterleavedAndZbH1 = {
    {"pp.schedule=interleaved", "pp.virtual_stages=2"}, {"pp.schedule=zb-h1"}};

TEST_F(DevicePp, FashionMlpTrainsAsOnTheCpu) { pipeline_as_on_the_cpu("mlp", kGpipeAnd1f1b); }

TEST_F(DevicePp, InterleavedAndZbH1TrainAsOnTheCpu) {
  pipeline_as_on_the_cpu("mlp", kInterleavedAndZbH1, {"fp32"});
  pipeline_as_on_the_cpu("gpt", kInterleavedAndZbH1, {"bf16"});
}

// The LM head's stage keeps the tied table in device memory: its gradient share travels on the
// tied link, the updated values come back after each step.
TEST_F(DevicePp, TiedCharGptTrainsAsOnTheCpu) {
  const auto blocks = nlohmann::json::parse(R"([["embed", "block0"], ["block1", "head"]])");
  const RunResult one_step = run(gpt("cpu", {"pp.stages=2", "train.max_steps=1"}), 2);
  EXPECT_EQ(one_step.summary["ranks"]["pipeline_stage_blocks"], blocks);
  EXPECT_TRUE(one_step.summary.contains("test_loss"));  // the runs are evaluated too
  pipeline_as_on_the_cpu("gpt", kGpipeAnd1f1b);
}

// dp 2 x pp 2 on 4 ranks: the pipeline's dp groups reduce their buckets on device memory too.
TEST_F(DevicePp, DataTimesPipelineTrainsAsOnTheCpu) {
  for (const char* precision : {"fp32", "bf16"}) {
    const std::vector<std::string> grid = {"pp.stages=2", "pp.microbatches=2",
                                           str("train.precision=", precision),
                                           "ddp.shared_memory=false"};
    const RunResult cpu = run(mlp("cpu", grid), 4);
    for (bool nccl : {false, true}) {
      SCOPED_TRACE(str(precision, nccl ? " nccl" : " staged"));
      const RunResult cuda = run_on_device(mlp("cuda", grid), 4, nccl);
      EXPECT_EQ(cuda.summary["layout"], "dp=2 pp=2");
      EXPECT_EQ(cuda.summary["engine"]["device_comm"], nccl ? "nccl" : kStaged);
      expect_links(cuda, nccl);
      expect_same_run(cuda, cpu);
    }
  }
}

// Deterministic mode: the exact sum of the micro-shards gives the one-rank CPU run's parameters
// for pp = 2 and dp 2 x pp 2, with the links staged or through NCCL.
TEST_F(DevicePp, DeterministicModeGivesTheOneRankRun) {
  const std::vector<std::string> det = {"train.deterministic=true", "ddp.micro_shard=16"};
  const RunResult cpu = run(mlp("cpu", det), 1);
  std::vector<std::string> pp = det;
  pp.insert(pp.end(), {"pp.stages=2", "pp.microbatches=1"});
  for (bool nccl : {false, true})
    for (int workers : {2, 4}) {
      SCOPED_TRACE(str(workers, " ranks", nccl ? " nccl" : " staged"));
      const RunResult cuda = run_on_device(mlp("cuda", pp), workers, nccl);
      expect_links(cuda, nccl);
      expect_same_run(cuda, cpu, false);
    }
}

// The links' point to point on device memory: staged, a sender goes on (its buffer reusable at
// once) before its receiver takes anything; staged and through the mock NCCL, the messages
// arrive in the order they were sent.
TEST_F(DevicePp, DeviceSendsArriveInOrder) {
  fakes::FakeDevice fake;
  comm::CommOptions options;
  options.timeout_s = 5;
  for (bool nccl : {false, true}) {
    SCOPED_TRACE(nccl ? "nccl" : "staged");
    comm::run_threads(
        2,
        [&](comm::Communicator& c) {
          DeviceScope scope(Device::kCuda, nullptr);
          std::unique_ptr<comm::DeviceCollectives> p2p;
          if (nccl)
            p2p = std::make_unique<comm::NcclCommunicator>(c, mock_nccl());
          else
            p2p = std::make_unique<comm::StagedCollectives>(c, Device::kCuda, nullptr);
          const comm::ElemType elem = comm::ElemType::kF32;
          std::vector<Tensor> bufs;
          std::vector<comm::NcclWork> works;
          for (int k = 1; k <= 3 && c.rank() == 0; ++k) {
            Tensor host = Tensor::empty({5});
            host.fill_(static_cast<float>(k));
            bufs.push_back(host.to_device(Device::kCuda));
            works.push_back(p2p->send(bufs.back().raw(), 5, elem, 1, {}));
            if (!nccl) {
              EXPECT_TRUE(works.back().done());  // its bytes are on the host already
            }
          }
          if (!nccl) c.barrier();  // staged: rank 1 receives after every send returned
          for (int k = 1; k <= 3 && c.rank() == 1; ++k) {
            bufs.push_back(Tensor::zeros({5}, DType::kF32, Device::kCuda));
            works.push_back(p2p->recv(bufs.back().raw(), 5, elem, 0, {}));
          }
          for (const comm::NcclWork& w : works) w.wait();
          for (int k = 1; k <= 3 && c.rank() == 1; ++k)
            EXPECT_EQ(bufs[static_cast<size_t>(k - 1)].to_device(Device::kCpu).data<float>()[4],
                      static_cast<float>(k));
          p2p->close();
        },
        options);
  }
}

}  // namespace
}  // namespace tessel::train
