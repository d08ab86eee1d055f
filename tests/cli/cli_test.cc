// End-to-end tests of the tessel binary: bad inputs give a clear message and exit code 1
// (never a crash), and an interrupted-and-resumed run ends with the same parameters.
#include "cli_testing.h"

namespace {

using namespace tessel_cli;

TEST_F(Cli, HelpAndUsage) {
  Result r = run("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("train"), std::string::npos);
  EXPECT_NE(r.output.find("Usage: tessel [OPTIONS]"), std::string::npos) << r.output;
  const Result launch = run("launch --help");  // its options, though mpirun parses the rest
  EXPECT_EQ(launch.exit_code, 0);
  for (const char* option : {"-np N", "--max-restarts K", "--hostfile FILE"})
    EXPECT_NE(launch.output.find(option), std::string::npos) << launch.output;
  EXPECT_EQ(run("train --help").exit_code, 0);
  EXPECT_EQ(run("frobnicate").exit_code, 2);
  EXPECT_EQ(run("train").exit_code, 2);  // CONFIG is required
}

TEST_F(Cli, UnknownConfigKey) {
  std::ofstream(path("c.toml")) << "[train]\nepoch = 3\n";
  expect_error(run("train " + path("c.toml")), "did you mean 'train.epochs'");
  expect_error(run("train " + kExamples + "/spiral.toml --set optim.learningrate=1"),
               "did you mean 'optim.lr'");
}

// runtime.device = cuda where it cannot run fails at start, exit code 1, with the reason: a
// build without CUDA says so, a host without a GPU gives the CUDA runtime's reason, a GPU the
// start checks' refusal of a model without cuda kernels (a sequential stack). runtime.device
// takes only its names.
TEST_F(Cli, CudaDeviceFailsAtStartWithTheReason) {
  const Result r = run("train " + kExamples + "/fashion_sequential.toml --set runtime.device=cuda");
  expect_error(r, "runtime.device = cuda");
  const bool reason = r.output.find("this tessel was built without cuda") != std::string::npos ||
                      r.output.find("cannot be used here: no CUDA device") != std::string::npos ||
                      r.output.find("no kernel for model.kind = sequential") != std::string::npos;
  EXPECT_TRUE(reason) << r.output;
  expect_error(run("train " + kExamples + "/spiral.toml --set runtime.device=gpu"),
               "runtime.device must be cpu or cuda, got 'gpu'");
}

TEST_F(Cli, BadValues) {
  expect_error(run("train " + kExamples + "/spiral.toml --set optim.lr=-1"), "optim.lr must be");
  expect_error(run("train " + kExamples + "/spiral.toml --set train.batch=0"),
               "train.batch must be in [1, 16777216], got 0");
  expect_error(run("train " + kExamples + "/spiral.toml --set model.kind=transformer"), "model");
  expect_error(run("train " + path("missing.toml")), "cannot read");
}

TEST_F(Cli, MissingTruncatedCorruptIdx) {
  expect_error(run("train " + kExamples + "/fashion_mlp.toml --set data.path=" + path("nowhere")),
               "nowhere");
  // Truncated: headers promise 100 images, the file holds 3.
  auto be32 = [](std::ofstream& o, uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) o.put(static_cast<char>(v >> s));
  };
  fs::create_directories(path("trunc"));
  for (const char* split : {"train", "t10k"}) {
    std::ofstream im(path(std::string("trunc/") + split + "-images-idx3-ubyte"), std::ios::binary);
    be32(im, 0x803);
    be32(im, 100);
    be32(im, 28);
    be32(im, 28);
    im << std::string(3 * 784, '\1');
    std::ofstream lb(path(std::string("trunc/") + split + "-labels-idx1-ubyte"), std::ios::binary);
    be32(lb, 0x801);
    be32(lb, 100);
    lb << std::string(100, '\2');
  }
  expect_error(run("train " + kExamples + "/fashion_mlp.toml --set data.path=" + path("trunc")),
               "trunc");
  // Corrupt: gz names holding garbage.
  fs::create_directories(path("gz"));
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    std::ofstream(path(std::string("gz/") + f), std::ios::binary) << "this is not gzip data at all";
  expect_error(run("train " + kExamples + "/fashion_mlp.toml --set data.path=" + path("gz")), "gz");
}

TEST_F(Cli, CorruptCheckpoints) {
  std::string train = "train " + kExamples + "/spiral.toml --quiet --set train.epochs=2 --run-dir ";
  Result ok = run(train + path("run"));
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  std::string ckpt_dir = path("run") + "/checkpoints/";
  std::string latest;
  std::ifstream(ckpt_dir + "latest") >> latest;
  std::string model = ckpt_dir + latest + "/shard-00000.safetensors";
  ASSERT_TRUE(fs::exists(model)) << model;
  std::string eval = "eval " + kExamples + "/spiral.toml --checkpoint " + path("run");
  ASSERT_EQ(run(eval).exit_code, 0);

  // Wrong shapes: a different model for the same checkpoint.
  expect_error(run(eval + " --set model.hidden=[50]"), "different");
  // Truncated file.
  auto size = fs::file_size(model);
  fs::resize_file(model, size / 2);
  expect_error(run(eval), "shard-00000.safetensors");
  // Bad header: a header length larger than the file.
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t huge = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&huge), 8);
  }
  expect_error(run(eval), "shard-00000.safetensors");
  // Missing file.
  fs::remove(model);
  expect_error(run(eval), "shard-00000.safetensors");
  expect_error(run("eval " + kExamples + "/spiral.toml --checkpoint " + path("none")), "none");
}

