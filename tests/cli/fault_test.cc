// Fault tolerance end to end (docs/fault_tolerance.md), with ranks as threads: a failed rank
// (an error, or a rank that hangs) restarts the run from the in-memory snapshot and ends with
// the uninterrupted parameters; SIGTERM stops at a step with a checkpoint and exit 143; a
// damaged newest checkpoint falls back to the previous one; impossible sizes and huge values
// give short, clear errors. The MPI side runs in mpi_fault_trials (bench/fault_trials.py).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

namespace fs = std::filesystem;

namespace {

const std::string kTessel = std::string(TESSEL_BINARY_DIR) + "/apps/tessel/tessel";
const std::string kSpiral = std::string(TESSEL_SOURCE_DIR) + "/examples/spiral.toml";
// Deterministic data parallel: every rank count and every restart gives the same bits.
const std::string kTrain = "train " + kSpiral +
                           " --quiet --set train.deterministic=true --set train.batch=24 "
                           "--set ddp.micro_shard=2 --set train.drop_last=true "
                           "--set train.epochs=20 --set model.dropout=0.1 ";

struct Result {
  int exit_code = -1;  // -1: killed by a signal (a crash)
  std::string output;  // stdout and stderr together
};

Result shell(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  Result r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Result run(const std::string& args) { return shell(kTessel + " " + args); }

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class Fault : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tessel_fault_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string sha(const std::string& run_dir) const {
    std::ifstream in(path(run_dir) + "/summary.json");
    return nlohmann::json::parse(in)["params_sha256"].get<std::string>();
  }
  // The uninterrupted run's params_sha256 (on 1 rank: the same bits as any rank count).
  std::string reference() {
    Result r = run(kTrain + "--run-dir " + path("reference"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return sha("reference");
  }
  fs::path dir_;
};

TEST_F(Fault, FailedRankRestartsFromTheSnapshotAndEndsWithTheSameParameters) {
  const std::string want = reference();
  const std::string recover = kTrain +
                              "--workers 4 --set train.max_restarts=2 "
                              "--set checkpoint.snapshot_steps=10 --set debug.fail_step=137 ";
  Result thrown = run(recover + "--set debug.fail_rank=2 --run-dir " + path("throw"));
  ASSERT_EQ(thrown.exit_code, 0) << thrown.output;
  EXPECT_TRUE(has(thrown.output, "resumes from the in-memory snapshot of step 130"))
      << thrown.output;
  EXPECT_EQ(sha("throw"), want);
  {
    std::ifstream in(path("throw") + "/summary.json");
    const nlohmann::json restarts = nlohmann::json::parse(in).at("restarts");
    ASSERT_EQ(restarts.size(), 1u);
    EXPECT_EQ(restarts[0]["from_step"], 130);
  }
  // A rank that hangs outside any call: the others name it at the deadline, then restart.
  Result hung = run(recover +
                    "--set debug.fail_rank=1 --set debug.fail_mode=hang "
                    "--set comm.timeout_s=1 --run-dir " +
                    path("hang"));
  ASSERT_EQ(hung.exit_code, 0) << hung.output;
  EXPECT_TRUE(has(hung.output, "rank 1 stopped making progress")) << hung.output;
  EXPECT_EQ(sha("hang"), want);
}

TEST_F(Fault, WithoutRestartsAFailedRankFailsTheRun) {
  Result r = run(kTrain +
                 "--workers 2 --set debug.fail_rank=1 --set debug.fail_step=5 "
                 "--run-dir " +
                 path("r"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r.output, "tessel: error: debug: injected failure")) << r.output;
  // From the newest checkpoint when there is no snapshot.
  Result c = run(kTrain +
                 "--workers 2 --set debug.fail_rank=1 --set debug.fail_step=30 "
                 "--set train.max_restarts=1 --set checkpoint.every_steps=20 "
                 "--run-dir " +
                 path("c"));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_TRUE(has(c.output, "resumes from " + path("c") + "/checkpoints/step-000020")) << c.output;
  EXPECT_EQ(sha("c"), reference());
}

TEST_F(Fault, SigtermStopsWithACheckpointAndExit143) {
  const std::string args = kTrain + "--workers 2 --set train.epochs=4000 --run-dir " + path("t");
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string cmd = "exec " + kTessel + " " + args + " > " + path("t.out") + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Once it trains (its first checkpoint-free steps), preempt it.
  for (int i = 0; i < 600 && !fs::exists(path("t") + "/metrics.jsonl"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 143);
  std::ifstream in(path("t") + "/summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_FALSE(summary["completed"].get<bool>());
  char latest[32];
  std::snprintf(latest, sizeof latest, "step-%06lld",
                static_cast<long long>(summary["steps"].get<int64_t>()));
  std::string named;
  std::ifstream(path("t") + "/checkpoints/latest") >> named;
  EXPECT_EQ(named, latest);  // the checkpoint is at the stop step
}

TEST_F(Fault, DamagedNewestCheckpointFallsBackToThePreviousOne) {
  const std::string common = kTrain + "--set checkpoint.every_steps=50 --run-dir " + path("d");
  Result part = run(common + " --stop-after 120");
  ASSERT_EQ(part.exit_code, 0) << part.output;
  // Flip one bit of a tensor in the newest checkpoint (the stop at step 120).
  const std::string shard = path("d") + "/checkpoints/step-000120/shard-00000.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    const char c = static_cast<char>(f.get() ^ 0x10);
    f.seekp(-3, std::ios::end);
    f.put(c);
  }
  Result rest = run(common + " --resume " + path("d"));
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  EXPECT_TRUE(has(rest.output, "shard-00000.safetensors")) << rest.output;
  EXPECT_TRUE(has(rest.output, "resuming from the previous complete checkpoint")) << rest.output;
  EXPECT_TRUE(has(rest.output, "step-000100")) << rest.output;
  EXPECT_EQ(sha("d"), reference());
  // run.json's start names the checkpoint it loaded, and the damaged one it passed over.
  std::ifstream record(path("d") + "/run.json");
  const nlohmann::json start = nlohmann::json::parse(record)["starts"].back();
  EXPECT_TRUE(has(start.value("resumed_from", ""), "step-000100")) << start.dump();
  EXPECT_TRUE(has(start.value("passed_over", ""), "step-000120")) << start.dump();
}

// A checkpoint write that fails (here: files limited to 1 MiB, as a full disk would stop it;
// 2 ranks, each writing its ZeRO-1 shard) exits 1 naming the file and leaves no temporary
// folder behind.
TEST_F(Fault, AFailedCheckpointWriteLeavesNoTemporaryFolder) {
  Result r =
      shell("bash -c 'trap \"\" XFSZ; ulimit -f 1024; exec " + kTessel + " train " + kSpiral +
            " --quiet --workers 2 --set zero.stage=1 --set data.kind=synthetic "
            "--set data.samples=256 --set data.features=256 --set model.hidden=[512,512] "
            "--set train.epochs=1 --set checkpoint.every_steps=2 --run-dir " +
            path("full") + "'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // The rank whose write failed names its file (the other rank may fail first, on the removed
  // folder: either message names a shard).
  EXPECT_TRUE(has(r.output, "tessel: error: checkpoint: ")) << r.output;
  EXPECT_TRUE(has(r.output, ".safetensors failed")) << r.output;
  for (const fs::directory_entry& e : fs::directory_iterator(path("full") + "/checkpoints"))
    ADD_FAILURE() << "left behind: " << e.path();
}

// tessel launch as root (most containers) starts mpirun without OpenMPI's root refusal; a
// launcher that never starts a rank (here `false`) is reported once, not restarted.
TEST_F(Fault, LaunchRunsAsRootAndDoesNotRestartALauncherThatNeverStarted) {
  const std::string train =
      " -- train " + kSpiral + " --quiet --set train.epochs=1 --run-dir " + path("ok");
  Result ok = run("launch -np 2 --mpirun 'mpirun --oversubscribe'" + train);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_FALSE(has(ok.output, "attempt to run as root")) << ok.output;
  Result never = run("launch -np 2 --max-restarts 3 --mpirun false -- train " + kSpiral +
                     " --run-dir " + path("never"));
  EXPECT_EQ(never.exit_code, 1) << never.output;
  EXPECT_TRUE(has(never.output, "before its ranks started")) << never.output;
  EXPECT_FALSE(has(never.output, "restart 1 of")) << never.output;
}

TEST_F(Fault, ImpossibleSizesAndHugeValuesGiveShortClearErrors) {
  auto expect_clear = [](const Result& r, const std::string& needle) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(has(r.output, "tessel: error: ")) << r.output;
    EXPECT_FALSE(has(r.output, "internal error")) << r.output;
    EXPECT_TRUE(has(r.output, needle)) << "expected '" << needle << "' in:\n" << r.output;
    EXPECT_LT(r.output.size(), 2500u) << "an error message is too long";
  };
  const std::string fashion = std::string(TESSEL_SOURCE_DIR) + "/examples/fashion_cnn.toml";
  expect_clear(run("train " + fashion + " --set model.kernel=2147483647"), "model.kernel");
  expect_clear(run("train " + kSpiral + " --set model.hidden=[2147483647,2147483647]"),
               "model.hidden");
  expect_clear(run("train " + kSpiral + " --set model.hidden=[4611686018427387904,4]"),
               "model.hidden");
  expect_clear(run("train " + kSpiral + " --set train.epochs=4611686018427387904"),
               "train.epochs must be in [1, 1000000], got 4611686018427387904");
  expect_clear(run("train " + kSpiral + " --set model.hidden=" + std::string(100000, '[')),
               "config: --set model.hidden:1: tables, keys and arrays nest more than 16 levels");
  const std::string huge(100000, 'x');
  expect_clear(run("train " + kSpiral + " --set model.kind=" + huge), "characters");
  expect_clear(run("train " + kSpiral +
                   " --set debug.fail_mode=explode --set debug.fail_rank=0 "
                   "--set debug.fail_step=1"),
               "debug.fail_mode");
  expect_clear(run("launch -np 0 -- train " + kSpiral), "-np must be >= 1");
  expect_clear(run("launch -np 2 -- eval " + kSpiral), "must be `train CONFIG");
}

}  // namespace
