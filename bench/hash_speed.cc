// GB/s of tessel's checksums against the implementations they replaced (issue 28, item 8):
// CRC-32C through ISA-L (crc32_iscsi: SSE4.2 crc32 and PCLMULQDQ folding, chosen at run time)
// against the table implementation tessel had (one byte per step), and SHA-256 through OpenSSL's
// libcrypto (EVP; SHA extensions or AVX2 where the CPU has them) against tessel's own FIPS 180-4
// code. The replaced code lives on here only as the baseline, checked to give the same result.
// Each figure: the best of R passes over a buffer of random bytes (1 MiB, 64 MiB).
//
//   hash_speed [--repeats R]
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "best_of.h"
#include "tessel/core/crc32c.h"
#include "tessel/core/rng.h"
#include "tessel/core/sha256.h"
#include "tessel/ops/isa.h"

using namespace tessel;

namespace {

// The replaced CRC-32C: a 256-entry table, one byte per step.
uint32_t table_crc32c(const uint8_t* p, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (c & 1 ? 0x82F63B78u : 0u);
      t[b] = c;
    }
    return t;
  }();
  uint32_t crc = ~0u;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

// The replaced SHA-256 (FIPS 180-4, one 64-byte block at a time in portable C++).
constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void sha256_block(std::array<uint32_t, 8>& h, const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t(p[4 * i]) << 24) | (uint32_t(p[4 * i + 1]) << 16) |
           (uint32_t(p[4 * i + 2]) << 8) | uint32_t(p[4 * i + 3]);
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  std::array<uint32_t, 8> v = h;  // a b c d e f g h
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = v[7] + (rotr(v[4], 6) ^ rotr(v[4], 11) ^ rotr(v[4], 25)) +
                        ((v[4] & v[5]) ^ (~v[4] & v[6])) + kK[i] + w[i];
    const uint32_t t2 = (rotr(v[0], 2) ^ rotr(v[0], 13) ^ rotr(v[0], 22)) +
                        ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
    for (int j = 7; j > 0; --j) v[j] = v[j - 1];
    v[4] += t1;
    v[0] = t1 + t2;
  }
  for (int j = 0; j < 8; ++j) h[j] += v[j];
}

std::string table_sha256_hex(const uint8_t* p, size_t size) {
  std::array<uint32_t, 8> h = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  size_t done = 0;
  for (; size - done >= 64; done += 64) sha256_block(h, p + done);
  uint8_t tail[128] = {};  // the rest, 0x80, zeros, the length in bits (big-endian)
  const size_t rest = size - done;
  std::memcpy(tail, p + done, rest);
  tail[rest] = 0x80;
  const size_t blocks = rest + 9 > 64 ? 2 : 1;
  const uint64_t bits = uint64_t(size) * 8;
  for (int i = 0; i < 8; ++i) tail[64 * blocks - 1 - i] = uint8_t(bits >> (8 * i));
  for (size_t b = 0; b < blocks; ++b) sha256_block(h, tail + 64 * b);
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (uint32_t word : h)
    for (int shift = 28; shift >= 0; shift -= 4) s += kHex[(word >> shift) & 15];
  return s;
}

// GB/s of the best of `repeats` calls of f over `bytes` bytes, after one warm-up call.
template <typename F>
double best_gbps(int repeats, size_t bytes, F f) {
  return static_cast<double>(bytes) / bench::best_seconds(repeats, f) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("isa: %s\n", ops::isa_description().c_str());  // CPU and ISA level
  int repeats = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::stoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: hash_speed [--repeats R]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  std::printf("%-8s %8s %14s %14s %8s\n", "hash", "buffer", "replaced GB/s", "library GB/s",
              "ratio");
  for (size_t mib : {size_t{1}, size_t{64}}) {
    const size_t bytes = mib << 20;
    std::vector<uint8_t> buf(bytes);
    const CounterRng rng(42, 0);
    for (size_t i = 0; i < bytes; ++i) buf[i] = static_cast<uint8_t>(rng.bits(i));
    uint32_t crc_table = 0, crc_lib = 0;
    std::string sha_table, sha_lib;
    const double crc_old =
        best_gbps(repeats, bytes, [&] { crc_table = table_crc32c(buf.data(), bytes); });
    const double crc_new = best_gbps(repeats, bytes, [&] { crc_lib = crc32c(buf.data(), bytes); });
    const double sha_old =
        best_gbps(repeats, bytes, [&] { sha_table = table_sha256_hex(buf.data(), bytes); });
    const double sha_new =
        best_gbps(repeats, bytes, [&] { sha_lib = sha256_hex(buf.data(), bytes); });
    if (crc_table != crc_lib || sha_table != sha_lib) {
      std::fprintf(stderr, "hash_speed: the replaced and the library results differ at %zu MiB\n",
                   mib);
      return 1;
    }
    std::printf("%-8s %4zu MiB %14.2f %14.2f %7.1fx\n", "crc32c", mib, crc_old, crc_new,
                crc_new / crc_old);
    std::printf("%-8s %4zu MiB %14.2f %14.2f %7.1fx\n", "sha256", mib, sha_old, sha_new,
                sha_new / sha_old);
  }
  return 0;
}
