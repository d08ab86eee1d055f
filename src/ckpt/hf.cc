// A GPT checkpoint to and from Hugging Face's GPT-2 folder (hf.h): one table pairs every tessel
// parameter with its GPT-2 name, shape and whether GPT-2 stores it transposed (Conv1D).
#include "tessel/ckpt/hf.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "posix_io.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/core/error.h"
#include "tessel/text/bpe.h"

namespace tessel::ckpt {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kConfigFile = "config.json";
constexpr const char* kVocabFile = "vocab.json";
constexpr const char* kMergesFile = "merges.txt";
constexpr double kLayerNormEps = 1e-5;  // tessel's LayerNorm (nn/layers.h)

struct Pair {
  std::string tessel, hf;
  Shape shape;              // tessel's
  bool transposed = false;  // GPT-2 holds it as [in, out]
};

// Every parameter of a classic GPT in model order.
std::vector<Pair> gpt2_pairs(const GptSizes& s) {
  const int64_t C = s.embed;
  std::vector<Pair> out = {{"embed.wte", "transformer.wte.weight", {s.vocab, C}},
                           {"embed.wpe", "transformer.wpe.weight", {s.context, C}}};
  auto norm = [&](const std::string& t, const std::string& h) {
    out.push_back({t + ".weight", h + ".weight", {C}});
    out.push_back({t + ".bias", h + ".bias", {C}});
  };
  auto linear = [&](const std::string& t, const std::string& h, int64_t in, int64_t outs) {
    out.push_back({t + ".weight", h + ".weight", {outs, in}, true});
    out.push_back({t + ".bias", h + ".bias", {outs}});
  };
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string t = str("block", l, "."), h = str("transformer.h.", l, ".");
    norm(t + "ln1", h + "ln_1");
    linear(t + "attn.qkv", h + "attn.c_attn", C, 3 * C);
    linear(t + "attn.proj", h + "attn.c_proj", C, C);
    norm(t + "ln2", h + "ln_2");
    linear(t + "mlp.fc", h + "mlp.c_fc", C, 4 * C);
    linear(t + "mlp.proj", h + "mlp.c_proj", 4 * C, C);
  }
  norm("head.ln", "transformer.ln_f");
  return out;
}

// [rows, cols] -> [cols, rows].
Tensor transpose(const Tensor& x) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  Tensor y = Tensor::empty({cols, rows});
  const float* a = x.data<float>();
  float* b = y.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) b[c * rows + r] = a[r * cols + c];
  return y;
}

// ---- export ----

// The sizes of the checkpoint's GPT, which must have exactly a classic GPT's parameters.
GptSizes checked_sizes(const CheckpointReader& reader, int64_t heads) {
  const Manifest& m = reader.manifest();
  const std::string where = str("hf export: ", reader.dir());
  if (m.model_kind != "gpt")
    throw InvalidArgument(str(where, " holds a '", m.model_kind,
                              "' model; GPT-2's layout holds a gpt (model.kind = \"gpt\") only"));
  GptSizes s;
  s.heads = heads;
  for (const TensorSpec& p : m.parameters) {
    if (p.name == "embed.wte" && p.shape.size() == 2) s.vocab = p.shape[0], s.embed = p.shape[1];
    if (p.name == "embed.wpe" && p.shape.size() == 2) s.context = p.shape[0];
    if (p.name.starts_with("block") && p.name.ends_with(".ln1.weight")) ++s.layers;
  }
  if (heads < 1 || s.embed % heads != 0)
    throw InvalidArgument(str(where, ": model.heads = ", heads, " does not divide the width ",
                              s.embed, "; give the heads the run was trained with"));
  const std::vector<Pair> pairs = gpt2_pairs(s);
  for (size_t i = 0; i < std::max(pairs.size(), m.parameters.size()); ++i) {
    const TensorSpec* got = i < m.parameters.size() ? &m.parameters[i] : nullptr;
    const Pair* want = i < pairs.size() ? &pairs[i] : nullptr;
    if (got && want && got->name == want->tessel && got->shape == want->shape) continue;
    throw InvalidArgument(str(
        where,
        " is not a classic GPT (LayerNorm, learned positions, GELU MLP, tied head): its "
        "parameter ",
        i, " is ", got ? str("'", got->name, "' ", shape_str(got->shape)) : "none",
        " where GPT-2 has ", want ? str("'", want->tessel, "' ", shape_str(want->shape)) : "none",
        "; GPT-2's layout cannot express it (export it with tessel ckpt export)"));
  }
  return s;
}

