// The decision table (tessel/parallel/composition.h) walked over its grid: every combination
// it accepts trains a few steps on its 1-4 ranks as threads, builds the parts the table names,
// and matches one worker of the same precision (exact paths to 1e-5, 16-bit precision and the
// compression kinds to their tolerances, docs/compression.md); every combination it refuses
// fails at start with the table's message. docs/composition.md is the table's own output.
// This binary walks a sample (fp32 and one 16-bit precision uncompressed, every refusal);
// composition_full_test (label slow) walks the whole grid.
#include "tessel/parallel/composition.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "tessel/tensor/device.h"
#include "train_on.h"

namespace tessel {
namespace {

using parallel::Combination;

TEST(Composition, DocIsTheTablesOutput) {
  std::ifstream in(std::string(TESSEL_SOURCE_DIR) + "/docs/composition.md");
  ASSERT_TRUE(in) << "docs/composition.md missing";
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), parallel::composition_markdown())
      << "docs/composition.md is out of date: regenerate it with "
         "`build/apps/tessel/tessel config --composition > docs/composition.md`";
}

// A tiny MLP (widths that tp = 2 cuts, 3 blocks for pp = 2) for a few steps.
train::Config tiny() {
  return train::parse_config(
      "", "composition",
      {"data.kind=synthetic", "data.samples=200", "data.features=8", "data.classes=4",
       "data.test_fraction=0.2", "train.batch=16", "train.max_steps=4", "train.prefetch=0",
       "train.drop_last=true", "optim.kind=adamw", "optim.lr=0.01", "model.hidden=[16,8]",
       "checkpoint.every_epochs=0", "ddp.bucket_mb=0.001", "ddp.overlap=off", "compress.ratio=0.25",
       "train.log_every=1000"});
}

// How far a combination's parameters may lie from one worker's of the same precision after 4
// steps (relative to the largest; measured maxima in brackets): the exact paths 1e-5 (8e-8);
// fp16 precision and the fp16 and bf16 codecs 2e-3 (3e-4); bf16 precision 5e-2 (0.026: one
// gradient rounded the other way moves an AdamW step by lr); int8, topk and powersgd are lossy
// by design (compress_test checks their accuracy), 0.5 (0.13).
double tolerance(const parallel::ParallelSpec& s) {
  using parallel::CompressKind, parallel::Precision;
  const CompressKind kind = s.compress.kind;
  if (kind == CompressKind::kInt8 || kind == CompressKind::kTopk || kind == CompressKind::kPowerSgd)
    return 0.5;
  if (s.precision == Precision::kBf16) return 5e-2;
  if (s.precision == Precision::kFp16 || kind != CompressKind::kNone) return 2e-3;
  return 1e-5;
}

#ifndef TESSEL_FULL_SWEEP
bool sampled(const Combination& c) {
  return c.spec.compress.kind == parallel::CompressKind::kNone &&
         c.spec.precision != parallel::Precision::kFp16;
}
#endif

TEST(Composition, WalksTheTable) {
  const train::Config base = tiny();
  const data::Splits data = data::make_datasets(base.data);
  std::map<parallel::Precision, testing::RunResult> one;  // one worker, by precision
  int trained = 0, refused = 0;
  for (const Combination& c : parallel::composition_grid(base.parallel)) {
    parallel::Parts parts;
    const std::string expected = parallel::refusal(c, &parts);
#ifndef TESSEL_FULL_SWEEP
    if (expected.empty() && !sampled(c)) continue;  // every refusal is checked: they are cheap
#endif
    train::Config cfg = base;
    cfg.parallel = c.spec;
    const std::string what = c.layout + ", zero.stage = " + std::to_string(c.spec.zero_stage) +
                             ", " + name_of(c.spec.precision) +
                             ", compress.kind = " + name_of(c.spec.compress.kind);
    if (!expected.empty()) {
      ++refused;
      EXPECT_EQ(expected.rfind("config: ", 0), 0u) << expected;
      try {
        testing::train_on(cfg, c.world, {}, &data);
        ADD_FAILURE() << what << " trained, but the table refuses it: " << expected;
      } catch (const InvalidArgument& e) {
        EXPECT_EQ(std::string(e.what()), expected) << what;
      }
      continue;
    }
    ++trained;
    if (!one.count(c.spec.precision)) {
      train::Config single = base;
      single.parallel.precision = c.spec.precision;
      one[c.spec.precision] = testing::train_on(single, 1, {}, &data);
    }
    const testing::RunResult run = testing::train_on(cfg, c.world, {}, &data);
    const nlohmann::json& engine = run.summary["engine"];
    EXPECT_EQ(engine["executor"], name_of(parts.executor)) << what;
    const std::string sync = engine["grad_sync"];
    EXPECT_TRUE(sync == parts.grad_sync || (parts.shared_memory && sync == "shared_memory"))
        << what << ": " << sync;
    EXPECT_EQ(run.summary["steps"], one[c.spec.precision].summary["steps"]) << what;
    const double diff = testing::max_rel_diff(one[c.spec.precision].params, run.params);
    EXPECT_LT(diff, tolerance(c.spec)) << what;
  }
  std::printf("%d combinations trained, %d refused\n", trained, refused);
  EXPECT_GT(trained, 0);
  EXPECT_GT(refused, 0);
}

