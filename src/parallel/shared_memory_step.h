// Data parallelism among ranks that share one host's memory (threads, or mpi ranks on one host:
// Communicator::shared_memory): every rank's gradient arena lives in one shared block, so the
// gradient sum moves no messages at all.
//   SharedGradSync   zero.stage 0: barrier (every backward is done); each rank sums its shards
//                    of every unit straight from the other ranks' arenas and writes the sum
//                    into every arena; barrier: each arena holds the whole reduced gradient.
//                    One rank computes each element's sum, so the replicas stay identical.
//   SharedMemoryStep zero.stage 1: the ranks keep ONE copy of the parameters in the block too;
//                    each rank sums its shards into its own arena, updates its shards of the
//                    shared parameters (its optimizer state is 1/N), barrier (the next forward
//                    sees the whole new model). Both the gradient sync and the parameter store.
// Internal to the parallel area.
#pragma once

#include <memory>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/parallel/param_store.h"
#include "tessel/parallel/units.h"

namespace tessel::parallel {

class SharedGradSync : public GradSync {
 public:
  // zero.stage 0. Collective over dp. Returns null when the ranks do not share a host (then
  // use messages).
  static std::unique_ptr<SharedGradSync> make(nn::Model& model, const Units& units,
                                              comm::Communicator& dp, comm::Communicator& workers);
  ~SharedGradSync() override;

  void reduce() override;
  double sq_norm() override;
  float* grads(nn::Range r) override;
  void clear() override;
  void take_stats(RankStats& s) override;

 protected:
  // One arena: the units' span in whole 64-byte lines, so every part of a block stays aligned.
  static size_t arena_bytes(const Units& units);
  // The arenas start `at` bytes into the block. whole: every arena gets the whole sum (stage 0).
  SharedGradSync(nn::Model& model, const Units& units, comm::Communicator& dp,
                 comm::Communicator& workers, std::shared_ptr<void> block, size_t at, bool whole);
  void sync_ranks();  // fence + barrier

  const Units& units_;
  comm::Communicator& dp_;
  comm::Communicator& workers_;
  std::shared_ptr<void> block_;
  std::vector<float*> rank_grads_;  // every rank's gradient arena in the block
  std::vector<nn::Range> shards_;   // this rank's shards
  bool whole_;
  std::shared_ptr<MemoryLedger> ledger_;
  int64_t charged_grads_ = 0;
  double reduce_s_ = 0, barrier_s_ = 0, bytes_ = 0;
};

class SharedMemoryStep final : public SharedGradSync, public ParamStore {
 public:
  // zero.stage 1. Collective over dp. Returns null when the ranks do not share a host.
  static std::unique_ptr<SharedMemoryStep> make(nn::Model& model, const Units& units,
                                                comm::Communicator& dp, comm::Communicator& workers,
                                                uint64_t seed);
  ~SharedMemoryStep() override;

  void update(optim::Optimizer& opt, float lr, float grad_scale, GradSync& sync,
              int64_t step) override;
  // A restore loads this rank's shards into the shared copy; start waits for every rank's.
  const std::vector<nn::Range>& loaded() const override { return shards_; }
  void before_start() override { sync_ranks(); }
  float* values(nn::Range r) override;
  void copy_values(nn::Range r, float* dst) override;
  void take_stats(RankStats& s) override;

 private:
  SharedMemoryStep(nn::Model& model, const Units& units, comm::Communicator& dp,
                   comm::Communicator& workers, std::shared_ptr<void> block);

  float* params_ = nullptr;
  int64_t charged_params_ = 0;
  double optimizer_s_ = 0;
};

}  // namespace tessel::parallel
