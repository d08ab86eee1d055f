// GPT-2's own tokenizer files: encoder.json maps each token, its bytes spelled one character per
// byte through GPT-2's bytes_to_unicode table, to its id; vocab.bpe lists the merges in rank
// order after a "#version" line. A token's id is its rank, as tiktoken's gpt2 encoding has it
// (tiktoken.load.data_gym_to_mergeable_bpe_ranks checks the same agreement).
#include <algorithm>
#include <array>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "tessel/core/error.h"
#include "tessel/text/bpe.h"
#include "tessel/text/file.h"

namespace tessel::text {
namespace {

// GPT-2's bytes_to_unicode, inverted: code point -> byte (-1: none). The printable bytes stand
// for themselves, the rest for 256, 257, ... in byte order.
std::array<int, 324> unicode_to_byte() {
  std::array<int, 324> out;
  out.fill(-1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    out[static_cast<size_t>(printable ? b : next++)] = b;
  }
  return out;
}

// The bytes a GPT-2 token string spells; false when a character is not in the table.
bool gpt2_bytes(const std::string& utf8, std::string* out) {
  static const std::array<int, 324> table = unicode_to_byte();
  out->clear();
  for (size_t i = 0; i < utf8.size();) {
    const auto c = static_cast<uint8_t>(utf8[i]);
    uint32_t cp = c;
    size_t len = 1;
    if (c >= 0xC0 && c < 0xE0 && i + 1 < utf8.size()) {
      cp = (c & 0x1Fu) << 6 | (static_cast<uint8_t>(utf8[i + 1]) & 0x3Fu);
      len = 2;
    } else if (c >= 0x80) {
      return false;  // no character of the table needs more than two UTF-8 bytes
    }
    if (cp >= table.size() || table[cp] < 0) return false;
    *out += static_cast<char>(table[cp]);
    i += len;
  }
  return !out->empty();
}

// A token's bytes spelled as GPT-2's files spell them: each byte as its bytes_to_unicode
// character (the inverse of unicode_to_byte), in UTF-8.
std::string gpt2_spelling(std::string_view bytes) {
  static const std::array<int, 324> table = unicode_to_byte();
  static const std::array<uint32_t, 256> code_point = [] {
    std::array<uint32_t, 256> out{};
    for (size_t cp = 0; cp < table.size(); ++cp)
      if (table[cp] >= 0) out[static_cast<size_t>(table[cp])] = static_cast<uint32_t>(cp);
    return out;
  }();
  std::string out;
  for (unsigned char b : bytes) {
    const uint32_t cp = code_point[b];
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      out += static_cast<char>(0xC0 | cp >> 6);
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

// The pair of lower-ranked tokens that BPE merges into token `r`: its bytes merged by the
// lowest-ranked pair first, with only the tokens below r, as tiktoken's converters find GPT-2's
// merges. Throws InvalidArgument when that does not end in two tokens.
std::pair<std::string, std::string> merge_of(const std::vector<std::string>& tokens, size_t r,
                                             const std::unordered_map<std::string, size_t>& rank) {
  std::vector<std::string> parts;
  for (char c : tokens[r]) parts.emplace_back(1, c);
  while (parts.size() > 2) {
    size_t best = parts.size(), best_rank = r;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = rank.find(parts[i] + parts[i + 1]);
      if (it != rank.end() && it->second < best_rank) best = i, best_rank = it->second;
    }
    if (best == parts.size()) break;
    parts[best] += parts[best + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  if (parts.size() != 2 || !rank.contains(parts[0]) || !rank.contains(parts[1]))
    throw InvalidArgument(str("tokenizer: token ", r, " \"", excerpt(tokens[r]),
                              "\" is no merge of two lower-ranked tokens, which GPT-2's "
                              "merges.txt needs; train the tokenizer with tessel tokenizer train"));
  return {parts[0], parts[1]};
}

// encoder.json's tokens (bytes) by id and the number of merges of vocab.bpe, both checked.
struct Gpt2Vocab {
  std::vector<std::string> tokens;
  size_t merges = 0;
};

Gpt2Vocab read_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe) {
  const std::string hint = "; give the encoder.json and vocab.bpe of GPT-2 (openai/gpt-2)";
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(read_file(encoder_json, "tokenizer"));
  } catch (const nlohmann::json::parse_error& e) {
    throw IoError(
        str("tokenizer: ", encoder_json, " is not valid JSON (error at byte ", e.byte, ")", hint));
  }
  if (!enc.is_object() || enc.empty())
    throw IoError(str("tokenizer: ", encoder_json, " is not a JSON object of token ids", hint));
  Gpt2Vocab out;
  std::vector<std::string>& tokens = out.tokens;
  tokens.resize(enc.size());
  std::unordered_map<std::string, int64_t> id_of;  // token string -> id
  for (const auto& [key, value] : enc.items()) {
    const int64_t id = value.is_number_integer() ? value.get<int64_t>() : -1;
    std::string bytes;
    if (id < 0 || static_cast<size_t>(id) >= tokens.size() || !tokens[id].empty() ||
        !gpt2_bytes(key, &bytes))
      throw IoError(str("tokenizer: ", encoder_json, " entry \"", excerpt(key),
                        "\": ", value.dump(), " is not a GPT-2 token with an id of its own in [0, ",
                        tokens.size(), ")", hint));
    tokens[id] = std::move(bytes);
    id_of[key] = id;
  }
  const std::string merges = read_file(vocab_bpe, "tokenizer");
  size_t line = 0;
  for (size_t at = 0; at < merges.size();) {
    size_t end = merges.find('\n', at);
    if (end == std::string::npos) end = merges.size();
    const std::string row = merges.substr(at, end - at);
    at = end + 1;
    if (++line == 1 && row.starts_with("#version")) continue;
    if (row.empty()) continue;
    const size_t space = row.find(' ');
    const auto it = space == std::string::npos
                        ? id_of.end()
                        : id_of.find(row.substr(0, space) + row.substr(space + 1));
    const int64_t expected = 256 + static_cast<int64_t>(out.merges++);
    if (it == id_of.end() || !id_of.contains(row.substr(0, space)) ||
        !id_of.contains(row.substr(space + 1)) || it->second != expected)
      throw IoError(str("tokenizer: ", vocab_bpe, " line ", line, " \"", excerpt(row),
                        "\" is not a merge of two tokens of ", encoder_json,
                        " into the token of id ", expected, hint));
  }
  return out;
}

BpeTokenizer bpe_of(Gpt2Vocab vocab, const std::string& encoder_json) {
  try {
    return BpeTokenizer(std::move(vocab.tokens));
  } catch (const InvalidArgument& e) {
    throw IoError(str("tokenizer: ", encoder_json, " is not a usable tokenizer: ", e.what()));
  }
}

}  // namespace

BpeTokenizer load_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe) {
  return bpe_of(read_gpt2_files(encoder_json, vocab_bpe), encoder_json);
}

std::shared_ptr<const Tokenizer> load_gpt2_tokenizer(const std::string& encoder_json,
                                                     const std::string& vocab_bpe) {
  Gpt2Vocab vocab = read_gpt2_files(encoder_json, vocab_bpe);
  const bool bytes = vocab.merges == 0 && vocab.tokens.size() < 256 &&
                     std::all_of(vocab.tokens.begin(), vocab.tokens.end(),
                                 [](const std::string& t) { return t.size() == 1; });
  if (!bytes) return std::make_shared<BpeTokenizer>(bpe_of(std::move(vocab), encoder_json));
  std::string vocabulary;
  for (const std::string& t : vocab.tokens) vocabulary += t;
  return std::make_shared<ByteTokenizer>(std::move(vocabulary));
}

Gpt2Files gpt2_files(const Tokenizer& tokenizer) {
  Gpt2Files out{"", "#version: 0.2\n"};
  nlohmann::ordered_json encoder = nlohmann::ordered_json::object();
  if (const auto* b = dynamic_cast<const ByteTokenizer*>(&tokenizer)) {
    for (size_t id = 0; id < b->vocabulary().size(); ++id)
      encoder[gpt2_spelling(b->vocabulary().substr(id, 1))] = id;
  } else if (const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tokenizer)) {
    const std::vector<std::string>& tokens = bpe->tokens();
    std::unordered_map<std::string, size_t> rank;
    for (size_t r = 0; r < tokens.size(); ++r) rank[tokens[r]] = r;
    for (size_t r = 0; r < tokens.size(); ++r) {
      encoder[gpt2_spelling(tokens[r])] = r;
      if (tokens[r].size() < 2) continue;
      const auto [left, right] = merge_of(tokens, r, rank);
      out.vocab_bpe += gpt2_spelling(left) + " " + gpt2_spelling(right) + "\n";
    }
  } else {
    throw InvalidArgument("tokenizer: only byte and BPE tokenizers have GPT-2 files");
  }
  out.encoder_json = encoder.dump();
  return out;
}

}  // namespace tessel::text
