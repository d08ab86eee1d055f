// tessel predict CONFIG --checkpoint RUN --input PATH --output PATH [--workers N | under mpirun]
#include "tessel/infer/predict.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "infer_commands.h"
#include "tessel/config/config.h"

namespace {

struct PredictArgs {
  std::string config_path, backend;
  std::vector<std::string> overrides;
  tessel::infer::PredictOptions options;
  int workers = 0;
};

int run_predict(PredictArgs& a) {
  if (a.workers > 0) a.overrides.push_back("runtime.workers=" + std::to_string(a.workers));
  if (!a.backend.empty()) a.overrides.push_back("runtime.backend=" + a.backend);
  const nlohmann::json summary =
      tessel::infer::predict(tessel::train::load_config(a.config_path, a.overrides), a.options);
  if (!summary.is_null()) std::printf("%s\n", summary.dump(2).c_str());
  return 0;
}

}  // namespace

void restart_predict_on_huge_pages(char** argv) {
  if (!argv[0] || !argv[1] || std::strcmp(argv[1], "predict") != 0) return;
  const char* had = std::getenv("GLIBC_TUNABLES");
  if (had && std::strstr(had, "glibc.malloc.hugetlb")) return;  // set already (by us or the user)
  const std::string tunables =
      had && *had ? std::string(had) + ":glibc.malloc.hugetlb=1" : "glibc.malloc.hugetlb=1";
  setenv("GLIBC_TUNABLES", tunables.c_str(), 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then go on as we are
}

InferCommand add_predict(CLI::App& app) {
  auto a = std::make_shared<PredictArgs>();
  CLI::App* cmd = app.add_subcommand(
      "predict", "Run a checkpoint's model over an input file on many workers, output in order");
  cmd->add_option("config", a->config_path, "Config file the checkpoint was trained with")
      ->required();
  cmd->add_option("--checkpoint", a->options.checkpoint, "Run folder or checkpoint folder")
      ->required();
  cmd->add_option(
         "--input", a->options.input,
         "IDX images (*-ubyte[.gz], *.idx), a .npy array, a .csv table, or .txt prompts (gpt)")
      ->required();
  cmd->add_option("--output", a->options.output, "Output file: .jsonl or .csv")->required();
  cmd->add_flag("--resume", a->options.resume,
                "Continue a killed job after the chunks its OUTPUT.progress file commits");
  cmd->add_option("--set", a->overrides, "Override a config key: section.key=value (repeatable)");
  cmd->add_option("--workers", a->workers, "Ranks as threads of this process (runtime.workers)");
  cmd->add_option("--backend", a->backend, "threads or mpi (runtime.backend; default: auto)");
  return {cmd, [a] { return run_predict(*a); }};
}
