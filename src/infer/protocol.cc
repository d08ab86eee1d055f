#include "protocol.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>

#include "tessel/core/error.h"
#include "tessel/data/npy.h"
#include "tessel/infer/generate.h"
#include "tessel/infer/output.h"
#include "tessel/tensor/dtype.h"

namespace tessel::infer {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

static_assert(std::endian::native == std::endian::little,
              "binary tensors are little-endian, as the host's memory is taken to be");

// The datatypes a classifier's input converts from; JSON carries each as a number.
constexpr const char* kIntegerTypes[] = {"INT8",  "INT16",  "INT32",  "INT64",
                                         "UINT8", "UINT16", "UINT32", "UINT64"};
constexpr const char* kFloatTypes[] = {"FP32", "FP64", "FP16", "BF16"};

bool one_of(const std::string& s, const auto& names) {
  return std::find(std::begin(names), std::end(names), s) != std::end(names);
}

int64_t top_k(const ModelInfo& info, const ModelLimits& limits) {
  return std::min(limits.top_k, info.spec.num_classes);
}

ojson tensor_meta(const char* name, const char* datatype, std::vector<int64_t> shape) {
  return {{"name", name}, {"datatype", datatype}, {"shape", std::move(shape)}};
}

// The prompts of a request: each encoded in the model's vocabulary, non-empty, and with
// max_new tokens within the context. `what` names the field in messages.
std::vector<Prompt> make_prompts(const std::vector<std::string>& texts, const std::string& what,
                                 int64_t max_new, uint64_t seed, const ModelInfo& info) {
  const int64_t context = info.spec.input_shape[0];
  std::vector<Prompt> out;
  for (size_t i = 0; i < texts.size(); ++i) {
    Prompt p{{}, max_new, seed + i};
    try {
      p.tokens = encode(texts[i], info.tokenizer.get());
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(str("serve: ", what, "[", i, "]: ", e.what()));
    }
    const int64_t len = static_cast<int64_t>(p.tokens.size());
    if (len == 0 || max_new < 1 || len + max_new > context)
      throw InvalidArgument(str("serve: ", what, "[", i, "] has ", len,
                                " tokens and max_new_tokens is ", max_new,
                                "; the prompt must be non-empty and prompt + max_new_tokens at "
                                "most the model's context of ",
                                context));
    out.push_back(std::move(p));
  }
  return out;
}

// A non-negative integer `key` of `obj` (`where` names obj), or `fallback` when absent.
uint64_t count_of(const json& obj, const char* key, const std::string& where, uint64_t fallback) {
  if (!obj.is_object() || !obj.contains(key)) return fallback;
  if (!obj[key].is_number_unsigned())
    throw InvalidArgument(str("serve: ", where, "\"", key,
                              "\" must be a non-negative integer, got ", obj[key].dump()));
  return obj[key].get<uint64_t>();
}

// A boolean `key` of `obj` (`where` names obj), or `fallback` when absent.
bool flag_of(const json& obj, const char* key, const std::string& where, bool fallback) {
  if (!obj.is_object() || !obj.contains(key)) return fallback;
  if (!obj[key].is_boolean())
    throw InvalidArgument(
        str("serve: ", where, "\"", key, "\" must be true or false, got ", obj[key].dump()));
  return obj[key].get<bool>();
}

// The bytes of v2 input `in` when its values travel as binary data after the JSON (the
// binary-tensor extension: "parameters": {"binary_data_size": bytes}, `binary` the bytes the
// body has after its JSON), checked; nullopt when they travel as JSON in "data".
std::optional<std::string_view> binary_input(const json& in, std::string_view binary) {
  const json params = in.value("parameters", json::object());
  const bool sized = params.is_object() && params.contains("binary_data_size");
  if (sized == in.contains("data"))
    throw InvalidArgument(
        "serve: inputs[0] must have either \"data\": [...] or, for values sent as binary data "
        "after the JSON, \"parameters\": {\"binary_data_size\": bytes}");
  if (!sized) {
    if (!binary.empty())
      throw InvalidArgument(str("serve: the body has ", binary.size(),
                                " bytes after its JSON (Inference-Header-Content-Length) that no "
                                "input's \"binary_data_size\" claims"));
    return std::nullopt;
  }
  const json& size = params["binary_data_size"];
  if (!size.is_number_unsigned() || size.get<uint64_t>() != binary.size())
    throw InvalidArgument(str("serve: inputs[0] has binary_data_size ", size.dump(), " but ",
                              binary.size(),
                              " bytes follow the JSON (Inference-Header-Content-Length); they "
                              "must be equal"));
  return binary;
}

// The leaves of a tensor's "data", flattened in row-major order (nested arrays allowed).
void flatten(const json& data, std::vector<const json*>& out) {
  if (!data.is_array()) return out.push_back(&data);
  for (const json& d : data) flatten(d, out);
}

// The one input tensor of a v2 request, checked for its name and shape.
const json& the_input(const json& body, const char* name) {
  if (!body.is_object() || !body.contains("inputs") || !body["inputs"].is_array() ||
      body["inputs"].size() != 1)
    throw InvalidArgument(
        str("serve: the body must be a JSON object with \"inputs\": [one tensor "
            "named \"",
            name, "\"] (see GET /v2/models/{name})"));
  const json& in = body["inputs"][0];
  for (const char* key : {"name", "datatype"})
    if (!in.is_object() || !in.contains(key) || !in[key].is_string())
      throw InvalidArgument(str("serve: inputs[0] must have a string \"", key, "\""));
  if (in["name"] != name)
    throw InvalidArgument(
        str("serve: unknown input ", in["name"].dump(), "; the model's input is \"", name, "\""));
  if (!in.contains("shape") || !in["shape"].is_array())
    throw InvalidArgument("serve: inputs[0] must have \"shape\": [...]");
  return in;
}

// The shape of a v2 input, checked: [n, row...] with 1 <= n <= max_batch.
int64_t rows_of(const json& in, const Shape& row, const ModelLimits& limits) {
  Shape want = row;
  want.insert(want.begin(), -1);
  const json& shape = in["shape"];
  bool ok = shape.size() == want.size();
  for (size_t i = 0; ok && i < shape.size(); ++i)
    ok = shape[i].is_number_integer() && (i == 0 || shape[i].get<int64_t>() == want[i]);
  const int64_t n = ok ? shape[0].get<int64_t>() : 0;
  if (!ok || n < 1 || n > limits.max_batch)
    throw InvalidArgument(str("serve: inputs[0] has shape ", shape.dump(), "; the model takes ",
                              shape_str(want), " with 1 to serve.max_batch = ", limits.max_batch,
                              " rows (split a larger request)"));
  return n;
}

// Converts the n binary values of v2 `dtype` at `bytes` (checked to hold them) to f32.
void binary_to_f32(float* dst, std::string_view bytes, int64_t n, const std::string& dtype) {
  const int width = std::stoi(dtype.substr(dtype.find_first_of("123456789"))) / 8;
  if (static_cast<int64_t>(bytes.size()) != n * width)
    throw InvalidArgument(str("serve: inputs[0] has ", bytes.size(),
                              " bytes of binary data; its shape holds ", n, " ", dtype, " values, ",
                              n * width, " bytes"));
  const char kind = dtype[0] == 'F' ? 'f' : dtype[0] == 'U' ? 'u' : 'i';  // as .npy names it
  if (dtype != "BF16") return data::npy_to_f32(dst, bytes.data(), n, {kind, width, {}});
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, 2);
    dst[i] = bf16_to_f32(bits);
  }
}

