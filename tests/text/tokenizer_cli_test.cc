// The tokenizer commands end to end: train a vocabulary, tokenize into a token file, train a
// GPT on it (and on text through data.tokenizer), generate from prompts with characters the
// corpus never held; and the errors of bad tokenizer and token files.
#include "../cli/cli_testing.h"

namespace {

using namespace tessel_cli;

// A tiny GPT on `data` (a token file or a text file), 4 steps.
std::string gpt_args(const std::string& kind, const std::string& data, const std::string& tok) {
  return str_cat(
      kExamples, "/spiral.toml --set model.kind=gpt --set model.layers=1 ",
      "--set model.heads=2 --set model.embed=16 --set data.kind=", kind,
      " --set data.classes=0 --set data.context=32 --set data.test_fraction=0.2 --set data.path=",
      data, " --set data.tokenizer=", tok, " --set train.batch=4 --set train.max_steps=4 ");
}

class TokenizerCli : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    std::ofstream corpus(path("corpus.txt"));
    for (int i = 0; i < 200; ++i)
      corpus << "the quick brown fox " << i << " jumps over the lazy dog's back, again.\n";
  }
};

TEST_F(TokenizerCli, TrainTokenizeTrainAndGenerate) {
  const Result t =
      run(str_cat("tokenizer train --vocab 300 --out ", path("tok"), " ", path("corpus.txt")));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("300 tokens (asked 300)"), std::string::npos) << t.output;
  const Result k = run(str_cat("tokenize --tokenizer ", path("tok"), " --out ", path("c.bin"), " ",
                               path("corpus.txt")));
  ASSERT_EQ(k.exit_code, 0) << k.output;
  const std::string bin = slurp(path("c.bin"));
  int32_t header[3];
  ASSERT_GT(bin.size(), 1024u);
  std::memcpy(header, bin.data(), sizeof header);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(bin.size(), 1024u + 2u * static_cast<size_t>(header[2]));

  const Result train = run(str_cat("train ", gpt_args("tokens", path("c.bin"), path("tok")),
                                   "--quiet --run-dir ", path("run")));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  std::string latest;
  std::ifstream(path("run/checkpoints/latest")) >> latest;
  const auto manifest = read_json(path("run/checkpoints/") + latest + "/manifest.json");
  EXPECT_EQ(manifest["tokenizer"]["kind"], "bpe");
  EXPECT_EQ(manifest["tokenizer"]["ranks"].size(), 300u);
  EXPECT_EQ(manifest["model_io"]["num_classes"], 300);

  // Characters the corpus never held fall back to their bytes.
  std::ofstream(path("prompts.txt")) << "the quick\nZ\xc3\xbcrich \xe5\x8c\x97\xe4\xba\xac~\n";
  const Result p = run(str_cat("predict ", gpt_args("tokens", path("c.bin"), path("tok")),
                               "--checkpoint ", path("run"), " --input ", path("prompts.txt"),
                               " --output ", path("gen.jsonl"), " --set infer.max_new_tokens=4"));
  ASSERT_EQ(p.exit_code, 0) << p.output;
  std::istringstream lines(slurp(path("gen.jsonl")));
  int rows = 0;
  for (std::string line; std::getline(lines, line); ++rows)
    EXPECT_TRUE(nlohmann::json::parse(line)["text"].is_string()) << line;
  EXPECT_EQ(rows, 2);

  // BPE on a text file directly, through data.tokenizer.
  const Result text = run(str_cat("train ", gpt_args("text", path("corpus.txt"), path("tok")),
                                  "--quiet --run-dir ", path("run_text")));
  ASSERT_EQ(text.exit_code, 0) << text.output;
}

TEST_F(TokenizerCli, BadFilesGetClearErrors) {
  std::ofstream(path("bad.tok")) << "AA== 0\nAQ== 2\n";
  expect_error(run(str_cat("tokenize --tokenizer ", path("bad.tok"), " --out ", path("x.bin"), " ",
                           path("corpus.txt"))),
               "bad.tok line 2 has rank \"2\", expected 1");
  std::ofstream(path("bad.bin")) << std::string(1024, 'x');
  expect_error(run(str_cat("train ", gpt_args("tokens", path("bad.bin"), "''"), "--quiet")),
               "has magic 2021161080 version 2021161080, not a token file's");
  expect_error_code(
      run(str_cat("tokenizer train --vocab 100 --out ", path("t"), " ", path("corpus.txt"))), 2,
      "--vocab");
  // Ids past the tokenizer's vocabulary: the token file was made with another one.
  ASSERT_EQ(run(str_cat("tokenizer train --vocab 300 --out ", path("big"), " ", path("corpus.txt")))
                .exit_code,
            0);
  ASSERT_EQ(run(str_cat("tokenize --tokenizer ", path("big"), " --out ", path("c.bin"), " ",
                        path("corpus.txt")))
                .exit_code,
            0);
  ASSERT_EQ(
      run(str_cat("tokenizer train --vocab 256 --out ", path("small"), " ", path("corpus.txt")))
          .exit_code,
      0);
  expect_error(run(str_cat("train ", gpt_args("tokens", path("c.bin"), path("small")), "--quiet")),
               "-token vocabulary of data.tokenizer");
}

}  // namespace
