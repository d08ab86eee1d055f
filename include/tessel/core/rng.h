// Counter-based random numbers (Philox4x32-10). Every number is a pure function of
// (seed, stream, index), so results never depend on which rank or thread draws them, nor in
// which order: init is keyed by (seed, parameter), dropout by (seed, step, global sample), the
// data shuffle by (seed, epoch). Stateless and thread safe.
#pragma once

#include <array>
#include <cstdint>

namespace tessel {

// What a stream of random numbers is for; part of the key so purposes never collide.
enum class RngPurpose : uint32_t {
  kInit = 1,
  kDropout = 2,
  kShuffle = 3,
  kData = 4,
  kSample = 5,
  kCompress = 6
};

// Philox4x32-10's round multipliers and key increments (Salmon et al. 2011), for the vector
// versions (src/ops/quantize_avx2.cc) that must match philox4x32 bit for bit.
constexpr uint32_t kPhiloxMul0 = 0xD2511F53u;
constexpr uint32_t kPhiloxMul1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxWeyl1 = 0xBB67AE85u;

// One Philox4x32-10 block: 4 x 32 random bits for a 128-bit counter under a 64-bit key.
std::array<uint32_t, 4> philox4x32(uint64_t key, std::array<uint32_t, 4> counter);

class CounterRng {
 public:
  // stream identifies one use (e.g. mix_stream(kDropout, step, sample)); index counts within it.
  CounterRng(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}

  uint32_t bits(uint64_t index) const;
  // The whole Philox block of `index` (bits() is its first lane): four numbers per call.
  std::array<uint32_t, 4> block(uint64_t index) const;
  float uniform(uint64_t index) const;  // in [0, 1), 24 bits of precision
  float normal(uint64_t index) const;   // standard normal (Box-Muller on one Philox block)

 private:
  uint64_t seed_;
  uint64_t stream_;
};

// Mixes a purpose and up to two counters into one 64-bit stream id (SplitMix64 finaliser).
uint64_t mix_stream(RngPurpose purpose, uint64_t a = 0, uint64_t b = 0);

}  // namespace tessel