Request read_classes(const json& in, std::string_view binary, const ModelInfo& info,
                     const ModelLimits& limits) {
  const std::string dtype = in["datatype"];
  const bool integer = one_of(dtype, kIntegerTypes);
  if (!integer && !one_of(dtype, kFloatTypes))
    throw InvalidArgument(str("serve: inputs[0] has datatype ", dtype,
                              "; the model takes FP32 (FP64, FP16, BF16 and INT8-64, UINT8-64 are "
                              "converted)"));
  const int64_t n = rows_of(in, info.spec.input_shape, limits);
  const int64_t numel = n * shape_numel(info.spec.input_shape);
  Shape shape = info.spec.input_shape;
  shape.insert(shape.begin(), n);
  Request r;
  r.x = Tensor::empty(shape);
  float* dst = r.x.data<float>();
  if (const auto bytes = binary_input(in, binary)) {
    binary_to_f32(dst, *bytes, numel, dtype);
    return r;
  }
  std::vector<const json*> data;
  flatten(in["data"], data);
  if (static_cast<int64_t>(data.size()) != numel)
    throw InvalidArgument(
        str("serve: inputs[0] has ", data.size(), " values; its shape holds ", numel));
  for (int64_t i = 0; i < numel; ++i) {
    const json& v = *data[static_cast<size_t>(i)];
    if (integer ? !v.is_number_integer() || (dtype[0] == 'U' && !v.is_number_unsigned())
                : !v.is_number())
      throw InvalidArgument(str("serve: inputs[0] value ", i, " is ", v.dump(), ", not ",
                                integer ? "an integer of " : "a number of ", dtype));
    dst[i] = v.get<float>();
  }
  return r;
}

