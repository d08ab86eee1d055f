// ByteTokenizer, and reading any tokenizer back from its manifest form.
#include "tessel/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>

#include "tessel/core/error.h"
#include "tessel/text/bpe.h"

namespace tessel::text {
namespace {

std::string byte_str(uint8_t b) {
  char buf[16];
  std::snprintf(buf, sizeof buf, b >= 32 && b < 127 ? "'%c'" : "0x%02x", b);
  return buf;
}

}  // namespace

ByteTokenizer::ByteTokenizer(std::string vocabulary) : vocabulary_(std::move(vocabulary)) {
  std::fill(id_, id_ + 256, -1);
  if (vocabulary_.empty())
    throw InvalidArgument("tokenizer: a byte vocabulary is empty; it needs at least one byte");
  for (size_t i = 0; i < vocabulary_.size(); ++i) {
    int32_t& id = id_[static_cast<uint8_t>(vocabulary_[i])];
    if (id >= 0)
      throw InvalidArgument(str("tokenizer: byte ", byte_str(vocabulary_[i]), " appears twice ",
                                "in a byte vocabulary, at ", id, " and ", i));
    id = static_cast<int32_t>(i);
  }
}

ByteTokenizer ByteTokenizer::of_text(std::string_view text) {
  std::array<bool, 256> present{};
  for (char c : text) present[static_cast<uint8_t>(c)] = true;
  std::string vocabulary;
  for (int b = 0; b < 256; ++b)
    if (present[b]) vocabulary += static_cast<char>(b);
  return ByteTokenizer(std::move(vocabulary));
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out(text.size());
  size_t unknown = 0, first = 0;
  for (size_t i = 0; i < text.size(); ++i)
    if ((out[i] = id_[static_cast<uint8_t>(text[i])]) < 0 && unknown++ == 0) first = i;
  if (unknown > 0)
    throw InvalidArgument(str(
        "tokenizer: the text holds ", unknown, " bytes outside the model's ", vocabulary_.size(),
        "-byte vocabulary, the first ", byte_str(text[first]), " at byte ", first,
        "; a char-level model knows only the characters of its training text (train with "
        "data.tokenizer, a BPE tokenizer, to read any text)"));
  return out;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= vocabulary_.size())
      throw InvalidArgument(str("tokenizer: token ", i, " is ", ids[i],
                                ", outside the byte vocabulary of ", vocabulary_.size()));
    out += vocabulary_[static_cast<size_t>(ids[i])];
  }
  return out;
}

nlohmann::json ByteTokenizer::to_json() const {
  nlohmann::json ids = nlohmann::json::array();  // numbers: a vocabulary need not be UTF-8
  for (unsigned char b : vocabulary_) ids.push_back(b);
  return {{"kind", "bytes"}, {"vocabulary", std::move(ids)}};
}

std::shared_ptr<const Tokenizer> tokenizer_from_json(const nlohmann::json& j) {
  auto bad = [](const std::string& field, const std::string& what) {
    return InvalidArgument(str("field \"tokenizer.", field, "\" ", what));
  };
  if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string())
    throw bad("kind", "is missing or not a string");
  const std::string kind = j["kind"].get<std::string>();
  const char* list = kind == "bytes" ? "vocabulary" : "ranks";
  if (kind != "bytes" && kind != "bpe")
    throw bad("kind", str("that is '", kind, "', not 'bytes' or 'bpe'"));
  if (!j.contains(list) || !j[list].is_array()) throw bad(list, "is missing or not an array");
  const nlohmann::json& items = j[list];
  if (kind == "bpe") {
    std::string all;  // the ranks' text in the tokenizer file's form, read by its parser
    for (size_t r = 0; r < items.size(); ++r) {
      if (!items[r].is_string()) throw bad(str("ranks[", r, "]"), "is not a base64 string");
      all += items[r].get<std::string>() + " " + std::to_string(r) + "\n";
    }
    try {
      return std::make_shared<const BpeTokenizer>(parse_bpe_file(all, "manifest tokenizer"));
    } catch (const IoError& e) {
      throw bad("ranks", e.what());
    }
  }
  std::string vocabulary;
  for (size_t i = 0; i < items.size(); ++i) {
    const nlohmann::json& b = items[i];
    if (!b.is_number_unsigned() || b.get<uint64_t>() > 255 ||
        vocabulary.find(static_cast<char>(b.get<uint64_t>())) != std::string::npos)
      throw bad(str("vocabulary[", i, "]"), str("that is not a byte of its own, got ", b.dump()));
    vocabulary += static_cast<char>(b.get<uint64_t>());
  }
  if (vocabulary.empty()) throw bad("vocabulary", "that is empty");
  return std::make_shared<const ByteTokenizer>(std::move(vocabulary));
}

bool same_tokenizer(const Tokenizer* a, const Tokenizer* b) {
  if (!a || !b) return a == b;
  return a->to_json() == b->to_json();
}

}  // namespace tessel::text
