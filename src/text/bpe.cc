// BpeTokenizer: encoding by ranks (tiktoken's byte_pair_merge), decoding, the tokenizer file.
#include "tessel/text/bpe.h"

#include <openssl/evp.h>

#include <climits>
#include <filesystem>
#include <queue>
#include <tuple>

#include "tessel/core/error.h"
#include "tessel/text/file.h"

namespace tessel::text {
namespace {

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
  if (piece.empty()) return;
  if (const int32_t whole = rank(piece); whole >= 0) {
    out.push_back(whole);
    return;
  }
  // The parts form a list over byte offsets: the part starting at s ends at end[s] (n: the last
  // ends the piece); dead[s] once s is merged into the part before it. A candidate is a pair of
  // adjacent parts (s, its right neighbour) whose joined bytes are a token, keyed (rank, s): the
  // smallest is tiktoken's choice (lowest rank, leftmost). It is stale when s has died or the
  // pair now ends elsewhere (the rank depends on the joined bytes only).
  const size_t n = piece.size();
  std::vector<size_t> end(n), before(n);
  std::vector<bool> dead(n, false);
  for (size_t i = 0; i < n; ++i) end[i] = i + 1, before[i] = i - 1;
  using Candidate = std::tuple<int32_t, size_t, size_t>;  // rank, s, where the pair ends
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto pair_end = [&](size_t s) { return end[s] < n ? end[end[s]] : n + 1; };  // n + 1: none
  auto offer = [&](size_t s) {
    if (const size_t e = pair_end(s); e <= n)
      if (const int32_t r = rank(piece.substr(s, e - s)); r >= 0) heap.push({r, s, e});
  };
  for (size_t s = 0; s + 1 < n; ++s) offer(s);
  while (!heap.empty()) {
    const auto [r, s, e] = heap.top();
    heap.pop();
    if (dead[s] || pair_end(s) != e) continue;
    const size_t m = end[s];  // the right part joins s
    dead[m] = true;
    end[s] = end[m];
    if (end[s] < n) before[end[s]] = s;
    if (s > 0) offer(before[s]);
    offer(s);
  }
  for (size_t s = 0; s < n; s = end[s]) out.push_back(rank(piece.substr(s, end[s] - s)));
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
