// Strategy: how a layout turns one rank's training step into the global one. The Trainer runs
// the loop and calls these hooks at fixed points; a strategy holds the communication and no
// loop. Single is the one-worker strategy (every hook a no-op); DataParallel reduces gradient
// buckets while the backward pass runs. One Strategy per rank, used by that rank's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/nn/model.h"

namespace tessel::comm {
class Communicator;
}

namespace tessel::parallel {

struct ParallelSpec {
  double bucket_mb = 1.0;     // ddp.bucket_mb: gradient bucket size for overlapped all-reduce
  // ddp.overlap: "on" all-reduces buckets on a progress thread during the backward pass; "off"
  // all-reduces the whole gradient on the compute thread at the step; "auto" overlaps only when
  // the machine has a spare core per rank for the progress threads.
  std::string overlap = "auto";
  int64_t check_every = 200;  // ddp.check_every: steps between cross-rank parameter checks (0 = off)
  bool deterministic = false; // train.deterministic: bit-identical results for any worker count
  int64_t micro_shard = 8;    // ddp.micro_shard: rows per fixed micro-shard in deterministic mode
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string layout() const = 0;  // "single", "dp=4"
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // This rank's share of every global batch: slice data_rank of data_size.
  virtual int data_rank() const = 0;
  virtual int data_size() const = 0;
  bool is_main() const { return rank() == 0; }

  // Before the first step (fresh or resumed): e.g. check every rank holds the same parameters.
  virtual void on_start() = 0;
  // A backward pass starts; `sync` is false on accumulation micro-steps that must not talk.
  virtual void begin_backward(bool sync) = 0;
  // Block i's parameter gradients are complete (called in reverse block order).
  virtual void after_block_backward(size_t block) = 0;
  // Deterministic mode: the gradient arena holds one micro-shard's gradient; keep it exactly.
  virtual void collect_shard() = 0;
  // Before the optimizer step: on return the gradient arena holds the global gradient sum.
  virtual void before_step() = 0;
  virtual void after_step(int64_t step) = 0;
  // Sums / maxes n values across ranks in place (metrics and evaluation).
  virtual void sum(double* values, int n) = 0;
  virtual void max(double* values, int n) = 0;
  // Every rank's `value`, indexed by rank.
  virtual std::vector<double> gather(double value) = 0;
  // Measurements since the last call, reduced across ranks (for metrics and summary.json).
  virtual nlohmann::json take_metrics() = 0;
};

// A strategy for `world` (null: the single-worker strategy) and the model it will train.
std::unique_ptr<Strategy> make_strategy(const ParallelSpec& spec, comm::Communicator* world,
                                        nn::Model& model);

}  // namespace tessel::parallel
