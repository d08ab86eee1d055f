// Trainer: the training loop every layout shares. It owns the model (its structure), the data
// loaders, the run folder and this rank's memory ledger; everything about how the work is cut
// across ranks is the parallel::Engine it builds from the world communicator it is given, which
// it calls at fixed points (a piece's forward and backward, the step). With several ranks every
// rank runs its own Trainer; rank 0 alone prints and writes the run folder's shared files.
// One run: optional resume from a checkpoint (checkpointer.h), epochs of steps, test-set
// evaluation each epoch (evaluator.h), metrics and progress (progress.h), checkpoints, and
// summary.json at the end. With a parameter server in async or ssp mode the workers train
// batches they claim at their own pace instead, and meet at epoch ends.
//
// Run folder (default runs/<config name>/): config.toml (resolved), metrics.jsonl,
// checkpoints/ (see ckpt/checkpoint.h), summary.json, run.json (run_folder.h); with train.trace
// trace.json (run_trace.h), with metrics.tensorboard tensorboard/ (tensorboard.h). A fresh run
// refuses a folder that holds a run unless told to overwrite it.
// Steps: the run trains train.epochs epochs or stops at train.max_steps, wherever that falls;
// the LR schedule always spans the epochs' steps, so a run stopped by train.max_steps and
// resumed with a larger one continues the same schedule from the same data position.
#pragma once

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tessel/config/config.h"
#include "tessel/data/loader.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/model.h"
#include "tessel/parallel/balance.h"
#include "tessel/parallel/engine.h"
#include "tessel/train/evaluator.h"

namespace tessel::train {

class Checkpointer;
class Progress;
class Snapshots;
class RunTrace;

struct RunOptions {
  std::string run_dir;     // empty: runs/<config name>
  std::string resume;      // run folder or checkpoint folder to continue from; empty: fresh
  int64_t stop_after = 0;  // > 0: stop after this many steps of this invocation (checkpointed)
  bool overwrite = false;  // a fresh run may clear a run folder that holds a run
  std::string command;     // the command line, recorded in run.json
  bool progress = true;    // print progress (a live line on a terminal, plain lines otherwise)
  // Set from another thread (e.g. a signal handler) to stop at the next step boundary with a
  // checkpoint. May be null.
  const std::atomic<bool>* interrupt = nullptr;
  // Ranks as threads (train/recovery.h): every rank adds its part of an in-memory snapshot
  // here every checkpoint.snapshot_steps steps and at every checkpoint; null: none.
  Snapshots* snapshots = nullptr;
  bool resume_snapshot = false;    // restore from snapshots' newest instead of `resume`
  std::vector<std::string> notes;  // said at the start (rank 0), e.g. what a resume overrides
  nlohmann::json layout_auto;      // layout = auto: the pick, recorded in run.json (plan_auto.h)
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
  // One optimizer step over this rank's slices of `batches` (train.accumulate micro-batches):
  // forward, loss, backward of every piece, then the engine's step. Adds this rank's loss x
  // rows and correct count to `sums`. run() calls it; benchmarks time it directly. Returns
  // with ddp.balance this rank's busy seconds per dealt shard (for agree_stop), else 0.
  double step(const std::vector<data::Batch>& batches, EvalResult& sums);

  // What this rank set up, as `tessel config` prints it: layout, engine parts, steps, the
  // pipeline's chunks and the bytes this rank holds (measured by its ledger).
  nlohmann::json plan() const;

  nn::Model& model() { return engine_->model(); }  // this rank's part
  const data::Splits& datasets() const { return data_; }
  const std::string& run_dir() const { return run_dir_; }
  parallel::Engine& engine() { return *engine_; }
  const std::shared_ptr<MemoryLedger>& ledger() const { return ledger_; }

