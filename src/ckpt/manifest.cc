// manifest.json: writing it from a Manifest and reading it back, both checked. The manifest
// records the size and SHA-256 of every other file of its step folder (checkpoint_reader.cc
// checks them) and the SHA-256 of its own content: any change of content fails the load.
#include "manifest.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "tessel/core/sha256.h"

namespace tessel::ckpt::detail {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // keeps fields in written order, which the self-hash needs

constexpr const char* kFormat = "tessel-sharded";
constexpr const char* kSelfHash = "manifest_sha256";
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

// A plain file name inside the step folder: no separators, no "." or "..".
bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// The SHA-256 of a manifest without its kSelfHash field, dumped compactly. The reader
// recomputes it from the parsed object, so any change of content fails the check.
std::string self_sha256(const Json& body) {
  const std::string text = body.dump();
  return sha256_hex(text.data(), text.size());
}

// ---- writing ----

Json parameters_json(const std::vector<TensorSpec>& parameters) {
  Json out = Json::array();
  std::set<std::string> names;
  for (const TensorSpec& p : parameters) {
    if (p.name.empty() || !names.insert(p.name).second)
      throw InvalidArgument(str("checkpoint: manifest parameter name '", p.name,
                                "' is empty or repeated; name each parameter once"));
    if (std::any_of(p.shape.begin(), p.shape.end(), [](int64_t d) { return d < 0; }))
      throw InvalidArgument(str("checkpoint: manifest parameter '", p.name, "' has shape ",
                                shape_str(p.shape), "; dimensions must be >= 0"));
    out.push_back({{"name", p.name}, {"shape", p.shape}});
  }
  return out;
}

// {"input_shape": [...], "input_dtype": "f32", "num_classes": n}, checked.
Json model_io_json(const std::optional<ModelIo>& io) {
  if (!io)
    throw InvalidArgument(
        "checkpoint: manifest has no model_io; set Manifest::io to the model's input shape, "
        "input dtype and number of classes");
  const bool bad_shape =
      io->input_shape.empty() ||
      std::any_of(io->input_shape.begin(), io->input_shape.end(), [](int64_t d) { return d <= 0; });
  const bool bad_dtype = io->input_dtype != DType::kF32 && io->input_dtype != DType::kI32;
  if (bad_shape || bad_dtype || io->num_classes < 1)
    throw InvalidArgument(str("checkpoint: manifest model_io has input ",
                              dtype_name(io->input_dtype), " ", shape_str(io->input_shape), " and ",
                              io->num_classes, " classes; the input must be f32 or i32, its ",
                              "dimensions and the classes >= 1"));
  const size_t features = static_cast<size_t>(shape_numel(io->input_shape));
  const bool bad_norm = io->input_mean.size() != io->input_std.size() ||
                        !(io->input_mean.empty() || io->input_mean.size() == features) ||
                        std::any_of(io->input_std.begin(), io->input_std.end(),
                                    [](float s) { return !(s > 0 && std::isfinite(s)); });
  if (bad_norm)
    throw InvalidArgument(str("checkpoint: manifest model_io has ", io->input_mean.size(),
                              " input means and ", io->input_std.size(), " stds for ", features,
                              " features; give one finite mean and positive std per feature"));
  if (!(io->input_names.empty() || io->input_names.size() == features))
    throw InvalidArgument(str("checkpoint: manifest model_io has ", io->input_names.size(),
                              " input names for ", features, " features; give one per feature"));
  Json out = {{"input_shape", io->input_shape},
              {"input_dtype", dtype_name(io->input_dtype)},
              {"num_classes", io->num_classes}};
  if (!io->input_names.empty()) {
    out["input_names"] = io->input_names;
    out["target_names"] = io->target_names;
  }
  if (!io->input_mean.empty()) {
    out["input_mean"] = io->input_mean;
    out["input_std"] = io->input_std;
  }
  if (io->task != data::Task::kClassification) out["task"] = name_of(io->task);
  return out;
}

// The manifest's shard list without the entries of writers that wrote nothing, after checking
// that every file is in `dir` with the size write_shard reported: a writer that wrote into a
// folder the committing rank does not see fails here, not at the next resume.
Json shards_json(const std::vector<ShardFile>& shards, const fs::path& dir) {
  Json out = Json::array();
  std::set<std::string> files = {kManifest, kTrainer};
  for (const ShardFile& s : shards) {
    if (s.file.empty()) continue;
    if (!plain_name(s.file) || !files.insert(s.file).second || !is_sha256_hex(s.sha256))
      throw InvalidArgument(str("checkpoint: manifest shard entry '", s.file, "' (sha256 '",
                                s.sha256, "') is not a unique plain file name with a SHA-256; ",
                                "pass the ShardFiles that write_shard returned"));
    std::error_code ec;
    const uintmax_t size = fs::file_size(dir / s.file, ec);
    if (ec || size != static_cast<uintmax_t>(s.bytes))
      throw IoError(str("checkpoint: shard file ", (dir / s.file).string(),
                        ec ? std::string(" is missing") : str(" has ", size, " bytes"),
                        ", expected ", s.bytes, " bytes; every writer must write_shard into ",
                        "the folder begin_checkpoint returned, on storage this rank sees"));
    out.push_back({{"file", s.file}, {"bytes", s.bytes}, {"sha256", s.sha256}});
  }
  return out;
}

// ---- reading ----

// One value of manifest.json with its name there, e.g. "parameters[2].shape".
struct Field {
  const Json& v;
  std::string name;
};

// Typed access to manifest.json: any defect is an IoError naming the file and the field.
class Fields {
 public:
  explicit Fields(std::string path) : path_(std::move(path)) {}
  [[noreturn]] void bad(const std::string& field, const std::string& defect) const {
    corrupt_file(path_, str("has field \"", field, "\" ", defect));
  }
  Field at(const Field& obj, const char* key) const {
    const std::string name = obj.name.empty() ? key : obj.name + "." + key;
    if (!obj.v.is_object() && obj.name.empty()) corrupt_file(path_, "is not a JSON object");
    if (!obj.v.is_object()) bad(obj.name, "that is not a JSON object");
    const auto it = obj.v.find(key);
    if (it == obj.v.end()) bad(name, "missing");
    return {*it, name};
  }
  Field item(const Field& array, size_t i) const {
    return {array.v[i], str(array.name, "[", i, "]")};
  }
  size_t size(const Field& f) const {
    if (!f.v.is_array()) bad(f.name, "that is not an array");
    return f.v.size();
  }
  std::string text(const Field& f) const {
    if (!f.v.is_string()) bad(f.name, "that is not a string");
    return f.v.get<std::string>();
  }
  float number(const Field& f) const {  // a finite number
    if (!f.v.is_number() || !std::isfinite(f.v.get<double>()))
      bad(f.name, str("that is not a finite number, got ", f.v.dump()));
    return f.v.get<float>();
  }
  int64_t count(const Field& f) const {  // a non-negative integer
    if (f.v.is_number_unsigned() ? f.v.get<uint64_t>() > uint64_t{kMaxInt64}
                                 : !f.v.is_number_integer() || f.v.get<int64_t>() < 0)
      bad(f.name, str("that is not a non-negative integer, got ", f.v.dump()));
    return f.v.get<int64_t>();
  }

