#include "tessel/train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tessel/core/clock.h"
#include "tessel/core/log.h"
#include "tessel/parallel/parameter_server.h"
#include "tessel/parallel/pipeline.h"

namespace tessel::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", long(s / 3600), long(s / 60 % 60));
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", long(s / 60), long(s % 60));
  return buf;
}

template <typename... Args>
std::string fmt(const char* f, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

}  // namespace

Progress::Progress(const Config& config, bool main, bool enabled, std::string run_dir)
    : config_(config),
      main_(main),
      enabled_(main && enabled),
      tty_(main && enabled && isatty(fileno(stderr))),
      run_dir_(std::move(run_dir)) {}

void Progress::start_log(bool fresh) {
  if (!main_) return;
  fs::create_directories(run_dir_);
  if (fresh) std::ofstream(fs::path(run_dir_) / "metrics.jsonl", std::ios::trunc);
}

void Progress::log(const json& record) {
  if (!main_) return;
  std::ofstream out(fs::path(run_dir_) / "metrics.jsonl", std::ios::app);
  out << record.dump() << "\n";
}

void Progress::info(const std::string& line) {
  if (enabled_) log_info(line);
}

void Progress::train_line(int64_t epoch, int64_t steps, int64_t total_steps, const EvalResult& m,
                          double lr, double sps, double samples_left) {
  log({{"type", "train"}, {"step", steps}, {"epoch", epoch + 1}, {"epoch_loss", m.loss},
       {"epoch_accuracy", m.accuracy}, {"lr", lr}, {"samples_per_second", sps}});
  if (!enabled_) return;
  const std::string line =
      fmt("epoch %ld/%ld step %ld/%ld loss %.4f acc %.2f%% %.0f samples/s ETA %s", long(epoch + 1),
          long(config_.train.epochs), long(steps), long(total_steps), m.loss, 100.0 * m.accuracy,
          sps, format_eta(samples_left / std::max(sps, 1e-9)).c_str());
  std::fprintf(stderr, tty_ ? "\r\033[K%s" : "%s\n", line.c_str());
}

void Progress::end_live_line() {
  if (tty_) std::fprintf(stderr, "\n");
}

void Progress::epoch_line(int64_t epoch, const EvalResult& train, const EvalResult* test,
                          const double* train_eval_accuracy, double seconds) {
  end_live_line();
  const int64_t epochs = config_.train.epochs;
  if (!enabled_ || !(epochs <= 20 || epoch + 1 == epochs || now_seconds() - last_epoch_line_ >= 2.0))
    return;
  last_epoch_line_ = now_seconds();
  std::string line = fmt("epoch %ld/%ld: train loss %.4f acc %.2f%%", long(epoch + 1), long(epochs),
                         train.loss, 100.0 * train.accuracy);
  if (test) line += fmt(", test loss %.4f acc %.2f%%", test->loss, 100.0 * test->accuracy);
  if (train_eval_accuracy) line += fmt(", train-set eval acc %.2f%%", 100.0 * *train_eval_accuracy);
  log_info(line, fmt(" (%.1f s)", seconds));
}

