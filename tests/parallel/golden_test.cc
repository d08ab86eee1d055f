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

#include <string>
#include <vector>

#include "small_images.h"
#include "tessel/ops/isa.h"
#include "train_on.h"

namespace tessel {
namespace {

struct Golden {
  const char* example;
  std::vector<std::string> overrides;
  const char* params_sha256;
  bool small_images = false;  // on testing::small_images_dir()'s images instead of Fashion-MNIST
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
  const std::string images = testing::small_images_dir();
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
