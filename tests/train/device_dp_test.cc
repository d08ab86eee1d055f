// Data parallel on device ranks, proved on the CPU: fashion_mlp with runtime.device = cuda on
// 2 and 4 ranks (threads) over the fake device (tests/support/fake_device.h), whose "device"
// memory is host blocks and whose kernel slots run the CPU kernels, must give what the same
// layout gives on the CPU. The ranks' buckets go through their DeviceCollectives: copies
// through the host (no NCCL installed: the CPU's own all-reduce, so the CPU's bits), or the
// mock NCCL (tests/comm/nccl_mock.h: ranks as threads, sums in rank order), whose buckets
// overlap the backward. zero.shard_size's shards go across the groups through a second
// DeviceCollectives, over the replica group. Deterministic mode, its exact sum on the device, gives
// one params_sha256 for 1, 2 and 4 device ranks, the CPU's. A rank that hangs is named at the
// deadline, through either path, and a rank whose NCCL dies ends the run, named.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "device_ranks_testing.h"
#include "fake_device.h"
#include "nccl_mock.h"
#include "tessel/core/clock.h"
#include "tessel/ops/exact.h"
#include "train_on.h"

namespace tessel::train {
namespace {

using comm::testing::mock_nccl;
using comm::testing::mock_nccl_delay;
using comm::testing::mock_nccl_fault;
using comm::testing::mock_nccl_state;
using comm::testing::MockFault;
using tessel::testing::example;
using tessel::testing::RunResult;
using tessel::testing::train_on;

class DeviceDp : public DeviceRanks {
 public:
  static void SetUpTestSuite() { load(example("fashion_mlp", {})); }

  // fashion_mlp, 6 steps of 64 rows (several buckets each), clipped, on `device`.
  static Config config(const std::string& device, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"train.clip_norm=0.5", "ddp.bucket_mb=0.1"});
    return device_config({.model = "fashion_mlp", .device = device, .steps = 6, .extra = extra});
  }
};

// Ranks sharing the one (fake) device, no NCCL: the host's all-reduce on staged copies.
TEST_F(DeviceDp, StagedRanksTrainAsTheCpuRanks) {
  for (const char* precision : {"fp32", "bf16"})
    for (int workers : {2, 4}) {
      SCOPED_TRACE(str(precision, " dp=", workers));
      const std::string p = str("train.precision=", precision);
      // The CPU ranks' bucket all-reduce (their default on one host sums in shared memory).
      const RunResult cpu = run(config("cpu", {p, "ddp.shared_memory=false"}), workers);
      fakes::FakeDevice fake;
      const RunResult cuda = run(config("cuda", {p}), workers);
      expect_same_run(cuda, cpu);
      EXPECT_EQ(cuda.summary["engine"]["grad_sync"], "allreduce");
      EXPECT_EQ(cuda.summary["engine"]["device_comm"], "staged (no NCCL in this build)");
      EXPECT_GT(fake.runtime().copies, 0);
    }
}

// ZeRO-1: each rank's gradient shard reduce-scattered, its optimizer state and update over
// its shards, the updated shards all-gathered into every replica, all on device memory.
TEST_F(DeviceDp, ZeroOneRanksTrainAsTheCpuRanks) {
  for (bool nccl : {false, true})
    for (int workers : {2, 4}) {
      SCOPED_TRACE(str(nccl ? "nccl" : "staged", " dp=", workers));
      const std::vector<std::string> zero = {"zero.stage=1", "train.precision=bf16",
                                             "optim.kind=adamw", "ddp.shared_memory=false"};
      const RunResult cpu = run(config("cpu", zero), workers);
      const RunResult cuda = run_on_device(config("cuda", zero), workers, nccl);
      EXPECT_EQ(cuda.summary["engine"]["grad_sync"], "reduce_scatter");
      if (!nccl || workers == 2) {
        expect_same_run(cuda, cpu);
      } else {
        const double want = cpu.summary["train_loss"], got = cuda.summary["train_loss"];
        EXPECT_NEAR(got, want, 1e-4 * want);
      }
    }
}

