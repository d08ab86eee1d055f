// Stochastic int8 quantisation (tessel/ops/quantize.h): the portable kernel writes the bytes
// the int8 codec wrote before it had per-level kernels (a pinned hash), and every level the
// host supports writes the portable bytes, on odd lengths, chunk boundaries, zeros, denormals,
// inf and NaN, under several keys; dequantize-add gives the portable bits.
#include "tessel/ops/quantize.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels.h"
#include "tessel/core/error.h"
#include "tessel/ops/isa.h"

namespace tessel::ops {
namespace {

struct Message {
  std::vector<float> scales;
  std::vector<int8_t> q;
};

Message quantize_at(Isa level, const std::vector<float>& x, int64_t chunk, uint64_t seed,
                    uint64_t stream) {
  const auto n = static_cast<int64_t>(x.size());
  Message m{std::vector<float>(static_cast<size_t>((n + chunk - 1) / chunk), -1.0f),
            std::vector<int8_t>(x.size(), 99)};
  kernels_for(level).int8_quantize(m.q.data(), m.scales.data(), x.data(), n, chunk, seed, stream);
  return m;
}

// Pseudo-random values over several magnitudes (integer math only: the same on every libm).
std::vector<float> ramp(int64_t n, uint32_t h) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    h = h * 1664525u + 1013904223u;
    const float v = static_cast<float>(static_cast<int32_t>(h >> 8) - (1 << 23)) / 8388608.0f;
    x[static_cast<size_t>(i)] = std::ldexp(v, static_cast<int>(i % 7) - 3);
  }
  return x;
}

// The ramp with zeros, denormal elements and one chunk (elements 512..767) of denormals only.
std::vector<float> golden_input(int64_t n) {
  std::vector<float> x = ramp(n, 12345);
  for (int64_t i = 0; i < n; i += 13) x[static_cast<size_t>(i)] = 0.0f;
  for (int64_t i = 5; i < n; i += 29) x[static_cast<size_t>(i)] = 1e-40f;
  for (int64_t i = 512; i < std::min<int64_t>(n, 768); ++i)
    x[static_cast<size_t>(i)] = (i % 2 ? 1 : -1) * 1e-39f;
  return x;
}

uint64_t fnv1a(const Message& m) {
  uint64_t h = 1469598103934665603ull;
  auto add = [&h](const void* p, size_t size) {
    for (size_t i = 0; i < size; ++i)
      h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  add(m.scales.data(), m.scales.size() * sizeof(float));
  add(m.q.data(), m.q.size());
  return h;
}

TEST(Int8Quantize, PortableWritesTheCodecsFormerBytes) {
  // The hash of the message the int8 codec's scalar loop wrote before the per-level kernels
  // (scales then values; 1000 elements, chunks of 256, seed 42).
  const Message m = quantize_at(Isa::kPortable, golden_input(1000), 256, 42, 0x0123456789abcdefull);
  EXPECT_EQ(fnv1a(m), 0x8dddcfe4b6371272ull);
}

// The inputs of the level comparison: name and values.
std::vector<std::pair<std::string, std::vector<float>>> inputs(int64_t n) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::pair<std::string, std::vector<float>>> out;
  out.emplace_back("ramp", golden_input(n));
  out.emplace_back("zeros", std::vector<float>(static_cast<size_t>(n), 0.0f));
  std::vector<float> denormal = ramp(n, 7);
  for (float& v : denormal) v *= 1e-39f;
  out.emplace_back("denormals", denormal);
  std::vector<float> special = ramp(n, 99);
  for (int64_t i = 3; i < n; i += 17) special[static_cast<size_t>(i)] = nan;
  for (int64_t i = 300; i < n; i += 97) special[static_cast<size_t>(i)] = i % 2 ? inf : -inf;
  out.emplace_back("inf and NaN", special);
  std::vector<float> nans = ramp(n, 5);
  for (int64_t i = 0; i < std::min<int64_t>(n, 40); ++i) nans[static_cast<size_t>(i)] = nan;
  out.emplace_back("NaN first", nans);
  return out;
}

void expect_same(const Message& got, const Message& want, const std::string& what) {
  ASSERT_EQ(got.scales.size(), want.scales.size()) << what;
  for (size_t c = 0; c < got.scales.size(); ++c)
    ASSERT_EQ(std::bit_cast<uint32_t>(got.scales[c]), std::bit_cast<uint32_t>(want.scales[c]))
        << what << ": scale " << c << " is " << got.scales[c] << ", want " << want.scales[c];
  for (size_t i = 0; i < got.q.size(); ++i)
    ASSERT_EQ(got.q[i], want.q[i]) << what << ": element " << i;
}

TEST(Int8Quantize, EveryLevelWritesThePortableBytes) {
  constexpr int64_t kLengths[] = {0, 1, 3, 4, 7, 31, 32, 33, 63, 255, 256, 257, 511, 1000, 4099};
  constexpr int64_t kChunks[] = {256, 4, 12, 36};
  constexpr uint64_t kKeys[][2] = {{0, 0}, {42, 0x0123456789abcdefull}, {~0ull, 1ull << 40}};
  for (Isa level : supported_isas()) {
    if (level == Isa::kPortable) continue;
    for (int64_t n : kLengths)
      for (int64_t chunk : kChunks)
        for (const auto& key : kKeys)
          for (const auto& [name, x] : inputs(n)) {
            const std::string what = std::string(isa_name(level)) + ", n " + std::to_string(n) +
                                     ", chunk " + std::to_string(chunk) + ", seed " +
                                     std::to_string(key[0]) + ", " + name;
            expect_same(quantize_at(level, x, chunk, key[0], key[1]),
                        quantize_at(Isa::kPortable, x, chunk, key[0], key[1]), what);
          }
  }
}

TEST(Int8Quantize, DequantizeAddGivesThePortableBitsAtEveryLevel) {
  for (Isa level : supported_isas()) {
    for (int64_t n : {1, 7, 8, 9, 255, 256, 1000, 4099}) {
      const Message m = quantize_at(Isa::kPortable, golden_input(n), 256, 3, 4);
      const std::vector<float> acc0 = ramp(n, 11);
      std::vector<float> got = acc0, want = acc0;
      kernels_for(level).int8_dequantize_add(got.data(), m.q.data(), m.scales.data(), n, 256);
      for (int64_t i = 0; i < n; ++i) {  // the definition, element by element
        const auto k = static_cast<size_t>(i);
        want[k] += static_cast<float>(m.q[k]) * m.scales[static_cast<size_t>(i / 256)];
      }
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
            << isa_name(level) << ", n " << n << ": element " << i;
    }
  }
}

TEST(Int8Quantize, ValuesStayWithinOneStepOfTheInputAndChunksAreChecked) {
  const std::vector<float> x = ramp(1000, 12345);
  const Message m = quantize_at(isa(), x, 256, 1, 2);
  for (size_t i = 0; i < x.size(); ++i) {
    const float step = m.scales[i / 256];
    EXPECT_LE(std::fabs(m.q[i] * step - x[i]), step * 1.0001f) << "element " << i;
  }
  std::vector<int8_t> q(8);
  std::vector<float> scales(2);
  EXPECT_THROW(int8_quantize(q.data(), scales.data(), x.data(), 8, 6, 0, 0), Error);
}

}  // namespace
}  // namespace tessel::ops