 private:
  // Where training stands; saved in trainer.json so a resumed run continues exactly.
  struct State {
    int64_t epoch = 0;
    int64_t batch_in_epoch = 0;  // next batch of `epoch` to run
    EvalResult epoch_sums;       // running train loss x samples and correct of this epoch
    double train_seconds = 0;    // time in training steps, across resumes
    double wall_seconds = 0;     // wall time of the invocations before this one, up to their
                                 // last checkpoint
    int64_t train_samples = 0;
  };
  void set_up_loader();
  void set_up_shards(int64_t workers, bool dealt);  // micro-shards, or ddp.balance's rows
  // The run folder for this start (run_folder.h) and, on a resume, the state to go on from in
  // s. Returns whether it resumed.
  bool open_run(State& s);
  void start_progress();  // the run's first line; the ETA's inputs
  void train_epoch(State& s, bool& stopped);
  bool train_claimed_epoch(State& s);
  void end_epoch(State& s, double epoch_start, nlohmann::json& epoch_records, EvalResult& last_test,
                 int64_t& last_test_step);
  // Collective over the training ranks: every rank's measurements since the last call, also
  // added to the epoch's and the run's.
  std::vector<parallel::RankStats> take_stats();
  void finish_trace();  // collective over the world: trace.json
  void train_piece(const parallel::Piece& piece, EvalResult& sums);
  // Collective after every step (one all-reduce): whether any rank was interrupted and, while
  // ddp.balance measures, every rank's seconds per shard (step()'s), fed to the deal.
  bool agree_stop(double seconds_per_shard);
  void rebalance(const std::vector<double>& seconds_per_shard);  // the deal's update, traced
  // A checkpoint (to_disk) and an in-memory snapshot (with options_.snapshots) of state s.
  void save(const State& s, bool to_disk = true);
  std::string restore(const std::string& path, State& s);  // returns the folder loaded
  EvalResult global_mean(const EvalResult& local_sums);
  float lr_at(int64_t step) const;
  nlohmann::json summary(const State& s, const EvalResult& last_train, const EvalResult& last_test,
                         const nlohmann::json& epoch_records, const std::string& stopped_by);

  Config config_;
  RunOptions options_;
  std::string run_dir_;
  std::shared_ptr<MemoryLedger> ledger_;  // this rank's allocations
  std::unique_ptr<RunTrace> trace_;       // train.trace (before every part that records)
  comm::Communicator own_world_;          // the one-rank world when none is given
  comm::Communicator* world_;
  data::Splits data_;
  std::unique_ptr<parallel::Engine> engine_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<data::DataLoader> loader_;
  // ddp.balance != off: which micro-shards (or rows) of every batch each rank computes (agreed
  // state, checkpointed); null: each rank computes its loader slice.
  std::unique_ptr<parallel::ShardDeal> deal_;
  int64_t total_steps_ = 0;     // where this run stops (train.max_steps cuts the epochs' steps)
  int64_t schedule_steps_ = 0;  // the LR schedule's span: every epoch's steps
  double wall_start_ = 0;       // when this invocation's run() began
  float base_lr_ = 0;
  int64_t step_ = 0;
  int prefetch_ = 0;  // train.prefetch resolved for this host (resolve_prefetch)
  // With a parameter server in async or ssp mode (not lockstep) workers train claimed worker
  // batches of batch_rows_ rows: claim_budget_ of them in the run (epochs, or train.max_steps x
  // workers), of which batches_done_ (every worker's, agreed at epoch ends) are done,
  // start_batches_ before this invocation. Lockstep: batch_rows_ = train.batch.
  bool lockstep_ = true;
  int64_t batch_rows_ = 0;
  int64_t claim_budget_ = 0, batches_done_ = 0, start_batches_ = 0;
  int64_t start_step_ = 0;
  // Time in training steps and steps trained since the last take_stats(); every rank's
  // measurements of this epoch and of this invocation.
  double untaken_s_ = 0;
  int64_t untaken_steps_ = 0;
  std::vector<parallel::RankStats> epoch_stats_, run_stats_;
};

}  // namespace tessel::train
