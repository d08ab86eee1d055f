// SHA-256 through OpenSSL: FIPS 180-4 / NIST known answers, and streaming in pieces of every
// size (empty ones included) giving the one-shot digest.
#include "tessel/core/sha256.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "tessel/core/rng.h"

namespace tessel {
namespace {

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(sha256_hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(sha256_hex(million.data(), million.size()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Sha256 h;  // the same million fed in uneven pieces
  for (size_t i = 0; i < million.size(); i += 777)
    h.update(million.data() + i, std::min<size_t>(777, million.size() - i));
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, StreamingInPiecesEqualsOneShot) {
  const CounterRng rng(7, 1), pieces(7, 2);
  std::vector<uint8_t> data(300000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(rng.bits(i));
  for (size_t size : {size_t{0}, size_t{1}, size_t{55}, size_t{56}, size_t{64}, size_t{65},
                      size_t{1000}, data.size()}) {
    const std::string whole = sha256_hex(data.data(), size);
    Sha256 h;
    uint64_t draw = 0;
    for (size_t at = 0; at < size;) {  // pieces of 0 to 199 bytes, crossing block edges
      const size_t n = std::min<size_t>(pieces.bits(draw++) % 200, size - at);
      h.update(data.data() + at, n);
      at += n;
    }
    EXPECT_EQ(h.hex_digest(), whole) << size << " bytes";
  }
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

TEST(Sha256, DigestBytesMatchHex) {
  Sha256 a, b;
  a.update("abc", 3);
  b.update("abc", 3);
  const std::array<uint8_t, 32> bytes = a.digest();
  const std::string hex = b.hex_digest();
  for (size_t i = 0; i < bytes.size(); ++i)
    EXPECT_EQ(std::stoi(hex.substr(2 * i, 2), nullptr, 16), bytes[i]) << i;
}

}  // namespace
}  // namespace tessel
