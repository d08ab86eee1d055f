// `tessel tokenizer train` (a BPE vocabulary from text files) and `tessel tokenize` (text files
// to one llm.c-format token file); docs/tokenizer.md.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "command_line.h"
#include "infer_commands.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/data/token_file.h"
#include "tessel/text/bpe.h"
#include "tessel/text/file.h"

namespace {

struct TokenizerArgs {
  std::vector<std::string> texts;
  std::string out, tokenizer;
  tessel::text::BpeTrainOptions train;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t total_bytes(const std::vector<std::string>& texts) {
  int64_t n = 0;
  for (const std::string& t : texts) n += static_cast<int64_t>(t.size());
  return n;
}

int run_train(const TokenizerArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> texts;
  for (const std::string& path : a.texts)
    texts.push_back(tessel::text::read_file(path, "tessel tokenizer"));
  const tessel::text::BpeTokenizer t = tessel::text::train_bpe(texts, a.train);
  tessel::ckpt::write_file_atomic(a.out, t.file_text());
  std::printf("wrote %s: %lld tokens (asked %lld%s) from %lld bytes in %.1f s\n", a.out.c_str(),
              static_cast<long long>(t.vocab_size()), static_cast<long long>(a.train.vocab_size),
              t.vocab_size() < a.train.vocab_size ? "; no pair left occurs --min-count times" : "",
              static_cast<long long>(total_bytes(texts)), seconds_since(t0));
  return 0;
}

int run_tokenize(const TokenizerArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const tessel::text::BpeTokenizer t = tessel::text::BpeTokenizer::load(a.tokenizer);
  std::vector<int32_t> tokens;
  int64_t bytes = 0;
  double encode_s = 0;
  for (const std::string& path : a.texts) {
    const std::string text = tessel::text::read_file(path, "tessel tokenizer");
    bytes += static_cast<int64_t>(text.size());
    const auto e0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = t.encode(text);
    encode_s += seconds_since(e0);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  tessel::ckpt::write_file_atomic(a.out, tessel::data::token_file_bytes(tokens));
  std::printf("wrote %s: %zu tokens (%s) from %lld bytes in %.2f s (encoding %.2f s, %.2f MB/s)\n",
              a.out.c_str(), tokens.size(), t.vocab_size() > 65536 ? "uint32" : "uint16",
              static_cast<long long>(bytes), seconds_since(t0), encode_s,
              static_cast<double>(bytes) / 1e6 / std::max(encode_s, 1e-9));
  return 0;
}

}  // namespace

TokenizerCommands add_tokenizer_commands(CLI::App& app) {
  auto a = std::make_shared<TokenizerArgs>();
  CLI::App* group = app.add_subcommand("tokenizer", "BPE tokenizer tools (docs/tokenizer.md)");
  group->require_subcommand(1);
  CLI::App* train = group->add_subcommand(
      "train", "Train a byte-level BPE vocabulary (GPT-2 pre-tokenisation) on text files");
  train->add_option("texts", a->texts, "Text files (UTF-8; any bytes encode)")->required();
  train->add_option("--vocab", a->train.vocab_size, "Vocabulary size: 256 bytes + merges")
      ->capture_default_str()
      ->check(tessel::cli::at_least(256, "tokens"));
  train
      ->add_option("--min-count", a->train.min_count,
                   "Stop early when the most frequent pair occurs fewer times")
      ->capture_default_str()
      ->check(tessel::cli::at_least(1, "occurrences"));
  train->add_option("--out", a->out, "Tokenizer file to write (tiktoken's rank format)")
      ->required();
  CLI::App* tokenize = app.add_subcommand(
      "tokenize", "Encode text files with a BPE tokenizer into one llm.c-format token file");
  tokenize->add_option("texts", a->texts, "Text files, encoded one after the other")->required();
  tokenize
      ->add_option("--tokenizer", a->tokenizer,
                   "Tokenizer file, or a folder with GPT-2's encoder.json and vocab.bpe")
      ->required();
  tokenize->add_option("--out", a->out, "Token file to write, e.g. train.bin")->required();
  return {{train, [a] { return run_train(*a); }}, {tokenize, [a] { return run_tokenize(*a); }}};
}
