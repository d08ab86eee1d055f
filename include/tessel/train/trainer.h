// Trainer: the single training loop every layout shares. It owns the model, the optimizer, the
// data loaders and the run folder; it holds no communication: a parallel::Strategy, built from
// the world communicator it is given, hooks it at fixed points (after each block's backward,
// before and after the step). With several ranks every rank runs its own Trainer; rank 0
// alone prints and writes the run folder. One run: optional resume from a checkpoint, epochs of steps
// (forward, loss, backward, clip, step), test-set evaluation each epoch, metrics JSONL,
// checkpoints, and summary.json at the end. A layout that is not lockstep (strategy.h) trains
// worker batches it claims at each worker's pace instead, and the ranks meet at epoch ends.
//
// Run folder (default runs/<config name>/): config.toml (resolved), metrics.jsonl,
// checkpoints/ (see ckpt/checkpoint.h), summary.json.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tessel/data/loader.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/model.h"
#include "tessel/optim/optimizer.h"
#include "tessel/parallel/strategy.h"
#include "tessel/train/config.h"

namespace tessel::train {

struct RunOptions {
  std::string run_dir;      // empty: runs/<config name>
  std::string resume;       // run folder or checkpoint folder to continue from; empty: fresh
  int64_t stop_after = 0;   // > 0: stop after this many steps of this invocation (checkpointed)
  bool progress = true;     // print progress (a live line on a terminal, plain lines otherwise)
  // Set from another thread (e.g. a SIGINT handler) to stop at the next step boundary with a
  // checkpoint. May be null.
  const std::atomic<bool>* interrupt = nullptr;
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  int64_t samples = 0;
};

class Trainer {
 public:
  // world: this rank's communicator (null: one worker). Must outlive the Trainer.
  // data: datasets already loaded (e.g. shared by the rank threads of one process; datasets
  // are immutable); null: load them from config.data.
  Trainer(Config config, RunOptions options, comm::Communicator* world = nullptr,
          const data::Splits* data = nullptr);
  ~Trainer();

  // Trains to the end (or until stop_after / interrupt) and returns summary.json's contents.
  nlohmann::json run();
  // Forward-only pass over a whole dataset in order, sharded across the ranks (collective).
  EvalResult evaluate(const data::Dataset& dataset);
  // One optimizer step over `batches` (train.accumulate micro-batches, this rank's slices):
  // forward, loss, backward, gradient reduction, clip, step. Adds this rank's loss x rows and
  // correct count to `sums`; returns this rank's mean loss.
  float step(const std::vector<data::Batch>& batches, EvalResult& sums);
  // Loads the weights (only) of a checkpoint folder or run folder into the model.
  void load_weights(const std::string& checkpoint_path);

  nn::Model& model() { return *model_; }
  const Config& config() const { return config_; }
  const data::Splits& datasets() const { return data_; }
  const std::string& run_dir() const { return run_dir_; }
  parallel::Strategy& strategy() { return *strategy_; }

 private:
  struct State;  // position in training: step, epoch, batch in epoch, running sums
  void save(const State& state);
  void restore(const std::string& path, State& state);
  void log_metrics(const nlohmann::json& record);
  EvalResult global_mean(const EvalResult& local_sums);
  nlohmann::json rank_metrics(double train_seconds);
  float backward_piece(const Tensor& x, const Tensor& y, int64_t first_sample, double weight,
                       bool sync, EvalResult& sums);
  bool train_claimed_epoch(State& s, double& epoch_train_seconds, double& last_plain_line,
                           bool tty);
  void report_progress(int64_t epoch, int64_t steps, const EvalResult& m, double sps,
                       double samples_left, bool tty, double& last_plain_line);

  Config config_;
  RunOptions options_;
  std::string run_dir_;
  data::Splits data_;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<parallel::Strategy> strategy_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<data::DataLoader> loader_;
  nn::CrossEntropyLoss loss_;
  int64_t total_steps_ = 0;
  float base_lr_ = 0;
  int64_t step_ = 0;
  int prefetch_ = 0;  // train.prefetch resolved for this host (resolve_prefetch)
  // Layouts that are not lockstep (strategy.h) train claimed worker batches of batch_rows_
  // rows: claim_budget_ of them in the run (epochs, or train.max_steps x workers), of which
  // batches_done_ (every worker's, agreed at epoch ends) are done, start_batches_ before this
  // invocation. Lockstep: batch_rows_ = train.batch.
  bool lockstep_ = true;
  int64_t batch_rows_ = 0;
  int64_t claim_budget_ = 0, batches_done_ = 0, start_batches_ = 0;
};

}  // namespace tessel::train
