// tessel ckpt export --format hf and tessel ckpt import: a trained char-level GPT goes out as
// a GPT-2 folder and back into a run with the same parameters, bit for bit, and the same greedy
// generation; a folder tessel's GPT cannot express, or a damaged one, gets an error naming what
// is wrong. A BPE tokenizer survives GPT-2's vocab.json + merges.txt. (bench/hf_roundtrip checks
// the folder against transformers itself.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../infer/infer_testing.h"  // run(): the tessel binary
#include "ckpt_testing.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/text/bpe.h"

namespace tessel::ckpt::testing {
namespace {

using infer::testing::Result;

Result tessel(const std::string& args) { return infer::testing::run(args); }

// A 2-block char-level GPT trained 3 steps once for the suite, exported to a GPT-2 folder.
class HfTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string text;
    for (int i = 0; i < 40; ++i) text += "the quick brown fox jumps over the lazy dog. ";
    write_bytes(path("corpus.txt"), text);
    write_bytes(path("gpt.toml"),
                "seed = 3\n[model]\nkind = \"gpt\"\nlayers = 2\nheads = 2\n"
                "embed = 16\n[data]\nkind = \"text\"\npath = \"" +
                    path("corpus.txt") +
                    "\"\ncontext = 16\n[optim]\nkind = \"adamw\"\nlr = 0.01\n"
                    "[train]\nbatch = 8\nmax_steps = 3\n[infer]\n"
                    "max_new_tokens = 8\n");
    write_bytes(path("prompts.txt"), "the qu\nover th\n");
    Result r = tessel("train " + path("gpt.toml") + " --quiet --run-dir " + path("run"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = tessel("ckpt export --format hf " + path("run") + " " + path("hf"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string path(const std::string& name) { return *dir_ / name; }
  // A copy of the exported folder for a test to damage.
  static std::string copy_of_export(const std::string& name) {
    fs::copy(path("hf"), path(name), fs::copy_options::recursive);
    return path(name);
  }
  static std::string import_error(const std::string& hf_dir) {
    const Result r = tessel("ckpt import " + hf_dir + " " + hf_dir + "_run");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    return r.output;
  }

 private:
  static TempDir* dir_;
};
TempDir* HfTest::dir_ = nullptr;

TEST_F(HfTest, ExportHasGpt2NamesConfigAndTokenizer) {
  const TensorFile f = read_safetensors(path("hf") + "/model.safetensors");
  EXPECT_EQ(f.metadata.at("format"), "pt");
  ASSERT_NE(f.find("transformer.wte.weight"), nullptr);
  const int64_t V = f.find("transformer.wte.weight")->dim(0);
  EXPECT_EQ(f.find("transformer.wpe.weight")->shape(), Shape({16, 16}));
  // Conv1D: [in, out]
  EXPECT_EQ(f.find("transformer.h.1.attn.c_attn.weight")->shape(), Shape({16, 48}));
  EXPECT_EQ(f.find("transformer.h.0.mlp.c_proj.weight")->shape(), Shape({64, 16}));
  EXPECT_NE(f.find("transformer.ln_f.bias"), nullptr);
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);  // tied
  EXPECT_EQ(f.tensors.size(), 2u + 2 * 12 + 2);
  const auto cfg = nlohmann::json::parse(read_bytes(path("hf") + "/config.json"));
  EXPECT_EQ(cfg["n_layer"], 2);
  EXPECT_EQ(cfg["n_head"], 2);
  EXPECT_EQ(cfg["n_embd"], 16);
  EXPECT_EQ(cfg["n_positions"], 16);
  EXPECT_EQ(cfg["vocab_size"], V);
  EXPECT_EQ(cfg["activation_function"], "gelu_new");
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  // The char vocabulary as GPT-2's files: one id per byte (' ' spelled as GPT-2's "Ġ").
  const auto vocab = nlohmann::json::parse(read_bytes(path("hf") + "/vocab.json"));
  EXPECT_EQ(static_cast<int64_t>(vocab.size()), V);
  EXPECT_EQ(vocab["\xc4\xa0"], 0);  // ' ' is the smallest byte of the corpus
  EXPECT_EQ(read_bytes(path("hf") + "/merges.txt"), "#version: 0.2\n");
}

TEST_F(HfTest, ImportGivesTheSameParametersAndGreedyTokens) {
  Result r = tessel("ckpt import " + path("hf") + " " + path("imported"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const CheckpointReader a(path("run")), b(path("imported"));
  ASSERT_EQ(a.manifest().parameters.size(), b.manifest().parameters.size());
  for (const TensorSpec& p : a.manifest().parameters) {
    const int64_t n = shape_numel(p.shape);
    std::vector<float> x(n), y(n);
    a.read(p.name, 0, n, x.data());
    b.read(p.name, 0, n, y.data());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), n * sizeof(float)), 0) << p.name;
  }
  EXPECT_TRUE(text::same_tokenizer(a.manifest().tokenizer.get(), b.manifest().tokenizer.get()));
  for (const auto& [config, run, out] :
       {std::tuple{path("gpt.toml"), path("run"), path("a.jsonl")},
        std::tuple{path("imported") + "/config.toml", path("imported"), path("b.jsonl")}}) {
    r = tessel("predict " + config + " --checkpoint " + run + " --input " + path("prompts.txt") +
               " --output " + out + " --set infer.max_new_tokens=8");
    ASSERT_EQ(r.exit_code, 0) << config << ": " << r.output;
  }
  const std::string a_out = read_bytes(path("a.jsonl")), b_out = read_bytes(path("b.jsonl"));
  EXPECT_NE(a_out.find("\"text\""), std::string::npos) << a_out;
  EXPECT_EQ(a_out, b_out);
  // Exporting the import again gives the same files.
  r = tessel("ckpt export --format hf " + path("imported") + " " + path("hf2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"/model.safetensors", "/config.json", "/vocab.json", "/merges.txt"})
    EXPECT_EQ(read_bytes(path("hf") + f), read_bytes(path("hf2") + f)) << f;
}

TEST_F(HfTest, ImportRefusesWhatTesselsGptCannotExpress) {
  auto with_config = [&](const std::string& name, const std::string& key, nlohmann::json value) {
    const std::string d = copy_of_export(name);
    auto cfg = nlohmann::json::parse(read_bytes(d + "/config.json"));
    cfg[key] = std::move(value);
    write_bytes(d + "/config.json", cfg.dump());
    return import_error(d);
  };
  EXPECT_NE(with_config("relu", "activation_function", "relu")
                .find("field \"activation_function\" is \"relu\""),
            std::string::npos);
  EXPECT_NE(with_config("inner", "n_inner", 32).find("field \"n_inner\" is 32"), std::string::npos);
  EXPECT_NE(with_config("untied", "tie_word_embeddings", false).find("tie_word_embeddings"),
            std::string::npos);
  EXPECT_NE(with_config("eps", "layer_norm_epsilon", 1e-6).find("layer_norm_epsilon"),
            std::string::npos);
  EXPECT_NE(with_config("bert", "model_type", "bert").find("model_type"), std::string::npos);
  // config.json and the tensors disagree: one layer more than the file holds.
  EXPECT_NE(with_config("layers", "n_layer", 3).find("lacks 'transformer.h.2.ln_1.weight'"),
            std::string::npos);
  EXPECT_NE(with_config("width", "n_embd", 32).find("expected"), std::string::npos);
}

TEST_F(HfTest, ImportRefusesDamagedFolders) {
  const TensorFile f = read_safetensors(path("hf") + "/model.safetensors");
  auto with_tensors = [&](const std::string& name, const TensorFile& file) {
    const std::string d = copy_of_export(name);
    write_safetensors(d + "/model.safetensors", file);
    return import_error(d);
  };
  TensorFile biasless = f;  // GPT-2 without a bias
  std::erase_if(biasless.tensors, [](const auto& t) { return t.first.ends_with("c_fc.bias"); });
  EXPECT_NE(with_tensors("biasless", biasless).find("lacks 'transformer.h.0.mlp.c_fc.bias'"),
            std::string::npos);
  TensorFile untied = f;  // a head of its own
  Tensor head = Tensor::zeros(f.find("transformer.wte.weight")->shape());
  untied.tensors.emplace_back("lm_head.weight", head);
  EXPECT_NE(with_tensors("head", untied).find("lm_head.weight other than"), std::string::npos);
  // Truncated model file, missing config, vocab.json without merges.txt.
  std::string d = copy_of_export("truncated");
  const std::string bytes = read_bytes(d + "/model.safetensors");
  write_bytes(d + "/model.safetensors", bytes.substr(0, bytes.size() / 2));
  EXPECT_NE(import_error(d).find("model.safetensors"), std::string::npos);
  d = copy_of_export("noconfig");
  fs::remove(d + "/config.json");
  EXPECT_NE(import_error(d).find("config.json"), std::string::npos);
  d = copy_of_export("nomerges");
  fs::remove(d + "/merges.txt");
  EXPECT_NE(import_error(d).find("vocab.json without merges.txt"), std::string::npos);
  // An import never writes over a run.
  EXPECT_NE(tessel("ckpt import " + path("hf") + " " + path("run")).output.find("already"),
            std::string::npos);
}

// transformers saves f16 and bf16 models too: their values arrive converted to f32.
TEST_F(HfTest, ImportConvertsHalfPrecision) {
  const TensorFile f = read_safetensors(path("hf") + "/model.safetensors");
  for (const DType t : {DType::kF16, DType::kBF16}) {
    TensorFile half = f;
    for (auto& [name, x] : half.tensors) {
      Tensor h = Tensor::empty(x.shape(), t);
      for (int64_t i = 0; i < x.numel(); ++i)
        static_cast<uint16_t*>(h.raw())[i] =
            t == DType::kF16 ? f32_to_f16(x.data<float>()[i]) : f32_to_bf16(x.data<float>()[i]);
      x = h;
    }
    const std::string d = copy_of_export(dtype_name(t)), run = d + "_run";
    write_safetensors(d + "/model.safetensors", half);
    const Result r = tessel("ckpt import " + d + " " + run);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const CheckpointReader reader(run);
    const Tensor& wpe = *half.find("transformer.wpe.weight");
    std::vector<float> got(wpe.numel());
    reader.read("embed.wpe", 0, wpe.numel(), got.data());
    for (int64_t i = 0; i < wpe.numel(); ++i) {
      const uint16_t v = static_cast<const uint16_t*>(wpe.raw())[i];
      ASSERT_EQ(got[i], t == DType::kF16 ? f16_to_f32(v) : bf16_to_f32(v)) << i;
    }
  }
}

TEST_F(HfTest, ExportRefusesANonGpt) {
  write_bytes(path("mlp.toml"),
              "[model]\nkind = \"mlp\"\nhidden = [8]\n[data]\nkind = \"spiral\"\n"
              "[train]\nbatch = 16\nmax_steps = 1\n");
  Result r = tessel("train " + path("mlp.toml") + " --quiet --run-dir " + path("mlp"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = tessel("ckpt export --format hf " + path("mlp") + " " + path("mlp_hf"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("holds a 'mlp' model; GPT-2's layout holds a gpt"), std::string::npos)
      << r.output;
  // The plain export stays the default.
  r = tessel("ckpt export " + path("mlp") + " " + path("mlp.safetensors"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// A BPE tokenizer through GPT-2's files: the same tokens, ids and encodings.
TEST(Gpt2Files, BpeRoundTrip) {
  std::string corpus;
  for (int i = 0; i < 50; ++i)
    corpus += "Hello world, hello tessel! Naïve café 123 " + std::to_string(i * 7) + "\n";
  const text::BpeTokenizer bpe = text::train_bpe({corpus}, {.vocab_size = 320, .min_count = 2});
  ASSERT_GT(bpe.vocab_size(), 256);
  const text::Gpt2Files files = text::gpt2_files(bpe);
  TempDir dir;
  write_bytes(dir / "vocab.json", files.encoder_json);
  write_bytes(dir / "merges.txt", files.vocab_bpe);
  const auto back = text::load_gpt2_tokenizer(dir / "vocab.json", dir / "merges.txt");
  EXPECT_TRUE(text::same_tokenizer(&bpe, back.get()));
  EXPECT_EQ(back->encode(corpus), bpe.encode(corpus));
}

}  // namespace
}  // namespace tessel::ckpt::testing
