#include "openai.h"

#include <algorithm>

#include "tessel/infer/output.h"

namespace tessel::infer {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

json parse(const std::string& body) {
  try {
    return json::parse(body);
  } catch (const json::parse_error& e) {
    throw OpenAiError(400, str("malformed JSON body: ", e.what()));
  }
}

// body[key] as a number in [lo, hi], or `fallback` when absent or null.
double number(const json& body, const char* key, double lo, double hi, double fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  const json& v = body[key];
  if (!v.is_number() || v.get<double>() < lo || v.get<double>() > hi)
    throw OpenAiError(
        400, str("'", key, "' must be a number in [", lo, ", ", hi, "], got ", v.dump()), key);
  return v.get<double>();
}

// body[key] as an integer >= lo, or `fallback` when absent or null.
int64_t integer(const json& body, const char* key, int64_t lo, int64_t fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  const json& v = body[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo)
    throw OpenAiError(400, str("'", key, "' must be an integer >= ", lo, ", got ", v.dump()), key);
  return v.get<int64_t>();
}

bool boolean(const json& body, const char* key) {
  if (!body.contains(key) || body[key].is_null()) return false;
  if (!body[key].is_boolean())
    throw OpenAiError(400, str("'", key, "' must be true or false, got ", body[key].dump()), key);
  return body[key].get<bool>();
}

// A message's content: a string, or a list of {"type": "text", "text"} parts.
std::string content_of(const json& m, size_t i) {
  const json& c = m.contains("content") ? m["content"] : json();
  if (c.is_string()) return c.get<std::string>();
  std::string out;
  if (c.is_array())
    for (const json& part : c) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string())
        throw OpenAiError(400, str("messages[", i, "].content: only text parts are supported"),
                          "messages");
      out += part["text"].get<std::string>();
    }
  else
    throw OpenAiError(400, str("messages[", i, "].content must be a string, got ", c.dump()),
                      "messages");
  return out;
}

// The chat template: "<role>: <content>\n" per message, then "assistant:".
std::string chat_prompt(const json& body) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    throw OpenAiError(400, "'messages' must be a non-empty list of {\"role\", \"content\"}",
                      "messages");
  std::string prompt;
  for (size_t i = 0; i < body["messages"].size(); ++i) {
    const json& m = body["messages"][i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw OpenAiError(400, str("messages[", i, "] must have a string 'role'"), "messages");
    prompt += m["role"].get<std::string>() + ": " + content_of(m, i) + "\n";
  }
  return prompt + "assistant:";
}

std::string completion_prompt(const json& body) {
  const json p = body.contains("prompt") ? body["prompt"] : json();
  if (p.is_string()) return p.get<std::string>();
  if (p.is_array() && p.size() == 1 && p[0].is_string()) return p[0].get<std::string>();
  throw OpenAiError(400, str("'prompt' must be a string (or a list of one), got ", p.dump()),
                    "prompt");
}

std::vector<std::string> stops(const json& body) {
  if (!body.contains("stop") || body["stop"].is_null()) return {};
  const json& s = body["stop"];
  std::vector<std::string> out;
  if (s.is_string()) out.push_back(s.get<std::string>());
  if (s.is_array() && s.size() <= 4)
    for (const json& x : s)
      if (x.is_string()) out.push_back(x.get<std::string>());
  if ((!s.is_string() && !s.is_array()) || out.size() != (s.is_string() ? 1 : s.size()) ||
      std::any_of(out.begin(), out.end(), [](const std::string& x) { return x.empty(); }))
    throw OpenAiError(
        400, str("'stop' must be a non-empty string or a list of up to 4, got ", s.dump()), "stop");
  return out;
}

ojson usage(int64_t prompt, int64_t completion) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}};
}

ojson head(const CompletionMeta& meta, bool chunk) {
  const char* object =
      meta.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

ojson reason_of(const std::string& finish_reason) {
  return finish_reason.empty() ? ojson() : ojson(finish_reason);
}

// Bytes at the end of s that begin a UTF-8 character not yet whole.
size_t partial_utf8(const std::string& s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? back : 0;
  }
  return 0;
}

}  // namespace

