#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/rng.h"

namespace tessel {
namespace {

TEST(Philox, MatchesReferenceVector) {
  // Random123 known-answer test for philox4x32-10, counter and key all 0xffffffff.
  auto r = philox4x32(0xffffffffffffffffull, {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu});
  EXPECT_EQ(r[0], 0x408f276du);
  EXPECT_EQ(r[1], 0x41c83b0eu);
  EXPECT_EQ(r[2], 0xa20bc7c6u);
  EXPECT_EQ(r[3], 0x6d5451fdu);
}

TEST(CounterRng, PureFunctionOfKeyAndIndex) {
  CounterRng a(7, mix_stream(RngPurpose::kDropout, 3, 9)),
      b(7, mix_stream(RngPurpose::kDropout, 3, 9));
  CounterRng c(7, mix_stream(RngPurpose::kDropout, 3, 10));
  int differ = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(a.bits(i), b.bits(i));
    differ += a.bits(i) != c.bits(i);
  }
  EXPECT_GT(differ, 95);
}

TEST(CounterRng, UniformAndNormalMoments) {
  CounterRng r(1, mix_stream(RngPurpose::kInit, 0));
  const int n = 200000;
  double su = 0, sn = 0, sn2 = 0;
  for (int i = 0; i < n; ++i) {
    float u = r.uniform(i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    su += u;
    double z = r.normal(i);
    sn += z;
    sn2 += z * z;
  }
  EXPECT_NEAR(su / n, 0.5, 0.01);
  EXPECT_NEAR(sn / n, 0.0, 0.01);
  EXPECT_NEAR(sn2 / n, 1.0, 0.02);
}

TEST(Check, ThrowsErrorWithMessage) {
  try {
    TESSEL_CHECK(1 + 1 == 3, "math is ", "broken");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("math is broken"), std::string::npos);
  }
}

}  // namespace
}  // namespace tessel
