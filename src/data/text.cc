// Character-level language modelling over one text file (kind text).
//
// Tokens are bytes; the vocabulary is the sorted set of distinct bytes in the whole file, so
// token id = rank of the byte in that set and num_classes = vocabulary size (data-dependent),
// unless DataSpec::vocabulary fixes it (a checkpoint's: every byte must be in it).
// The first floor((1 - test_fraction) * n) bytes form the train split, the rest the test split.
// Within a split, sample i is the window starting at s = i * context: inputs are ids
// [s, s + context), labels ids [s + 1, s + context + 1) - the next token at each position.
// Windows do not overlap, so a split of L tokens holds floor((L - 1) / context) samples.
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "datasets_internal.h"

namespace tessel::data::detail {
namespace {

class TextDataset final : public Dataset {
 public:
  // Windows over ids[begin, end) of a token buffer shared by both splits.
  TextDataset(std::shared_ptr<const std::vector<uint8_t>> ids, size_t begin, size_t end,
              int64_t context, int64_t vocab)
      : ids_(std::move(ids)),
        begin_(begin),
        context_(context),
        vocab_(vocab),
        count_(static_cast<int64_t>((end - begin - 1) / static_cast<size_t>(context))) {}
  std::string name() const override { return "text"; }
  int64_t size() const override { return count_; }
  Shape input_shape() const override { return {context_}; }
  DType input_dtype() const override { return DType::kI32; }
  Shape label_shape() const override { return {context_}; }
  int64_t num_classes() const override { return vocab_; }

  void get(int64_t index, void* x, int32_t* y) const override {
    TESSEL_CHECK(index >= 0 && index < count_, "dataset text: index ", index, " outside [0, ",
                 count_, ")");
    const uint8_t* src = ids_->data() + begin_ + static_cast<size_t>(index * context_);
    int32_t* dst = static_cast<int32_t*>(x);
    for (int64_t t = 0; t < context_; ++t) {
      dst[t] = src[t];
      y[t] = src[t + 1];
    }
  }

 private:
  std::shared_ptr<const std::vector<uint8_t>> ids_;
  size_t begin_;
  int64_t context_;
  int64_t vocab_;
  int64_t count_;
};

std::vector<uint8_t> read_text(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw IoError(str("data: text file not found, got data.path = \"", path,
                      "\"; set data.path to a readable text file"));
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) throw IoError(str("data: cannot open ", path, ", got \"", std::strerror(errno), "\""));
  uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw IoError(str("data: cannot stat ", path, ", got \"", ec.message(), "\""));
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f.get());
  if (got != bytes.size())
    throw IoError(str("data: cannot read ", path, ", got ", got, " of ", bytes.size(), " bytes"));
  return bytes;
}

// The bytes present, in increasing order: the vocabulary of a fresh model.
std::string distinct_bytes(const std::vector<uint8_t>& bytes) {
  std::array<bool, 256> present{};
  for (uint8_t b : bytes) present[b] = true;
  std::string out;
  for (int b = 0; b < 256; ++b)
    if (present[b]) out += static_cast<char>(b);
  return out;
}

std::string byte_str(uint8_t b) {
  char buf[16];
  std::snprintf(buf, sizeof buf, b >= 32 && b < 127 ? "'%c'" : "0x%02x", b);
  return buf;
}

// Replaces each byte by its id in `vocabulary`, in place. A byte the vocabulary lacks is an
// error naming the first one and how many there are.
void to_ids(std::vector<uint8_t>& bytes, const std::string& vocabulary, const DataSpec& spec) {
  std::array<int, 256> id;
  id.fill(-1);
  for (size_t i = 0; i < vocabulary.size(); ++i)
    id[static_cast<uint8_t>(vocabulary[i])] = static_cast<int>(i);
  size_t unknown = 0, first = 0;
  for (size_t i = 0; i < bytes.size(); ++i)
    if (id[bytes[i]] < 0 && unknown++ == 0) first = i;
  if (unknown > 0)
    throw InvalidArgument(str(
        "data: ", spec.path, " holds ", unknown, " bytes outside the model's ", vocabulary.size(),
        "-token vocabulary, the first ", byte_str(bytes[first]), " at byte ", first,
        "; the model only knows the characters of the text "
        "it was trained on (its checkpoint's manifest.json lists them)"));
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(id[b]);
}

}  // namespace

Splits make_text_splits(const DataSpec& spec) {
  check_range("context", spec.context, 1, int64_t{1} << 24);
  check_test_fraction(spec);
  std::vector<uint8_t> bytes = read_text(spec.path);
  const size_t n = bytes.size();
  const size_t need = static_cast<size_t>(spec.context) + 1;  // one window and its last label
  if (n == 0)
    throw IoError(str("data: text file ", spec.path,
                      " is empty, got 0 bytes; set data.path to a file with some text"));

  const std::string vocabulary = spec.vocabulary.empty() ? distinct_bytes(bytes) : spec.vocabulary;
  const auto vocab = static_cast<int64_t>(vocabulary.size());
  to_ids(bytes, vocabulary, spec);

  const size_t train_end =
      static_cast<size_t>(std::floor((1.0 - spec.test_fraction) * static_cast<double>(n)));
  if (train_end < need)
    throw InvalidArgument(str("data: text file ", spec.path, " is too short, got ", train_end,
                              " train bytes of ", n, ", need at least context + 1 = ", need,
                              "; lower data.context or data.test_fraction, or use a longer file"));
  const size_t test_len = n - train_end;
  if (spec.test_fraction > 0 && test_len < need)
    throw InvalidArgument(str("data: text test split of ", spec.path, " is too short, got ",
                              test_len, " bytes, need context + 1 = ", need,
                              "; raise data.test_fraction, lower data.context, or set "
                              "data.test_fraction = 0 for no test set"));

  auto ids = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  Splits s;
  s.vocabulary = vocabulary;
  s.train = std::make_shared<TextDataset>(ids, 0, train_end, spec.context, vocab);
  if (spec.test_fraction > 0)
    s.test = std::make_shared<TextDataset>(ids, train_end, n, spec.context, vocab);
  return s;
}

}  // namespace tessel::data::detail