// The n prompts of a BYTES input sent as binary data: each a 4-byte length, then its bytes.
std::vector<std::string> binary_prompts(std::string_view bytes, int64_t n) {
  std::vector<std::string> texts;
  for (uint32_t len = 0; !bytes.empty(); bytes.remove_prefix(len)) {
    if (bytes.size() < 4 || (std::memcpy(&len, bytes.data(), 4), len > bytes.size() - 4))
      throw InvalidArgument(
          "serve: inputs[0]'s binary data is not BYTES elements (each a 4-byte little-endian "
          "length, then that many bytes)");
    bytes.remove_prefix(4);
    texts.emplace_back(bytes.substr(0, len));
  }
  if (static_cast<int64_t>(texts.size()) != n)
    throw InvalidArgument(
        str("serve: inputs[0] has ", texts.size(), " prompts; its shape holds ", n));
  return texts;
}

Request read_prompts(const json& body, const json& in, std::string_view binary,
                     const ModelInfo& info, const ModelLimits& limits) {
  if (in["datatype"] != "BYTES")
    throw InvalidArgument(str("serve: inputs[0] has datatype ", in["datatype"].get<std::string>(),
                              "; a gpt model takes BYTES (one prompt per row)"));
  const int64_t n = rows_of(in, {}, limits);
  std::vector<std::string> texts;
  if (const auto bytes = binary_input(in, binary)) {
    texts = binary_prompts(*bytes, n);
  } else {
    std::vector<const json*> data;
    flatten(in["data"], data);
    if (static_cast<int64_t>(data.size()) != n)
      throw InvalidArgument(
          str("serve: inputs[0] has ", data.size(), " prompts; its shape holds ", n));
    for (size_t i = 0; i < data.size(); ++i) {
      if (!data[i]->is_string())
        throw InvalidArgument(
            str("serve: prompt[", i, "] must be a string, got ", data[i]->dump()));
      texts.push_back(data[i]->get<std::string>());
    }
  }
  const json params = body.value("parameters", json::object());
  Request r;
  r.prompts = make_prompts(texts, "prompt",
                           static_cast<int64_t>(count_of(params, "max_new_tokens", "parameters ",
                                                         limits.max_new_tokens)),
                           count_of(params, "seed", "parameters ", 0), info);
  return r;
}

}  // namespace

std::vector<std::string> output_names(const ModelInfo& info) {
  if (info.generates()) return {"text"};
  if (info.spec.task == data::Task::kRegression) return {"value"};
  if (info.spec.task == data::Task::kMultilabel) return {"probs", "labels"};
  return {"class", "top_k_class", "top_k_prob"};
}

ojson model_metadata(const std::string& name, const ModelInfo& info, const ModelLimits& limits) {
  ojson m = {{"name", name}, {"versions", {"1"}}, {"platform", "tessel"}};
  if (info.generates()) {
    m["inputs"] = {tensor_meta("prompt", "BYTES", {-1})};
    m["outputs"] = {tensor_meta("text", "BYTES", {-1})};
    return m;
  }
  Shape in = info.spec.input_shape;
  in.insert(in.begin(), -1);
  const int64_t k = top_k(info, limits);
  m["inputs"] = {tensor_meta("input", "FP32", in)};
  if (info.spec.task == data::Task::kRegression) {
    m["outputs"] = {tensor_meta("value", "FP32", {-1})};
    return m;
  }
  if (info.spec.task == data::Task::kMultilabel) {
    const int64_t labels = info.spec.num_classes;
    m["outputs"] = {tensor_meta("probs", "FP64", {-1, labels}),
                    tensor_meta("labels", "INT64", {-1, labels})};
    return m;
  }
  m["outputs"] = {tensor_meta("class", "INT64", {-1}), tensor_meta("top_k_class", "INT64", {-1, k}),
                  tensor_meta("top_k_prob", "FP64", {-1, k})};
  return m;
}

