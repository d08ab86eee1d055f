// What predict writes and serve answers, one record per input row:
//   classification  {"row": 7, "class": 3, "top_k": [{"class": 3, "prob": 0.912346}, ...]}
//                   CSV: row,class,top1_class,top1_prob,...,topK_class,topK_prob
//   regression      {"row": 7, "value": 2.5}   CSV: row,value
//   generation      {"row": 7, "prompt": "...", "text": "..."}   CSV: row,prompt,text
// Probabilities are the softmax of the logits (in double), rounded to 6 decimals; classes are
// ordered by probability (ties: lower class first). Formatting is a pure function of the rows'
// values, so equal logits give equal bytes whatever worker computed them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel::infer {

enum class OutputFormat { kJsonl, kCsv };

// By the name's extension (.jsonl or .csv); throws InvalidArgument otherwise.
OutputFormat output_format(const std::string& path);

// One row's classification: "class" and "top_k" (k most probable classes, at most C).
nlohmann::ordered_json class_record(const float* logits, int64_t classes, int64_t k);

// One row's regression output: "value", the model's single output.
nlohmann::ordered_json value_record(float value);

// The first line of a CSV file (none for JSONL).
std::string csv_header(bool generation, bool regression, int64_t k);

// Records of rows [first_row, first_row + n) in `format`, each ending in "\n": classes of
// logits [n, C], or values of outputs [n, 1] when `regression`.
std::string format_classes(const Tensor& logits, int64_t first_row, int64_t k, OutputFormat format,
                           bool regression);
std::string format_texts(const std::vector<std::string>& prompts,
                         const std::vector<std::string>& texts, int64_t first_row,
                         OutputFormat format);

// A JSON text of `j` that never fails on bytes that are not UTF-8 (replaced by U+FFFD).
std::string dump_json(const nlohmann::ordered_json& j);

}  // namespace tessel::infer
