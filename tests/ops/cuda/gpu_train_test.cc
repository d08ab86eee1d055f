// Training on a real GPU (runtime.device = cuda, the CUDA runtime and kernel table installed):
// fashion_mlp and char_gpt, a few deterministic fp32 steps, twice on the device and once on the
// CPU. The two device runs give one params_sha256; the device's loss is the CPU's to 1e-4
// relative; the summary's peak memory (the ledger, by category, what the device runtime was
// asked for) is the caching pool's own peak count to 5%. Skips without a device, saying why
// (TESSEL_GPU_REQUIRED=1 makes that a failure). Data: the bundle's copies (.gpu/data, made by
// scripts/gpu_bundle) where they exist, else the examples' paths.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tessel/ops/cuda/runtime.h"
#include "train_on.h"

namespace tessel::ops::cuda::testing {
namespace {

using tessel::testing::example;
using tessel::testing::RunResult;
using tessel::testing::train_on;

std::string data_path(const std::string& bundled, const std::string& installed) {
  const std::string p = std::string(TESSEL_SOURCE_DIR) + "/.gpu/data/" + bundled;
  return std::filesystem::exists(p) ? p : installed;
}

struct Model {
  const char* name;
  std::string data;
  std::vector<std::string> settings;
};

std::vector<Model> models() {
  return {{"fashion_mlp",
           data_path("fashion-mnist", "/usr/share/datasets/fashion-mnist"),
           {"train.batch=64"}},
          {"char_gpt",
           data_path("songs-poems", "/usr/share/games/fortunes/songs-poems"),
           {"train.batch=8"}}};
}

class GpuTrain : public Gpu {
 protected:
  void SetUp() override {
    Gpu::SetUp();
    if (!IsSkipped() && !HasFailure()) install();
  }
  static RunResult train(const Model& m, const std::string& device) {
    std::vector<std::string> s = {str("data.path=", m.data),  "train.max_steps=4",
                                  "train.deterministic=true", "train.drop_last=true",
                                  "train.precision=fp32",     str("runtime.device=", device)};
    s.insert(s.end(), m.settings.begin(), m.settings.end());
    tessel::train::RunOptions opts;
    opts.run_dir = tessel::testing::test_run_dir(str("gpu_train_", m.name, "_", device));
    return train_on(example(m.name, s), 1, opts);
  }
};

TEST_F(GpuTrain, TrainsAsTheCpuDoesTwiceAlikeWithThePoolsPeak) {
  for (const Model& m : models()) {
    const RunResult cpu = train(m, "cpu");
    pool_reset_peak();
    const RunResult first = train(m, "cuda");
    const int64_t pool_peak = pool_stats().peak_in_use;
    const RunResult again = train(m, "cuda");
    EXPECT_EQ(first.summary["params_sha256"], again.summary["params_sha256"]) << m.name;
    EXPECT_EQ(first.params, again.params) << m.name;
    const double loss = first.summary["train_loss"], want = cpu.summary["train_loss"];
    EXPECT_LE(std::fabs(loss - want), 1e-4 * std::fabs(want))
        << m.name << ": cuda " << loss << ", cpu " << want;
    const auto& mem = first.summary["ranks"]["per_rank"][0]["memory"];
    const double peak = mem["peak_total_bytes"];
    std::printf("[ gpu train ] %s: ledger peak %.0f bytes %s, pool peak %lld bytes\n", m.name, peak,
                mem["peak_bytes"].dump().c_str(), static_cast<long long>(pool_peak));
    EXPECT_GT(peak, 0) << m.name;
    EXPECT_LE(std::fabs(peak - static_cast<double>(pool_peak)), 0.05 * pool_peak)
        << m.name << ": the summary's peak against the pool's";
  }
}

}  // namespace
}  // namespace tessel::ops::cuda::testing