// ZeRO-2 (only this rank's gradient shards kept, each bucket reduce-scattered into them) and
// ZeRO-3 (only parameter shards kept, each unit all-gathered into a device buffer before a
// block's forward and backward and released after), staged and through the mock NCCL: the CPU
// ranks' bits where the sums run in the same order, to rounding where the mock's 4-rank order
// differs.
void expect_zero_runs_as_the_cpu(int stage, const RunResult& cpu, const RunResult& cuda, bool nccl,
                                 int workers) {
  EXPECT_EQ(cuda.summary["engine"]["grad_sync"], "reduce_scatter_shard");
  EXPECT_EQ(cuda.summary["engine"]["store"], stage == 3 ? "sharded" : "replicated");
  EXPECT_EQ(cuda.summary["engine"]["device_comm"],
            nccl ? "nccl" : "staged (no NCCL in this build)");
  if (!nccl || workers == 2) {
    expect_same_run(cuda, cpu);
  } else {
    const double want = cpu.summary["train_loss"], got = cuda.summary["train_loss"];
    EXPECT_NEAR(got, want, 1e-4 * want);
  }
}

void zero_on_device_as_on_the_cpu(int stage) {
  for (const char* precision : {"fp32", "bf16"})
    for (int workers : {2, 4}) {
      const std::vector<std::string> zero = {str("zero.stage=", stage),
                                             str("train.precision=", precision), "optim.kind=adamw",
                                             "ddp.shared_memory=false"};
      const RunResult cpu = DeviceDp::run(DeviceDp::config("cpu", zero), workers);
      // ZeRO's shard paths are the CPU's too: against plain data parallel, a bug they share
      // still shows.
      std::vector<std::string> plain = zero;
      plain[0] = "zero.stage=0";
      const double dp_loss = DeviceDp::run(DeviceDp::config("cpu", plain), workers)
                                 .summary["train_loss"]
                                 .get<double>();
      for (bool nccl : {false, true}) {
        SCOPED_TRACE(str("zero.stage=", stage, " ", precision, " ", nccl ? "nccl" : "staged",
                         " dp=", workers));
        const RunResult cuda =
            DeviceDp::run_on_device(DeviceDp::config("cuda", zero), workers, nccl);
        expect_zero_runs_as_the_cpu(stage, cpu, cuda, nccl, workers);
        // bf16: the 16-bit messages round other sums than plain data parallel's all-reduce.
        const double rtol = std::string(precision) == "fp32" ? 1e-4 : 1e-2;
        EXPECT_NEAR(cuda.summary["train_loss"].get<double>(), dp_loss, rtol * dp_loss);
      }
    }
}

TEST_F(DeviceDp, ZeroTwoRanksTrainAsTheCpuRanks) { zero_on_device_as_on_the_cpu(2); }

TEST_F(DeviceDp, ZeroThreeRanksTrainAsTheCpuRanks) { zero_on_device_as_on_the_cpu(3); }

// Deterministic mode with gradient and parameter shards: the one-worker CPU run's bits.
TEST_F(DeviceDp, DeterministicZeroGivesTheOneWorkerRun) {
  const std::vector<std::string> det = {"train.deterministic=true", "ddp.micro_shard=16"};
  const RunResult cpu = run(config("cpu", det), 1);
  for (int stage : {2, 3})
    for (bool nccl : {false, true}) {
      SCOPED_TRACE(str("zero.stage=", stage, nccl ? " nccl" : " staged"));
      comm::install_nccl_api(nccl ? &mock_nccl() : nullptr);
      std::vector<std::string> zero = det;
      zero.push_back(str("zero.stage=", stage));
      fakes::FakeDevice fake;
      for (int workers : {2, 4}) expect_same_run(run(config("cuda", zero), workers), cpu);
    }
}

// zero.shard_size = 2 on 4 ranks: ZeRO within two shard groups of two ranks, each rank's
// summed gradient shard all-reduced across the groups through a second DeviceCollectives made
// over the replica group (staged, or the mock NCCL), on device memory. Every sum is of two
// ranks (a + b either way): the CPU's same layout's bits, through either path.
TEST_F(DeviceDp, ShardGroupsTrainAsTheCpuRanks) {
  for (int stage : {1, 2, 3})
    for (const char* precision : {"fp32", "bf16"}) {
      const std::vector<std::string> zero = {str("zero.stage=", stage), "zero.shard_size=2",
                                             str("train.precision=", precision), "optim.kind=adamw",
                                             "ddp.shared_memory=false"};
      const RunResult cpu = run(config("cpu", zero), 4);
      for (bool nccl : {false, true}) {
        SCOPED_TRACE(str("zero.stage=", stage, " ", precision, " ", nccl ? "nccl" : "staged"));
        const RunResult cuda = run_on_device(config("cuda", zero), 4, nccl);
        const std::string kind = nccl ? "nccl" : "staged (no NCCL in this build)";
        EXPECT_EQ(cuda.summary["engine"]["device_comm"], kind);
        EXPECT_EQ(cuda.summary["engine"]["across_device_comm"], kind);
        EXPECT_EQ(cuda.summary["engine"]["replica_groups"], 2);
        expect_same_run(cuda, cpu);
        EXPECT_GT(cuda.summary["ranks"]["per_rank"][0]["comm_bytes_across_groups"].get<double>(),
                  0);
        EXPECT_EQ(mock_nccl_state().live_comms, 0);  // both communicators closed
      }
    }
}

