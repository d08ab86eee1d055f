// SHA-256 (FIPS 180-4), used for params_sha256 in summaries and checkpoint integrity.
// Incremental: update() any number of times, then hex_digest(). Not thread safe per object.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessel {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  std::array<uint8_t, 32> digest();  // finalises; the object is spent afterwards
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_;
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(const void* data, size_t bytes);

}  // namespace tessel
