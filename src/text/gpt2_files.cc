// GPT-2's own tokenizer files: encoder.json maps each token, its bytes spelled one character per
// byte through GPT-2's bytes_to_unicode table, to its id; vocab.bpe lists the merges in rank
// order after a "#version" line. A token's id is its rank, as tiktoken's gpt2 encoding has it
// (tiktoken.load.data_gym_to_mergeable_bpe_ranks checks the same agreement).
#include <array>
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

}  // namespace

BpeTokenizer load_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe) {
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
  std::vector<std::string> tokens(enc.size());
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
  size_t line = 0, merge = 0;
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
    const int64_t expected = 256 + static_cast<int64_t>(merge++);
    if (it == id_of.end() || !id_of.contains(row.substr(0, space)) ||
        !id_of.contains(row.substr(space + 1)) || it->second != expected)
      throw IoError(str("tokenizer: ", vocab_bpe, " line ", line, " \"", excerpt(row),
                        "\" is not a merge of two tokens of ", encoder_json,
                        " into the token of id ", expected, hint));
  }
  try {
    return BpeTokenizer(std::move(tokens));
  } catch (const InvalidArgument& e) {
    throw IoError(str("tokenizer: ", encoder_json, " is not a usable tokenizer: ", e.what()));
  }
}

}  // namespace tessel::text
