// tessel plan CONFIG --workers N [--memory-per-rank SIZE] [--hosts H --bandwidth B --latency L]
// [--json], or tessel plan --gpt SIZE --workers N ...: every layout's predicted memory and step
// time (tessel/train/plan.h, plan_scale.h), ranked.
#include "tessel/train/plan.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command_line.h"
#include "plan_command.h"
#include "tessel/comm/types.h"
#include "tessel/config/config.h"
#include "tessel/core/error.h"
#include "tessel/train/plan_scale.h"

namespace {

struct PlanArgs {
  std::string config_path, gpt, memory, bandwidth, host_bandwidth, cache_dir;
  std::vector<std::string> overrides;
  tessel::train::PlanOptions options;
  tessel::train::ScaleOptions scale;
  bool json = false;
};

int64_t bytes_of(const std::string& text) {
  return text.empty() ? 0 : static_cast<int64_t>(tessel::comm::parse_bytes(text));
}

int print(const std::vector<tessel::train::Candidate>& plan,
          const tessel::train::PlanOptions& shown, bool json) {
  if (json)
    std::printf("%s\n", tessel::train::plan_json(plan, shown).dump(2).c_str());
  else
    std::printf("%s", tessel::train::plan_table(plan, shown).c_str());
  return 0;
}

int run_plan(PlanArgs& a) {
  using namespace tessel::train;
  a.options.memory_per_rank = bytes_of(a.memory);
  a.options.bandwidth = static_cast<double>(bytes_of(a.bandwidth));
  if (!a.gpt.empty()) {  // on paper
    if (!a.config_path.empty())
      throw tessel::InvalidArgument("plan: give a CONFIG or --gpt SIZE, not both");
    ScaleOptions& s = a.scale;
    s.workers = a.options.workers;
    s.memory_per_rank = a.options.memory_per_rank;
    if (a.options.bandwidth > 0) s.bandwidth = a.options.bandwidth;
    if (a.options.latency > 0) s.latency = a.options.latency;
    if (!a.host_bandwidth.empty())
      s.host_bandwidth = static_cast<double>(bytes_of(a.host_bandwidth));
    PlanOptions shown = a.options;
    shown.hosts = std::max(1, s.workers / s.ranks_per_host);
    return print(plan_gpt(gpt_preset(a.gpt), s), shown, a.json);
  }
  if (a.config_path.empty())
    throw tessel::InvalidArgument(
        "plan: which model? give a CONFIG (e.g. examples/char_gpt.toml) or --gpt SIZE");
  const Config config = load_config(a.config_path, a.overrides);
  check_options(a.options);  // before the calibration runs
  const Calibration cal =
      calibrate(config, a.cache_dir.empty() ? default_cache_dir() : a.cache_dir);
  return print(plan_layouts(config, a.options, cal), a.options, a.json);
}

}  // namespace

InferCommand add_plan(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Predict memory per rank and step time of every layout of N ranks, ranked by samples/s: "
      "tessel plan CONFIG --workers N [--memory-per-rank SIZE] [--hosts H --bandwidth B "
      "--latency L] [--json], or tessel plan --gpt SIZE --workers N (docs/planning.md)");
  cmd->add_option("config", a->config_path, "Config file (TOML), e.g. examples/char_gpt.toml");
  cmd->add_option("--workers", a->options.workers, "Ranks to lay out")
      ->required()
      ->check(tessel::cli::at_least(1, "ranks"));
  cmd->add_option("--memory-per-rank", a->memory,
                  "Memory each rank may hold, e.g. 512MiB or 80GiB (default: no cap)");
  cmd->add_option("--hosts", a->options.hosts, "Hosts the ranks are spread over (default 1)")
      ->check(tessel::cli::at_least(1, "hosts"));
  cmd->add_option("--bandwidth", a->bandwidth,
                  "Bytes/s between hosts, e.g. 12.5GB (default: measured here; --gpt: 25GB)");
  cmd->add_option("--latency", a->options.latency,
                  "Seconds per message between hosts, e.g. 5e-6 (--gpt default 5e-6)");
  cmd->add_flag("--json", a->json, "Print JSON instead of the table");
  cmd->add_option("--set", a->overrides, "Override a config key: section.key=value (repeatable)");
  cmd->add_option("--cache-dir", a->cache_dir,
                  "Where calibrations are kept (default ~/.cache/tessel/plan)");
  cmd->add_option("--gpt", a->gpt, "Plan a GPT on paper instead: 1.5b, 2.7b, 6.7b, 13b, 175b");
  cmd->add_option("--batch", a->scale.global_batch, "--gpt: sequences per step (default 512)");
  cmd->add_option("--micro-batch", a->scale.micro_batch,
                  "--gpt: sequences per micro-batch (default 1)");
  cmd->add_option("--flops", a->scale.flops_per_rank,
                  "--gpt: sustained FLOP/s per rank (default 150e12)");
  cmd->add_option("--ranks-per-host", a->scale.ranks_per_host,
                  "--gpt: ranks per host; tensor parallelism stays within one (default 8)");
  cmd->add_option("--host-bandwidth", a->host_bandwidth,
                  "--gpt: bytes/s within a host (default 150GB)");
  cmd->footer(
      "Memory is the fullest rank's by ledger category; time is the slowest rank's step split "
      "into compute, exposed communication and pipeline bubble. The first run on a config "
      "calibrates this machine (under 30 s) and caches it.");
  return {cmd, [a] { return run_plan(*a); }};
}