// Deterministic mode with shard groups: the one-worker CPU run's bits.
TEST_F(DeviceDp, DeterministicShardGroupsGiveTheOneWorkerRun) {
  const std::vector<std::string> det = {"train.deterministic=true", "ddp.micro_shard=16"};
  const RunResult cpu = run(config("cpu", det), 1);
  for (int stage : {1, 2, 3})
    for (bool nccl : {false, true}) {
      SCOPED_TRACE(str("zero.stage=", stage, nccl ? " nccl" : " staged"));
      comm::install_nccl_api(nccl ? &mock_nccl() : nullptr);
      std::vector<std::string> zero = det;
      zero.insert(zero.end(), {str("zero.stage=", stage), "zero.shard_size=2"});
      fakes::FakeDevice fake;
      const RunResult cuda = run(config("cuda", zero), 4);
      expect_same_run(cuda, cpu);
      // The exact sum runs over all of dp, through a DeviceCollectives of its 4 ranks.
      EXPECT_EQ(cuda.summary["engine"]["dp_device_comm"],
                nccl ? "nccl" : "staged (no NCCL in this build)");
    }
}

// The memory ledger's measured bytes of rank 0's model state (parameters, gradients, optimizer
// state) on 4 device ranks shrink with the stage as the CPU ranks' do (to the device
// allocator's size classes).
TEST_F(DeviceDp, ZeroMemoryPerRankShrinksAsOnTheCpu) {
  auto bytes = [](const RunResult& r, const char* category) {
    return r.summary["ranks"]["per_rank"][0]["memory"]["bytes"][category].get<double>();
  };
  double last = 0;
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(str("zero.stage=", stage));
    const std::vector<std::string> zero = {str("zero.stage=", stage), "optim.kind=adamw",
                                           "ddp.shared_memory=false"};
    const RunResult cpu = run(config("cpu", zero), 4);
    fakes::FakeDevice fake;
    const RunResult cuda = run(config("cuda", zero), 4);
    double total = 0;
    for (const char* c : {"parameters", "gradients", "optimizer_state"}) {
      EXPECT_NEAR(bytes(cuda, c), bytes(cpu, c), 0.01 * bytes(cpu, c)) << c;  // size classes
      total += bytes(cuda, c);
    }
    if (stage > 0) {
      EXPECT_LT(total, last);
    }
    last = total;
  }
}

// Through NCCL (the mock): two ranks' sums are the CPU's bits (a + b either way); four ranks
// add in the mock's rank order, not the CPU ring's, so their losses agree to rounding.
TEST_F(DeviceDp, NcclRanksTrainAsTheCpuRanks) {
  for (int workers : {2, 4}) {
    SCOPED_TRACE(str("dp=", workers));
    const RunResult cpu = run(config("cpu", {"ddp.shared_memory=false"}), workers);
    const RunResult cuda = run_on_device(config("cuda"), workers, true);
    EXPECT_EQ(cuda.summary["engine"]["device_comm"], "nccl");
    if (workers == 2) {
      expect_same_run(cuda, cpu);
    } else {
      const double want = cpu.summary["train_loss"], got = cuda.summary["train_loss"];
      EXPECT_NEAR(got, want, 1e-5 * want);
    }
    EXPECT_EQ(mock_nccl_state().live_comms, 0);  // every rank closed its communicator
    EXPECT_EQ(mock_nccl_state().live_streams, 0);
  }
}

