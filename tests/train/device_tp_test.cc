// Tensor parallel on device ranks, proved on the CPU: fashion_mlp and char_gpt with
// runtime.device = cuda and tp.size = 2 on ranks as threads over the fake device
// (tests/support/fake_device.h: "device" memory in host blocks, kernel slots that run the CPU
// kernels and check every pointer is device memory) must give what the same layout gives on
// the CPU. The tp group's all-reduces of activations and gradients, and the vocab-parallel
// loss's row statistics, go through its DeviceCollectives: copies through the host (no NCCL
// installed: the CPU's own all-reduce, so the CPU's bits) or the mock NCCL
// (tests/comm/nccl_mock.h; a sum of two ranks is a + b either way, so the bits too). tp = 4,
// dp2 x tp2 on 4 ranks, and deterministic mode, as on the CPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "device_ranks_testing.h"
#include "fake_device.h"
#include "nccl_mock.h"
#include "tessel/core/clock.h"
#include "train_on.h"

namespace tessel::train {
namespace {

using comm::testing::mock_nccl;
using tessel::testing::RunResult;

// fashion_mlp, 6 steps of 64 rows, clipped (the norm sums over the tp group's cut parameters).
Config fashion_mlp(const std::string& device, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"train.clip_norm=0.5", "ddp.shared_memory=false"});
  return device_config({.model = "fashion_mlp", .device = device, .steps = 6, .extra = extra});
}

// Shortened char_gpt (2 blocks, width 64, context 32, 4 heads: 2 per rank), AdamW, clipped.
Config char_gpt(const std::string& device, std::vector<std::string> extra) {
  extra.insert(extra.begin(),
               {"train.drop_last=true", "train.clip_norm=0.5", "ddp.shared_memory=false"});
  return device_config({.model = "char_gpt", .device = device, .extra = extra});
}

class DeviceTp : public DeviceRanks {
 public:
  static void SetUpTestSuite() { load(fashion_mlp("cpu", {}), char_gpt("cpu", {})); }
};

std::string tp_comm(bool nccl) { return nccl ? "nccl" : "staged (no NCCL in this build)"; }

// Each model on tp = 2 (and `workers` / 2 dp replicas), fp32 and bf16, staged and through the
// mock NCCL, against the CPU's same layout, bit for bit.
void expect_device_runs_as_the_cpu(
    const std::function<Config(const std::string&, std::vector<std::string>)>& make, int workers,
    std::vector<std::string> extra = {}) {
  for (const char* precision : {"fp32", "bf16"}) {
    std::vector<std::string> o = extra;
    o.insert(o.end(), {"tp.size=2", str("train.precision=", precision)});
    const RunResult cpu = DeviceTp::run(make("cpu", o), workers);
    EXPECT_EQ(cpu.summary["engine"]["tp"], extra.empty() || extra[0] != "tp.sequence_parallel=true"
                                               ? "tensor_parallel"
                                               : "sequence_parallel");
    for (bool nccl : {false, true}) {
      SCOPED_TRACE(
          str(o.back(), " ", make("cpu", o).name, nccl ? " nccl" : " staged", " ranks=", workers));
      const RunResult cuda = DeviceTp::run_on_device(make("cuda", o), workers, nccl);
      EXPECT_EQ(cuda.summary["engine"]["tp_device_comm"], tp_comm(nccl));
      if (workers > 2) {
        EXPECT_EQ(cuda.summary["engine"]["device_comm"], tp_comm(nccl));  // the dp groups'
      }
      expect_same_run(cuda, cpu);
    }
  }
}

TEST_F(DeviceTp, FashionMlpTrainsAsOnTheCpu) { expect_device_runs_as_the_cpu(fashion_mlp, 2); }

// The GPT's cut attention and MLP, its vocab-parallel embedding, tied head and loss.
TEST_F(DeviceTp, CharGptTrainsAsOnTheCpu) { expect_device_runs_as_the_cpu(char_gpt, 2); }

TEST_F(DeviceTp, ModernCharGptTrainsAsOnTheCpu) {
  expect_device_runs_as_the_cpu(
      char_gpt, 2, {"model.norm=rmsnorm", "model.position=rotary", "model.mlp=swiglu"});
}

// Sequence parallelism: the activations between the cut regions split along the sequence,
// gathered and reduce-scattered along T on device memory, the whole parameters' gradients
// summed over the group at the step; alone and with 2 dp replicas.
TEST_F(DeviceTp, SequenceParallelCharGptTrainsAsOnTheCpu) {
  for (int workers : {2, 4})
    expect_device_runs_as_the_cpu(char_gpt, workers, {"tp.sequence_parallel=true"});
}

