// The same bits on every CPU: short deterministic runs of the fashion_mlp and char_gpt examples
// must end in these exact parameters (params_sha256) on every machine and at every ISA level it
// supports (portable, AVX2, AVX-512; tessel/ops/isa.h). The constants were written by the first
// run and hold on any x86-64 CPU as long as no kernel changes its order of arithmetic: a change
// that does (a new sum order, a different exp) must update them, and say so.
#include <gtest/gtest.h>

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
};

const Golden kGolden[] = {
    {"fashion_mlp",
     {"train.deterministic=true", "train.drop_last=true", "train.max_steps=4", "train.batch=32"},
     "20da03da5d3516cdd766b5949ce7eae6c99fd2407ff42f126e2a879415c79790"},
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
  for (const Golden& g : kGolden) {
    const train::Config cfg = testing::example(g.example, g.overrides);
    const auto run = testing::train_on(cfg, 1);
    EXPECT_EQ(run.summary["params_sha256"], g.params_sha256)
        << g.example << " at " << ops::isa_name(GetParam()) << " on " << ops::isa_description();
    EXPECT_EQ(run.summary["isa"], ops::isa_name(GetParam()));
  }
}

INSTANTIATE_TEST_SUITE_P(EveryLevel, GoldenTest, ::testing::ValuesIn(ops::supported_isas()),
                         [](const ::testing::TestParamInfo<ops::Isa>& info) {
                           return std::string(ops::isa_name(info.param));
                         });

}  // namespace
}  // namespace tessel