 private:
  std::string path_;
};

std::vector<TensorSpec> parse_parameters(const Fields& f, const Field& params) {
  std::vector<TensorSpec> out;
  std::set<std::string> names;
  for (size_t i = 0; i < f.size(params); ++i) {
    const Field p = f.item(params, i);
    TensorSpec spec{f.text(f.at(p, "name")), {}};
    if (spec.name.empty() || !names.insert(spec.name).second)
      f.bad(p.name + ".name", str("that is empty or repeated, got '", spec.name, "'"));
    const Field shape = f.at(p, "shape");
    int64_t numel = 1;
    for (size_t k = 0; k < f.size(shape); ++k) {
      spec.shape.push_back(f.count(f.item(shape, k)));
      if (__builtin_mul_overflow(numel, spec.shape.back(), &numel))
        f.bad(shape.name, "with more elements than fit in 64 bits");
    }
    out.push_back(std::move(spec));
  }
  return out;
}

ModelIo parse_model_io(const Fields& f, const Field& io) {
  ModelIo out;
  const Field shape = f.at(io, "input_shape");
  for (size_t k = 0; k < f.size(shape); ++k) {
    out.input_shape.push_back(f.count(f.item(shape, k)));
    if (out.input_shape.back() == 0 || out.input_shape.back() > (int64_t{1} << 40))
      f.bad(f.item(shape, k).name, str("that is not a dimension, got ", out.input_shape.back()));
  }
  if (out.input_shape.empty()) f.bad(shape.name, "that is empty");
  const Field dtype = f.at(io, "input_dtype");
  const std::string name = f.text(dtype);
  if (name != "f32" && name != "i32")
    f.bad(dtype.name, str("that is not 'f32' or 'i32', got '", name, "'"));
  out.input_dtype = dtype_from_name(name);
  const Field classes = f.at(io, "num_classes");
  out.num_classes = f.count(classes);
  if (out.num_classes < 1) f.bad(classes.name, "that is not a positive integer, got 0");
  if (io.v.is_object() && io.v.contains("input_mean")) {
    const size_t features = static_cast<size_t>(shape_numel(out.input_shape));
    const Field mean = f.at(io, "input_mean"), sd = f.at(io, "input_std");
    auto read = [&](const Field& field, std::vector<float>& values) {
      if (f.size(field) != features)
        f.bad(field.name, str("that has ", f.size(field), " values for ", features, " features"));
      for (size_t k = 0; k < features; ++k) values.push_back(f.number(f.item(field, k)));
    };
    read(mean, out.input_mean);
    read(sd, out.input_std);
    for (size_t k = 0; k < features; ++k)
      if (!(out.input_std[k] > 0)) f.bad(sd.name, str("that holds ", out.input_std[k], " <= 0"));
  }
  if (io.v.is_object() && io.v.contains("input_names")) {
    const size_t features = static_cast<size_t>(shape_numel(out.input_shape));
    const Field names = f.at(io, "input_names"), targets = f.at(io, "target_names");
    if (f.size(names) != features)
      f.bad(names.name, str("that has ", f.size(names), " names for ", features, " features"));
    for (size_t k = 0; k < features; ++k) out.input_names.push_back(f.text(f.item(names, k)));
    for (size_t k = 0; k < f.size(targets); ++k)
      out.target_names.push_back(f.text(f.item(targets, k)));
  }
  if (io.v.is_object() && io.v.contains("task")) {
    const Field task = f.at(io, "task");
    const std::optional<data::Task> t = value_of<data::Task>(f.text(task));
    if (!t || *t == data::Task::kClassification)
      f.bad(task.name, str("that is not 'regression' or 'multilabel', got '", f.text(task), "'"));
    out.task = *t;
  }
  return out;
}

std::vector<ShardFile> parse_shards(const Fields& f, const Field& shards) {
  std::vector<ShardFile> out;
  std::set<std::string> files = {kManifest, kTrainer};
  for (size_t i = 0; i < f.size(shards); ++i) {
    const Field s = f.item(shards, i);
    ShardFile file{f.text(f.at(s, "file")), f.count(f.at(s, "bytes")), f.text(f.at(s, "sha256"))};
    if (!plain_name(file.file) || !files.insert(file.file).second)
      f.bad(s.name + ".file",
            str("that is not a plain file name of its own, got '", file.file, "'"));
    if (!is_sha256_hex(file.sha256)) f.bad(s.name + ".sha256", "that is not 64 hex digits");
    out.push_back(std::move(file));
  }
  return out;
}

}  // namespace