// tp = 4 (one head per rank in char_gpt; its vocabulary padded to a multiple of 4): staged,
// the CPU's bits; through the mock NCCL, whose 4-rank sums add in rank order (the CPU's ring
// does not), to rounding.
TEST_F(DeviceTp, FourRanksTrainAsOnTheCpu) {
  for (auto make : {fashion_mlp, char_gpt}) {
    const std::vector<std::string> tp = {"tp.size=4"};
    const RunResult cpu = run(make("cpu", tp), 4);
    for (bool nccl : {false, true}) {
      SCOPED_TRACE(str(make("cpu", tp).name, nccl ? " nccl" : " staged"));
      const RunResult cuda = run_on_device(make("cuda", tp), 4, nccl);
      EXPECT_EQ(cuda.summary["engine"]["tp_device_comm"], tp_comm(nccl));
      if (!nccl) {
        expect_same_run(cuda, cpu);
      } else {
        const double want = cpu.summary["train_loss"], got = cuda.summary["train_loss"];
        EXPECT_NEAR(got, want, 1e-5 * want);
      }
    }
  }
}

// dp2 x tp2 on 4 ranks: the tp groups' all-reduces and the dp groups' buckets, each through
// their own DeviceCollectives.
TEST_F(DeviceTp, DataAndTensorParallelTrainAsOnTheCpu) {
  for (auto make : {fashion_mlp, char_gpt}) expect_device_runs_as_the_cpu(make, 4);
}

// Deterministic mode: the CPU's tp = 2 run's parameters (exact dp sums, tp sums of two ranks),
// on 2 ranks and with 2 dp replicas on 4. fashion_mlp's tp = 2 run is the one-rank run too
// (its cut layers sum two partial products in one rounding, as the whole GEMM's order gives
// here); char_gpt's is not (its attention and loss split their sums), on the CPU as here.
TEST_F(DeviceTp, DeterministicModeGivesTheCpuRun) {
  for (auto make : {fashion_mlp, char_gpt}) {
    const std::vector<std::string> det = {"train.deterministic=true", "ddp.micro_shard=4"};
    std::vector<std::string> tp = det;
    tp.push_back("tp.size=2");
    const RunResult cpu = run(make("cpu", tp), 2);
    const bool mlp = make("cpu", {}).model.kind == nn::ModelKind::kMlp;
    if (mlp) {
      EXPECT_EQ(cpu.summary["params_sha256"], run(make("cpu", det), 1).summary["params_sha256"]);
    }
    for (bool nccl : {false, true})
      for (int workers : {2, 4}) {
        SCOPED_TRACE(
            str(mlp ? "fashion_mlp " : "char_gpt ", nccl ? "nccl" : "staged", " ranks=", workers));
        const RunResult cuda = run_on_device(make("cuda", tp), workers, nccl);
        EXPECT_EQ(cuda.summary["engine"]["grad_sync"], "exact");
        expect_same_run(cuda, cpu);
      }
  }
}

// Rank 1 hangs after step 2 outside any call: rank 0's next tp all-reduce waits until
// comm.timeout_s and names it, staged (the host's all-reduce) or through NCCL (its wait).
TEST_F(DeviceTp, HungRankIsNamedAtTheDeadline) {
  const Config cfg = fashion_mlp("cuda", {"tp.size=2", "debug.fail_rank=1", "debug.fail_mode=hang",
                                          "debug.fail_step=2", "comm.timeout_s=1"});
  comm::CommOptions options;
  options.timeout_s = cfg.comm.timeout_s;  // as the tessel binary's communicators
  RunOptions opts;
  opts.progress = false;
  opts.run_dir = tessel::testing::test_run_dir("device_tp_hang");
  for (bool nccl : {false, true}) {
    SCOPED_TRACE(nccl ? "nccl" : "staged");
    comm::install_nccl_api(nccl ? &mock_nccl() : nullptr);
    fakes::FakeDevice fake;
    std::filesystem::remove_all(opts.run_dir);
    const double t0 = now_seconds();
    std::string error;  // rank 0's (the hung rank's own may reach run_threads first)
    try {
      comm::run_threads(
          2,
          [&](comm::Communicator& c) {
            try {
              Trainer(cfg, opts, &c, mlp_data_).run();
            } catch (const std::exception& e) {
              if (c.rank() == 0) error = e.what();
              throw;
            }
          },
          options);
    } catch (const std::exception&) {
      // Expected: the run fails; rank 0's account is checked below.
    }
    EXPECT_NE(error.find("rank 1 stopped making progress"), std::string::npos) << error;
    // The row-cut layer's all-reduce of its output (64 rows x 256), through the tp group's path.
    EXPECT_NE(error.find(nccl ? "nccl: allreduce" : "comm: allreduce"), std::string::npos) << error;
    EXPECT_NE(error.find("16384 x f32"), std::string::npos) << error;
    EXPECT_LT(now_seconds() - t0, 1 + 5.0) << error;  // comm.timeout_s + 5 s (a loaded host)
  }
}

}  // namespace
}  // namespace tessel::train
