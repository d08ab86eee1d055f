// Language-modelling data over text (kind text) and token files (kind tokens, tokens.cc).
//
// Text is read through a tokenizer: the checkpoint's when one is given (DataSpec::tokenizer),
// else a BPE tokenizer file (data.tokenizer), else the file's own distinct bytes (char-level:
// token id = rank of the byte among them). num_classes is the tokenizer's vocabulary size.
// The first floor((1 - test_fraction) * n) tokens form the train split, the rest the test split
// (or the test split is data.test_path's, read the same way).
// Within a split, sample i is the window starting at s = i * context: inputs are ids
// [s, s + context), labels ids [s + 1, s + context + 1) - the next token at each position.
// Windows do not overlap, so a split of L tokens holds floor((L - 1) / context) samples.
#include <cmath>
#include <memory>

#include "datasets_internal.h"
#include "tessel/text/bpe.h"
#include "tessel/text/file.h"

namespace tessel::data::detail {
namespace {

class TokenWindows final : public Dataset {
 public:
  // Windows over ids[begin, end) of a token buffer shared by both splits.
  TokenWindows(std::string name, std::shared_ptr<const std::vector<int32_t>> ids, size_t begin,
               size_t end, int64_t context, int64_t vocab)
      : name_(std::move(name)),
        ids_(std::move(ids)),
        begin_(begin),
        context_(context),
        vocab_(vocab),
        count_(static_cast<int64_t>((end - begin - 1) / static_cast<size_t>(context))) {}
  std::string name() const override { return name_; }
  int64_t size() const override { return count_; }
  Shape input_shape() const override { return {context_}; }
  DType input_dtype() const override { return DType::kI32; }
  Shape label_shape() const override { return {context_}; }
  int64_t num_classes() const override { return vocab_; }

  void get(int64_t index, void* x, int32_t* y) const override {
    TESSEL_CHECK(index >= 0 && index < count_, "dataset ", name_, ": index ", index,
                 " outside [0, ", count_, ")");
    const int32_t* src = ids_->data() + begin_ + static_cast<size_t>(index * context_);
    std::memcpy(x, src, static_cast<size_t>(context_) * sizeof(int32_t));
    std::memcpy(y, src + 1, static_cast<size_t>(context_) * sizeof(int32_t));
  }

 private:
  std::string name_;
  std::shared_ptr<const std::vector<int32_t>> ids_;
  size_t begin_;
  int64_t context_;
  int64_t vocab_;
  int64_t count_;
};

// The tokenizer text is read with: the checkpoint's, data.tokenizer's, or the text's bytes.
std::shared_ptr<const text::Tokenizer> text_tokenizer(const DataSpec& spec,
                                                      const std::string& bytes) {
  if (spec.tokenizer) return spec.tokenizer;
  if (!spec.tokenizer_path.empty())
    return std::make_shared<const text::BpeTokenizer>(
        text::BpeTokenizer::load(spec.tokenizer_path));
  return std::make_shared<const text::ByteTokenizer>(text::ByteTokenizer::of_text(bytes));
}

std::vector<int32_t> encode_file(const text::Tokenizer& tokenizer, const std::string& bytes,
                                 const std::string& path) {
  try {
    return tokenizer.encode(bytes);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(str("data: ", path, ": ", e.what()));
  }
}

}  // namespace

Splits token_windows(std::vector<int32_t> ids, std::vector<int32_t> test_ids, const DataSpec& spec,
                     int64_t vocab) {
  const size_t n = ids.size();
  const size_t need = static_cast<size_t>(spec.context) + 1;  // one window and its last label
  const bool own_test = spec.test_path.empty();
  const size_t train_end =
      own_test
          ? static_cast<size_t>(std::floor((1.0 - spec.test_fraction) * static_cast<double>(n)))
          : n;
  if (train_end < need)
    throw InvalidArgument(str("data: ", spec.path, " is too short, got ", train_end,
                              " train tokens of ", n, ", need at least context + 1 = ", need,
                              "; lower data.context or data.test_fraction, or use a longer file"));
  auto all = std::make_shared<std::vector<int32_t>>(std::move(ids));
  size_t test_begin = train_end, test_end = n;
  if (!own_test) {
    test_begin = all->size();
    all->insert(all->end(), test_ids.begin(), test_ids.end());
    test_end = all->size();
  }
  const size_t test_len = test_end - test_begin;
  const bool with_test = !own_test || spec.test_fraction > 0;
  if (with_test && test_len < need)
    throw InvalidArgument(str("data: the test split of ", own_test ? spec.path : spec.test_path,
                              " is too short, got ", test_len, " tokens, need context + 1 = ", need,
                              "; use more test text, lower data.context, or set ",
                              "data.test_fraction = 0 (and no data.test_path) for no test set"));
  Splits s;
  s.train =
      std::make_shared<TokenWindows>(name_of(spec.kind), all, 0, train_end, spec.context, vocab);
  if (with_test)
    s.test = std::make_shared<TokenWindows>(name_of(spec.kind), all, test_begin, test_end,
                                            spec.context, vocab);
  return s;
}

Splits make_text_splits(const DataSpec& spec) {
  check_range("context", spec.context, 1, int64_t{1} << 24);
  check_test_fraction(spec);
  const std::string bytes = text::read_file(spec.path, "data.path");
  if (bytes.empty())
    throw IoError(str("data: text file ", spec.path,
                      " is empty, got 0 bytes; set data.path to a file with some text"));
  std::shared_ptr<const text::Tokenizer> tokenizer = text_tokenizer(spec, bytes);
  std::vector<int32_t> test_ids;
  if (!spec.test_path.empty())
    test_ids =
        encode_file(*tokenizer, text::read_file(spec.test_path, "data.test_path"), spec.test_path);
  Splits s = token_windows(encode_file(*tokenizer, bytes, spec.path), std::move(test_ids), spec,
                           tokenizer->vocab_size());
  s.tokenizer = std::move(tokenizer);
  return s;
}

}  // namespace tessel::data::detail
