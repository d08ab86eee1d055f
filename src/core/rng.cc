#include "tessel/core/rng.h"

#include <cmath>

namespace tessel {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::array<uint32_t, 4> philox4x32(uint64_t key, std::array<uint32_t, 4> c) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kPhiloxMul0) * c[0];
    uint64_t p1 = static_cast<uint64_t>(kPhiloxMul1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += kPhiloxWeyl0;
    k1 += kPhiloxWeyl1;
  }
  return c;
}

std::array<uint32_t, 4> CounterRng::block(uint64_t index) const {
  return philox4x32(seed_, {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                            static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)});
}

uint32_t CounterRng::bits(uint64_t index) const { return block(index)[0]; }

float CounterRng::uniform(uint64_t index) const {
  return static_cast<float>(bits(index) >> 8) * (1.0f / 16777216.0f);
}

float CounterRng::normal(uint64_t index) const {
  auto r =
      philox4x32(seed_, {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                         static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)});
  // u1 in (0, 1] so log() is finite.
  double u1 = (static_cast<double>(r[0]) + 1.0) / 4294967296.0;
  double u2 = static_cast<double>(r[1]) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

uint64_t mix_stream(RngPurpose purpose, uint64_t a, uint64_t b) {
  return splitmix64(splitmix64(splitmix64(static_cast<uint64_t>(purpose)) ^ a) ^ b);
}

}  // namespace tessel