[[noreturn]] void corrupt_file(const std::string& path, const std::string& defect) {
  throw IoError(str("checkpoint: ", path, " ", defect,
                    "; the file is corrupt: resume from an older checkpoint"));
}

// manifest.json's text (see checkpoint.h), with the size and SHA-256 of trainer.json and the
// SHA-256 of the manifest itself.
std::string manifest_text(const Manifest& m, const std::string& trainer_json, const fs::path& dir) {
  if (m.optimizer_steps < 0)
    throw InvalidArgument(
        str("checkpoint: manifest optimizer_steps must be >= 0, got ", m.optimizer_steps));
  std::set<std::string> buffers;
  for (const std::string& b : m.state_buffers)
    if (b.empty() || !buffers.insert(b).second)
      throw InvalidArgument(str("checkpoint: manifest state buffer '", b,
                                "' is empty or repeated; name each buffer once"));
  Json body = {{"format", kFormat},
               {"version", Manifest::kVersion},
               {"model_kind", m.model_kind},
               {"model_io", model_io_json(m.io)},
               {"parameters", parameters_json(m.parameters)},
               {"optimizer",
                {{"kind", m.optimizer_kind},
                 {"steps", m.optimizer_steps},
                 {"state_buffers", m.state_buffers}}}};
  if (m.tokenizer) body["tokenizer"] = m.tokenizer->to_json();
  body["shards"] = shards_json(m.shards, dir);
  body["trainer"] = {{"bytes", trainer_json.size()},
                     {"sha256", sha256_hex(trainer_json.data(), trainer_json.size())}};
  try {
    const std::string self = self_sha256(body);
    body[kSelfHash] = self;
    return body.dump(2) + "\n";
  } catch (const Json::exception&) {
    throw InvalidArgument(
        "checkpoint: a manifest name or kind is not valid UTF-8; use UTF-8 names");
  }
}