OpenAiCall read_openai(const std::string& body_text, bool chat, const std::string& model,
                       int64_t default_max_tokens, const SampleOptions& defaults) {
  const json body = parse(body_text);
  if (!body.is_object()) throw OpenAiError(400, "the body must be a JSON object");
  if (!body.contains("model") || !body["model"].is_string())
    throw OpenAiError(400, str("'model' must be a string (this server's model: \"", model, "\")"),
                      "model");
  if (body["model"] != model)
    throw OpenAiError(404,
                      str("the model '", body["model"].get<std::string>(),
                          "' does not exist; this server serves \"", model, "\""),
                      "model", "model_not_found");
  if (integer(body, "n", 1, 1) != 1)
    throw OpenAiError(400, "'n' must be 1: one choice per request", "n");
  OpenAiCall c;
  c.chat = chat;
  c.prompt = chat ? chat_prompt(body) : completion_prompt(body);
  const char* max_key =
      chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  c.max_tokens = integer(body, max_key, 1, default_max_tokens);
  c.sample = defaults;
  c.sample.temperature =
      static_cast<float>(number(body, "temperature", 0, 2, defaults.temperature));
  c.sample.top_p = static_cast<float>(number(body, "top_p", 0, 1, 1));
  if (c.sample.top_p == 0) c.sample.temperature = 0;  // only the most likely token
  c.sample.seed =
      static_cast<uint64_t>(integer(body, "seed", 0, static_cast<int64_t>(defaults.seed)));
  c.stop = stops(body);
  c.stream = boolean(body, "stream");
  if (body.contains("stream_options") && body["stream_options"].is_object())
    c.include_usage = boolean(body["stream_options"], "include_usage");
  return c;
}

ojson openai_error(const std::string& message, int status, const std::string& param,
                   const std::string& code) {
  const char* type = status == 404   ? "invalid_request_error"
                     : status == 503 ? "server_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? ojson() : ojson(param)},
            {"code", code.empty() ? ojson() : ojson(code)}}}};
}

ojson models_list(const std::string& model) {
  ojson m = {{"id", model}, {"object", "model"}, {"created", 0}, {"owned_by", "tessel"}};
  ojson list = {{"object", "list"}};
  list["data"] = ojson::array({m});
  return list;
}

bool CompletionText::add(int32_t token) {
  tokens_.push_back(token);
  const size_t before = text_.size();
  text_ = decode(tokens_, tokenizer_.get());
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) {
    const size_t from = before >= s.size() ? before - s.size() + 1 : 0;
    cut = std::min(cut, text_.find(s, from));
  }
  if (cut == std::string::npos) return true;
  text_.resize(cut);
  return false;
}

std::string CompletionText::take(bool last) {
  size_t end = text_.size();
  if (!last) {
    size_t hold = 0;
    for (const std::string& s : stop_) hold = std::max(hold, s.size() - 1);
    end = end > hold ? end - hold : 0;
    end -= partial_utf8(text_.substr(0, end));
  }
  if (end <= taken_) return "";
  std::string out = text_.substr(taken_, end - taken_);
  taken_ = end;
  return out;
}

ojson completion_body(const CompletionMeta& meta, const CompletionText& text,
                      const std::string& finish_reason) {
  ojson body = head(meta, false);
  ojson choice = {{"index", 0}};
  if (meta.chat)
    choice["message"] = {{"role", "assistant"}, {"content", text.text()}};
  else
    choice["text"] = text.text();
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = reason_of(finish_reason);
  body["choices"] = ojson::array({choice});
  body["usage"] = usage(meta.prompt_tokens, text.tokens());
  return body;
}

// Written as text, not built as a document (an event per sequence per generated token: building
// it was a tenth of a continuous-batching server's CPU): the bytes dump_json gives the document
// (openai_test).
std::string completion_chunk(const CompletionMeta& meta, const std::string& piece,
                             const std::string& finish_reason) {
  auto quoted = [](const std::string& text) { return dump_json(ojson(text)); };
  std::string out = "data: " + dump_json(head(meta, true));
  out.pop_back();  // the head's closing brace
  out += ",\"choices\":[{\"index\":0,";
  if (!meta.chat)
    out += "\"text\":" + quoted(piece);
  else if (finish_reason.empty())
    out += "\"delta\":{\"role\":\"assistant\",\"content\":" + quoted(piece) + "}";
  else
    out += "\"delta\":{}";
  out += ",\"logprobs\":null,\"finish_reason\":";
  out += finish_reason.empty() ? std::string("null") : quoted(finish_reason);
  out += "}]}\n\n";
  return out;
}

std::string usage_chunk(const CompletionMeta& meta, int64_t completion_tokens) {
  ojson body = head(meta, true);
  body["choices"] = ojson::array();
  body["usage"] = usage(meta.prompt_tokens, completion_tokens);
  return "data: " + dump_json(body) + "\n\n";
}

}  // namespace tessel::infer
