#include "tessel/infer/output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "tessel/core/error.h"

namespace tessel::infer {
namespace {

// A CSV field: quoted when it holds a comma, quote or line break (quotes doubled).
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

double round6(double p) { return std::round(p * 1e6) / 1e6; }

double sigmoid(float z) { return 1.0 / (1.0 + std::exp(-static_cast<double>(z))); }

std::vector<std::pair<int64_t, double>> top_classes(const float* logits, int64_t C, int64_t k) {
  const double mx = *std::max_element(logits, logits + C);
  double total = 0;
  for (int64_t c = 0; c < C; ++c) total += std::exp(static_cast<double>(logits[c]) - mx);
  std::vector<int64_t> order(static_cast<size_t>(C));
  std::iota(order.begin(), order.end(), 0);
  k = std::min(k, C);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [logits](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<std::pair<int64_t, double>> out;
  for (int64_t i = 0; i < k; ++i)
    out.push_back({order[i], std::exp(static_cast<double>(logits[order[i]]) - mx) / total});
  return out;
}

OutputFormat output_format(const std::string& path) {
  if (path.ends_with(".jsonl")) return OutputFormat::kJsonl;
  if (path.ends_with(".csv")) return OutputFormat::kCsv;
  throw InvalidArgument(
      str("predict: --output must end in .jsonl or .csv (the format), got ", path));
}

nlohmann::ordered_json class_record(const float* logits, int64_t classes, int64_t k) {
  const auto top = top_classes(logits, classes, k);
  nlohmann::ordered_json rec;
  rec["class"] = top[0].first;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& [c, p] : top) list.push_back({{"class", c}, {"prob", round6(p)}});
  rec["top_k"] = std::move(list);
  return rec;
}

nlohmann::ordered_json output_record(const float* outputs, int64_t C, int64_t k, data::Task task) {
  if (task == data::Task::kRegression) return {{"value", outputs[0]}};
  if (task == data::Task::kClassification) return class_record(outputs, C, k);
  nlohmann::ordered_json probs = nlohmann::ordered_json::array(),
                         labels = nlohmann::ordered_json::array();
  for (int64_t c = 0; c < C; ++c) {
    const double p = sigmoid(outputs[c]);
    probs.push_back(round6(p));
    labels.push_back(p >= 0.5 ? 1 : 0);
  }
  return {{"probs", std::move(probs)}, {"labels", std::move(labels)}};
}

std::string csv_header(bool generation, data::Task task, int64_t k, int64_t outputs) {
  if (generation) return "row,prompt,text\n";
  if (task == data::Task::kRegression) return "row,value\n";
  if (task == data::Task::kMultilabel) {
    std::string h = "row";
    for (int64_t c = 0; c < outputs; ++c) h += str(",prob", c);
    return h + "\n";
  }
  std::string h = "row,class";
  for (int64_t i = 1; i <= k; ++i) h += str(",top", i, "_class,top", i, "_prob");
  return h + "\n";
}

std::string format_classes(const Tensor& logits, int64_t first_row, int64_t k, OutputFormat format,
                           data::Task task) {
  TESSEL_CHECK(logits.ndim() == 2, "predict: classification needs logits [rows, classes], got ",
               shape_str(logits.shape()));
  const int64_t n = logits.dim(0), C = logits.dim(1);
  std::string out;
  char buf[64];
  for (int64_t r = 0; r < n; ++r) {
    const float* row = logits.data<float>() + r * C;
    if (format == OutputFormat::kJsonl) {
      nlohmann::ordered_json rec = {{"row", first_row + r}};
      rec.update(output_record(row, C, k, task));
      out += dump_json(rec) + "\n";
      continue;
    }
    if (task == data::Task::kRegression) {
      out += str(first_row + r, ",", dump_json(row[0]), "\n");
      continue;
    }
    if (task == data::Task::kMultilabel) {
      out += str(first_row + r);
      for (int64_t c = 0; c < C; ++c) {
        std::snprintf(buf, sizeof buf, ",%.6f", round6(sigmoid(row[c])));
        out += buf;
      }
      out += "\n";
      continue;
    }
    const auto top = top_classes(row, C, k);
    out += str(first_row + r, ",", top[0].first);
    for (const auto& [c, p] : top) {
      std::snprintf(buf, sizeof buf, ",%lld,%.6f", static_cast<long long>(c), round6(p));
      out += buf;
    }
    for (int64_t i = static_cast<int64_t>(top.size()); i < k; ++i) out += ",,";
    out += "\n";
  }
  return out;
}

std::string format_texts(const std::vector<std::string>& prompts,
                         const std::vector<std::string>& texts, int64_t first_row,
                         OutputFormat format) {
  std::string out;
  for (size_t r = 0; r < prompts.size(); ++r) {
    const int64_t row = first_row + static_cast<int64_t>(r);
    if (format == OutputFormat::kJsonl)
      out += dump_json({{"row", row}, {"prompt", prompts[r]}, {"text", texts[r]}}) + "\n";
    else
      out += str(row, ",", csv_field(prompts[r]), ",", csv_field(texts[r]), "\n");
  }
  return out;
}

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace tessel::infer
