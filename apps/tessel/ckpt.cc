// `tessel ckpt export` (plain safetensors, or a GPT as Hugging Face's GPT-2 folder) and `tessel
// ckpt import` (a GPT-2 folder into a run folder); docs/checkpointing.md.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "infer_commands.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/hf.h"
#include "tessel/config/config.h"
#include "tessel/core/error.h"

namespace {

namespace fs = std::filesystem;

struct CkptArgs {
  std::string checkpoint, out, format = "safetensors", hf_dir;
};

// model.heads of the run the checkpoint at `path` belongs to (RUN/config.toml).
int64_t run_heads(const std::string& path) {
  const fs::path run =
      fs::path(tessel::ckpt::resolve_checkpoint_dir(path)).parent_path().parent_path();
  const fs::path config = run / "config.toml";
  if (!fs::exists(config))
    throw tessel::IoError(tessel::str("hf export: ", config.string(),
                                      " is missing; the GPT-2 config needs the run's model.heads, "
                                      "so export from the run folder the checkpoint belongs to"));
  return tessel::train::load_config(config.string()).model.heads;
}

int run_export(const CkptArgs& a) {
  if (a.format == "hf")
    tessel::ckpt::export_hf(a.checkpoint, run_heads(a.checkpoint), a.out);
  else
    tessel::ckpt::export_model(a.checkpoint, a.out);
  std::printf("wrote %s\n", a.out.c_str());
  return 0;
}

// The run's config: the imported GPT's sizes, which predict and serve read.
std::string imported_config(const tessel::ckpt::GptSizes& s, const std::string& hf_dir) {
  return tessel::str("# Imported by tessel ckpt import from ", fs::absolute(hf_dir).string(),
                     " (a GPT-2 model).\n# For predict and serve (eval: set data.kind and "
                     "data.path); checkpoints/ holds the parameters.\n[model]\nkind = \"gpt\"\n"
                     "layers = ",
                     s.layers, "\nheads = ", s.heads, "\nembed = ", s.embed,
                     "\n\n[data]\nkind = \"tokens\"\ncontext = ", s.context, "\n");
}

int run_import(const CkptArgs& a) {
  const tessel::ckpt::GptSizes s = tessel::ckpt::import_hf(a.hf_dir, a.out);
  const std::string config = (fs::path(a.out) / "config.toml").string();
  tessel::ckpt::write_file_atomic(config, imported_config(s, a.hf_dir));
  tessel::train::load_config(config);  // what predict will read must load
  std::printf(
      "wrote %s: a gpt of %lld layers, %lld heads, width %lld, context %lld, "
      "vocabulary %lld; e.g. tessel predict %s --checkpoint %s --input prompts.txt "
      "--output out.jsonl\n",
      a.out.c_str(), static_cast<long long>(s.layers), static_cast<long long>(s.heads),
      static_cast<long long>(s.embed), static_cast<long long>(s.context),
      static_cast<long long>(s.vocab), config.c_str(), a.out.c_str());
  return 0;
}

}  // namespace

CkptCommands add_ckpt_commands(CLI::App& app) {
  auto a = std::make_shared<CkptArgs>();
  CLI::App* ckpt = app.add_subcommand("ckpt", "Checkpoint tools: export, import");
  ckpt->require_subcommand(1);
  CLI::App* exp = ckpt->add_subcommand(
      "export",
      "Write a checkpoint's parameters as one plain safetensors file (PyTorch loads it), or a "
      "GPT as a Hugging Face GPT-2 folder (--format hf)");
  exp->add_option("checkpoint", a->checkpoint, "Run folder or checkpoint folder")->required();
  exp->add_option("out", a->out,
                  "Output file, e.g. model.safetensors; with --format hf an output folder")
      ->required();
  exp->add_option("--format", a->format,
                  "safetensors: tessel's names; hf: GPT-2's model.safetensors, config.json and "
                  "tokenizer (vocab.json, merges.txt) that transformers loads")
      ->check(CLI::IsMember({"safetensors", "hf"}))
      ->capture_default_str();
  CLI::App* imp = ckpt->add_subcommand(
      "import",
      "Read a Hugging Face GPT-2 folder (config.json, model.safetensors, vocab.json + "
      "merges.txt) into a new run folder for predict and serve");
  imp->add_option("hf_dir", a->hf_dir, "Folder that save_pretrained wrote")->required();
  imp->add_option("out_run", a->out, "New run folder: config.toml and checkpoints/")->required();
  return {{exp, [a] { return run_export(*a); }}, {imp, [a] { return run_import(*a); }}};
}
