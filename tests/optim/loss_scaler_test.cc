// LossScaler against PyTorch's GradScaler (tests/fixtures/loss_scale.json, written by
// gen_loss_scale_fixture.py): on the same scripted overflow pattern, the same scale every step,
// the same steps skipped, and the same scale after each update; plus restoring its state.
#include "tessel/optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tessel/core/error.h"

namespace tessel::optim {
namespace {

using nlohmann::json;

const json& fixtures() {
  static const json j = [] {
    std::ifstream in(TESSEL_SOURCE_DIR "/tests/fixtures/loss_scale.json");
    if (!in) throw IoError("loss_scaler_test: cannot open tests/fixtures/loss_scale.json");
    return json::parse(in);
  }();
  return j;
}

// The fixture's runs [value, count] expanded.
template <typename T>
std::vector<T> expand(const json& runs) {
  std::vector<T> out;
  for (const json& r : runs) out.insert(out.end(), r[1].get<size_t>(), r[0].get<T>());
  return out;
}

class LossScalerTrajectory : public ::testing::TestWithParam<std::string> {};

TEST_P(LossScalerTrajectory, MatchesGradScaler) {
  const json& c = fixtures()["cases"][GetParam()];
  LossScalerSpec spec;
  spec.init_scale = c["init_scale"];
  spec.growth_factor = c["growth_factor"];
  spec.backoff_factor = c["backoff_factor"];
  spec.growth_interval = c["growth_interval"];
  const auto used = expand<float>(c["scale_used"]), after = expand<float>(c["scale_after"]);
  const auto skipped = expand<bool>(c["skipped"]);
  const int64_t steps = c["steps"];
  ASSERT_EQ(static_cast<int64_t>(used.size()), steps);
  std::vector<int64_t> overflow = c["overflow_steps"];
  LossScaler scaler(spec);
  int64_t skips = 0;
  for (int64_t s = 0; s < steps; ++s) {
    SCOPED_TRACE(testing::Message() << "step " << s);
    ASSERT_EQ(scaler.scale(), used[s]);
    const bool found_inf = std::find(overflow.begin(), overflow.end(), s) != overflow.end();
    ASSERT_EQ(found_inf, skipped[s]);  // PyTorch skipped exactly the overflowing steps
    scaler.update(found_inf);
    skips += found_inf;
    ASSERT_EQ(scaler.scale(), after[s]);
  }
  EXPECT_EQ(scaler.skipped(), skips);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LossScalerTrajectory,
                         ::testing::Values("interval_3", "defaults"));

TEST(LossScaler, DefaultsAreGradScalers) {
  const LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 65536.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
}

// A restored scaler continues exactly where the saved one was.
TEST(LossScaler, RestoreContinues) {
  LossScalerSpec spec;
  spec.growth_interval = 3;
  LossScaler a(spec), b(spec);
  for (bool inf : {true, false, false}) a.update(inf);
  b.restore(a.scale(), a.growth_tracker(), a.skipped());
  for (bool inf : {false, true, false, false, false, false}) {
    a.update(inf);
    b.update(inf);
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.growth_tracker(), b.growth_tracker());
  }
  EXPECT_EQ(a.skipped(), b.skipped());
  EXPECT_THROW(b.restore(0.0f, 0, 0), InvalidArgument);
  EXPECT_THROW(b.restore(1024.0f, -1, 0), InvalidArgument);
}

// Growth that would overflow f32 keeps the scale (as GradScaler's kernel does).
TEST(LossScaler, GrowthStopsBeforeInfinity) {
  LossScalerSpec spec;
  spec.init_scale = 2e38f;
  spec.growth_interval = 1;
  LossScaler s(spec);
  s.update(false);
  EXPECT_EQ(s.scale(), 2e38f);
}

}  // namespace
}  // namespace tessel::optim
