#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/rng.h"
#include "tessel/core/sha256.h"

namespace tessel {
namespace {

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::string million(1000000, 'a');
  Sha256 h;  // fed in uneven pieces to exercise the buffering
  for (size_t i = 0; i < million.size(); i += 777)
    h.update(million.data() + i, std::min<size_t>(777, million.size() - i));
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, EmptyPiecesChangeNothing) {
  // An empty std::vector's data() is null: hashing it adds nothing (under UBSan, passing the
  // null on to memcpy was undefined behaviour, seen in Engine::params_sha256).
  std::vector<float> empty;
  Sha256 h;
  h.update(empty.data(), 0);
  h.update("abc", 3);
  h.update(nullptr, 0);
  EXPECT_EQ(h.hex_digest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Philox, MatchesReferenceVector) {
  // Random123 known-answer test for philox4x32-10, counter and key all 0xffffffff.
  auto r = philox4x32(0xffffffffffffffffull, {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu});
  EXPECT_EQ(r[0], 0x408f276du);
  EXPECT_EQ(r[1], 0x41c83b0eu);
  EXPECT_EQ(r[2], 0xa20bc7c6u);
  EXPECT_EQ(r[3], 0x6d5451fdu);
}

TEST(CounterRng, PureFunctionOfKeyAndIndex) {
  CounterRng a(7, mix_stream(RngPurpose::kDropout, 3, 9)), b(7, mix_stream(RngPurpose::kDropout, 3, 9));
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
