// Generation with a GPT: the KV cache gives the logits and tokens of recomputing the context,
// a prompt's tokens do not depend on the batch it runs in, sampling is seeded, and bad prompts
// are refused with a message naming the prompt.
#include "tessel/infer/generate.h"

#include <gtest/gtest.h>

#include "tessel/core/error.h"
#include "tiny_gpt.h"

namespace tessel::infer {
namespace {

constexpr int64_t kVocab = 23, kContext = 40;

std::unique_ptr<nn::Model> tiny_gpt() { return testing::tiny_gpt(kVocab, kContext, 7); }

std::vector<Prompt> prompts(int64_t new_tokens) {
  std::vector<Prompt> p;
  for (int64_t b = 0; b < 4; ++b) {
    Prompt pr;
    for (int64_t t = 0; t < 1 + 3 * b; ++t)
      pr.tokens.push_back(static_cast<int32_t>((5 * b + 3 * t) % kVocab));
    pr.max_new_tokens = new_tokens - b;
    pr.key = static_cast<uint64_t>(100 + b);
    p.push_back(pr);
  }
  return p;
}

TEST(Generate, KvCacheGivesTheTokensOfRecomputing) {
  auto model = tiny_gpt();
  for (float temperature : {0.0f, 1.0f}) {
    SampleOptions cached{temperature, 5, 11, true}, recompute = cached;
    recompute.kv_cache = false;
    const auto a = generate(*model, prompts(20), cached);
    const auto b = generate(*model, prompts(20), recompute);
    ASSERT_EQ(a.size(), 4u);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].size(), static_cast<size_t>(20 - i));
      EXPECT_EQ(a[i], b[i]) << "prompt " << i << " temperature " << temperature;
    }
  }
}

TEST(Generate, APromptsTokensDoNotDependOnItsBatch) {
  auto model = tiny_gpt();
  const SampleOptions opts{0.8f, 0, 3, true};
  const auto all = generate(*model, prompts(12), opts);
  const std::vector<Prompt> ps = prompts(12);
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_EQ(generate(*model, {ps[i]}, opts)[0], all[i]) << "prompt " << i;
}

TEST(Generate, SamplingIsSeededAndTopOneIsGreedy) {
  auto model = tiny_gpt();
  const auto greedy = generate(*model, prompts(15), {0.0f, 0, 0, true});
  EXPECT_EQ(generate(*model, prompts(15), {1.5f, 1, 9, true}), greedy);
  const auto s1 = generate(*model, prompts(15), {1.5f, 0, 9, true});
  EXPECT_EQ(generate(*model, prompts(15), {1.5f, 0, 9, true}), s1);
  EXPECT_NE(generate(*model, prompts(15), {1.5f, 0, 10, true}), s1);
  EXPECT_NE(s1, greedy);
}

TEST(Generate, ChooseTokenKeepsToTheTopK) {
  std::vector<float> logits(kVocab, 0.0f);
  logits[4] = 3.0f, logits[9] = 2.9f, logits[1] = 2.8f;
  EXPECT_EQ(choose_token(logits.data(), kVocab, {0.0f, 0, 0, true}, 0, 0), 4);
  for (int64_t pos = 0; pos < 200; ++pos) {
    const int32_t t = choose_token(logits.data(), kVocab, {2.0f, 2, 1, true}, 5, pos);
    EXPECT_TRUE(t == 4 || t == 9) << t;
  }
}

TEST(Generate, BadPromptsAreRefusedByName) {
  auto model = tiny_gpt();
  std::vector<Prompt> p = prompts(5);
  p[2].tokens.clear();
  try {
    generate(*model, p, {});
    FAIL() << "an empty prompt was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("prompt 2 is empty"), std::string::npos) << e.what();
  }
  p = prompts(5);
  p[1].max_new_tokens = kContext;
  try {
    generate(*model, p, {});
    FAIL() << "a prompt past the context was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("prompt 1 has 4 tokens"), std::string::npos) << e.what();
  }
  nn::ModelSpec mlp;
  mlp.input_shape = {4};
  mlp.num_classes = 3;
  auto m = nn::build_model(mlp);
  m->materialize(1);
  EXPECT_THROW(generate(*m, prompts(5), {}), InvalidArgument);
}

TEST(Generate, TextThroughTheModelsTokenizer) {
  const text::ByteTokenizer bytes("\n abc");
  EXPECT_EQ(encode("ab c", &bytes), (std::vector<int32_t>{2, 3, 1, 4}));
  EXPECT_EQ(decode({4, 2, 0}, &bytes), "ca\n");
  try {
    encode("abz", &bytes);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("byte 2"), std::string::npos) << e.what();
  }
  try {
    encode("ab", nullptr);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("has no tokenizer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel::infer
