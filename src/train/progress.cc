#include "tessel/train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tessel/core/clock.h"
#include "tessel/core/log.h"
#include "tessel/train/summary_text.h"
#include "tessel/train/tensorboard.h"

namespace tessel::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (seconds < 9.95) return fmt("%.1fs", seconds);  // short runs: tenths, to judge the estimate
  if (s >= 3600) return fmt("%ldh%02ldm", long(s / 3600), long(s / 60 % 60));
  return fmt("%ldm%02lds", long(s / 60), long(s % 60));
}

// What the deal gains: the predicted step compute time of an even deal over this one's.
double balance_speedup(const parallel::ShardDeal& deal) {
  return deal.predicted_s() > 0 ? deal.even_s() / deal.predicted_s() : 1.0;
}

// The straggler by the deal's smoothed speeds: the rank slower per shard than
// kStragglerSlowdown x the median of the others (the slowest such), with how much slower and
// how much of its cost the deal recovers (the step time an even deal loses to it over the
// ideal split's, won back); null when none is.
json shard_straggler(const parallel::ShardDeal& deal) {
  const std::vector<double>& t = deal.seconds_per_shard();
  int slowest = -1;
  double slowdown = kStragglerSlowdown;
  for (size_t r = 0; r < t.size() && t.size() > 1; ++r) {
    std::vector<double> peers;
    for (size_t q = 0; q < t.size(); ++q)
      if (q != r) peers.push_back(t[q]);
    const double median = parallel::median(peers);
    if (median > 0 && t[r] / median > slowdown) slowdown = t[r] / median, slowest = int(r);
  }
  const double cost = deal.even_s() - deal.ideal_s();
  if (slowest < 0 || !(cost > 0)) return nullptr;
  return {{"rank", slowest},
          {"slowdown_per_shard", slowdown},
          {"recovered", (deal.even_s() - deal.predicted_s()) / cost}};
}

}  // namespace

Progress::Progress(const Config& config, bool main, bool enabled, bool live, std::string run_dir)
    : config_(config),
      main_(main),
      enabled_(main && enabled),
      tty_(main && enabled && live && isatty(fileno(stderr))),
      run_dir_(std::move(run_dir)) {}

Progress::~Progress() = default;

