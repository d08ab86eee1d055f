#include "tessel/core/sha256.h"

#include <openssl/err.h>
#include <openssl/evp.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

// Throws with OpenSSL's reason when an EVP call failed (no memory, or a libcrypto configured
// without SHA-256, e.g. a FIPS provider that did not load).
void check(int ok, const char* call) {
  if (ok == 1) return;
  char reason[256] = "unknown reason";
  if (const unsigned long code = ERR_get_error()) ERR_error_string_n(code, reason, sizeof reason);
  throw Error(str("sha256: OpenSSL ", call, " failed: ", reason,
                  "; check the libcrypto installation (libssl3) and its OPENSSL_CONF"));
}

}  // namespace

void Sha256::FreeContext::operator()(evp_md_ctx_st* ctx) const { EVP_MD_CTX_free(ctx); }

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  check(ctx_ != nullptr, "EVP_MD_CTX_new");
  check(EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr), "EVP_DigestInit_ex");
}

void Sha256::update(const void* data, size_t bytes) {
  // Nothing to add; an empty buffer's data() may be null.
  if (bytes == 0) return;
  check(EVP_DigestUpdate(ctx_.get(), data, bytes), "EVP_DigestUpdate");
}

std::array<uint8_t, 32> Sha256::digest() {
  std::array<uint8_t, 32> out;
  unsigned int size = 0;
  check(EVP_DigestFinal_ex(ctx_.get(), out.data(), &size), "EVP_DigestFinal_ex");
  check(size == out.size(), "EVP_DigestFinal_ex (digest size)");
  return out;
}

std::string Sha256::hex_digest() {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : digest()) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

std::string sha256_hex(const void* data, size_t bytes) {
  Sha256 h;
  h.update(data, bytes);
  return h.hex_digest();
}

}  // namespace tessel
