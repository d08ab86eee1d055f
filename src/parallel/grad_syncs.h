// The gradient syncs (grad_sync.h), each holding this rank's gradient memory:
//   ArenaSync    the full gradient of the local units in one arena; each unit's bucket is
//                all-reduced (zero.stage 0) or reduce-scattered in place so that this rank
//                holds the sum of its shards (1) once its last backward pass is done. With a
//                one-rank group it only holds the gradients (one worker, a parameter-server
//                worker that pushes them).
//   ShardSync    zero.stage 2 and 3: only this rank's gradient shards persist; a
//                unit's gradient accumulates in a bucket buffer taken from a small pool when
//                its backward starts, is reduce-scattered after every backward pass and added
//                into the shard, and the buffer goes back to the pool.
//   ExactSync    deterministic mode (any stage): every micro-shard's gradient of every unit is
//                kept apart and summed exactly at the step (exact_sum.h); the full reduced
//                gradient stays in an arena, and the norm is summed block by block so that
//                every layout gives the same bits. On a device the arena, the kept
//                micro-shards and the integer sums are the device's (ExactSum on the device's
//                exact kernels, the integers all-reduced through its DeviceCollectives): no
//                gradient comes to the host, and any worker count gives the CPU run's bits.
//   ExactPushSync  a parameter-server worker in deterministic mode: ExactSync's micro-shards,
//                quantised at the scales agreed over the workers into int64 sums that the worker
//                pushes (parameter_server.h); the servers add them.
// With zero.shard_size ArenaSync and ShardSync reduce-scatter within this rank's shard group
// and all-reduce its shards across the groups (Buckets::Spec::across); ExactSync sums over the
// whole dp group as before, so deterministic mode keeps one worker's bits.
// Ranks of one host sum their arenas in shared memory instead (shared_memory_step.h).
// ArenaSync and ShardSync send each unit through Buckets (buckets.h) and its codecs: f32 by
// default; in train.precision bf16 | fp16 the gradients stay f32 where they accumulate (a token
// table sums thousands of rows: 16-bit sums would lose the small ones), while the units travel
// as 16-bit messages (half the bytes), rounded at launch and widened back when their collective
// is done; with compress.kind, as the kind's codec. ExactSync's integer sums need no codec.
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

// The squared norm of this rank's shards of every unit, summed over `workers` (null: this
// rank alone): with every element owned by exactly one rank, the global squared norm. With
// shard groups, a shard counts on the first group only (`counted` false elsewhere: zero).
double shards_sq_norm(const Units& units, GradSync& sync, comm::Communicator* workers,
                      bool counted);

// Every unit's range, in the list's order (ExactSum's scale buckets).
std::vector<nn::Range> ranges_of(const Units& units);

class ArenaSync final : public GradSync, public BlockHooks {
 public:
  enum class Reduction { kAllReduce, kReduceScatter };
  // dp: the ranks holding the same blocks (null or one rank: nothing to reduce; with shard
  // groups, this rank's group); workers: every training rank, for the norm (null: this rank
  // alone). spec.scatter is set from reduction.
  ArenaSync(nn::Model& model, const Units& units, Reduction reduction, comm::Communicator* dp,
            comm::Communicator* workers, Buckets::Spec spec = {});

  void on_block(nn::Phase phase, size_t block, bool last) override;
  void reduce() override;
  double sq_norm() override;
  float* grads(nn::Range r) override;
  void clear() override;
  void take_stats(RankStats& s) override;
  std::vector<float> save_state() override { return buckets_.save_state(); }
  void load_state(const std::vector<float>& state) override { buckets_.load_state(state); }

 private:
  void launch(int unit);

  const Units& units_;
  comm::Communicator* dp_;
  comm::Communicator* workers_;
  bool counted_;  // this rank's shards count in the norm (the first shard group's)
  Tensor arena_;  // gradients of units_.span
  Buckets buckets_;
  std::vector<char> launched_;
};

