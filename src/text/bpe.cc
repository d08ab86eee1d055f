// BpeTokenizer: encoding by ranks (tiktoken's byte_pair_merge), decoding, the tokenizer file.
#include "tessel/text/bpe.h"

#include <openssl/evp.h>

#include <climits>
#include <filesystem>

#include "tessel/core/error.h"
#include "tessel/text/file.h"

namespace tessel::text {
namespace {

constexpr int32_t kNone = INT32_MAX;  // a span that is no token

std::string base64(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// False when `text` is not padded base64.
bool unbase64(std::string_view text, std::string* out) {
  if (text.empty() || text.size() % 4 != 0 ||
      text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") !=
          std::string_view::npos)
    return false;
  out->assign(text.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out->data()),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0) return false;
  const size_t pad = text.ends_with("==") ? 2 : text.ends_with('=') ? 1 : 0;
  out->resize(static_cast<size_t>(n) - pad);
  return true;
}

std::string shown(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    char buf[8];
    std::snprintf(buf, sizeof buf, c >= 32 && c < 127 && c != '\\' ? "%c" : "\\x%02x", c);
    out += buf;
  }
  return "\"" + out + "\"";
}

}  // namespace

BpeTokenizer::BpeTokenizer(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
  if (tokens_.size() > static_cast<size_t>(INT32_MAX - 1))
    throw InvalidArgument(str("bpe: ", tokens_.size(), " tokens do not fit int32 ids"));
  rank_.reserve(tokens_.size());
  for (size_t r = 0; r < tokens_.size(); ++r) {
    if (tokens_[r].empty())
      throw InvalidArgument(str("bpe: token of rank ", r, " is empty; every token is 1+ bytes"));
    if (!rank_.emplace(tokens_[r], static_cast<int32_t>(r)).second)
      throw InvalidArgument(str("bpe: token of rank ", r, " ", shown(tokens_[r]),
                                " repeats the one of rank ", rank_.at(tokens_[r]),
                                "; every token's bytes must be its own"));
  }
  for (int b = 0; b < 256; ++b)
    if (rank(std::string_view(reinterpret_cast<const char*>(&b), 1)) < 0)
      throw InvalidArgument(str("bpe: the single byte ", b, " is no token, got ", tokens_.size(),
                                " tokens; a byte-level BPE needs all 256 bytes as tokens"));
}

int32_t BpeTokenizer::rank(std::string_view bytes) const {
  const auto it = rank_.find(bytes);
  return it == rank_.end() ? -1 : it->second;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (const int32_t whole = rank(piece); whole >= 0) {
    out.push_back(whole);
    return;
  }
  // parts[i] = (start of part i, rank of parts i and i + 1 joined); the last two are sentinels.
  struct Part {
    size_t start;
    int32_t rank;
  };
  auto rank_or_none = [&](size_t lo, size_t hi) {
    const int32_t r = rank(piece.substr(lo, hi - lo));
    return r < 0 ? kNone : r;
  };
  const size_t n = piece.size();
  std::vector<Part> parts;
  parts.reserve(n + 1);
  for (size_t i = 0; i + 1 < n; ++i) parts.push_back({i, rank_or_none(i, i + 2)});
  parts.push_back({n - 1, kNone});
  parts.push_back({n, kNone});
  // The rank of parts i..i+2 joined, read before part i + 1 is removed.
  auto joined = [&](size_t i) {
    return i + 3 < parts.size() ? rank_or_none(parts[i].start, parts[i + 3].start) : kNone;
  };
  for (;;) {
    size_t best = 0;
    int32_t best_rank = kNone;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].rank < best_rank) best_rank = parts[i].rank, best = i;
    if (best_rank == kNone) break;
    if (best > 0) parts[best - 1].rank = joined(best - 1);
    parts[best].rank = joined(best);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    out.push_back(rank(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start)));
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  gpt2_pieces(text, [&](std::string_view piece) { encode_piece(piece, out); });
  return out;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= tokens_.size())
      throw InvalidArgument(str("bpe: token ", i, " is ", ids[i], ", outside the vocabulary of ",
                                tokens_.size(), "; decode ids of this tokenizer only"));
    out += tokens_[static_cast<size_t>(ids[i])];
  }
  return out;
}

std::string BpeTokenizer::file_text() const {
  std::string out;
  for (size_t r = 0; r < tokens_.size(); ++r)
    out += base64(tokens_[r]) + " " + std::to_string(r) + "\n";
  return out;
}

nlohmann::json BpeTokenizer::to_json() const {
  nlohmann::json ranks = nlohmann::json::array();
  for (const std::string& t : tokens_) ranks.push_back(base64(t));
  return {{"kind", "bpe"}, {"ranks", std::move(ranks)}};
}

BpeTokenizer parse_bpe_file(const std::string& text, const std::string& name) {
  auto corrupt = [&](size_t line, const std::string& what) -> IoError {
    return IoError(str("tokenizer: ", name, " line ", line, " ", what,
                       "; a tokenizer file has one \"<base64 bytes> <rank>\" line per token in "
                       "rank order (write one with `tessel tokenizer train`)"));
  };
  std::vector<std::string> tokens;
  size_t line = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string_view row(text.data() + at, end - at);
    at = end + 1;
    ++line;
    if (row.empty()) continue;
    const size_t space = row.find(' ');
    std::string bytes;
    if (space == std::string_view::npos || !unbase64(row.substr(0, space), &bytes))
      throw corrupt(
          line, str("is not \"<base64 bytes> <rank>\", got \"", excerpt(std::string(row)), "\""));
    const std::string rank(row.substr(space + 1));
    if (rank != std::to_string(tokens.size()))
      throw corrupt(line, str("has rank \"", excerpt(rank), "\", expected ", tokens.size()));
    tokens.push_back(std::move(bytes));
  }
  try {
    return BpeTokenizer(std::move(tokens));
  } catch (const InvalidArgument& e) {
    throw IoError(str("tokenizer: ", name, " is not a usable tokenizer: ", e.what()));
  }
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return load_gpt2_files((std::filesystem::path(path) / "encoder.json").string(),
                           (std::filesystem::path(path) / "vocab.bpe").string());
  return parse_bpe_file(read_file(path, "tokenizer"), path);
}

}  // namespace tessel::text