InferCall read_infer(const json& body, std::string_view binary, const ModelInfo& info,
                     const ModelLimits& limits) {
  InferCall call;
  const json& in = the_input(body, info.generates() ? "prompt" : "input");
  call.request = info.generates() ? read_prompts(body, in, binary, info, limits)
                                  : read_classes(in, binary, info, limits);
  if (body.contains("id")) call.id = body["id"];
  const bool all_binary =
      flag_of(body.value("parameters", json::object()), "binary_data_output", "parameters ", false);
  const std::vector<std::string> known = output_names(info);
  for (const json& o : body.value("outputs", json::array())) {
    if (!o.is_object() || !o.contains("name") || !o["name"].is_string() ||
        !one_of(o["name"].get<std::string>(), known))
      throw InvalidArgument(str("serve: unknown output ", o.dump(), "; the model's outputs are ",
                                json(known).dump()));
    call.outputs.push_back(o["name"]);
    call.binary.push_back(flag_of(o.value("parameters", json::object()), "binary_data",
                                  str("output ", o["name"].dump(), "'s parameters "), all_binary));
  }
  if (call.outputs.empty()) {
    call.outputs = known;
    call.binary.assign(known.size(), all_binary);
  }
  return call;
}

namespace {

// Each row's top classes (output.h's top_classes).
using TopClasses = std::vector<std::vector<std::pair<int64_t, double>>>;

// The values of v2 output `o` for the rows, row by row, each through `add`: what
// output_record's records of the rows hold for it.
template <typename Add>
void output_data(const std::string& o, const BatchRows& rows, const TopClasses& tops, Add add) {
  for (int64_t r = 0; r < rows.count; ++r) {
    if (o == "text") {
      add(rows.text(r));
    } else if (o == "value") {
      add(rows.values(r)[0]);
    } else if (o == "probs" || o == "labels") {
      for (int64_t c = 0; c < rows.width(); ++c) {
        const double p = sigmoid(rows.values(r)[c]);
        add(o == "probs" ? ojson(round6(p)) : ojson(p >= 0.5 ? 1 : 0));
      }
    } else if (o == "class") {
      add(tops[static_cast<size_t>(r)][0].first);
    } else {
      for (const auto& [c, p] : tops[static_cast<size_t>(r)])
        add(o == "top_k_class" ? ojson(c) : ojson(round6(p)));
    }
  }
}

// Appends `v`, a value of v2 `datatype`, as binary data (BYTES: a 4-byte length, its bytes).
void append_binary(std::string& out, std::string_view datatype, const ojson& v) {
  auto raw = [&out](auto x) { out.append(reinterpret_cast<const char*>(&x), sizeof x); };
  if (datatype == "BYTES") {
    const auto& s = v.get_ref<const std::string&>();
    raw(static_cast<uint32_t>(s.size()));
    out += s;
  } else if (datatype == "INT64") {
    raw(v.get<int64_t>());
  } else if (datatype == "FP32") {
    raw(v.get<float>());
  } else {
    raw(v.get<double>());
  }
}

}  // namespace

