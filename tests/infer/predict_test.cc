// tessel predict end to end: the same output bytes on any number of workers, with a pipeline,
// after a worker dies or stalls; a pipeline's and a tensor-parallel group's logits equal one
// worker's to 1e-5, and a model over the per-rank memory cap runs only split over stages or a
// tensor-parallel group; bad inputs and resumes fail clearly.
#include <cmath>
#include <nlohmann/json.hpp>

#include "infer_testing.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/comm/threads.h"
#include "tessel/core/memory.h"
#include "tessel/core/sha256.h"
#include "tessel/infer/input.h"
#include "tessel/infer/replica.h"
#include "tessel/parallel/layout.h"

namespace tessel::infer::testing {
namespace {

using Predict = TrainedMlp;

void expect_every_row_in_order(const std::string& text, int64_t rows) {
  int64_t row = 0;
  size_t at = 0;
  for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1, ++row)
    ASSERT_EQ(
        text.compare(at, 8 + std::to_string(row).size(), "{\"row\":" + std::to_string(row) + ","),
        0)
        << "line " << row;
  EXPECT_EQ(row, rows);
}

TEST_F(Predict, SameBytesOnOneToFourWorkersAndAPipeline) {
  ASSERT_EQ(predict("1.jsonl", "--workers 1").exit_code, 0);
  const std::string one = slurp(path("1.jsonl"));
  expect_every_row_in_order(one, kRows);
  for (const std::string args : {"--workers 2", "--workers 3", "--workers 4",
                                 "--workers 2 --set pp.stages=2 --set pp.microbatches=3"}) {
    const Result r = predict("n.jsonl", args);
    ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_TRUE(slurp(path("n.jsonl")) == one) << args << " wrote other bytes";
  }
  ASSERT_EQ(predict("1.csv", "--set infer.top_k=2").exit_code, 0);
  ASSERT_EQ(predict("3.csv", "--set infer.top_k=2 --workers 3").exit_code, 0);
  const std::string csv = slurp(path("1.csv"));
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "row,class,top1_class,top1_prob,top2_class,top2_prob");
  EXPECT_TRUE(slurp(path("3.csv")) == csv);
  // Tensor parallelism sums partial products in another order: every row, in order (the
  // logits are compared to 1e-5 below).
  const Result tp = predict("tp.jsonl", "--workers 4 --set tp.size=2 --set infer.chunk_rows=100");
  ASSERT_EQ(tp.exit_code, 0) << tp.output;
  expect_every_row_in_order(slurp(path("tp.jsonl")), kRows);
}

TEST_F(Predict, AKilledOrStalledWorkersChunksAreRerun) {
  // 20 chunks of 100 rows, so that every worker gets some.
  ASSERT_EQ(predict("clean.jsonl").exit_code, 0);
  const std::string clean = slurp(path("clean.jsonl"));
  Result r = predict("killed.jsonl",
                     "--workers 3 --set infer.chunk_rows=100 --set debug.kill_rank=1 "
                     "--set debug.kill_after=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"failed_workers\": [\n    1\n  ]"), std::string::npos) << r.output;
  EXPECT_TRUE(slurp(path("killed.jsonl")) == clean);
  // Rank 1 sleeps 5 s before each chunk; after 0.3 s its chunk goes to another worker.
  r = predict(
      "stalled.jsonl",
      "--workers 3 --set infer.chunk_rows=100 --set debug.slow_rank=1 --set debug.delay_ms=5000 "
      "--set infer.chunk_timeout_s=0.3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("\"reruns\": 0"), std::string::npos) << r.output;
  EXPECT_TRUE(slurp(path("stalled.jsonl")) == clean);
}

// A copy of the trained run whose manifest.json went through `edit` (its self-hash redone).
template <typename F>
std::string edited_run(const std::string& name, F&& edit) {
  const std::string run = TrainedMlp::path(name);
  fs::remove_all(run);
  fs::copy(TrainedMlp::run_dir(), run, fs::copy_options::recursive);
  const std::string manifest = ckpt::resolve_checkpoint_dir(run) + "/manifest.json";
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(slurp(manifest));
  edit(j);
  j.erase("manifest_sha256");
  const std::string body = j.dump();
  j["manifest_sha256"] = sha256_hex(body.data(), body.size());
  std::ofstream(manifest) << j.dump(2);
  return run;
}