namespace {

json memory_json(const parallel::RankStats& s) {
  json held = json::object(), peak = json::object();
  for (int k = 0; k < kMemCategories; ++k) {
    held[mem_category_name(MemCategory(k))] = static_cast<int64_t>(s.mem[static_cast<size_t>(k)]);
    peak[mem_category_name(MemCategory(k))] = static_cast<int64_t>(s.mem_peak[static_cast<size_t>(k)]);
  }
  return {{"bytes", held}, {"peak_bytes", peak}, {"peak_total_bytes", static_cast<int64_t>(s.mem_peak_total)}};
}

json pipeline_json(const std::vector<parallel::RankStats>& ranks, parallel::Engine& engine,
                   const nn::Model& model, const Config& config) {
  const parallel::Layout& layout = engine.layout();
  json stages = json::array();
  double bubble_sum = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const parallel::RankStats& s = ranks[r];
    const double busy = s.forward_s + s.backward_s;
    const double bubble = s.schedule_s > 0 ? std::max(0.0, 1.0 - busy / s.schedule_s) : 0.0;
    bubble_sum += bubble;
    stages.push_back({{"rank", r},
                      {"stage", static_cast<int>(s.stage)},
                      {"replica", layout.coord(static_cast<int>(r)).dp},
                      {"forward_seconds", s.forward_s},
                      {"backward_seconds", s.backward_s},
                      {"send_seconds", s.send_s},
                      {"recv_wait_seconds", s.recv_wait_s},
                      {"idle_seconds", std::max(0.0, s.schedule_s - busy)},
                      {"schedule_seconds", s.schedule_s},
                      {"bubble_fraction", bubble},
                      {"peak_activation_bytes", s.mem_peak[static_cast<size_t>(MemCategory::kActivations)]},
                      {"peak_inflight_microbatches", static_cast<int>(s.peak_inflight)},
                      {"sent_bytes", s.sent_bytes}});
  }
  const double P = layout.pp, m = static_cast<double>(config.parallel.pp_microbatches);
  std::vector<std::vector<std::string>> blocks(static_cast<size_t>(layout.pp));
  const parallel::Partition& part = engine.pipeline()->partition();
  for (size_t c = 0; c < part.chunks(); ++c)
    for (size_t i = part.begin[c]; i < part.begin[c + 1]; ++i)
      blocks[static_cast<size_t>(part.stage[c])].push_back(model.block_name(i));
  return {{"pipeline_schedule", config.parallel.pp_schedule},
          {"pipeline_microbatches", config.parallel.pp_microbatches},
          {"pipeline_partition", config.parallel.pp_cuts.empty() ? config.parallel.pp_partition : "cuts"},
          {"pipeline_stage_blocks", blocks},
          {"pipeline_bubble_fraction_model", (P - 1) / (m + P - 1)},
          {"pipeline_bubble_fraction_measured", bubble_sum / static_cast<double>(ranks.size())},
          {"pipeline_stages", stages}};
}

}  // namespace

json rank_report(const std::vector<parallel::RankStats>& ranks, parallel::Engine& engine,
                 const nn::Model& model, const Config& config) {
  double max_t = 0, sum_t = 0, max_compute = 0;
  int slowest = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    sum_t += ranks[r].step_s;
    if (ranks[r].step_s > max_t) max_t = ranks[r].step_s, slowest = static_cast<int>(r);
    max_compute = std::max(max_compute, ranks[r].step_s - ranks[r].comm_exposed_s);
  }
  json per_rank = json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const parallel::RankStats& s = ranks[r];
    const double compute = s.step_s - s.comm_exposed_s;
    per_rank.push_back({{"rank", r}, {"step_seconds", s.step_s}, {"compute_seconds", compute},
                        {"optimizer_seconds", s.optimizer_s},
                        {"comm_exposed_seconds", s.comm_exposed_s},
                        {"comm_overlapped_seconds", s.comm_overlapped_s},
                        {"comm_bytes", s.comm_bytes},
                        {"tp_comm_seconds", s.tp_comm_s},
                        {"tp_bytes", s.tp_bytes},
                        // Waiting for the slowest rank shows up as exposed communication time
                        // on the faster ranks: estimated as the compute gap to the slowest.
                        {"wait_for_slowest_seconds", max_compute - compute},
                        {"memory", memory_json(s)}});
  }
  json out = {{"per_rank", per_rank},
              {"load_balance_max_over_mean",
               sum_t > 0 ? max_t * static_cast<double>(ranks.size()) / sum_t : 1.0},
              {"slowest_rank", slowest},
              {"zero_stage", config.parallel.zero_stage}};
  if (engine.pipeline()) out.update(pipeline_json(ranks, engine, model, config));
  if (engine.ps()) out.update(engine.ps()->report());
  return out;
}

}  // namespace tessel::train