Json gpt2_config(const GptSizes& s) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", s.vocab},
          {"n_positions", s.context},
          {"n_ctx", s.context},
          {"n_embd", s.embed},
          {"n_layer", s.layers},
          {"n_head", s.heads},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", kLayerNormEps},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", true},
          {"bos_token_id", nullptr},
          {"eos_token_id", nullptr},
          {"torch_dtype", "float32"}};
}

// ---- import ----

[[noreturn]] void refuse(const fs::path& config, const std::string& field, const Json& got,
                         const std::string& why) {
  throw InvalidArgument(
      str("hf import: ", config.string(), " field \"", field, "\" is ", got.dump(), "; ", why));
}

int64_t positive(const Json& cfg, const fs::path& path, const char* field) {
  if (!cfg.contains(field))
    throw IoError(str("hf import: ", path.string(), " lacks \"", field,
                      "\"; give the config.json that transformers' save_pretrained wrote"));
  const Json& v = cfg[field];
  if (!v.is_number_integer() || v.get<int64_t>() < 1) refuse(path, field, v, "expected a count");
  return v.get<int64_t>();
}

// What config.json says, refusing what tessel's GPT cannot compute.
GptSizes read_config(const fs::path& path) {
  Json cfg;
  try {
    cfg = Json::parse(detail::read_text(path.string()));
  } catch (const Json::parse_error& e) {
    throw IoError(str("hf import: ", path.string(), " is not valid JSON (error at byte ", e.byte,
                      "); give the config.json that transformers' save_pretrained wrote"));
  }
  if (!cfg.is_object()) throw IoError(str("hf import: ", path.string(), " is not a JSON object"));
  auto is = [&](const char* field, const Json& want) {
    return !cfg.contains(field) || cfg[field] == want;
  };
  if (!is("model_type", "gpt2"))
    refuse(path, "model_type", cfg["model_type"], "tessel imports GPT-2 models (\"gpt2\") only");
  GptSizes s{positive(cfg, path, "n_layer"), positive(cfg, path, "n_head"),
             positive(cfg, path, "n_embd"), positive(cfg, path, "n_positions"),
             positive(cfg, path, "vocab_size")};
  if (s.embed % s.heads != 0)
    refuse(path, "n_head", cfg["n_head"], str("it must divide n_embd = ", s.embed));
  const Json act = cfg.value("activation_function", Json("gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    refuse(path, "activation_function", cfg["activation_function"],
           "tessel's GPT computes the tanh GELU (\"gelu_new\") only");
  if (cfg.contains("n_inner") && !cfg["n_inner"].is_null() && cfg["n_inner"] != 4 * s.embed)
    refuse(path, "n_inner", cfg["n_inner"],
           str("tessel's GPT has an MLP of 4 n_embd = ", 4 * s.embed, " (or null)"));
  if (cfg.contains("layer_norm_epsilon") &&
      !(cfg["layer_norm_epsilon"].is_number() &&
        std::abs(cfg["layer_norm_epsilon"].get<double>() - kLayerNormEps) <= 1e-12))
    refuse(path, "layer_norm_epsilon", cfg["layer_norm_epsilon"], "tessel's LayerNorm uses 1e-05");
  if (!is("tie_word_embeddings", true))
    refuse(path, "tie_word_embeddings", cfg["tie_word_embeddings"],
           "tessel's GPT ties its head to the token embedding (true)");
  if (!is("scale_attn_weights", true))
    refuse(path, "scale_attn_weights", cfg["scale_attn_weights"],
           "tessel's attention scales by 1/sqrt(head size) (true)");
  if (!is("scale_attn_by_inverse_layer_idx", false))
    refuse(path, "scale_attn_by_inverse_layer_idx", cfg["scale_attn_by_inverse_layer_idx"],
           "tessel's attention does not scale by layer (false)");
  if (!is("add_cross_attention", false))
    refuse(path, "add_cross_attention", cfg["add_cross_attention"],
           "tessel's GPT is decoder-only (false)");
  return s;
}

// A tensor of the file as f32, whatever its float dtype.
Tensor read_f32(const SafetensorsReader& file, const TensorInfo& info) {
  if (info.dtype != DType::kF32 && info.dtype != DType::kF16 && info.dtype != DType::kBF16)
    throw IoError(str("hf import: ", file.path(), " holds '", info.name, "' as ",
                      dtype_name(info.dtype), "; parameters must be F32, F16 or BF16"));
  Tensor stored = Tensor::empty(info.shape, info.dtype);
  file.read(info.name, 0, stored.numel(), stored.raw());
  return info.dtype == DType::kF32 ? stored : stored.to(DType::kF32);
}

// The file's parameters by GPT-2 name ("transformer." prefixed, as GPT2LMHeadModel saves
// them; a GPT2Model's are not), without the attention mask buffers older versions saved.
std::map<std::string, const TensorInfo*> gpt2_tensors(const SafetensorsReader& file,
                                                      const std::vector<Pair>& pairs) {
  std::map<std::string, const TensorInfo*> out;
  for (const TensorInfo& t : file.tensors()) {
    const std::string name = t.name.starts_with("transformer.") || t.name == "lm_head.weight"
                                 ? t.name
                                 : "transformer." + t.name;
    if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) continue;
    out[name] = &t;
  }
  for (const auto& [name, info] : out)
    if (name != "lm_head.weight" &&
        std::none_of(pairs.begin(), pairs.end(), [&](const Pair& p) { return p.hf == name; }))
      throw InvalidArgument(str("hf import: ", file.path(), " holds '", info->name,
                                "', which tessel's GPT has no place for; config.json's n_layer "
                                "and the file disagree, or the model is no GPT-2"));
  return out;
}

