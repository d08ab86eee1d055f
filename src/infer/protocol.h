// Private to src/infer: the bodies tessel serve reads and writes, apart from the transport.
//   KServe v2 / Open Inference Protocol (JSON tensors, or binary ones after the JSON: the
//   binary-tensor extension, which tritonclient uses by default):
//     classifier  input "input" [n, <the model's input shape>], FP32 (or FP64, FP16, INT8-64,
//                 UINT8-64, converted to f32); outputs "class" INT64 [n], "top_k_class" INT64
//                 [n, k], "top_k_prob" FP64 [n, k] (what tessel predict writes for each row)
//     gpt         input "prompt" BYTES [n] (parameters max_new_tokens, seed); output "text"
//                 BYTES [n]
//   /v1/predict: {"inputs": [[x, ...], ...]} or {"prompts": [...], "max_new_tokens", "seed"}.
// Every read throws InvalidArgument naming what is wrong (the caller answers 400).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/data/task.h"
#include "tessel/infer/batcher.h"
#include "tessel/infer/http.h"
#include "tessel/infer/replica.h"

namespace tessel::infer {

// What a request may ask of the model.
struct ModelLimits {
  int64_t max_batch = 64;       // rows per request
  int64_t max_new_tokens = 32;  // gpt: when the request names none
  int64_t top_k = 5;            // classes per row in an answer
};

// v2: the names of the model's outputs, in the order of its metadata.
std::vector<std::string> output_names(const ModelInfo& info);

// v2: GET /v2/models/{name}.
nlohmann::ordered_json model_metadata(const std::string& name, const ModelInfo& info,
                                      const ModelLimits& limits);

// v2: a POST /v2/models/{name}/infer body (its JSON, and `binary`, the bytes that follow the
// JSON when the request has an Inference-Header-Content-Length), its "id" and the outputs it
// asks for (none: all), each as JSON or as binary data.
struct InferCall {
  Request request;
  nlohmann::json id;  // null when the request has none
  std::vector<std::string> outputs;
  std::vector<char> binary;  // per output: whether it goes as binary data (none: as JSON)
};
InferCall read_infer(const nlohmann::json& body, std::string_view binary, const ModelInfo& info,
                     const ModelLimits& limits);

// v2: the answer to an infer call from its rows: a classifier's outputs (as output_record makes
// its record of them for `task`, k classes), or a gpt's texts; JSON, followed by the outputs
// asked as binary data if any (with the Inference-Header-Content-Length header).
HttpResponse infer_answer(const std::string& name, const InferCall& call, const BatchRows& rows,
                          int64_t k, data::Task task);

// v1: a POST /v1/predict body.
Request read_predict(const nlohmann::json& body, const ModelInfo& info, const ModelLimits& limits);

}  // namespace tessel::infer
