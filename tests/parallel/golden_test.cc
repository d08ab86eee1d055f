// The same bits on every CPU: short deterministic runs of the fashion_mlp, fashion_cnn and
// char_gpt examples must end in these exact parameters (params_sha256) on every machine and at
// every ISA level it supports (portable, AVX2, AVX-512; tessel/ops/isa.h). The constants were
// written by the first run and hold on any x86-64 CPU as long as no kernel changes its order of
// arithmetic: a change that does (a new sum order, a different exp) must update them, and say so.
// fashion_cnn's was written on an AVX2 host at the portable and AVX2 levels (the direct
// convolution's order, conv_direct_portable.cc, is the AVX-512 kernel's). fashion_mlp's and
// fashion_cnn's were rewritten when IDX pixels became (p - 255 mean) / (255 std), the map serve
// applies to raw pixels (before: (p / 255 - mean) / std): a change of the input rows, alike at
// every level, not of a kernel.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tessel/ops/isa.h"
#include "train_on.h"

namespace tessel {
namespace {

struct Golden {
  const char* example;
  std::vector<std::string> overrides;
  const char* params_sha256;
  bool small_images = false;  // on small_images_dir()'s images instead of Fashion-MNIST
};

const Golden kGolden[] = {
    {"fashion_mlp",
     {"train.deterministic=true", "train.drop_last=true", "train.max_steps=4", "train.batch=32"},
     "c24784928ce59f74b443a64acc67e5be556d4740cfa33b9ff62a51654325b4a0"},
    {"fashion_cnn",
     {"train.deterministic=true", "train.drop_last=true", "train.max_steps=3", "train.batch=16"},
     "8800646b686620965abadd2573c993ec583cf0dcee20f0875db721440cfdfab6",
     true},
    {"char_gpt",
     {"train.deterministic=true", "train.drop_last=true", "train.max_steps=6", "train.batch=8"},
     "4100be64e0232ac470766712f0d92c96196ca2012976ce712da6fb8652949724"},
};

// A folder of IDX files shaped like Fashion-MNIST's, 64 training and 32 test images of 28 x 28
// with pixels and labels from a fixed formula: the CNN's run evaluates its whole test set, and
// Fashion-MNIST's 10,000 images would take minutes through the portable convolution.
std::string small_images_dir() {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tessel_golden_idx_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto be32 = [](std::ofstream& out, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.put(static_cast<char>(v >> shift & 0xFF));
  };
  for (const auto& [split, n] : {std::pair{"train", 64u}, std::pair{"t10k", 32u}}) {
    std::ofstream images(dir / (std::string(split) + "-images-idx3-ubyte"), std::ios::binary);
    be32(images, 0x803);
    be32(images, n);
    be32(images, 28);
    be32(images, 28);
    for (uint32_t i = 0; i < n * 784; ++i)
      images.put(static_cast<char>((i * 37 + i / 784 * 11) % 251));
    std::ofstream labels(dir / (std::string(split) + "-labels-idx1-ubyte"), std::ios::binary);
    be32(labels, 0x801);
    be32(labels, n);
    for (uint32_t i = 0; i < n; ++i) labels.put(static_cast<char>(i % 10));
  }
  return dir.string();
}

class GoldenTest : public ::testing::TestWithParam<ops::Isa> {
 protected:
  void SetUp() override {
    saved_ = ops::isa();
    ops::set_isa(GetParam());
  }
  void TearDown() override { ops::set_isa(saved_); }

 private:
  ops::Isa saved_ = ops::Isa::kPortable;
};

TEST_P(GoldenTest, ParamsSha256OfShortDeterministicRuns) {
  const std::string images = small_images_dir();
  for (const Golden& g : kGolden) {
    std::vector<std::string> overrides = g.overrides;
    if (g.small_images) overrides.push_back("data.path=" + images);
    const train::Config cfg = testing::example(g.example, overrides);
    const auto run = testing::train_on(cfg, 1);
    EXPECT_EQ(run.summary["params_sha256"], g.params_sha256)
        << g.example << " at " << ops::isa_name(GetParam()) << " on " << ops::isa_description();
    EXPECT_EQ(run.summary["isa"], ops::isa_name(GetParam()));
  }
  std::filesystem::remove_all(images);
}

INSTANTIATE_TEST_SUITE_P(EveryLevel, GoldenTest, ::testing::ValuesIn(ops::supported_isas()),
                         [](const ::testing::TestParamInfo<ops::Isa>& info) {
                           return std::string(ops::isa_name(info.param));
                         });

}  // namespace
}  // namespace tessel
