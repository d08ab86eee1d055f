// Progress: what a run tells the person watching it and what it leaves in the run folder's
// metrics.jsonl. Rank 0 prints (a line updated in place on a terminal, plain lines otherwise)
// and writes; every other rank's Progress is silent. rank_report() turns every rank's typed
// measurements (parallel::RankStats, one all-gather) into the per-rank part of epoch records
// and summary.json: time split, load balance, memory per category, and the layout's figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/parallel/engine.h"
#include "tessel/train/config.h"
#include "tessel/train/evaluator.h"

namespace tessel::train {

class Progress {
 public:
  // main: rank 0 (the only one that prints and writes); enabled: print at all.
  Progress(const Config& config, bool main, bool enabled, std::string run_dir);

  // Appends a record to metrics.jsonl (rank 0). fresh: truncate the file first.
  void log(const nlohmann::json& record);
  void start_log(bool fresh);
  void info(const std::string& line);  // a line for the person (rank 0, when enabled)
  // A train record after `steps` of total_steps, and a progress line: live on a terminal,
  // plain every train.log_every steps otherwise. samples_left gives the ETA.
  void train_line(int64_t epoch, int64_t steps, int64_t total_steps, const EvalResult& m,
                  double lr, double samples_per_second, double samples_left);
  // The end of an epoch: closes a live line and prints the epoch's results (thinned to one
  // line every 2 s for runs of many short epochs).
  void epoch_line(int64_t epoch, const EvalResult& train, const EvalResult* test,
                  const double* train_eval_accuracy, double seconds);
  void end_live_line();

 private:
  const Config& config_;
  bool main_, enabled_, tty_;
  std::string run_dir_;
  double last_epoch_line_ = 0;
};

// The per-rank report of an epoch (collective inputs already gathered): every rank's times,
// memory and bytes, load balance, and the layout's own figures (pipeline stages, parameter
// servers, ZeRO).
nlohmann::json rank_report(const std::vector<parallel::RankStats>& ranks, parallel::Engine& engine,
                           const nn::Model& model, const Config& config);

}  // namespace tessel::train