// The tokenizer of the folder, or null when it has none; its vocabulary must be the model's.
std::shared_ptr<const text::Tokenizer> read_tokenizer(const fs::path& dir, int64_t vocab) {
  const fs::path v = dir / kVocabFile, m = dir / kMergesFile;
  if (!fs::exists(v) && !fs::exists(m)) return nullptr;
  if (!fs::exists(v) || !fs::exists(m))
    throw IoError(str("hf import: ", dir.string(), " has ",
                      fs::exists(v) ? kVocabFile : kMergesFile, " without ",
                      fs::exists(v) ? kMergesFile : kVocabFile,
                      "; a GPT-2 tokenizer needs both (or neither: a model without one)"));
  auto t = text::load_gpt2_tokenizer(v.string(), m.string());
  if (t->vocab_size() != vocab)
    throw InvalidArgument(str("hf import: ", v.string(), " holds ", t->vocab_size(),
                              " tokens but config.json's vocab_size is ", vocab,
                              "; tessel needs a tokenizer of the model's vocabulary"));
  return t;
}

}  // namespace

void export_hf(const std::string& path, int64_t heads, const std::string& out_dir) {
  const CheckpointReader reader(path);
  const GptSizes s = checked_sizes(reader, heads);
  TensorFile file;
  file.metadata = {{"format", "pt"}};  // transformers refuses a file without it
  for (const Pair& p : gpt2_pairs(s)) {
    Tensor t = Tensor::empty(p.shape);
    reader.read(p.tessel, 0, t.numel(), t.data<float>());
    file.tensors.emplace_back(p.hf, p.transposed ? transpose(t) : t);
  }
  const fs::path out(out_dir);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw IoError(str("hf export: cannot create the folder ", out_dir, ": ", ec.message()));
  const std::string model = (out / kModelFile).string(), tmp = str(model, ".tmp-", ::getpid());
  try {
    write_safetensors(tmp, file);
    fs::rename(tmp, model);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  write_file_atomic((out / kConfigFile).string(), gpt2_config(s).dump(2) + "\n");
  const auto& tokenizer = reader.manifest().tokenizer;
  if (tokenizer) {
    const text::Gpt2Files files = text::gpt2_files(*tokenizer);
    write_file_atomic((out / kVocabFile).string(), files.encoder_json);
    write_file_atomic((out / kMergesFile).string(), files.vocab_bpe);
  } else {  // no stale tokenizer of an earlier export beside this model
    fs::remove(out / kVocabFile, ec);
    fs::remove(out / kMergesFile, ec);
  }
  fsync_dir(out_dir);
}

GptSizes import_hf(const std::string& hf_dir, const std::string& run_dir) {
  const fs::path dir(hf_dir);
  if (fs::exists(fs::path(run_dir) / "checkpoints"))
    throw InvalidArgument(
        str("hf import: ", run_dir, " holds checkpoints already; import into a new folder"));
  const GptSizes s = read_config(dir / kConfigFile);
  const fs::path model = dir / kModelFile;
  if (!fs::exists(model))
    throw IoError(str("hf import: ", hf_dir, " has no ", kModelFile,
                      "; save the model with save_pretrained(..., safe_serialization=True)"));
  const SafetensorsReader file(model.string());
  const std::vector<Pair> pairs = gpt2_pairs(s);
  const std::map<std::string, const TensorInfo*> by_name = gpt2_tensors(file, pairs);
  Manifest m;
  m.model_kind = "gpt";
  m.io = ModelIo{{s.context}, DType::kI32, s.vocab};
  m.tokenizer = read_tokenizer(dir, s.vocab);
  m.optimizer_kind = "none";
  std::vector<ShardSlice> slices;
  for (const Pair& p : pairs) {
    const auto it = by_name.find(p.hf);
    const Shape want = p.transposed ? Shape{p.shape[1], p.shape[0]} : p.shape;
    if (it == by_name.end() || it->second->shape != want)
      throw IoError(
          str("hf import: ", model.string(), " ",
              it == by_name.end() ? str("lacks '", p.hf, "'")
                                  : str("holds '", p.hf, "' as ", shape_str(it->second->shape)),
              ", expected ", shape_str(want), " from config.json (n_layer ", s.layers, ", n_embd ",
              s.embed, ", n_positions ", s.context, ", vocab_size ", s.vocab, ")"));
    const Tensor t = read_f32(file, *it->second);
    slices.push_back({p.tessel, 0, (p.transposed ? transpose(t) : t).reshape({t.numel()})});
    m.parameters.push_back({p.tessel, p.shape});
  }
  if (const auto head = by_name.find("lm_head.weight"); head != by_name.end()) {
    const Tensor h = read_f32(file, *head->second);
    const Tensor& wte = slices.front().data;
    if (h.numel() != wte.numel() ||
        std::memcmp(h.raw(), wte.raw(), static_cast<size_t>(wte.nbytes())) != 0)
      throw InvalidArgument(str("hf import: ", model.string(),
                                " holds an lm_head.weight other than transformer.wte.weight; "
                                "tessel's GPT ties its head to the token embedding"));
  }
  const std::string tmp = begin_checkpoint(run_dir, 0);
  m.shards = {write_shard(tmp, 0, slices)};
  const Json trainer = {{"imported_from", fs::absolute(dir).string()}};
  commit_checkpoint(run_dir, tmp, 0, m, trainer.dump(2), 1);
  return s;
}

}  // namespace tessel::ckpt