void Progress::start_log(bool fresh) {
  if (!main_) return;
  fs::create_directories(run_dir_);
  if (fresh) {
    std::ofstream(fs::path(run_dir_) / "metrics.jsonl", std::ios::trunc);
    std::error_code ec;  // an earlier run's event files (a resumed run adds a file)
    fs::remove_all(fs::path(run_dir_) / "tensorboard", ec);
  }
  if (config_.observe.tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(run_dir_);
}

void Progress::log(const json& record) {
  if (!main_) return;
  std::ofstream out(fs::path(run_dir_) / "metrics.jsonl", std::ios::app);
  out << record.dump() << "\n";
  if (tensorboard_) tensorboard_->add_record(record);
}

void Progress::info(const std::string& line) {
  if (enabled_) log_info(line);
}

void Progress::start(int64_t step, int64_t total_steps, int64_t steps_per_epoch,
                     double eval_steps) {
  start_step_ = step;
  total_steps_ = total_steps;
  steps_per_epoch_ = std::max<int64_t>(steps_per_epoch, 1);
  eval_steps_ = eval_steps;
  start_time_ = now_seconds();
  last_epoch_ = step / steps_per_epoch_;
}

// The steps left at the pace of the steps so far, plus the epoch ends left at the mean cost of
// those so far (before the first, eval_steps training steps each).
double Progress::eta_seconds(int64_t step) const {
  const int64_t done = step - start_step_;
  if (done <= 0) return NAN;
  const double per_step = (now_seconds() - start_time_ - end_seconds_) / static_cast<double>(done);
  const int64_t ends_left = (total_steps_ + steps_per_epoch_ - 1) / steps_per_epoch_ -
                            start_step_ / steps_per_epoch_ - epoch_ends_;
  const double per_end =
      epoch_ends_ > 0 ? end_seconds_ / static_cast<double>(epoch_ends_) : eval_steps_ * per_step;
  return static_cast<double>(total_steps_ - step) * per_step +
         static_cast<double>(std::max<int64_t>(ends_left, 0)) * per_end;
}

void Progress::epoch_end_took(double seconds) {
  end_seconds_ += seconds;
  ++epoch_ends_;
}

void Progress::track_straggler(const std::vector<parallel::RankStats>& ranks) {
  const std::optional<Straggler> s = find_straggler(ranks);
  if (s && s->rank == slow_rank_) {
    ++slow_windows_;
  } else {
    slow_rank_ = s ? s->rank : -1;
    slow_windows_ = s ? 1 : 0;
  }
  straggler_ = slow_windows_ >= kPersistWindows ? s : std::nullopt;
}

void Progress::draw(int64_t step) {
  const std::string line = fmt("epoch %ld/%ld step %ld/%ld ", long(last_epoch_ + 1),
                               long(config_.train.epochs), long(step), long(total_steps_)) +
                           live_tail_ + " ETA " + format_eta(eta_seconds(step));
  std::fprintf(stderr, tty_ ? "\r\033[K%s" : "%s\n", line.c_str());
  last_draw_ = now_seconds();
}

void Progress::tick(int64_t step) {
  if (tty_ && !live_tail_.empty() && now_seconds() - last_draw_ >= 0.25) draw(step);
}

void Progress::train_line(const TrainPoint& p) {
  json rec = {{"type", "train"},
              {"step", p.step},
              {"epoch", p.epoch + 1},
              {"epoch_loss", p.metrics.loss},
              {"epoch_accuracy", p.metrics.accuracy},
              {"loss", p.window.loss},
              {"accuracy", p.window.accuracy},
              {"lr", p.lr},
              {"samples_per_second", p.samples_per_second}};
  last_epoch_ = p.epoch;
  live_tail_ = fmt("loss %.4f acc %.2f%% %.0f samples/s", p.metrics.loss,
                   100.0 * p.metrics.accuracy, p.samples_per_second);
  if (p.ranks && !p.ranks->empty()) {
    double step_s = 0, exposed_s = 0, peak = 0;
    int busiest = 0;
    for (size_t r = 0; r < p.ranks->size(); ++r) {
      const parallel::RankStats& s = (*p.ranks)[r];
      step_s += s.step_s;
      exposed_s += s.comm_exposed_s;
      if (s.mem_peak_total > peak) peak = s.mem_peak_total, busiest = static_cast<int>(r);
    }
    const double share = step_s > 0 ? exposed_s / step_s : 0;
    rec["comm_exposed_share"] = share;
    if (json c = compress_report(*p.ranks); !c.is_null()) rec["compress"] = c;
    rec["memory_peak_bytes_max"] = peak;
    rec["memory_peak_rank"] = busiest;
    track_straggler(*p.ranks);
    live_tail_ +=
        fmt(" comm %.0f%% mem %.1f MiB (rank %d)", 100.0 * share, peak / (1 << 20), busiest);
  }
  if (straggler_) {
    rec["straggler_rank"] = straggler_->rank;
    if (!p.deal)  // a deal's own text names the straggler by its time per shard
      live_tail_ += fmt(" straggler rank %d (x%.2f)", straggler_->rank, straggler_->slowdown());
  }
  if (p.deal) {
    rec["shards_per_rank"] = p.deal->counts();
    rec["seconds_per_shard"] = p.deal->seconds_per_shard();
    const json balance = balance_report(*p.deal);
    rec["balance_speedup"] = balance["speedup_vs_even"];
    if (!balance["straggler"].is_null())
      rec["balance_recovered"] = balance["straggler"]["recovered"];
    live_tail_.append(" ").append(balance_text(balance));
  }
  log(rec);
  if (enabled_) draw(p.step);
}

void Progress::end_live_line() {
  if (tty_ && last_draw_ > 0) std::fprintf(stderr, "\n");
  last_draw_ = 0;
}

void Progress::epoch_line(int64_t epoch, const EvalResult& train, const EvalResult* test,
                          const double* train_eval_accuracy, double seconds) {
  end_live_line();
  last_epoch_ = epoch + 1;
  const int64_t epochs = config_.train.epochs;
  if (!enabled_ ||
      !(epochs <= 20 || epoch + 1 == epochs || now_seconds() - last_epoch_line_ >= 2.0))
    return;
  last_epoch_line_ = now_seconds();
  std::string line = fmt("epoch %ld/%ld: train loss %.4f acc %.2f%%", long(epoch + 1), long(epochs),
                         train.loss, 100.0 * train.accuracy);
  if (test) line += fmt(", test loss %.4f acc %.2f%%", test->loss, 100.0 * test->accuracy);
  if (train_eval_accuracy) line += fmt(", train-set eval acc %.2f%%", 100.0 * *train_eval_accuracy);
  log_info(line, fmt(" (%.1f s)", seconds));
}

std::optional<Straggler> find_straggler(const std::vector<parallel::RankStats>& ranks) {
  std::optional<Straggler> worst;
  auto busy = [](const parallel::RankStats& s) {
    return (s.step_s - s.comm_exposed_s) / std::max(s.steps, 1.0);
  };
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::vector<double> peers;  // the other ranks of the same stage
    for (size_t q = 0; q < ranks.size(); ++q)
      if (q != r && ranks[q].stage == ranks[r].stage) peers.push_back(busy(ranks[q]));
    if (peers.empty()) continue;
    const double median = parallel::median(peers);
    const Straggler s{static_cast<int>(r), busy(ranks[r]), median};
    if (median > 0 && s.slowdown() > kStragglerSlowdown &&
        (!worst || s.slowdown() > worst->slowdown()))
      worst = s;
  }
  return worst;
}

