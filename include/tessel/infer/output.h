// What predict writes and serve answers, one record per input row:
//   classification  {"row": 7, "class": 3, "top_k": [{"class": 3, "prob": 0.912346}, ...]}
//                   CSV: row,class,top1_class,top1_prob,...,topK_class,topK_prob
//   regression      {"row": 7, "value": 2.5}   CSV: row,value
//   multilabel      {"row": 7, "probs": [0.912346, 0.031, ...], "labels": [1, 0, ...]}
//                   (each label's sigmoid probability, and 1 where it is at least 0.5)
//                   CSV: row,prob0,...,probK-1
//   generation      {"row": 7, "prompt": "...", "text": "..."}   CSV: row,prompt,text
// Probabilities are the softmax (multilabel: sigmoid) of the logits in double, rounded to 6
// decimals; classes are
// ordered by probability (ties: lower class first). Formatting is a pure function of the rows'
// values, so equal logits give equal bytes whatever worker computed them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tessel/data/task.h"
#include "tessel/tensor/tensor.h"

namespace tessel::infer {

enum class OutputFormat { kJsonl, kCsv };

// By the name's extension (.jsonl or .csv); throws InvalidArgument otherwise.
OutputFormat output_format(const std::string& path);

// A probability as records hold it: rounded to 6 decimals.
double round6(double p);
// A multilabel output's probability (its label is 1 from 0.5 on).
double sigmoid(float z);
// The k most probable classes of one row (at most C) with their softmax probabilities (in
// double, not rounded), most probable first, ties to the lower class.
std::vector<std::pair<int64_t, double>> top_classes(const float* logits, int64_t C, int64_t k);

// One row's classification: "class" and "top_k" (k most probable classes, at most C).
nlohmann::ordered_json class_record(const float* logits, int64_t classes, int64_t k);

// One row's record of a model's C outputs for `task`: class_record, a regression's "value"
// (its single output), or multilabel "probs" and "labels".
nlohmann::ordered_json output_record(const float* outputs, int64_t C, int64_t k, data::Task task);

// The first line of a CSV file (none for JSONL); `outputs`: a multilabel model's labels K.
std::string csv_header(bool generation, data::Task task, int64_t k, int64_t outputs);

// Records of rows [first_row, first_row + n) of outputs [n, C] in `format`, each ending in
// "\n" (output_record's fields).
std::string format_classes(const Tensor& logits, int64_t first_row, int64_t k, OutputFormat format,
                           data::Task task);
std::string format_texts(const std::vector<std::string>& prompts,
                         const std::vector<std::string>& texts, int64_t first_row,
                         OutputFormat format);

// A JSON text of `j` that never fails on bytes that are not UTF-8 (replaced by U+FFFD).
std::string dump_json(const nlohmann::ordered_json& j);

}  // namespace tessel::infer