// Written as text as it goes from the rows' values, each value by nlohmann's serializer: the
// bytes dump_json gives the document of the rows' records, without building either (the
// document of a one-row answer cost a third of the forward of its row in a batch of 64, on
// fashion_mlp; its records, tens of allocations a row, most of what was left).
HttpResponse infer_answer(const std::string& name, const InferCall& call, const BatchRows& rows,
                          int64_t k, data::Task task) {
  std::string out = "{\"model_name\":";
  out.reserve(256 + 32 * static_cast<size_t>(rows.count) * call.outputs.size() *
                        static_cast<size_t>(k + 1));
  nlohmann::detail::serializer<ojson> writer(nlohmann::detail::output_adapter<char>(out), ' ',
                                             ojson::error_handler_t::replace);
  auto value = [&writer](const ojson& v) { writer.dump(v, false, false, 0); };
  value(name);
  out += ",\"model_version\":\"1\"";
  if (!call.id.is_null()) {
    out += ",\"id\":";
    value(call.id);
  }
  out += ",\"outputs\":[";
  const int64_t n = rows.count;
  const bool texts = n > 0 && !rows.batch->values.defined();
  // Each row's top classes, once for the three outputs that show them.
  TopClasses tops;
  std::string binary;  // the outputs sent as binary data, in their order
  if (!texts && task == data::Task::kClassification)
    for (int64_t i = 0; i < n; ++i) tops.push_back(top_classes(rows.values(i), rows.width(), k));
  for (size_t i = 0; i < call.outputs.size(); ++i) {
    const std::string& o = call.outputs[i];
    const bool per_row = o == "text" || o == "class" || o == "value";
    const bool multilabel = o == "probs" || o == "labels";
    const char* datatype = o == "text"         ? "BYTES"
                           : o == "value"      ? "FP32"
                           : o == "probs"      ? "FP64"
                           : o == "top_k_prob" ? "FP64"
                                               : "INT64";
    // Appended piece by piece (str() formats through a stream, allocating as it goes).
    out += i ? ",{\"name\":\"" : "{\"name\":\"";
    out += o;
    out += "\",\"datatype\":\"";
    out += datatype;
    out += "\",\"shape\":[";
    out += std::to_string(n);
    // K values a row: a multilabel row's probs or labels, or its top k classes.
    if (!per_row) {
      out += ',';
      out += std::to_string(n == 0       ? 0
                            : multilabel ? rows.width()
                                         : static_cast<int64_t>(tops[0].size()));
    }
    if (i < call.binary.size() && call.binary[i]) {
      const size_t before = binary.size();
      output_data(o, rows, tops, [&](const ojson& v) { append_binary(binary, datatype, v); });
      out += "],\"parameters\":{\"binary_data_size\":";
      out += std::to_string(binary.size() - before);
      out += "}}";
      continue;
    }
    out += "],\"data\":[";
    bool comma = false;
    output_data(o, rows, tops, [&](const ojson& v) {
      if (comma) out += ',';
      comma = true;
      value(v);
    });
    out += "]}";
  }
  out += "]}";
  if (std::find(call.binary.begin(), call.binary.end(), true) == call.binary.end())
    return {200, "application/json", out + "\n", {}};
  const std::string json_bytes = std::to_string(out.size());
  return {200,
          "application/octet-stream",
          out + binary,
          {{"Inference-Header-Content-Length", json_bytes}}};
}

Request read_predict(const json& body, const ModelInfo& info, const ModelLimits& limits) {
  const char* key = info.generates() ? "prompts" : "inputs";
  if (!body.is_object() || !body.contains(key) || !body[key].is_array())
    throw InvalidArgument(str("serve: the body must be a JSON object with \"", key,
                              "\": [...], got ",
                              body.is_object() ? "no such array" : body.type_name()));
  const json& rows = body[key];
  if (rows.empty() || static_cast<int64_t>(rows.size()) > limits.max_batch)
    throw InvalidArgument(str("serve: \"", key,
                              "\" must hold 1 to serve.max_batch = ", limits.max_batch,
                              " rows, got ", rows.size(), "; split a larger request"));
  Request r;
  if (info.generates()) {
    std::vector<std::string> texts;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!rows[i].is_string())
        throw InvalidArgument(
            str("serve: prompts[", i, "] must be a string, got ", rows[i].type_name()));
      texts.push_back(rows[i].get<std::string>());
    }
    r.prompts = make_prompts(
        texts, "prompts",
        static_cast<int64_t>(count_of(body, "max_new_tokens", "", limits.max_new_tokens)),
        count_of(body, "seed", "", 0), info);
    return r;
  }
  const int64_t n = static_cast<int64_t>(rows.size()), numel = shape_numel(info.spec.input_shape);
  Shape shape = info.spec.input_shape;
  shape.insert(shape.begin(), n);
  r.x = Tensor::empty(shape);
  float* dst = r.x.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const json& row = rows[i];
    if (!row.is_array() || static_cast<int64_t>(row.size()) != numel)
      throw InvalidArgument(str("serve: inputs[", i, "] must be a flat array of ", numel,
                                " numbers (the model's input ", shape_str(info.spec.input_shape),
                                "), got ",
                                row.is_array() ? str(row.size(), " entries") : row.type_name()));
    for (int64_t j = 0; j < numel; ++j) {
      if (!row[j].is_number())
        throw InvalidArgument(
            str("serve: inputs[", i, "][", j, "] must be a number, got ", row[j].dump()));
      *dst++ = row[j].get<float>();
    }
  }
  return r;
}

}  // namespace tessel::infer