// Device buckets overlap the backward: through the mock NCCL, whose every work item completes
// kDelay late, each rank enqueues a bucket as the backward completes it and waits for them
// only at the step's end. Rank 0's backward blocks are slowed 40 times (debug.slow_factor):
// its buckets complete behind the rest of its backward, which its metrics show as overlapped
// time (waited for at launch, they would show none); rank 1, fast,
// finds them unfinished at its step's end (they need rank 0's) and shows that wait as exposed.
// (Sleeps only lengthen: the lower bounds hold on a loaded host.)
TEST_F(DeviceDp, NcclBucketsOverlapTheBackward) {
  constexpr double kDelay = 0.01;
  constexpr int kSteps = 6;
  comm::install_nccl_api(&mock_nccl());
  mock_nccl_delay(kDelay);
  fakes::FakeDevice fake;
  const RunResult r = run(config("cuda", {"debug.slow_rank=0", "debug.slow_factor=40"}), 2);
  EXPECT_EQ(r.summary["engine"]["device_comm"], "nccl");
  const auto& ranks = r.summary["ranks"]["per_rank"];
  const double overlapped = ranks[0]["comm_overlapped_seconds"];
  const double exposed = ranks[0]["comm_exposed_seconds"];
  const double fast_exposed = ranks[1]["comm_exposed_seconds"];
  std::printf("[ overlap ] rank 0: %.3f s overlapped, %.4f s exposed; rank 1: %.3f s exposed\n",
              overlapped, exposed, fast_exposed);
  EXPECT_GE(overlapped, kSteps * kDelay);  // at least a bucket per step hidden
  EXPECT_GE(fast_exposed, kSteps * kDelay);
}

// Deterministic mode: the exact integer sum of the micro-shards, kept on the device (the
// exact slots), the integers all-reduced staged or through NCCL (the mock's rank-order int64
// sums are exact too), gives the one-worker CPU run's parameters for any worker count. No
// micro-shard comes down to the host: through NCCL the run copies to the host less than one
// parameter copy more than plain data parallel does (the checkpoint, losses, the scales'
// maxima), where copying each micro-shard down took two per rank and step.
TEST_F(DeviceDp, DeterministicModeGivesOneRunForAnyWorkerCount) {
  const std::vector<std::string> det = {"train.deterministic=true", "ddp.micro_shard=16"};
  const RunResult cpu = run(config("cpu", det), 1);
  const double param_bytes = 4.0 * static_cast<double>(cpu.params.size());
  for (bool nccl : {false, true})
    for (int workers : {1, 2, 4}) {
      SCOPED_TRACE(str(nccl ? "nccl" : "staged", " dp=", workers));
      comm::install_nccl_api(nccl ? &mock_nccl() : nullptr);
      double plain_bytes = 0;
      {
        fakes::FakeDevice fake;
        run(config("cuda"), workers);
        plain_bytes = static_cast<double>(fake.runtime().to_host_bytes);
      }
      fakes::FakeDevice fake;
      const RunResult cuda = run(config("cuda", det), workers);
      EXPECT_EQ(cuda.summary["engine"]["grad_sync"], "exact");
      expect_same_run(cuda, cpu);
      for (const char* slot : {"exact_collect", "exact_quantise", "exact_dequantise"})
        EXPECT_GT(fake.calls(slot), 0) << slot;
      if (nccl || workers == 1) {  // staged collectives copy the integers through the host
        EXPECT_LT(static_cast<double>(fake.runtime().to_host_bytes), plain_bytes + param_bytes);
      }
    }
}

// Each exact slot broken as a kernel's launch bounds could break it (quantise missing each
// range's last value, dequantise its first, the maximum over the first value only): the run's
// bits leave the CPU's.
TEST_F(DeviceDp, DeterministicModeFailsWithABrokenExactKernel) {
  const std::vector<std::string> det = {"train.deterministic=true", "ddp.micro_shard=16"};
  const RunResult cpu = run(config("cpu", det), 1);
  for (int broken = 0; broken < 3; ++broken) {
    SCOPED_TRACE(str("broken slot ", broken));
    fakes::FakeDevice fake;
    ops::DeviceKernels k = *ops::device_kernels(Device::kCuda);
    if (broken == 0)
      k.exact_quantise = [](int64_t* acc, const float* g, int64_t n, double scale, void*) {
        DeviceScope host(Device::kCpu, nullptr);  // the CPU loop
        ops::exact_quantise(acc, g, n - 1, scale);
      };
    if (broken == 1)
      k.exact_collect = [](float* kept, float* max, const float* g, int64_t n, void*) {
        DeviceScope host(Device::kCpu, nullptr);
        ops::exact_collect(kept, max, g, 1);
        std::copy(g + 1, g + std::max<int64_t>(n, 1), kept + 1);
      };
    if (broken == 2)
      k.exact_dequantise = [](float* out, const int64_t* sums, int64_t n, double scale, void*) {
        DeviceScope host(Device::kCpu, nullptr);
        ops::exact_dequantise(out + 1, sums + 1, n - 1, scale);
      };
    ops::install_device_kernels(Device::kCuda, &k);
    EXPECT_NE(run(config("cuda", det), 2).summary["params_sha256"], cpu.summary["params_sha256"]);
  }
}

