// Tokenizers: GPT-2 pre-tokenisation, BPE encoding by ranks (worked by hand), training on a tiny
// corpus, the tokenizer file and its errors, the byte vocabulary, the manifest form.
#include "tessel/text/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "tessel/core/error.h"
#include "tessel/text/bpe.h"

namespace tessel::text {
namespace {

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  gpt2_pieces(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

std::vector<int32_t> ids(std::initializer_list<int> v) { return {v.begin(), v.end()}; }

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// "aaabdaaabac", one piece: (a, a) x4 first; then (a, b) and (aa, a) tie at 2 and the lower
// pair wins; then (aa, ab).
BpeTokenizer tiny() { return train_bpe({"aaabdaaabac"}, {.vocab_size = 259, .min_count = 2}); }

TEST(Gpt2Pieces, SplitsAsThePatternSays) {
  EXPECT_EQ(pieces("Hello world's  end\n"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " end", "\n"}));
  EXPECT_EQ(pieces("x=42; déjà vu 北京\t!"),
            (std::vector<std::string>{"x", "=", "42", ";", " déjà", " vu", " 北京", "\t", "!"}));
  // Bytes that are not UTF-8 are pieces of their own, so the pieces still cover the text.
  EXPECT_EQ(pieces("a\xff\xfe b"), (std::vector<std::string>{"a", "\xff\xfe", " b"}));
  EXPECT_TRUE(pieces("").empty());
}

TEST(Bpe, TrainsTheMostFrequentPairsInOrder) {
  const BpeTokenizer t = tiny();
  ASSERT_EQ(t.vocab_size(), 259);
  EXPECT_EQ(t.tokens()[256], "aa");
  EXPECT_EQ(t.tokens()[257], "ab");
  EXPECT_EQ(t.tokens()[258], "aaab");
  EXPECT_EQ(t.tokens()['q'], "q");
  // Merged lowest rank first, leftmost first among equals (worked by hand).
  EXPECT_EQ(t.encode("aaabdaaabac"), ids({258, 'd', 258, 'a', 'c'}));
  EXPECT_EQ(t.encode("aaab aab"), ids({258, ' ', 256, 'b'}));
  // Stops when no pair is frequent enough.
  EXPECT_EQ(train_bpe({"abcd"}, {.vocab_size = 1000, .min_count = 2}).vocab_size(), 256);
  EXPECT_NE(error_of([] { train_bpe({"x"}, {.vocab_size = 100}); }).find("[256, 2^30], got 100"),
            std::string::npos);
}

TEST(Bpe, RoundTripsAnyBytes) {
  const BpeTokenizer t = train_bpe({"the cat sat on the mat; the end. Über 3.14 über!"}, {300, 2});
  EXPECT_GT(t.vocab_size(), 256);
  for (const std::string& s :
       std::vector<std::string>{"the cat", "unseen: 你好 \xf0\x9f\x98\x80 \xff\x80 tail",
                                std::string("\0a\n\n  b", 7)}) {
    const std::vector<int32_t> e = t.encode(s);
    EXPECT_EQ(t.decode(e), s);
  }
  EXPECT_LT(t.encode("the cat sat").size(), std::string("the cat sat").size());
  EXPECT_NE(error_of([&] { t.decode(ids({1, 300})); }).find("token 1 is 300"), std::string::npos);
}

// tiktoken's byte_pair_merge as written there (quadratic): the reference for encode_piece.
std::vector<int32_t> reference_merge(const BpeTokenizer& t, const std::string& piece) {
  std::map<std::string, int32_t> rank;
  for (size_t r = 0; r < t.tokens().size(); ++r) rank[t.tokens()[r]] = static_cast<int32_t>(r);
  auto rank_of = [&](size_t lo, size_t hi) {
    const auto it = rank.find(piece.substr(lo, hi - lo));
    return it == rank.end() ? INT32_MAX : it->second;
  };
  if (rank.count(piece)) return {rank[piece]};
  std::vector<std::pair<size_t, int32_t>> parts;
  for (size_t i = 0; i + 1 < piece.size(); ++i) parts.push_back({i, rank_of(i, i + 2)});
  parts.push_back({piece.size() - 1, INT32_MAX});
  parts.push_back({piece.size(), INT32_MAX});
  auto joined = [&](size_t i) {
    return i + 3 < parts.size() ? rank_of(parts[i].first, parts[i + 3].first) : INT32_MAX;
  };
  for (;;) {
    size_t best = 0;
    int32_t min = INT32_MAX;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].second < min) min = parts[i].second, best = i;
    if (min == INT32_MAX) break;
    if (best > 0) parts[best - 1].second = joined(best - 1);
    parts[best].second = joined(best);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  std::vector<int32_t> out;
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    out.push_back(rank_of(parts[i].first, parts[i + 1].first));
  return out;
}

TEST(Bpe, MergesAsTiktokenDoesOnAnyPiece) {
  std::mt19937 rng(7);
  std::string corpus;
  for (int i = 0; i < 20000; ++i) corpus += "abcab"[rng() % 5];
  const BpeTokenizer t = train_bpe({corpus}, {.vocab_size = 400, .min_count = 2});
  for (int trial = 0; trial < 200; ++trial) {
    std::string piece;
    for (size_t k = 0, len = 1 + rng() % 300; k < len; ++k) piece += "abcab"[rng() % 5];
    std::vector<int32_t> got;
    t.encode_piece(piece, got);
    ASSERT_EQ(got, reference_merge(t, piece)) << piece;
  }
  // A long run of letters is one piece: merged in n log n, not n^2.
  std::string run(1 << 20, 'a');
  for (size_t k = 0; k < run.size(); k += 3) run[k] = 'b';
  EXPECT_EQ(t.decode(t.encode(run)), run);
}

TEST(Bpe, FileRoundTripsAndItsErrorsNameTheLine) {
  const BpeTokenizer t = tiny();
  const std::string file = t.file_text();
  EXPECT_EQ(file.substr(file.size() - 13), "YWFhYg== 258\n");
  EXPECT_EQ(parse_bpe_file(file, "f").tokens(), t.tokens());

  std::string bad_rank = file;
  bad_rank.replace(bad_rank.find(" 5\n"), 3, " 7\n");
  EXPECT_NE(error_of([&] {
              parse_bpe_file(bad_rank, "tok.bpe");
            }).find("tok.bpe line 6 has rank \"7\", expected 5"),
            std::string::npos);
  std::string bad_base64 = file;
  bad_base64.replace(0, 4, "A*==");
  EXPECT_NE(error_of([&] {
              parse_bpe_file(bad_base64, "tok.bpe");
            }).find("tok.bpe line 1 is not \"<base64 bytes> <rank>\""),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              parse_bpe_file("YQ== 0\n", "tok.bpe");
            }).find("the single byte 0 is no token"),
            std::string::npos);
  std::string repeated = file + "YQ== 259\n";
  EXPECT_NE(error_of([&] { parse_bpe_file(repeated, "tok.bpe"); }).find("repeats the one of rank"),
            std::string::npos);
  EXPECT_NE(error_of([] { BpeTokenizer::load("/nonexistent/tok.bpe"); }).find("file not found"),
            std::string::npos);
}

