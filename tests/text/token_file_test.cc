// Token files (llm.c's format) and the dataset of kind tokens.
#include "tessel/data/token_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tessel/core/error.h"
#include "tessel/data/dataset.h"
#include "tessel/text/bpe.h"

namespace tessel::data {
namespace {

class TokenFiles : public ::testing::Test {
 protected:
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  std::string io_error(const std::string& path) {
    try {
      read_token_file(path);
    } catch (const IoError& e) {
      return e.what();
    }
    return "(no error)";
  }
  std::filesystem::path dir_ =
      std::filesystem::temp_directory_path() / ("tessel_token_files_" + std::to_string(::getpid()));
};

TEST_F(TokenFiles, RoundTripNarrowAndWide) {
  const std::vector<int32_t> narrow = {0, 1, 65535, 7};
  const std::string n = token_file_bytes(narrow);
  ASSERT_EQ(n.size(), 1024u + 8u);
  EXPECT_EQ(n.substr(0, 12), std::string("\x88\xd8\x34\x01\x01\0\0\0\x04\0\0\0", 12));
  EXPECT_EQ(read_token_file(write("n.bin", n)), narrow);
  const std::vector<int32_t> wide = {65536, 3, 100000};
  const std::string w = token_file_bytes(wide);
  ASSERT_EQ(w.size(), 1024u + 12u);
  EXPECT_EQ(w.substr(0, 8), std::string("\xa1\xd9\x34\x01\x07\0\0\0", 8));  // 20240801, 7
  EXPECT_EQ(read_token_file(write("w.bin", w)), wide);
}

TEST_F(TokenFiles, BadFilesNameWhatIsWrong) {
  std::string n = token_file_bytes({1, 2, 3});
  EXPECT_NE(
      io_error(write("short.bin", n.substr(0, 1028))).find("says it holds 3 tokens of 2 bytes"),
      std::string::npos);
  EXPECT_NE(io_error(write("tiny.bin", "abc")).find("shorter than the 1024-byte header"),
            std::string::npos);
  n[4] = 2;  // version 2
  EXPECT_NE(io_error(write("v2.bin", n)).find("has magic 20240520 version 2"), std::string::npos);
}

TEST_F(TokenFiles, DatasetWindowsAndTestFile) {
  std::vector<int32_t> ids(41), test(9);
  for (int i = 0; i < 41; ++i) ids[i] = i % 13;
  for (int i = 0; i < 9; ++i) test[i] = 12 - i;
  DataSpec spec;
  spec.kind = DataKind::kTokens;
  spec.path = write("train.bin", token_file_bytes(ids));
  spec.test_path = write("test.bin", token_file_bytes(test));
  spec.context = 8;
  const Splits s = make_datasets(spec);
  EXPECT_FALSE(s.tokenizer);
  EXPECT_EQ(s.train->num_classes(), 13);  // the largest id + 1, without a tokenizer
  EXPECT_EQ(s.train->size(), 5);          // (41 - 1) / 8
  ASSERT_TRUE(s.test);
  EXPECT_EQ(s.test->size(), 1);
  std::vector<int32_t> x(8), y(8);
  s.train->get(1, x.data(), y.data());
  EXPECT_EQ(x[0], 8);
  EXPECT_EQ(y[0], 9);
  EXPECT_EQ(y[7], 16 % 13);
  s.test->get(0, x.data(), y.data());
  EXPECT_EQ(x[0], 12);
  EXPECT_EQ(y[7], 4);
  // With a tokenizer the vocabulary is its size, and the checkpoint keeps it.
  spec.tokenizer = std::make_shared<const text::BpeTokenizer>(text::train_bpe({"abab"}, {257}));
  const Splits t = make_datasets(spec);
  EXPECT_EQ(t.train->num_classes(), 257);
  EXPECT_EQ(t.tokenizer, spec.tokenizer);
}

// data.classes pads a file's own vocabulary (GPT-2's 50257 to 50304); too few, or padding a
// tokenizer's vocabulary, is an error saying what to set.
TEST_F(TokenFiles, ClassesPadTheVocabulary) {
  DataSpec spec;
  spec.kind = DataKind::kTokens;
  spec.path = write("pad.bin", token_file_bytes({0, 50256, 3, 7, 1}));
  spec.context = 2;
  spec.test_fraction = 0;
  EXPECT_EQ(make_datasets(spec).train->num_classes(), 50257);
  spec.classes = 50304;
  EXPECT_EQ(make_datasets(spec).train->num_classes(), 50304);
  spec.classes = 50000;
  try {
    make_datasets(spec);
    ADD_FAILURE() << "data.classes below the largest id + 1 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("set data.classes to at least 50257"), std::string::npos)
        << e.what();
  }
  spec.classes = 512;
  spec.path = write("small.bin", token_file_bytes({0, 1, 2, 3, 4}));
  spec.tokenizer = std::make_shared<const text::BpeTokenizer>(text::train_bpe({"abab"}, {257}));
  try {
    make_datasets(spec);
    ADD_FAILURE() << "data.classes with a tokenizer was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the tokenizer's 257 tokens"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tessel::data