namespace {

json memory_json(const parallel::RankStats& s) {
  json held = json::object(), peak = json::object();
  for (int k = 0; k < kMemCategories; ++k) {
    held[mem_category_name(MemCategory(k))] = static_cast<int64_t>(s.mem[static_cast<size_t>(k)]);
    peak[mem_category_name(MemCategory(k))] =
        static_cast<int64_t>(s.mem_peak[static_cast<size_t>(k)]);
  }
  return {{"bytes", held},
          {"peak_bytes", peak},
          {"peak_total_bytes", static_cast<int64_t>(s.mem_peak_total)}};
}

}  // namespace

json compress_report(const std::vector<parallel::RankStats>& ranks) {
  double steps = 0, sent = 0, formula = 0, f32 = 0, encode = 0, decode = 0, exposed = 0;
  for (const parallel::RankStats& s : ranks) {
    steps += s.steps, sent += s.compress_bytes, formula += s.compress_formula_bytes;
    f32 += s.compress_f32_bytes, encode += s.encode_s, decode += s.decode_s;
    exposed += s.comm_exposed_s;
  }
  if (f32 == 0 || steps == 0) return nullptr;
  return {{"bytes_per_step", sent / steps},
          {"formula_bytes_per_step", formula / steps},
          {"f32_bytes_per_step", f32 / steps},
          {"ratio", sent > 0 ? f32 / sent : 0.0},
          {"ratio_formula", formula > 0 ? f32 / formula : 0.0},
          {"encode_seconds_per_step", encode / steps},
          {"decode_seconds_per_step", decode / steps},
          {"comm_exposed_seconds_per_step", exposed / steps}};
}

json balance_report(const parallel::ShardDeal& deal) {
  json out = deal.save();
  out["speedup_vs_even"] = balance_speedup(deal);
  out["straggler"] = shard_straggler(deal);
  return out;
}

json rank_report(const std::vector<parallel::RankStats>& ranks, parallel::Engine& engine,
                 const Config& config) {
  // Load balance over the time each rank computes (waiting for the others is communication).
  double max_compute = 0, sum_compute = 0;
  int slowest = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const double compute = ranks[r].step_s - ranks[r].comm_exposed_s;
    sum_compute += compute;
    if (compute > max_compute) max_compute = compute, slowest = static_cast<int>(r);
  }
  json per_rank = json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const parallel::RankStats& s = ranks[r];
    const double compute = s.step_s - s.comm_exposed_s;
    per_rank.push_back({{"rank", r},
                        {"step_seconds", s.step_s},
                        {"steps", s.steps},
                        {"compute_seconds", compute},
                        {"optimizer_seconds", s.optimizer_s},
                        {"comm_exposed_seconds", s.comm_exposed_s},
                        {"comm_overlapped_seconds", s.comm_overlapped_s},
                        // Everything the rank sent: gradients and parameters, pipeline
                        // activations and gradients (sent_bytes), tensor-parallel collectives.
                        {"comm_bytes", s.comm_bytes + s.sent_bytes + s.tp_bytes},
                        // Of them, the all-reduces across zero.shard_size's shard groups (e.g.
                        // between hosts); the rest stayed inside the rank's group.
                        {"comm_bytes_across_groups", s.comm_across_bytes},
                        {"tp_comm_seconds", s.tp_comm_s},
                        {"tp_bytes", s.tp_bytes},
                        // Waiting for the slowest rank shows up as exposed communication time
                        // on the faster ranks: estimated as the compute gap to the slowest.
                        {"wait_for_slowest_seconds", max_compute - compute},
                        {"memory", memory_json(s)}});
  }
  const std::optional<Straggler> straggler = find_straggler(ranks);
  json out = {
      {"per_rank", per_rank},
      {"load_balance_max_over_mean",
       sum_compute > 0 ? max_compute * static_cast<double>(ranks.size()) / sum_compute : 1.0},
      {"slowest_rank", slowest},
      {"straggler", straggler ? json{{"rank", straggler->rank},
                                     {"busy_seconds_per_step", straggler->busy_s_per_step},
                                     {"peers_median_seconds_per_step", straggler->peers_median_s},
                                     {"slowdown", straggler->slowdown()}}
                              : json(nullptr)},
      {"zero_stage", config.parallel.zero_stage},
      {"zero_shard_size", config.parallel.zero_shard_size}};
  out.update(engine.report(ranks));  // the parts' own figures (pipeline, parameter servers)
  return out;
}

}  // namespace tessel::train
