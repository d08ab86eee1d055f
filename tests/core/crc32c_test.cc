// CRC-32C through ISA-L: RFC 3720 known answers, and every length from 0 to 1100 bytes at
// every alignment (ISA-L's code paths differ by length and alignment) against the bitwise
// definition, whole and continued over a split.
#include "tessel/core/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "tessel/core/rng.h"

namespace tessel {
namespace {

// The definition: reflected polynomial 0x82F63B78, one bit at a time, inverted in and out.
uint32_t bitwise_crc32c(const uint8_t* p, size_t size) {
  uint32_t crc = ~0u;
  for (size_t i = 0; i < size; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (crc & 1 ? 0x82F63B78u : 0u);
  }
  return ~crc;
}

// Known answers: RFC 3720 (iSCSI) B.4 and the classic check value of "123456789".
TEST(Crc32c, KnownAnswers) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  unsigned char buf[32];
  std::fill(buf, buf + 32, 0x00);
  EXPECT_EQ(crc32c(buf, 32), 0x8A9136AAu);
  std::fill(buf, buf + 32, 0xFF);
  EXPECT_EQ(crc32c(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(crc32c(buf, 32), 0x113FDB5Cu);
  // Continuing over a split buffer gives the CRC of the whole.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
}

TEST(Crc32c, EveryLengthAndAlignmentMatchesDefinition) {
  const CounterRng rng(11, 2);
  std::vector<uint8_t> data(1100 + 8);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(rng.bits(i));
  for (size_t offset = 0; offset < 8; ++offset) {
    const uint8_t* p = data.data() + offset;
    for (size_t size = 0; size <= 1100; ++size) {
      const uint32_t want = bitwise_crc32c(p, size);
      ASSERT_EQ(crc32c(p, size), want) << size << " bytes at offset " << offset;
      const size_t split = size / 3;
      ASSERT_EQ(crc32c(p + split, size - split, crc32c(p, split)), want)
          << size << " bytes split at " << split << ", offset " << offset;
    }
  }
}

TEST(Crc32c, LargeBufferMatchesDefinition) {
  const CounterRng rng(11, 3);
  std::vector<uint8_t> data((4 << 20) + 13);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(rng.bits(i));
  EXPECT_EQ(crc32c(data.data(), data.size()), bitwise_crc32c(data.data(), data.size()));
}

}  // namespace
}  // namespace tessel
