// The gradient syncs (grad_sync.h), each holding this rank's gradient memory:
//   ArenaSync    the full gradient of the local units in one arena; each unit's bucket is
//                all-reduced (zero.stage 0) or reduce-scattered in place so that this rank
//                holds the sum of its pieces (1) once its last backward pass is done. With a
//                one-rank group it only holds the gradients (one worker, a parameter-server
//                worker that pushes them).
//   ShardSync    zero.stage 2 and 3: only a gradient shard (this rank's pieces) persists; a
//                unit's gradient accumulates in a bucket buffer taken from a small pool when
//                its backward starts, is reduce-scattered after every backward pass and added
//                into the shard, and the buffer goes back to the pool.
//   ExactSync    deterministic mode (any stage): every micro-shard's gradient of every unit is
//                kept apart and summed exactly at the step (exact_sum.h); the full reduced
//                gradient stays in an arena, and the norm is summed block by block so that
//                every layout gives the same bits.
// Ranks of one host sum their arenas in shared memory instead (shared_memory_step.h).
// In train.precision bf16 | fp16 the gradients stay f32 where they accumulate (a token table sums
// thousands of rows: 16-bit sums would lose the small ones), while the buckets of ArenaSync and
// ShardSync travel as 16-bit messages (half the bytes), rounded at launch and widened back
// when their collective is done. ExactSync's integer sums need no message type.
// Internal to the parallel area; built by the Engine.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "buckets.h"
#include "exact_sum.h"
#include "tessel/comm/communicator.h"
#include "tessel/parallel/grad_sync.h"
#include "tessel/parallel/units.h"

namespace tessel::parallel {

// The squared norm of this rank's pieces of every unit, summed over `workers` (null: this
// rank alone): with every element owned by exactly one rank, the global squared norm.
double pieces_sq_norm(const Units& units, GradSync& sync, comm::Communicator* workers);

// 16-bit message buffers of one bucket's size, reused (charged to communication buffers).
class Messages {
 public:
  Messages(DType type, int64_t numel) : type_(type), numel_(numel) {}
  bool used() const { return type_ != DType::kF32; }
  DType type() const { return type_; }
  // A buffer holding n f32 values of src rounded to the message type.
  Tensor take(const float* src, int64_t n);
  void give(Tensor t) { free_.push_back(std::move(t)); }

 private:
  DType type_;
  int64_t numel_;
  std::vector<Tensor> free_;
};

class ArenaSync final : public GradSync, public BlockHooks {
 public:
  enum class Reduction { kAllReduce, kReduceScatter };
  // dp: the ranks holding the same blocks (null or one rank: nothing to reduce); workers:
  // every training rank, for the norm (null: this rank alone).
  ArenaSync(nn::Model& model, const Units& units, Reduction reduction, comm::Communicator* dp,
            comm::Communicator* workers, bool async, DType message = DType::kF32);

  void on_block(nn::Phase phase, size_t block, bool last) override;
  void reduce() override;
  double sq_norm() override;
  float* grads(nn::Range r) override;
  void clear() override;
  void take_stats(RankStats& s) override;

 private:
  void launch(int unit);
  void launch_message(const Unit& u, float* g, const comm::CallOptions& call);

  const Units& units_;
  Reduction reduction_;
  comm::Communicator* dp_;
  comm::Communicator* workers_;
  Tensor arena_;  // gradients of units_.span
  Buckets buckets_;
  std::vector<char> launched_;
  Messages messages_;
};

class ShardSync final : public GradSync, public BlockHooks {
 public:
  // per_pass: reduce after every backward pass; false (a pipeline, whose micro-batches
  // interleave): keep a unit's bucket open through the step and reduce it after its last pass.
  ShardSync(nn::Model& model, const Units& units, comm::Communicator& dp,
            comm::Communicator* workers, bool async, bool per_pass,
            DType message = DType::kF32);

  void on_block(nn::Phase phase, size_t block, bool last) override;
  void reduce() override;
  double sq_norm() override;
  float* grads(nn::Range r) override;
  void clear() override;
  void take_stats(RankStats& s) override;

 private:
  void open(int unit);    // a zeroed bucket buffer becomes the unit's gradient memory
  void launch(int unit);  // reduce-scatter the bucket, add this rank's piece into the shard

  nn::Model& model_;
  const Units& units_;
  comm::Communicator& dp_;
  comm::Communicator* workers_;
  Tensor shard_;                     // this rank's pieces of the reduced gradient
  std::vector<Tensor> free_;         // bucket buffers not in use
  std::vector<Tensor> open_;         // per unit: its bucket while in use
  std::vector<char> launched_;       // per unit: reduced into the shard in this step
  int64_t bucket_numel_ = 0;
  bool per_pass_;
  Buckets buckets_;
  Messages messages_;
};

class ExactSync final : public GradSync, public BlockHooks {
 public:
  // scale_buckets: units over the whole model (one rank, no pipeline), the same in every
  // layout. dp: the ranks whose micro-shards are summed; workers: every training rank.
  // overflow_ok: fp16, whose loss scaling skips a step with an inf or NaN gradient.
  ExactSync(nn::Model& model, const Units& units, const Units& scale_buckets,
            comm::Communicator& dp, comm::Communicator& workers, bool overflow_ok);

  void on_block(nn::Phase phase, size_t block, bool last) override;
  void reduce() override;
  double sq_norm() override;
  float* grads(nn::Range r) override;
  void clear() override;
  void take_stats(RankStats& s) override;

 private:
  nn::Model& model_;
  const Units& units_;
  comm::Communicator& dp_;
  comm::Communicator& workers_;
  Tensor arena_;
  ExactSum sum_;
  double reduce_s_ = 0, bytes_ = 0;
};

}  // namespace tessel::parallel