// runtime.device = cuda: the table's rules, each with its message, and the start check (the
// device's runtime, then the model's layers), with a stand-in runtime: this host need not have
// a GPU, nor this build CUDA.
std::string refusal_on_cuda(parallel::ParallelSpec spec, int world = 1) {
  spec.device = Device::kCuda;
  try {
    parallel::compose(spec, parallel::Layout::resolve(spec, world), false);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Composition, RefusesOnCudaWhatRunsOnlyOnTheCpu) {
  parallel::ParallelSpec s;
  EXPECT_EQ(refusal_on_cuda(s, 4), "");  // data parallel runs on device ranks
  s.pp_stages = 2;
  EXPECT_EQ(refusal_on_cuda(s, 4), "");  // pipeline too, and dp x pp
  s.pp_stages = 1;
  s.tp_size = 2;
  EXPECT_EQ(refusal_on_cuda(s, 4), "");  // tensor parallel runs on device ranks, with dp too
  s.tp_sequence = true;
  EXPECT_EQ(refusal_on_cuda(s, 2), "");  // sequence parallelism too
  s.tp_sequence = false;
  s.pp_stages = 2;
  EXPECT_EQ(refusal_on_cuda(s, 4), "");  // pp x tp
  s.pp_stages = 1;
  s.tp_size = 1;
  s.ps_servers = 1;
  EXPECT_NE(refusal_on_cuda(s, 3).find("runs data, pipeline and tensor parallel only"),
            std::string::npos)
      << refusal_on_cuda(s, 3);
  EXPECT_NE(refusal_on_cuda(s, 3).find("set ps.servers = 0"), std::string::npos);
  s.ps_servers = 0;
  s.zero_stage = 1;
  EXPECT_EQ(refusal_on_cuda(s, 2), "");  // ZeRO-1 too
  s.zero_stage = 2;
  EXPECT_EQ(refusal_on_cuda(s, 2), "");  // ZeRO-2 and 3 as well
  s.zero_stage = 3;
  EXPECT_EQ(refusal_on_cuda(s, 4), "");
  s.zero_shard_size = 2;
  EXPECT_EQ(refusal_on_cuda(s, 4), "");  // and within shard groups, all-reduced across them
  s.zero_shard_size = 0;
  s.zero_stage = 0;
  s.compress.kind = parallel::CompressKind::kBf16;
  EXPECT_NE(refusal_on_cuda(s).find("compress.kind = bf16"), std::string::npos);
  s.compress.kind = parallel::CompressKind::kNone;
  s.recompute = nn::Recompute::kFull;
  EXPECT_NE(refusal_on_cuda(s).find("train.recompute = full"), std::string::npos);
  s.recompute = nn::Recompute::kNone;
  s.precision = parallel::Precision::kFp16;
  EXPECT_NE(refusal_on_cuda(s).find("set train.precision = bf16"), std::string::npos);
  EXPECT_EQ(refusal_on_cuda(s).rfind("config: runtime.device = cuda ", 0), 0u);
  s.precision = parallel::Precision::kBf16;  // one rank, fp32 or bf16: the table lets it pass
  EXPECT_EQ(refusal_on_cuda(s), "");
  s.precision = parallel::Precision::kFp32;
  EXPECT_EQ(refusal_on_cuda(s), "");
}

class StandInCuda final : public DeviceRuntime {
 public:
  explicit StandInCuda(std::string reason) : reason_(std::move(reason)) {}
  std::string unavailable_reason() const override { return reason_; }
  size_t allocation_size(size_t bytes) const override { return bytes; }
  void* allocate(size_t) override { throw Error("stand-in: no memory"); }
  void free(void*, size_t) noexcept override {}
  void zero(void*, size_t, void*) override {}
  void copy(void*, Device, const void*, Device, size_t, void*) override {}
  void convert(void*, DType, const void*, DType, int64_t, void*) override {}

 private:
  std::string reason_;
};

std::string start_error(const nn::ModelSpec& model) {
  parallel::ParallelSpec spec;
  spec.device = Device::kCuda;
  try {
    parallel::check_device(spec, model);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Composition, CudaAtStartNeedsTheRuntimeTheDeviceAndKernelsForTheModel) {
  nn::ModelSpec mlp;
  install_device_runtime(Device::kCuda, nullptr);
  EXPECT_NE(start_error(mlp).find("this tessel was built without cuda"), std::string::npos)
      << start_error(mlp);
  StandInCuda absent("no CUDA device: no CUDA-capable device is detected");
  install_device_runtime(Device::kCuda, &absent);
  EXPECT_NE(start_error(mlp).find("cannot be used here: no CUDA device: no CUDA-capable"),
            std::string::npos)
      << start_error(mlp);
  StandInCuda present("");
  install_device_runtime(Device::kCuda, &present);
  EXPECT_EQ(start_error(mlp), "");
  nn::ModelSpec cnn;
  cnn.kind = nn::ModelKind::kCnn;
  EXPECT_EQ(start_error(cnn), "");
  nn::ModelSpec sequential;
  sequential.kind = nn::ModelKind::kSequential;
  EXPECT_NE(start_error(sequential).find("no kernel for model.kind = sequential"),
            std::string::npos);
  nn::ModelSpec dropout;
  dropout.dropout = 0.1f;
  EXPECT_EQ(start_error(dropout), "");  // the CPU's mask on the device
  nn::ModelSpec gpt;  // a gpt runs, classic or modern, with attention's head sizes
  gpt.kind = nn::ModelKind::kGpt;
  EXPECT_EQ(start_error(gpt), "");
  gpt.norm = nn::Norm::kRmsNorm;
  gpt.position = nn::Position::kRotary;
  gpt.mlp = nn::Mlp::kSwiglu;
  EXPECT_EQ(start_error(gpt), "");
  gpt.heads = 8;  // head size 8
  EXPECT_NE(start_error(gpt).find("no kernel for model.embed / model.heads = 64 / 8"),
            std::string::npos);
  nn::ModelSpec regression;
  regression.task = data::Task::kRegression;
  EXPECT_NE(start_error(regression).find("data.task = regression"), std::string::npos);
  install_device_runtime(Device::kCuda, nullptr);
}

}  // namespace
}  // namespace tessel
