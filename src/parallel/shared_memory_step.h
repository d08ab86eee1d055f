// SharedMemoryStep: ZeRO-1 among ranks that share one host's memory (threads, or mpi ranks on
// one host: Communicator::shared_memory). The ranks keep ONE copy of the parameters in shared
// memory and each rank's gradient arena beside it, so a step moves no messages at all:
// barrier (every backward is done), each rank sums its pieces of every rank's gradient straight
// from their memory, updates its pieces of the shared parameters (its optimizer state is 1/N),
// barrier (the next forward sees the whole new model). It is both the gradient sync and the
// parameter store of such a layout. Internal to the parallel area.
#pragma once

#include <memory>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/parallel/param_store.h"
#include "tessel/parallel/units.h"

namespace tessel::parallel {

class SharedMemoryStep final : public GradSync, public ParamStore {
 public:
  // Collective over dp. Returns null when the ranks do not share a host (then use messages).
  static std::unique_ptr<SharedMemoryStep> make(nn::Model& model, const Units& units,
                                                comm::Communicator& dp,
                                                comm::Communicator& workers, uint64_t seed);
  ~SharedMemoryStep() override;

  // GradSync
  void reduce() override;
  double sq_norm() override;
  float* grads(nn::Range r) override;
  void clear() override;
  // ParamStore
  void update(optim::Optimizer& opt, float lr, float grad_scale, GradSync& sync) override;
  float* values(nn::Range r) override;
  void copy_values(nn::Range r, float* dst) override;
  void take_stats(RankStats& s) override;

 private:
  SharedMemoryStep(const Units& units, comm::Communicator& dp, comm::Communicator& workers,
                   std::shared_ptr<void> block);
  void sync_ranks();  // fence + barrier

  const Units& units_;
  comm::Communicator& dp_;
  comm::Communicator& workers_;
  std::shared_ptr<void> block_;
  float* params_ = nullptr;
  std::vector<float*> rank_grads_;  // every rank's gradient arena in the block
  std::shared_ptr<MemoryLedger> ledger_;
  int64_t charged_params_ = 0, charged_grads_ = 0;
  double reduce_s_ = 0, barrier_s_ = 0, optimizer_s_ = 0, bytes_ = 0;
};

}  // namespace tessel::parallel
