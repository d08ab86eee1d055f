// Token files (token_file.h) and the dataset of kind tokens: next-token windows over a token
// file, as text.cc makes them over a text file.
#include <cstring>

#include "datasets_internal.h"
#include "tessel/data/token_file.h"
#include "tessel/text/bpe.h"
#include "tessel/text/file.h"

namespace tessel::data {
namespace {

constexpr size_t kHeader = 256 * sizeof(int32_t);

}  // namespace

std::string token_file_bytes(const std::vector<int32_t>& tokens) {
  if (tokens.size() >= (size_t{1} << 31))
    throw InvalidArgument(str("tokens: ", tokens.size(), " tokens do not fit a token file's ",
                              "int32 count; split the text into several files"));
  bool wide = false;
  for (int32_t t : tokens) {
    TESSEL_CHECK(t >= 0, "tokens: negative token id ", t);
    wide |= t > 0xffff;
  }
  std::vector<int32_t> header(256, 0);
  header[0] = wide ? kTokenMagic32 : kTokenMagic16;
  header[1] = wide ? 7 : 1;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string bytes(reinterpret_cast<const char*>(header.data()), kHeader);
  for (int32_t t : tokens) {
    const auto u = static_cast<uint32_t>(t);
    const char le[4] = {static_cast<char>(u), static_cast<char>(u >> 8), static_cast<char>(u >> 16),
                        static_cast<char>(u >> 24)};
    bytes.append(le, wide ? 4 : 2);
  }
  return bytes;
}

std::vector<int32_t> read_token_file(const std::string& path) {
  const std::string bytes = text::read_file(path, "tokens");
  const std::string what = "; write token files with `tessel tokenize` (or llm.c's write_datafile)";
  if (bytes.size() < kHeader)
    throw IoError(str("tokens: ", path, " is ", bytes.size(), " bytes, shorter than the ", kHeader,
                      "-byte header of a token file", what));
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof header);
  const bool narrow = header[0] == kTokenMagic16 && header[1] == 1;
  const bool wide = header[0] == kTokenMagic32 && header[1] == 7;
  if (!narrow && !wide)
    throw IoError(str("tokens: ", path, " has magic ", header[0], " version ", header[1],
                      ", not a token file's (", kTokenMagic16, " version 1 for uint16 tokens, ",
                      kTokenMagic32, " version 7 for uint32)", what));
  const size_t width = narrow ? 2 : 4;
  if (header[2] < 0 || bytes.size() != kHeader + static_cast<size_t>(header[2]) * width)
    throw IoError(str("tokens: ", path, " says it holds ", header[2], " tokens of ", width,
                      " bytes, but has ", bytes.size() - kHeader, " bytes after its header; the ",
                      "file is truncated or corrupt", what));
  std::vector<int32_t> out(static_cast<size_t>(header[2]));
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data() + kHeader);
  for (size_t i = 0; i < out.size(); ++i, p += width)
    out[i] = static_cast<int32_t>(narrow ? p[0] | p[1] << 8
                                         : p[0] | p[1] << 8 | p[2] << 16 | uint32_t{p[3]} << 24);
  return out;
}

}  // namespace tessel::data

namespace tessel::data::detail {

Splits make_tokens_splits(const DataSpec& spec) {
  check_range("context", spec.context, 1, int64_t{1} << 24);
  check_test_fraction(spec);
  std::shared_ptr<const text::Tokenizer> tokenizer = spec.tokenizer;
  if (!tokenizer && !spec.tokenizer_path.empty())
    tokenizer =
        std::make_shared<const text::BpeTokenizer>(text::BpeTokenizer::load(spec.tokenizer_path));
  std::vector<int32_t> ids = read_token_file(spec.path), test_ids;
  if (!spec.test_path.empty()) test_ids = read_token_file(spec.test_path);
  // The vocabulary: the tokenizer's, else the largest id seen + 1 (or data.classes).
  int64_t vocab = tokenizer ? tokenizer->vocab_size() : 1;
  for (const auto* file : {&ids, &test_ids})
    for (int32_t t : *file) {
      if (t < 0 || (tokenizer && t >= vocab))
        throw InvalidArgument(str("data: ", file == &ids ? spec.path : spec.test_path,
                                  " holds token id ", static_cast<uint32_t>(t), ", outside the ",
                                  vocab, "-token vocabulary of data.tokenizer; tokenize the text ",
                                  "with the same tokenizer"));
      if (!tokenizer) vocab = std::max<int64_t>(vocab, int64_t{t} + 1);
    }
  // data.classes pads a file's own vocabulary (GPT-2: 50257 ids to 50304, a multiple of 128).
  if (!tokenizer) {
    vocab = resolve_classes(vocab - 1, spec.classes, spec.path);
  } else if (spec.classes != 0) {
    throw InvalidArgument(str("data: data.classes = ", spec.classes, " with data.tokenizer: the ",
                              "vocabulary is the tokenizer's ", vocab, " tokens (generation ",
                              "would sample ids it cannot decode); set data.classes = 0"));
  }
  Splits s = token_windows(std::move(ids), std::move(test_ids), spec, vocab);
  s.tokenizer = std::move(tokenizer);
  return s;
}

}  // namespace tessel::data::detail