TEST(Bpe, LoadsGpt2FilesAndRejectsBadOnes) {
  // GPT-2's byte-to-character table for the bytes used here: printable ASCII is itself, the
  // space is U+0120 ("Ġ"); the other bytes take the code points they are given in order.
  const BpeTokenizer t = tiny();
  auto spelled = [](const std::string& bytes) {
    std::string out;
    for (unsigned char b : bytes) out += b == ' ' ? "\xc4\xa0" : std::string(1, b);
    return out;
  };
  nlohmann::json enc = nlohmann::json::object();
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : next++;
    std::string s = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                              : std::string{static_cast<char>(0xC0 | cp >> 6),
                                            static_cast<char>(0x80 | (cp & 0x3F))};
    enc[s] = b;  // ids in byte order here: GPT-2's own put the printable ones first
  }
  enc[spelled("aa")] = 256;
  enc[spelled("ab")] = 257;
  enc[spelled("aaab")] = 258;
  const auto dir = std::filesystem::temp_directory_path() / "tessel_gpt2_files_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "encoder.json") << enc.dump();
  std::ofstream(dir / "vocab.bpe") << "#version: 0.2\na a\na b\naa ab\n";
  EXPECT_EQ(BpeTokenizer::load(dir.string()).tokens(), t.tokens());
  std::ofstream(dir / "vocab.bpe") << "#version: 0.2\na a\naa ab\n";
  EXPECT_NE(error_of([&] {
              BpeTokenizer::load(dir.string());
            }).find("line 3 \"aa ab\" is not a merge of two tokens"),
            std::string::npos);
  std::ofstream(dir / "encoder.json") << "{\"a\": 0,";
  EXPECT_NE(error_of([&] { BpeTokenizer::load(dir.string()); }).find("is not valid JSON"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(ByteTokenizer, EncodesTheBytesOfItsVocabularyOnly) {
  const ByteTokenizer t("\n abc");
  EXPECT_EQ(t.encode("ab c"), ids({2, 3, 1, 4}));
  EXPECT_EQ(t.decode(ids({4, 2, 0})), "ca\n");
  EXPECT_NE(error_of([&] { t.encode("abz"); }).find("the first 'z' at byte 2"), std::string::npos);
  EXPECT_EQ(ByteTokenizer::of_text("banana").vocabulary(), "abn");
  EXPECT_THROW(ByteTokenizer("aa"), InvalidArgument);
}

TEST(Tokenizer, ManifestFormRoundTrips) {
  const BpeTokenizer bpe = tiny();
  const ByteTokenizer bytes("\na\xff");
  EXPECT_TRUE(same_tokenizer(tokenizer_from_json(bpe.to_json()).get(), &bpe));
  EXPECT_TRUE(same_tokenizer(tokenizer_from_json(bytes.to_json()).get(), &bytes));
  EXPECT_FALSE(same_tokenizer(&bytes, &bpe));
  EXPECT_FALSE(same_tokenizer(&bytes, nullptr));
  nlohmann::json j = bpe.to_json();
  j["ranks"][3] = "!!";
  EXPECT_NE(error_of([&] { tokenizer_from_json(j); }).find("field \"tokenizer.ranks\""),
            std::string::npos);
  EXPECT_NE(error_of([] {
              tokenizer_from_json({{"kind", "words"}});
            }).find("that is 'words', not 'bytes' or 'bpe'"),
            std::string::npos);
}

}  // namespace
}  // namespace tessel::text