TEST_F(Predict, ShapesComeFromTheManifestAndAnOldCheckpointLoadsTheData) {
  const std::optional<ckpt::ModelIo> io = ckpt::CheckpointReader(run_dir()).manifest().io;
  ASSERT_TRUE(io.has_value());
  // With the pixel map training applied (data.mean, data.std of 0..1 pixels, on 0..255 ones).
  EXPECT_EQ(*io, (ckpt::ModelIo{{784},
                                DType::kF32,
                                10,
                                std::vector<float>(784, 255.0f * 0.2860f),
                                std::vector<float>(784, 255.0f * 0.3530f)}));
  // The training data is not read: a data.path that does not exist does not matter.
  ASSERT_EQ(predict("new.jsonl", "--set data.path=/nonexistent").exit_code, 0);
  const std::string expected = slurp(path("new.jsonl"));
  // A version 2 checkpoint (no model_io) learns the shapes from the training data, as before.
  const std::string old = edited_run("old_run", [](nlohmann::ordered_json& j) {
    j["version"] = 2;
    j.erase("model_io");
  });
  const std::string args = config() + " --input " + images() + " --workers 2 --checkpoint " + old;
  Result r = run("predict " + args + " --output " + path("old.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("predates model_io"), std::string::npos) << r.output;
  EXPECT_TRUE(slurp(path("old.jsonl")) == expected);
  expect_error(
      run("predict " + args + " --output " + path("o.jsonl") + " --set data.path=/nonexistent"),
      "/nonexistent");
  // A version 3 manifest without model_io, or with a bad one, is corrupt.
  const std::string missing =
      edited_run("missing_run", [](nlohmann::ordered_json& j) { j.erase("model_io"); });
  expect_error(run("predict " + config() + " --input " + images() + " --output " + path("o.jsonl") +
                   " --checkpoint " + missing),
               "has field \"model_io\" missing; the file is corrupt");
  const std::string bad =
      edited_run("bad_run", [](nlohmann::ordered_json& j) { j["model_io"]["input_dtype"] = "u8"; });
  expect_error(run("predict " + config() + " --input " + images() + " --output " + path("o.jsonl") +
                   " --checkpoint " + bad),
               "has field \"model_io.input_dtype\" that is not 'f32' or 'i32', got 'u8'");
}

TEST_F(Predict, BadInputsAndResumesFailClearly) {
  expect_error(run("predict " + config() + " --checkpoint " + run_dir() + " --input " +
                   path("none.npy") + " --output " + path("o.jsonl")),
               "none.npy");
  std::ofstream(path("p.txt")) << "hello\n";
  expect_error(run("predict " + config() + " --checkpoint " + run_dir() + " --input " +
                   path("p.txt") + " --output " + path("o.jsonl")),
               "p.txt");
  expect_error(predict("o.txt"), "o.txt");
  expect_error(predict("fresh.jsonl", "--resume"), "--resume found no");
  ASSERT_EQ(predict("o.jsonl").exit_code, 0);
  expect_error(predict("o.jsonl", "--resume --set infer.chunk_rows=500"), "another job");
  expect_error(predict("o.jsonl", "--set pp.stages=3 --workers 2"), "pp.stages");
  expect_error(predict("o.jsonl", "--set tp.size=3 --workers 3"), "tp.size = 3");
}

// Rows 0-299 of the test images through a replica: one worker, or `stages` pipeline stages of
// `tp` tensor-parallel threads each, every rank under `limit_mb`. Returns the logits (of every
// last-stage rank: a tensor-parallel group's agree) and each rank's peak bytes.
struct Forward {
  std::vector<Tensor> logits;
  std::vector<int64_t> peak;
};
Forward forward(int stages, int tp, int64_t limit_mb) {
  train::Config config =
      train::load_config(TrainedMlp::config(),
                         {"pp.stages=" + std::to_string(stages), "tp.size=" + std::to_string(tp),
                          "runtime.memory_limit_mb=" + std::to_string(limit_mb), "infer.batch=32"});
  const ModelInfo info = model_info(config, TrainedMlp::run_dir());
  const Rows rows = open_input(TrainedMlp::images(), info, config.data)->read(300);
  Forward f{std::vector<Tensor>(static_cast<size_t>(tp)),
            std::vector<int64_t>(static_cast<size_t>(stages * tp))};
  comm::run_threads(stages * tp, [&](comm::Communicator& world) {
    auto ledger = std::make_shared<MemoryLedger>(limit_mb << 20, "rank");
    {
      MemoryScope scope(ledger, MemCategory::kOther);
      parallel::Mesh mesh(world, parallel::Layout::resolve(config.parallel, world.size()));
      Replica replica(config, info, stages > 1 ? &mesh.group(parallel::Axis::kPp) : nullptr,
                      tp > 1 ? &mesh.group(parallel::Axis::kTp) : nullptr);
      Tensor out = replica.forward(rows.x, 300, 0);
      if (replica.last_stage()) f.logits[static_cast<size_t>(mesh.coord().tp)] = out;
    }
    f.peak[static_cast<size_t>(world.rank())] = ledger->peak_total();
  });
  return f;
}

double worst_difference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst =
        std::max(worst, static_cast<double>(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return worst;
}

TEST_F(Predict, PipelineLogitsEqualOneWorkersAndSplitAModelOverTheCap) {
  const Forward one = forward(1, 1, 0), two = forward(2, 1, 0);
  EXPECT_LE(worst_difference(one.logits[0], two.logits[0]), 1e-5);
  // 2.7 MB of parameters: over a 2 MiB cap on one worker, under it on each of two stages.
  EXPECT_GT(one.peak[0], int64_t{2} << 20);
  try {
    forward(1, 1, 2);
    FAIL() << "the whole model fit under 2 MiB";
  } catch (const MemoryLimitError& e) {
    EXPECT_NE(std::string(e.what()).find("pp.stages"), std::string::npos) << e.what();
  }
  const Forward split = forward(2, 1, 2);
  for (int64_t peak : split.peak) EXPECT_LT(peak, int64_t{2} << 20);
  EXPECT_TRUE(std::equal(split.logits[0].data<float>(),
                         split.logits[0].data<float>() + split.logits[0].numel(),
                         two.logits[0].data<float>()));
}

TEST_F(Predict, TensorParallelLogitsEqualOneWorkersAndSplitAModelOverTheCap) {
  const Forward one = forward(1, 1, 0);
  for (const auto& [stages, tp] : {std::pair{1, 2}, std::pair{2, 2}}) {
    const Forward cut = forward(stages, tp, 2);  // each rank's cut under 2 MiB
    for (int64_t peak : cut.peak) EXPECT_LT(peak, int64_t{2} << 20);
    for (const Tensor& logits : cut.logits)
      EXPECT_LE(worst_difference(one.logits[0], logits), 1e-5) << "pp " << stages << " tp " << tp;
  }
}

}  // namespace
}  // namespace tessel::infer::testing
