// Tokenizer: text <-> token ids for a language model, one interface for both kinds tessel has.
// A ByteTokenizer gives each distinct byte of the training text an id (char-level models:
// the vocabulary is what the text held, and a byte outside it cannot be encoded); a
// BpeTokenizer (bpe.h) is byte-level BPE, which encodes any text. Tokenizers are immutable
// once built, so one may be shared by threads. A checkpoint stores its model's tokenizer as
// to_json() (manifest.json); tokenizer_from_json reads it back.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::text {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int64_t vocab_size() const = 0;
  // Throws InvalidArgument naming the byte when the text holds one this tokenizer cannot
  // encode (a ByteTokenizer's missing byte).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The bytes of the tokens, concatenated (not always valid UTF-8: a token can end inside a
  // character). Throws InvalidArgument naming an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // {"kind": "bytes" | "bpe", ...}: what tokenizer_from_json reads back.
  virtual nlohmann::json to_json() const = 0;
};

// Token id = index of the byte in `vocabulary` (distinct bytes, at least one).
class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(std::string vocabulary);
  // The distinct bytes of `text`, in increasing order: the vocabulary of a fresh model.
  static ByteTokenizer of_text(std::string_view text);
  const std::string& vocabulary() const { return vocabulary_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(vocabulary_.size()); }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  nlohmann::json to_json() const override;

 private:
  std::string vocabulary_;
  int32_t id_[256];  // -1: not in the vocabulary
};

// The tokenizer to_json() described. Throws InvalidArgument naming the field that is wrong.
std::shared_ptr<const Tokenizer> tokenizer_from_json(const nlohmann::json& j);

// Whether two tokenizers give the same ids (same kind and vocabulary); null equals null only.
bool same_tokenizer(const Tokenizer* a, const Tokenizer* b);

}  // namespace tessel::text
