// Strategy: how a layout turns one rank's share of a training step into the global one. The
// Trainer runs the loop (data, epochs, metrics, checkpoints) and calls these hooks at fixed
// points; a strategy holds the communication and decides what this rank computes:
//   - train_piece / eval_piece: forward (+ loss + backward) of this rank's rows; the default
//     runs the whole model on this rank, a pipeline runs its stage's micro-batch schedule;
//   - step: reduce the gradients as the layout needs, clip, update the parameters this rank
//     owns (all of them, a ZeRO shard, a pipeline stage's, or none on a parameter-server
//     worker, whose servers update);
//   - consolidate: make the whole model (and optimizer state) current on rank 0 before a
//     checkpoint or the final checksum.
// One Strategy per rank, used by that rank's thread. make_strategy() picks the strategy from
// the layout (layout.h): data parallel (single worker included), pipeline, parameter server.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/model.h"
#include "tessel/optim/optimizer.h"

namespace tessel::comm {
class Communicator;
}

namespace tessel::parallel {

// Config sections ddp, pp, ps and debug (docs/config.md documents each key).
struct ParallelSpec {
  // ddp.*
  double bucket_mb = 1.0;     // gradient bucket size for overlapped all-reduce
  // "on" all-reduces buckets on a progress thread during the backward pass; "off" reduces at
  // the step on the compute thread, sharded (reduce-scatter, update 1/N, all-gather); "auto"
  // overlaps only when the machine has a spare core per rank for the progress threads.
  std::string overlap = "auto";
  int64_t check_every = 200;  // steps between cross-rank parameter checks (0 = off)
  // Sharded step of ranks on one host: one parameter arena in shared memory, gradients read
  // from each other's memory (no messages). false: reduce-scatter + all-gather messages, as
  // between hosts.
  bool shared_memory = true;
  bool deterministic = false; // train.deterministic: bit-identical results for any worker count
  int64_t micro_shard = 8;    // rows per fixed micro-shard in deterministic mode

  // pp.* (pipeline model parallelism)
  int64_t pp_stages = 1;                  // pipeline stages (1: no pipeline)
  int64_t pp_microbatches = 1;            // micro-batches per batch
  std::string pp_schedule = "1f1b";       // gpipe | 1f1b
  std::string pp_partition = "balanced";  // balanced | uniform | round_robin
  std::vector<int64_t> pp_cuts;           // explicit first block of stages 1..P-1 (overrides partition)

  // ps.* (parameter server)
  int64_t ps_servers = 0;          // server ranks (0: no parameter server)
  std::string ps_mode = "sync";    // sync | async | ssp
  int64_t ps_staleness = 2;        // ssp: a worker at clock c waits for the slowest to reach c - s
  std::string ps_stale_lr = "inverse";  // none | inverse: scale an update by 1 / (1 + staleness)

  // debug.*
  int64_t slow_rank = -1;  // this worker sleeps debug.delay_ms in every step (-1: none)
  double delay_ms = 0;
};

// One piece of this rank's rows of a step (a batch slice, or one micro-shard of it).
struct Piece {
  Tensor x, y;
  nn::Context ctx;
  double weight = 1;  // the piece's share of the step's global rows: scales the loss gradient
  bool sync = true;   // false on accumulation micro-steps that must not communicate
};

// Loss and accuracy sums of a piece, counted where the loss is computed (a pipeline's last
// stage; elsewhere zero).
struct PieceResult {
  double loss_sum = 0;  // mean loss x rows
  double correct = 0;   // rows classified correctly (fractional for sequence models)
  int64_t rows = 0;
};

class Strategy {
 public:
  Strategy(nn::Model& model, const ParallelSpec& spec) : model_(model), spec_(spec) {}
  virtual ~Strategy() = default;

  virtual std::string layout() const = 0;  // "single", "dp=4", "dp=2 pp=2", "ps: 1 server x 4 workers"
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // This rank's share of every global batch: slice data_rank of data_size.
  virtual int data_rank() const = 0;
  virtual int data_size() const = 0;
  bool is_main() const { return rank() == 0; }

  // A parameter-server server rank serves pushes and pulls instead of training: the Trainer
  // calls serve() and nothing else on it. `lr(step)` is the schedule.
  virtual bool is_server() const { return false; }
  virtual nlohmann::json serve(optim::Optimizer& opt, const std::function<float(int64_t)>& lr);