TEST_F(Cli, EvalRunsAPipelineCheckpointInOneProcess) {
  // A checkpoint does not depend on the layout: eval of a 2-stage pipeline's run gives the
  // run's own test accuracy and parameters, in one process.
  Result r = run("train " + kExamples +
                 "/spiral.toml --quiet --workers 2 --set pp.stages=2 "
                 "--set pp.microbatches=2 --set train.epochs=3 --run-dir " +
                 path("pp"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto summary = read_json(path("pp") + "/summary.json");
  EXPECT_EQ(summary["layout"], "pp=2");
  Result e = run("eval " + kExamples + "/spiral.toml --set pp.stages=2 --checkpoint " + path("pp"));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  auto out = nlohmann::json::parse(e.output);
  EXPECT_EQ(out["params_sha256"], summary["params_sha256"]);
  EXPECT_EQ(out["test_accuracy"], summary["test_accuracy"]);
}

TEST_F(Cli, ExportedZeroThreeCheckpointGivesTheSameLogitsInPyTorch) {
  // Trained with ZeRO-3 on 2 workers (no rank ever holds the whole model), exported as one
  // plain safetensors file: PyTorch's MLP on those weights gives tessel eval's logits.
  if (std::system("/usr/bin/python3 -c 'import torch, numpy' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3-torch or python3-numpy is not installed";
  Result r = run("train " + kExamples +
                 "/fashion_mlp.toml --quiet --workers 2 "
                 "--set zero.stage=3 --set train.max_steps=60 --set train.epochs=1 "
                 "--run-dir " +
                 path("z3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Result x = run("ckpt export " + path("z3") + " " + path("model.safetensors"));
  ASSERT_EQ(x.exit_code, 0) << x.output;
  Result e = run("eval " + kExamples + "/fashion_mlp.toml --checkpoint " + path("z3") +
                 " --logits " + path("logits.npy") + " --limit 100");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  auto out = nlohmann::json::parse(e.output);
  EXPECT_EQ(out["params_sha256"], read_json(path("z3") + "/summary.json")["params_sha256"]);
  const std::string check = "/usr/bin/python3 " + std::string(TESSEL_SOURCE_DIR) +
                            "/tests/fixtures/torch_logits.py " + path("model.safetensors") + " " +
                            path("logits.npy") + " /usr/share/datasets/fashion-mnist 2>&1";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;
}

TEST_F(Cli, InterruptedAndResumedRunMatchesUninterrupted) {
  // Dropout, momentum and a cosine schedule make every piece of state matter.
  std::string common = "train " + kExamples +
                       "/spiral.toml --quiet --set train.epochs=6 "
                       "--set model.dropout=0.1 --set schedule.kind=cosine --run-dir ";
  Result full = run(common + path("full"));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  Result part = run(common + path("part") + " --stop-after 37");  // mid-epoch (10 steps/epoch)
  ASSERT_EQ(part.exit_code, 0) << part.output;
  EXPECT_FALSE(read_json(path("part") + "/summary.json")["completed"].get<bool>());
  EXPECT_EQ(read_json(path("part") + "/summary.json")["stopped_by"], "stop_after");
  Result rest = run(common + path("part") + " --resume " + path("part"));
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  auto a = read_json(path("full") + "/summary.json");
  auto b = read_json(path("part") + "/summary.json");
  EXPECT_EQ(a["stopped_by"], "epochs");
  EXPECT_EQ(a["steps"], b["steps"]);
  EXPECT_EQ(a["params_sha256"], b["params_sha256"]);
  EXPECT_EQ(a["test_accuracy"], b["test_accuracy"]);
  EXPECT_EQ(a["train_loss"], b["train_loss"]);
}

// train.max_steps inside the first epoch: completed, stopped by max_steps, 0 whole epochs; a
// resume with nothing left to train says so.
TEST_F(Cli, AMaxStepsStopSaysWhatEndedItAndAResumeOfAFinishedRunSaysSo) {
  const std::string common =
      "train " + kExamples + "/spiral.toml --set train.max_steps=4 --run-dir " + path("m");
  Result r = run(common + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto s = read_json(path("m") + "/summary.json");
  EXPECT_TRUE(s["completed"].get<bool>());
  EXPECT_EQ(s["stopped_by"], "max_steps");
  EXPECT_EQ(s["epochs"], 0);
  EXPECT_EQ(s["steps"], 4);
  Result again = run(common + " --resume " + path("m"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("nothing left to train"), std::string::npos) << again.output;
}

// `train CONFIG --resume RUN` keeps the run's own layout, ZeRO stage and precision
// (RUN/config.toml) and says what the command line overrides, the schedule's new length included.
TEST_F(Cli, ResumeUsesTheRunsOwnConfigAndSaysWhatItOverrides) {
  const std::string spiral = "train " + kExamples + "/spiral.toml";
  Result part = run(spiral +
                    " --quiet --workers 2 --set zero.stage=2 --set train.precision=bf16 "
                    "--set train.epochs=2 --stop-after 5 --run-dir " +
                    path("r"));
  ASSERT_EQ(part.exit_code, 0) << part.output;
  Result rest = run(spiral + " --resume " + path("r"));
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  EXPECT_NE(rest.output.find("resuming with the run's own config"), std::string::npos)
      << rest.output;
  // spiral.toml's own train.epochs = 400 does not undo the run's --set train.epochs=2.
  EXPECT_NE(rest.output.find("says train.epochs = 400, but the run's 2 stays (--set "
                             "train.epochs=400 changes it)"),
            std::string::npos)
      << rest.output;
  auto s = read_json(path("r") + "/summary.json");
  EXPECT_EQ(s["layout"], "dp=2");
  EXPECT_EQ(s["zero_stage"], 2);
  EXPECT_EQ(s["engine"]["precision"], "bf16");
  Result more = run(spiral + " --set train.epochs=3 --resume " + path("r"));
  ASSERT_EQ(more.exit_code, 0) << more.output;
  EXPECT_NE(more.output.find("overridden: train.epochs = 3 (the run had 2)"), std::string::npos)
      << more.output;
  EXPECT_NE(more.output.find("learning-rate schedule is laid out again"), std::string::npos)
      << more.output;
  EXPECT_EQ(read_json(path("r") + "/summary.json")["epochs"], 3);
}

// Each train record has the loss of the steps since the last record beside the epoch's running
// mean: with a record every step of equal batches, loss_k = k epoch_loss_k - (k-1) epoch_loss_k-1.
TEST_F(Cli, TrainRecordsCarryThePerStepLoss) {
  Result r = run("train " + kExamples +
                 "/spiral.toml --quiet --workers 2 --set train.log_every=1 --set train.max_steps=8 "
                 "--set train.drop_last=true --run-dir " +
                 path("l"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream metrics(path("l") + "/metrics.jsonl");
  std::vector<double> loss, mean;
  for (std::string line; std::getline(metrics, line);) {
    auto rec = nlohmann::json::parse(line);
    if (rec["type"] != "train") continue;
    loss.push_back(rec["loss"].get<double>());
    mean.push_back(rec["epoch_loss"].get<double>());
  }
  ASSERT_EQ(loss.size(), 8u);
  EXPECT_DOUBLE_EQ(loss[0], mean[0]);
  for (size_t k = 1; k < loss.size(); ++k)
    EXPECT_NEAR(loss[k], (k + 1) * mean[k] - k * mean[k - 1], 1e-9) << k;
  EXPECT_NE(loss.back(), mean.back());
}

// More data-parallel ranks than rows in a batch: warned at the start, naming both numbers.
TEST_F(Cli, MoreRanksThanBatchRowsIsWarned) {
  Result r = run("train " + kExamples +
                 "/spiral.toml --workers 4 --set train.batch=3 --set train.max_steps=2 --run-dir " +
                 path("w"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(
                "train.batch = 3 rows over 4 data-parallel ranks leaves 1 of them without rows"),
            std::string::npos)
      << r.output;
}

TEST_F(Cli, SpiralReachesNinetyEightPercentTrainingAccuracy) {
  Result r = run("train " + kExamples + "/spiral.toml --quiet --run-dir " + path("spiral"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream metrics(path("spiral") + "/metrics.jsonl");
  double last = 0;
  for (std::string line; std::getline(metrics, line);) {
    auto rec = nlohmann::json::parse(line);
    if (rec["type"] == "epoch") last = rec["train_eval_accuracy"].get<double>();
  }
  EXPECT_GE(last, 0.98);
}

}  // namespace
