// DataParallel: every rank holds the whole model and trains on its contiguous slice of each
// global batch. With one rank (no communicator) it is the single-worker strategy: no
// communication, same arithmetic, so deterministic mode gives the same bits for any world size.
//
// With ddp.overlap, gradients are grouped into buckets (exact_sum.h) whose all-reduce starts
// asynchronously as soon as the backward pass has finished their blocks, so communication
// overlaps the rest of the backward pass; step() waits for the buckets, then every rank clips
// and updates all parameters identically.
//
// Without overlap the step is sharded instead (ZeRO stage 1's arithmetic): one in-place
// reduce-scatter leaves each rank the global gradient of its 1/N shard of the arena, each rank
// updates only its shard, and an all-gather of the parameters brings every rank the whole
// model. The traffic equals one all-reduce, but each rank runs 1/N of the optimizer; the
// optimizer state of other shards goes stale and is all-gathered by consolidate() before a
// checkpoint. (The state is still allocated full length on every rank.)
//
// When the ranks share one host's memory (threads, or mpi ranks on one host:
// Communicator::shared_memory), the sharded step moves no messages at all: the ranks keep ONE
// parameter arena in shared memory and each rank's gradient arena sits beside it. A step is
// then: barrier (every backward is done), each rank sums its shard of every rank's gradient
// straight from their memory, updates its shard of the shared parameters, barrier (the next
// forward sees the whole new model). No parameter all-gather, no copies through messages.
//
// Deterministic mode: the Trainer computes each fixed micro-shard's gradient separately and
// hands it over with collect_shard(); step() sums them exactly with ExactSum (exact_sum.h), so
// the run is independent of how shards were spread over ranks.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/parallel/exact_sum.h"
#include "tessel/parallel/strategy.h"

namespace tessel::parallel {

class DataParallel : public Strategy {
 public:
  // world may be null (one rank). The model's arenas must be allocated.
  DataParallel(const ParallelSpec& spec, comm::Communicator* world, nn::Model& model);
  ~DataParallel() override;

  std::string layout() const override;
  int rank() const override { return world_ ? world_->rank() : 0; }
  int world_size() const override { return world_ ? world_->size() : 1; }
  int data_rank() const override { return rank(); }
  int data_size() const override { return world_size(); }

  void on_start() override;
  void begin_backward(bool sync) override;
  void after_block_backward(size_t block) override;
  void collect_shard() override;
  void step(optim::Optimizer& opt, float lr, float clip_norm, int64_t step) override;
  void consolidate(optim::Optimizer& opt) override;
  void sum(double* values, int n) override;
  void max(double* values, int n) override;
  std::vector<double> gather(double value) override;
  nlohmann::json take_metrics() override;

  size_t num_buckets() const { return buckets_.size(); }
  bool overlaps() const { return overlap_; }
  bool sharded() const { return sharded_; }

 private:
  struct Bucket {
    size_t first_block;  // the lowest block with parameters in the bucket: launch after it
    int64_t lo, hi;      // element range of the gradient arena
    comm::Work work;
    bool launched = false;
    double launch_time = 0;
    double done_time = 0;  // when completion was first seen (0: not yet)
  };
  void launch(Bucket& b);
  // Deterministic or overlapped: on return the gradient arena holds the global gradient sum.
  void reduce();
  void sharded_step(optim::Optimizer& opt, float lr, float clip_norm);
  void share_memory();
  void reduce_shared_shard();  // own shard of the gradient = sum over every rank's arena
  void sync_shared();          // fence + barrier
  void check_parameters(int64_t step);

  comm::Communicator* world_;
  bool overlap_ = false;  // resolved ddp.overlap
  bool sharded_ = false;  // sharded step: no overlap, not deterministic, several ranks
  std::vector<size_t> shard_counts_;  // elements of each rank's shard of the arena
  int64_t shard_lo_ = 0, shard_hi_ = 0;  // this rank's shard
  std::shared_ptr<void> shared_;          // shared memory of the shared sharded step, or null
  std::vector<const float*> rank_grads_;  // every rank's gradient arena in shared_
  std::vector<Bucket> buckets_;
  bool sync_ = true;
  std::optional<ExactSum> exact_;  // deterministic mode

  // Measurements since the last take_metrics().
  double exposed_s_ = 0;     // waiting for buckets after the backward pass
  double overlapped_s_ = 0;  // bucket all-reduce time hidden behind the backward pass
  double reduce_s_ = 0;      // deterministic reduction time (all exposed)
  double bytes_ = 0;         // gradient bytes all-reduced
};

}  // namespace tessel::parallel
