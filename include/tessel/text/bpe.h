// Byte-level BPE (GPT-2's scheme, as tiktoken runs it). Text is first cut into pieces by
// GPT-2's pre-tokenisation pattern (gpt2_pieces); each piece is encoded on its own. A token is
// a byte string, and its id is its rank: ids 0..255 include every single byte, so any text
// encodes (byte fallback). Encoding a piece: the whole piece when it is a token, else start
// from its bytes and merge, again and again, the adjacent pair whose concatenation is the
// lowest-ranked token (leftmost first among equals) until no pair is a token. The
// tokenizer file is tiktoken's rank format: one line per token, "<base64 bytes> <rank>", in rank
// order, which tiktoken.load.load_tiktoken_bpe reads. Training (train_bpe) counts pairs once and
// updates the counts of the words a merge touches only. Immutable once built: encode and decode
// may run on several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tessel/text/tokenizer.h"

namespace tessel::text {

// GPT-2's pre-tokenisation pattern (PCRE2 syntax; tiktoken's r50k_base/gpt2 pat_str).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Calls piece(p) for each piece of `text` in order; the pieces concatenate to `text`. Bytes
// that are not valid UTF-8 match no branch of the pattern: each run of them is a piece.
void gpt2_pieces(std::string_view text, const std::function<void(std::string_view)>& piece);

class BpeTokenizer final : public Tokenizer {
 public:
  // tokens[r] is the byte string of rank (id) r. Throws InvalidArgument naming the rank when a
  // token is empty or repeated or a single byte is missing.
  explicit BpeTokenizer(std::vector<std::string> tokens);
  BpeTokenizer(BpeTokenizer&&) = default;  // rank_ views stay valid: the strings do not move
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;
  // A tokenizer file (tiktoken rank format), or a folder holding GPT-2's encoder.json and
  // vocab.bpe. Throws IoError naming the file and line when it cannot be read or is corrupt.
  static BpeTokenizer load(const std::string& path);
  // The tokenizer file's text.
  std::string file_text() const;

  const std::vector<std::string>& tokens() const { return tokens_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::vector<int32_t> encode(std::string_view text) const override;
  // Appends the ids of one pre-tokenised piece to out.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  std::string decode(std::span<const int32_t> ids) const override;
  nlohmann::json to_json() const override;

 private:
  int32_t rank(std::string_view bytes) const;  // -1: not a token

  std::vector<std::string> tokens_;
  std::unordered_map<std::string_view, int32_t> rank_;  // views into tokens_
};

// Reads a tokenizer file's text (tiktoken rank format); `name` is for messages.
BpeTokenizer parse_bpe_file(const std::string& text, const std::string& name);
// Reads GPT-2's encoder.json (token string -> id, bytes spelled through GPT-2's byte-to-
// character table) and vocab.bpe (the merges, checked against the encoder).
BpeTokenizer load_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe);
// The same files as Hugging Face's GPT2Tokenizer reads them (vocab.json, merges.txt): a BPE
// tokenizer, or, for single-byte tokens without merges short of all 256 bytes (a char-level
// model's, as gpt2_files writes them), a ByteTokenizer.
std::shared_ptr<const Tokenizer> load_gpt2_tokenizer(const std::string& encoder_json,
                                                     const std::string& vocab_bpe);

// A tokenizer as GPT-2's two files (Hugging Face's vocab.json and merges.txt): every token's
// bytes spelled through GPT-2's byte-to-character table with its id, and, for a BPE tokenizer,
// the merge that makes each longer token, in rank order. GPT2Tokenizer then encodes as this
// tokenizer does. Throws InvalidArgument for a token that is no merge of two lower-ranked ones.
struct Gpt2Files {
  std::string encoder_json, vocab_bpe;
};
Gpt2Files gpt2_files(const Tokenizer& tokenizer);

struct BpeTrainOptions {
  int64_t vocab_size = 8192;  // 256 bytes + merges; at least 256
  int64_t min_count = 2;      // stop early when the most frequent pair is rarer than this
};
// Trains a vocabulary on `texts`: each new token is the most frequent adjacent pair of tokens
// within a piece (ties: the pair of lower ids). May stop short of vocab_size when no pair is
// frequent enough; the caller reports the size reached.
BpeTokenizer train_bpe(const std::vector<std::string>& texts, const BpeTrainOptions& options);

}  // namespace tessel::text