// Parses and checks manifest.json; `trainer` receives trainer.json's recorded size and hash.
Manifest parse_manifest(const std::string& path, const std::string& text, ShardFile* trainer) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    corrupt_file(path, str("is not valid JSON (error at byte ", e.byte, ")"));
  }
  const Fields f(path);
  const Field root{j, ""};
  const std::string format = f.text(f.at(root, "format"));
  if (format != kFormat) f.bad("format", str("that is '", format, "', not '", kFormat, "'"));
  const int64_t version = f.count(f.at(root, "version"));
  if (version > Manifest::kVersion)
    throw IoError(str("checkpoint: ", path, " has version ", version, ", newer than the ",
                      Manifest::kVersion, " this tessel reads; resume with a newer tessel"));
  if (version < 1) f.bad("version", str("that no tessel wrote, got ", version));
  // Checked before the other fields, so that a flipped bit reads as what it is.
  const std::string recorded = f.text(f.at(root, kSelfHash));
  Json body = j;
  body.erase(kSelfHash);
  if (self_sha256(body) != recorded)
    corrupt_file(path, "does not match the SHA-256 it records of its own content");

  Manifest m;
  m.model_kind = f.text(f.at(root, "model_kind"));
  if (version >= 3) m.io = parse_model_io(f, f.at(root, "model_io"));
  m.parameters = parse_parameters(f, f.at(root, "parameters"));
  const Field opt = f.at(root, "optimizer");
  m.optimizer_kind = f.text(f.at(opt, "kind"));
  m.optimizer_steps = f.count(f.at(opt, "steps"));
  const Field buffers = f.at(opt, "state_buffers");
  for (size_t i = 0; i < f.size(buffers); ++i) {
    m.state_buffers.push_back(f.text(f.item(buffers, i)));
    if (m.state_buffers.back().empty() ||
        std::count(m.state_buffers.begin(), m.state_buffers.end(), m.state_buffers.back()) > 1)
      f.bad(f.item(buffers, i).name, "that is empty or repeated");
  }
  if (j.contains("tokenizer")) {
    try {
      m.tokenizer = text::tokenizer_from_json(j["tokenizer"]);
    } catch (const InvalidArgument& e) {
      corrupt_file(path, str("has ", e.what()));
    }
  }
  m.shards = parse_shards(f, f.at(root, "shards"));
  const Field t = f.at(root, "trainer");
  *trainer = {kTrainer, f.count(f.at(t, "bytes")), f.text(f.at(t, "sha256"))};
  return m;
}

}  // namespace tessel::ckpt::detail