struct Failed {
  std::string type, error;
  double seconds = 0;
};

// The failure's kind, for its account.
std::string kind_of(const std::exception& e) {
  if (dynamic_cast<const Timeout*>(&e)) return "Timeout";
  if (dynamic_cast<const CommError*>(&e)) return "CommError";
  return "other";
}

// Trains cfg on `workers` ranks as threads whose communicators take cfg's comm.timeout_s (as
// the tessel binary's do), expecting a failure: rank 0's account of it (the failing rank's own
// error may reach run_threads first).
Failed run_failing(const Config& cfg, int workers, const data::Splits* data) {
  comm::CommOptions options;
  options.timeout_s = cfg.comm.timeout_s;
  RunOptions opts;
  opts.progress = false;
  opts.run_dir = tessel::testing::test_run_dir("device_dp_failing");
  std::filesystem::remove_all(opts.run_dir);
  const double t0 = now_seconds();
  Failed f{"none", "", 0};
  try {
    comm::run_threads(
        workers,
        [&](comm::Communicator& c) {
          try {
            Trainer(cfg, opts, &c, data).run();
          } catch (const std::exception& e) {
            if (c.rank() == 0) f = {kind_of(e), e.what(), now_seconds() - t0};
            throw;
          }
        },
        options);
  } catch (const std::exception& e) {
    if (f.type == "none") f = {kind_of(e), e.what(), now_seconds() - t0};
  }
  return f;
}

// Rank 1 hangs after step 2 outside any call: the others' next bucket waits until
// comm.timeout_s and names it, with NCCL (its wait) or without (the host's all-reduce).
TEST_F(DeviceDp, HungRankIsNamedAtTheDeadline) {
  const std::vector<std::string> hang = {"debug.fail_rank=1", "debug.fail_mode=hang",
                                         "debug.fail_step=2", "comm.timeout_s=1"};
  fakes::FakeDevice fake;
  for (bool nccl : {false, true}) {
    SCOPED_TRACE(nccl ? "nccl" : "staged");
    comm::install_nccl_api(nccl ? &mock_nccl() : nullptr);
    const Failed f = run_failing(config("cuda", hang), 2, mlp_data_);
    EXPECT_NE(f.type, "none");
    EXPECT_NE(f.error.find("rank 1 stopped making progress"), std::string::npos) << f.error;
    EXPECT_LT(f.seconds, 1 + 5.0) << f.error;  // comm.timeout_s + 5 s (a loaded host)
  }
}

// Rank 1's process dies inside NCCL (its work never runs, its thread shows no more life, its
// peers' NCCL reports ncclRemoteError): the run ends with CommError naming rank 1, whose NCCL
// side went silent while rank 0's polled, within comm.timeout_s + 5 s (and without waiting for
// the deadline: not a Timeout).
TEST_F(DeviceDp, DeadNcclRankEndsTheRun) {
  constexpr double kTimeout = 3;
  fakes::FakeDevice fake;
  comm::install_nccl_api(&mock_nccl());
  mock_nccl_fault(1, MockFault::kDie, 5);
  const Failed f = run_failing(config("cuda", {str("comm.timeout_s=", kTimeout)}), 2, mlp_data_);
  EXPECT_EQ(f.type, "CommError") << f.error;
  EXPECT_NE(f.error.find("ncclRemoteError"), std::string::npos) << f.error;
  EXPECT_NE(f.error.find("allreduce #5"), std::string::npos) << f.error;  // the dead call
  EXPECT_NE(f.error.find("rank 1 stopped making progress: its NCCL side has shown no activity"),
            std::string::npos)
      << f.error;
  EXPECT_LT(f.seconds, kTimeout + 5.0) << f.error;
}

}  // namespace
}  // namespace tessel::train
