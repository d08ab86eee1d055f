// SHA-256 (FIPS 180-4), used for params_sha256 in summaries and checkpoint integrity; computed
// by OpenSSL's libcrypto (EVP), which uses the CPU's SHA extensions (or AVX2) where it has them.
// Incremental: update() any number of times, then hex_digest(). Not thread safe per object.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX, kept out of the callers' includes

namespace tessel {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  std::array<uint8_t, 32> digest();  // finalises; the object is spent afterwards
  std::string hex_digest();

 private:
  struct FreeContext {
    void operator()(evp_md_ctx_st* ctx) const;
  };
  std::unique_ptr<evp_md_ctx_st, FreeContext> ctx_;
};

std::string sha256_hex(const void* data, size_t bytes);

}  // namespace tessel
