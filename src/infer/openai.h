// Private to src/infer: the OpenAI API's bodies for tessel serve's gpt models, apart from the
// transport and the scheduler: requests read into an OpenAiCall, answers and server-sent event
// chunks written, errors in OpenAI's shape ({"error": {"message", "type", "param", "code"}}).
//   GET  /v1/models              {"object": "list", "data": [{"id": <name>, "object": "model"}]}
//   POST /v1/completions         "prompt" (a string, or a list of one)
//   POST /v1/chat/completions    "messages" [{"role", "content"}], as one prompt by the template
//                                "<role>: <content>\n" per message, then "assistant:"
// Both take "model" (required), "max_tokens" (chat also "max_completion_tokens"),
// "temperature", "top_p", "seed", "stop" (a string or up to 4), "stream", "stream_options"
// {"include_usage"}, "n" (1 only); absent ones take the config's infer.* values.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/infer/generate.h"

namespace tessel::infer {

// A request refused: its HTTP status and OpenAI's error fields (param, code: "" for null).
struct OpenAiError : Error {
  OpenAiError(int status, const std::string& message, std::string param = "", std::string code = "")
      : Error(message), status(status), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string param, code;
};

struct OpenAiCall {
  bool chat = false;
  std::string prompt;  // the text the model continues (chat: the template applied)
  int64_t max_tokens = 16;
  SampleOptions sample;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
};

// Reads a completions (chat: chat completions) body; `defaults` are the config's (max_tokens,
// sampling). Throws OpenAiError (400, or 404 for another model than `model`).
OpenAiCall read_openai(const std::string& body, bool chat, const std::string& model,
                       int64_t default_max_tokens, const SampleOptions& defaults);

nlohmann::ordered_json openai_error(const std::string& message, int status,
                                    const std::string& param = "", const std::string& code = "");
nlohmann::ordered_json models_list(const std::string& model);

// The text of a generation so far: tokens decoded, cut before the first stop string met.
class CompletionText {
 public:
  CompletionText(std::shared_ptr<const text::Tokenizer> tokenizer, std::vector<std::string> stop)
      : tokenizer_(std::move(tokenizer)), stop_(std::move(stop)) {}
  // Adds a new token; false once a stop string has been met (the text ends before it).
  bool add(int32_t token);
  // Text not yet taken that can go out now: all of it when `last`, else less what could still
  // be the start of a stop string or of a UTF-8 character.
  std::string take(bool last);
  const std::string& text() const { return text_; }
  int64_t tokens() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  std::shared_ptr<const text::Tokenizer> tokenizer_;
  std::vector<std::string> stop_;
  std::vector<int32_t> tokens_;
  std::string text_;
  size_t taken_ = 0;
};

// What an answer says besides its text.
struct CompletionMeta {
  std::string id, model;
  int64_t created = 0, prompt_tokens = 0;
  bool chat = false;
};

// The whole answer (stream = false).
nlohmann::ordered_json completion_body(const CompletionMeta& meta, const CompletionText& text,
                                       const std::string& finish_reason);
// One server-sent event "data: {...}\n\n" of a streamed answer: a piece of text, or (with a
// finish reason) the last chunk; `usage`: the usage-only chunk of stream_options.include_usage.
std::string completion_chunk(const CompletionMeta& meta, const std::string& piece,
                             const std::string& finish_reason);
std::string usage_chunk(const CompletionMeta& meta, int64_t completion_tokens);
inline constexpr const char* kDoneEvent = "data: [DONE]\n\n";

}  // namespace tessel::infer
