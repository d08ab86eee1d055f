// GPT-2's pre-tokenisation through PCRE2 (JIT-compiled, Unicode properties for \p{L}, \p{N} and
// \s). PCRE2_MATCH_INVALID_UTF lets the pattern run over bytes that are not UTF-8: such bytes
// match nothing, and the gaps they leave become pieces of their own.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "tessel/core/error.h"
#include "tessel/text/bpe.h"

namespace tessel::text {
namespace {

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// The compiled pattern, built on first use (thread-safe static initialisation) and kept.
const pcre2_code* gpt2_code() {
  static const std::unique_ptr<pcre2_code, CodeDeleter> code = [] {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* c =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
    TESSEL_CHECK(c != nullptr, "bpe: GPT-2 pattern does not compile at ", offset, ": ",
                 pcre2_message(error));
    const int jit = pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
    TESSEL_CHECK(jit == 0, "bpe: PCRE2 JIT compile failed: ", pcre2_message(jit));
    return std::unique_ptr<pcre2_code, CodeDeleter>(c);
  }();
  return code.get();
}

}  // namespace

void gpt2_pieces(std::string_view text, const std::function<void(std::string_view)>& piece) {
  const pcre2_code* code = gpt2_code();
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
      pcre2_match_data_create_from_pattern(code, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_jit_match(code, subject, text.size(), pos, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    TESSEL_CHECK(rc > 0, "bpe: PCRE2 match failed at byte ", pos, ": ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.get());
    if (ov[0] > pos) piece(text.substr(pos, ov[0] - pos));  // bytes that are not UTF-8
    piece(text.substr(ov[0], ov[1] - ov[0]));
    pos = ov[1];
  }
  if (pos < text.size()) piece(text.substr(pos));
}

}  // namespace tessel::text