  // Lockstep (the default): every training rank trains its slice of every global batch, the
  // same steps in the same order, so the Trainer may meet the ranks at any step. A layout that
  // is not lockstep (parameter server in async and ssp modes) hands an epoch's batches out
  // dynamically instead: each worker trains whole worker batches (train.batch / workers rows)
  // that it claims one at a time, so a slow worker trains fewer of them; the ranks meet only
  // at epoch ends. The Trainer then calls set_claims() and claim() instead of slicing batches.
  virtual bool lockstep() const { return true; }
  // Work handed out when !lockstep(): batches [first, limit) of epoch `epoch` (in worker
  // batches); `step` is the global step at `first` (W worker batches make one step).
  struct Claims {
    int64_t epoch = 0, first = 0, limit = 0, step = 0;
    bool open = false;  // false: claim nothing more (e.g. stopping)
  };
  // Sets the range this worker claims from; the next step() claims one more batch of it in the
  // same exchange with the servers. Local (no communication).
  virtual void set_claims(const Claims&) {
    throw Error("parallel: a lockstep layout hands out no claims (this is a bug)");
  }
  // The batch of the range this worker trains next (each batch goes to exactly one worker):
  // the one claimed with the last step(), or, none asked for yet, one claimed now; -1 once every
  // batch of the range has been handed out or the range is closed.
  virtual int64_t claim() {
    throw Error("parallel: a lockstep layout hands out no claims (this is a bug)");
  }

  // Before the first step (fresh or resumed): e.g. check every rank holds the same parameters.
  virtual void on_start() = 0;
  // A backward pass starts; `sync` is false on accumulation micro-steps that must not talk.
  virtual void begin_backward(bool sync) = 0;
  // Block i's parameter gradients are complete (called in reverse block order).
  virtual void after_block_backward(size_t block) = 0;
  // Forward, loss and backward of a piece; gradients accumulate in the model's gradient arena.
  // Default: the whole model on this rank, after_block_backward() after each block.
  virtual PieceResult train_piece(const Piece& piece, nn::CrossEntropyLoss& loss);
  // Forward and loss only (evaluation). Default: the whole model on this rank.
  virtual PieceResult eval_piece(const Piece& piece, nn::CrossEntropyLoss& loss);
  // Deterministic mode: the gradient arena holds one micro-shard's gradient; keep it exactly.
  virtual void collect_shard() = 0;
  // The optimizer step `step` (0-based) at learning rate lr: on entry the gradient arena holds
  // this rank's gradients of the step; reduce them, clip the global norm to clip_norm (0: off),
  // update the parameters this rank owns.
  virtual void step(optim::Optimizer& opt, float lr, float clip_norm, int64_t step) = 0;
  // Collective: the whole model's parameters and the optimizer's state become current on rank 0
  // (a checkpoint, the final checksum). Default: nothing to do, every rank holds them.
  virtual void consolidate(optim::Optimizer& opt);
  // Sums / maxes n values across the training ranks in place (metrics and evaluation).
  virtual void sum(double* values, int n) = 0;
  virtual void max(double* values, int n) = 0;
  // Every training rank's `value`, indexed by rank.
  virtual std::vector<double> gather(double value) = 0;
  // Measurements since the last call (for metrics and summary.json): at least
  // comm_exposed_seconds, comm_overlapped_seconds and optimizer_seconds of this rank; any other
  // key is the layout's own (already the same on every rank) and is reported as it is.
  virtual nlohmann::json take_metrics() = 0;

 protected:
  // Clips the gradients of [lo, hi) (element range of the arenas) to clip_norm, where
  // `sum_norm` adds up the squared norms of every rank's owned range (the global norm), then
  // runs the optimizer over [lo, hi). Times itself into optimizer_seconds_.
  void update(optim::Optimizer& opt, float lr, float clip_norm, int64_t lo, int64_t hi,
              const std::function<void(double*)>& sum_norm);
  // Forward of the whole model on this rank and the loss (the defaults' common part).
  PieceResult forward_loss(const Piece& piece, nn::CrossEntropyLoss& loss);
  // Throws naming the step when a training loss is not finite.
  static void check_loss(double loss, int64_t step);

  nn::Model& model_;
  ParallelSpec spec_;
  double optimizer_seconds_ = 0;  // since the last take_metrics()
};

// The strategy for this rank: the layout (layout.h) follows from spec and world's size. world
// null: one worker. Throws InvalidArgument for an impossible layout.
std::unique_ptr<Strategy> make_strategy(const ParallelSpec& spec, comm::Communicator* world,
                                        nn::Model& model);

}  // namespace tessel::parallel
