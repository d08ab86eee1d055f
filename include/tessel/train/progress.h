// Progress: what a run tells the person watching it and what it leaves in the run folder's
// metrics.jsonl (and, with metrics.tensorboard, TensorBoard event files of the same values).
// Rank 0 prints and writes; every other rank's Progress is silent. On a terminal one line is
// updated in place (after every log point, and between them at most 4 times a second for the
// step count and ETA); otherwise (a pipe, a file, under mpirun) a plain line every
// train.log_every steps. rank_report() turns every rank's typed measurements
// (parallel::RankStats, one all-gather) into the per-rank part of epoch records and
// summary.json: time split, load balance, stragglers, memory per category, and the layout's
// figures.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tessel/config/config.h"
#include "tessel/parallel/balance.h"
#include "tessel/parallel/engine.h"
#include "tessel/train/evaluator.h"

namespace tessel::train {

class TensorBoardWriter;

// A rank that computes persistently slower than the ranks doing the same work (its busy time
// per step, outside communication waits, against the median of its peers).
struct Straggler {
  int rank = -1;
  double busy_s_per_step = 0, peers_median_s = 0;
  double slowdown() const { return busy_s_per_step / peers_median_s; }
};

// The slowest rank of `ranks` if it is busier per step than kStragglerSlowdown x the median of
// the ranks that do the same work (the same pipeline stage); none otherwise.
constexpr double kStragglerSlowdown = 1.2;
std::optional<Straggler> find_straggler(const std::vector<parallel::RankStats>& ranks);

// One train record: where the run stands and the means of the epoch so far.
struct TrainPoint {
  int64_t epoch = 0, step = 0;
  EvalResult metrics;  // running means over the epoch so far
  EvalResult window;   // means over the steps since the last record
  double lr = 0, samples_per_second = 0;
  // Every rank's measurements since the last record (lockstep layouts); null: rank 0's view.
  const std::vector<parallel::RankStats>* ranks = nullptr;
  const parallel::ShardDeal* deal = nullptr;  // ddp.balance's deal of the last step; null: off
};

class Progress {
 public:
  // main: rank 0 (the only one that prints and writes); enabled: print at all; live: a line
  // updated in place when stderr is a terminal (false under mpirun).
  Progress(const Config& config, bool main, bool enabled, bool live, std::string run_dir);
  ~Progress();

  // Appends a record to metrics.jsonl (rank 0) and its numbers to the TensorBoard file. fresh:
  // truncate metrics.jsonl first.
  void log(const nlohmann::json& record);
  void start_log(bool fresh);
  void info(const std::string& line);  // a line for the person (rank 0, when enabled)
  // Training starts at `step` of total_steps; epochs are steps_per_epoch steps; the
  // evaluation after each epoch costs about eval_steps training steps (a guess until one ran).
  void start(int64_t step, int64_t total_steps, int64_t steps_per_epoch, double eval_steps);
  // After every step (rank 0): a live line follows the step count.
  void tick(int64_t step);
  // A train record and a progress line (live, or plain every train.log_every steps).
  void train_line(const TrainPoint& p);
  // The end of an epoch: closes a live line and prints the epoch's results (thinned to one
  // line every 2 s for runs of many short epochs). seconds: the epoch's wall time.
  void epoch_line(int64_t epoch, const EvalResult& train, const EvalResult* test,
                  const double* train_eval_accuracy, double seconds);
  // The time an epoch end took (evaluation, report, checkpoint), for the ETA.
  void epoch_end_took(double seconds);
  void end_live_line();

 private:
  static constexpr int kPersistWindows = 3;
  double eta_seconds(int64_t step) const;
  void track_straggler(const std::vector<parallel::RankStats>& ranks);
  void draw(int64_t step);

  const Config& config_;
  bool main_, enabled_, tty_;
  std::string run_dir_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  double last_epoch_line_ = 0, last_draw_ = 0;
  std::string live_tail_;  // the last record's figures, redrawn with each step count
  // ETA: training started at start_step_ at start_time_; epoch ends so far took end_seconds_.
  int64_t start_step_ = 0, total_steps_ = 0, steps_per_epoch_ = 1;
  double start_time_ = 0, end_seconds_ = 0, eval_steps_ = 0;
  int64_t epoch_ends_ = 0, last_epoch_ = 0;
  // Stragglers: the slowest rank of consecutive records and how many in a row it was slow.
  std::optional<Straggler> straggler_;
  int slow_rank_ = -1, slow_windows_ = 0;
};

// The per-rank report of an epoch (collective inputs already gathered): every rank's times,
// memory and bytes, load balance, and the layout's own figures (pipeline stages, parameter
// servers, ZeRO).
// Gradient compression over these ranks' records (null when nothing was compressed): bytes
// per step and rank as sent (the transport's counter), by the codecs' formula and as f32
// all-reduces; the ratios f32 / sent and f32 / formula; encode, decode and exposed seconds.
nlohmann::json compress_report(const std::vector<parallel::RankStats>& ranks);
// ddp.balance (summary.json, train records): the deal, the smoothed seconds per micro-shard by
// rank, how many times the deal changed, the step's predicted speed-up over an even deal, and
// the straggler by seconds per shard (rank, slowdown, the share of its cost recovered) or null.
nlohmann::json balance_report(const parallel::ShardDeal& deal);
nlohmann::json rank_report(const std::vector<parallel::RankStats>& ranks, parallel::Engine& engine,
                           const Config& config);

}  // namespace tessel::train
