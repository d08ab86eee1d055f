// The OpenAI bodies apart from the server: requests read with their defaults, bad ones refused
// naming the parameter, the chat template, stop strings cutting the text (and held back while
// streaming), and the answer and chunk shapes.
#include "openai.h"

#include <gtest/gtest.h>

#include "tessel/infer/output.h"

namespace tessel::infer {
namespace {

const SampleOptions kDefaults{0.0f, 0, 7, true};

OpenAiCall read(const std::string& body, bool chat = false) {
  return read_openai(body, chat, "m", 16, kDefaults);
}

void expect_refused(const std::string& body, int status, const std::string& param,
                    const std::string& code = "") {
  try {
    read(body);
    FAIL() << "accepted: " << body;
  } catch (const OpenAiError& e) {
    EXPECT_EQ(e.status, status) << body;
    EXPECT_EQ(e.param, param) << body << ": " << e.what();
    EXPECT_EQ(e.code, code) << body;
  }
}

TEST(OpenAi, ReadsARequestWithItsDefaults) {
  const OpenAiCall c = read(R"({"model": "m", "prompt": "ab"})");
  EXPECT_EQ(c.prompt, "ab");
  EXPECT_EQ(c.max_tokens, 16);
  EXPECT_EQ(c.sample.temperature, 0.0f);
  EXPECT_EQ(c.sample.seed, 7u);
  EXPECT_FALSE(c.stream);
  const OpenAiCall d = read(
      R"({"model": "m", "prompt": ["x"], "max_tokens": 3, "temperature": 0.5, "top_p": 0.9,
          "seed": 4, "stop": ["\n", "ab"], "stream": true, "stream_options": {"include_usage": true}})");
  EXPECT_EQ(d.max_tokens, 3);
  EXPECT_EQ(d.sample.temperature, 0.5f);
  EXPECT_EQ(d.sample.top_p, 0.9f);
  EXPECT_EQ(d.sample.seed, 4u);
  EXPECT_EQ(d.stop, (std::vector<std::string>{"\n", "ab"}));
  EXPECT_TRUE(d.stream && d.include_usage);
}

TEST(OpenAi, ChatMessagesBecomeOnePromptByTheTemplate) {
  const OpenAiCall c = read(
      R"({"model": "m", "messages": [{"role": "system", "content": "be brief"},
          {"role": "user", "content": [{"type": "text", "text": "hi"}]}]})",
      true);
  EXPECT_EQ(c.prompt, "system: be brief\nuser: hi\nassistant:");
}

TEST(OpenAi, BadRequestsAreRefusedNamingTheParameter) {
  expect_refused("{not json", 400, "");
  expect_refused(R"({"model": "other", "prompt": "a"})", 404, "model", "model_not_found");
  expect_refused(R"({"prompt": "a"})", 400, "model");
  expect_refused(R"({"model": "m", "prompt": 3})", 400, "prompt");
  for (const char* bad : {"0", "-1", "\"5\"", "1.5"})
    expect_refused(str(R"({"model": "m", "prompt": "a", "max_tokens": )", bad, "}"), 400,
                   "max_tokens");
  expect_refused(R"({"model": "m", "prompt": "a", "temperature": 3})", 400, "temperature");
  expect_refused(R"({"model": "m", "prompt": "a", "stop": ["a", "b", "c", "d", "e"]})", 400,
                 "stop");
  expect_refused(R"({"model": "m", "prompt": "a", "n": 2})", 400, "n");
  expect_refused(R"({"model": "m", "prompt": "a", "stream": "yes"})", 400, "stream");
  const auto e = openai_error("bad", 400, "max_tokens");
  EXPECT_EQ(
      e.dump(),
      R"({"error":{"message":"bad","type":"invalid_request_error","param":"max_tokens","code":null}})");
}

TEST(OpenAi, StopStringsCutTheTextAndAreHeldBackWhileStreaming) {
  const auto vocab = std::make_shared<text::ByteTokenizer>("abcd\n");
  CompletionText t(vocab, {"cd"});
  std::string streamed;
  for (int32_t tok : {0, 1, 2}) {  // "abc": "c" may begin "cd"
    EXPECT_TRUE(t.add(tok));
    streamed += t.take(false);
  }
  EXPECT_EQ(streamed, "ab");
  EXPECT_FALSE(t.add(3));  // "abcd": stop met
  EXPECT_EQ(t.text(), "ab");
  EXPECT_EQ(t.take(true), "");
  EXPECT_EQ(t.tokens(), 4);
  CompletionText u(vocab, {});
  for (int32_t tok : {0, 4}) EXPECT_TRUE(u.add(tok));
  EXPECT_EQ(u.take(false), "a\n");
}

TEST(OpenAi, AnswersAndChunksHaveOpenAisShape) {
  CompletionText t(std::make_shared<text::ByteTokenizer>("ab"), {});
  t.add(1);
  const CompletionMeta chat{"chatcmpl-1", "m", 5, 3, true};
  const auto body = completion_body(chat, t, "length");
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "b");
  EXPECT_EQ(body["usage"]["total_tokens"], 4);
  EXPECT_EQ(completion_chunk({"cmpl-2", "m", 5, 3, false}, "b", ""),
            "data: {\"id\":\"cmpl-2\",\"object\":\"text_completion\",\"created\":5,\"model\":\"m\","
            "\"choices\":[{\"index\":0,\"text\":\"b\",\"logprobs\":null,\"finish_reason\":null}]}"
            "\n\n");
  const std::string last = completion_chunk(chat, "", "stop");
  EXPECT_NE(last.find("\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\""),
            std::string::npos)
      << last;
}

// A streamed chunk is written as text: the bytes of its JSON document, for both kinds, with and
// without a finish reason, and pieces that JSON escapes (quotes, control bytes, UTF-8, bytes
// that are not UTF-8: replaced as dump_json replaces them).
TEST(OpenAi, ChunksAreTheTextOfTheirDocuments) {
  for (bool chat : {false, true})
    for (const std::string reason : {"", "stop", "length"})
      for (const std::string piece : {"", "b", "a \"q\" \\ /", "\n\t\x01\x1f",
                                      "\xc3\xa9\xe2\x82\xac", "\xff", "\xc3", "x\x80y"}) {
        const CompletionMeta meta{chat ? "chatcmpl-7" : "cmpl-\"7", "m\xe9", 1732000000, 3, chat};
        nlohmann::ordered_json body = {
            {"id", meta.id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model}};
        nlohmann::ordered_json choice = {{"index", 0}};
        if (!chat)
          choice["text"] = piece;
        else
          choice["delta"] = reason.empty()
                                ? nlohmann::ordered_json{{"role", "assistant"}, {"content", piece}}
                                : nlohmann::ordered_json::object();
        choice["logprobs"] = nullptr;
        choice["finish_reason"] =
            reason.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(reason);
        body["choices"] = nlohmann::ordered_json::array({choice});
        EXPECT_EQ(completion_chunk(meta, piece, reason), "data: " + dump_json(body) + "\n\n")
            << chat << " " << reason << " " << piece;
      }
}

}  // namespace
}  // namespace tessel::infer