class ShardSync final : public GradSync, public BlockHooks {
 public:
  // per_pass: reduce after every backward pass; false (a pipeline, whose micro-batches
  // interleave): keep a unit's bucket open through the step and reduce it after its last pass.
  // dp: the ranks sharing the units' shards (with shard groups, this rank's group).
  // spec.scatter is set.
  ShardSync(nn::Model& model, const Units& units, comm::Communicator& dp,
            comm::Communicator* workers, bool per_pass, Buckets::Spec spec);

  void on_block(nn::Phase phase, size_t block, bool last) override;
  void reduce() override;
  double sq_norm() override;
  float* grads(nn::Range r) override;
  void clear() override;
  void take_stats(RankStats& s) override;
  std::vector<float> save_state() override { return buckets_.save_state(); }
  void load_state(const std::vector<float>& state) override { buckets_.load_state(state); }

 private:
  void open(int unit);    // a zeroed bucket buffer becomes the unit's gradient memory
  void launch(int unit);  // reduce the bucket, add this rank's shard into shard_

  nn::Model& model_;
  const Units& units_;
  comm::Communicator* workers_;
  bool counted_;                // this rank's shards count in the norm (the first shard group's)
  Tensor shard_;                // this rank's shards of the reduced gradient, packed
  compress::BufferPool pool_;   // bucket buffers not in use
  std::vector<Tensor> open_;    // per unit: its bucket while in use
  std::vector<char> launched_;  // per unit: reduced into the shard in this step
  bool per_pass_;
  Buckets buckets_;
};

class ExactSync final : public GradSync, public BlockHooks {
 public:
  // scale_buckets: units over the whole model (one rank, no pipeline), the same in every
  // layout. dp: the ranks whose micro-shards are summed; workers: every training rank.
  // overflow_ok: fp16, whose loss scaling skips a step with an inf or NaN gradient. device: on
  // a device rank, dp's collectives on device memory (null: the CPU, or dp of one rank).
  ExactSync(nn::Model& model, const Units& units, const Units& scale_buckets,
            comm::Communicator& dp, comm::Communicator& workers, bool overflow_ok,
            comm::DeviceCollectives* device = nullptr);

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
  comm::DeviceCollectives* device_;
  Tensor arena_;
  ExactSum sum_;
  double reduce_s_ = 0, bytes_ = 0;
};

// A parameter-server worker's gradient in deterministic mode (ParameterServer::worker_sync):
// every micro-shard's gradient is kept apart (ExactSum); reduce() agrees over the workers the
// scales one worker holding every shard would pick (from the largest |g| over all of them) and
// quantises this worker's shards into int64 sums at them, which its push carries; the servers
// add the workers' integers (in any order the same sums) and dequantise them.
class ExactPushSync final : public GradSync {
 public:
  // units: the whole model's (the servers' buckets, also the scale buckets); workers: every
  // worker rank; overflow_ok: fp16 (an inf or NaN makes the step's scales NaN).
  ExactPushSync(nn::Model& model, const Units& units, comm::Communicator& workers,
                bool overflow_ok);

  void collect(size_t block);  // after a backward pass: the units `block` completed
  void reduce() override;
  // Read only by fp16's overflow test: train.clip_norm, which would need the norm of the summed
  // gradient that only the servers hold, is refused with ps.servers in deterministic mode
  // (config.cc). +inf when any worker's gradient held an inf or NaN (the agreed scales), else 0.
  double sq_norm() override;
  float* grads(nn::Range r) override { return arena_.data<float>() + r.lo; }
  void clear() override {}  // collect() zeroes each micro-shard's gradient
  void take_stats(RankStats& s) override;
  const int64_t* sums() const { return sum_.sums(); }  // after reduce(), over the arena
  const std::vector<double>& scales() const { return scales_; }

 private:
  const Units& units_;
  comm::Communicator& workers_;
  Tensor arena_;
  ExactSum sum_;
  std::vector<double> scales_;
  double reduce_s_ = 0;
};

}  // namespace tessel::parallel
