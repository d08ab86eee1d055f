// The parameter stores (param_store.h) of data parallelism:
//   ReplicatedStore  every rank of a dp group holds the values of its units. zero.stage 0: the
//                    optimizer updates everything (every replica the same); 1 and 2: each rank
//                    updates its shards (optimizer state allocated 1/N) and the shards are
//                    all-gathered back into every replica after the step.
//   ShardedStore     zero.stage 3: a rank holds only its shards (the master values the optimizer
//                    updates). Before a block runs forward or backward, the units it reads are
//                    all-gathered into buffers from a pool; after it, a unit no neighbouring
//                    block reads is released (in a pipeline, whose micro-batches interleave,
//                    at the end of the step instead). The order of gathers is recorded on the first
//                    training step; later steps check every gather against it (a rank that
//                    runs other blocks fails naming them) and gather the next unit of the
//                    order in the background while this one computes (zero.prefetch). In
//                    train.precision bf16 | fp16 the gathers move 16-bit values (each rank
//                    rounds its shard into its block of the buffer, then all-gathers in place;
//                    with the masters on the host, from its 16-bit shard on the device).
// With zero.shard_size a store's dp group is this rank's shard group and `across` the ranks
// holding the same shards in the other groups (null: none): every group holds the whole
// model's state, and only the first group's ranks write their shards to checkpoints.
// Internal to the parallel area; built by the Engine.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/comm/nccl.h"
#include "tessel/parallel/param_store.h"
#include "tessel/parallel/units.h"

namespace tessel::parallel {

class ReplicatedStore final : public ParamStore {
 public:
  // stage 0: update everything; 1 or 2: update this rank's shards and all-gather them.
  // check_every: check the replicas at the start and every that many steps (ddp.check_every;
  // 0: at the start only).
  // device: dp's collectives on device memory (a device rank with dp peers), which gather the
  // shards instead of dp.
  // host_masters: the values in pinned host memory (optimizer offload in bf16 | fp16; the blocks
  // read the working copy), the shards gathered through dp.
  ReplicatedStore(nn::Model& model, const Units& units, int stage, comm::Communicator& dp,
                  comm::Communicator* across, uint64_t seed, int64_t check_every,
                  comm::DeviceCollectives* device = nullptr, bool host_masters = false);

  void update(optim::Optimizer& opt, float lr, float grad_scale, GradSync& sync,
              int64_t step) override;
  float* values(nn::Range r) override;
  void copy_values(nn::Range r, float* dst) override;
  void take_stats(RankStats& s) override;
  void before_start() override { check_replicas(0); }
  void end_step(int64_t step) override {
    if (check_every_ > 0 && (step + 1) % check_every_ == 0) check_replicas(step + 1);
  }
  // Throws naming the ranks whose values differ from dp rank 0's (a replica diverged).
  void check_replicas(int64_t step);

 private:
  const Units& units_;
  int stage_;
  int64_t check_every_;
  comm::Communicator& dp_;
  comm::Communicator* across_;
  comm::DeviceCollectives* device_;
  Tensor values_;  // units_.span
  double optimizer_s_ = 0, gather_s_ = 0, bytes_ = 0;
};

class ShardedStore final : public ParamStore, public BlockHooks {
 public:
  // hold_for_step: keep a gathered unit until end_step() (pipelines) instead of releasing it
  // after the last neighbouring block that reads it. type: what the blocks read and the
  // gathers move (train.precision); the shard stays f32. device: dp's collectives on device
  // memory (a device rank with dp peers), which gather the units instead of dp. host_masters:
  // the f32 shard in pinned host memory (optimizer offload; type 16-bit), and a 16-bit copy of
  // it on the device, which the optimizer rewrites and the gathers read.
  ShardedStore(nn::Model& model, const Units& units, comm::Communicator& dp,
               comm::Communicator* across, uint64_t seed, bool prefetch, bool hold_for_step,
               DType type, comm::DeviceCollectives* device = nullptr, bool host_masters = false);
  ~ShardedStore() override;

  void on_block(nn::Phase phase, size_t block, bool last) override;
  void update(optim::Optimizer& opt, float lr, float grad_scale, GradSync& sync,
              int64_t step) override;
  float* values(nn::Range r) override;
  void copy_values(nn::Range r, float* dst) override;
  void take_stats(RankStats& s) override;
  // Training passes record and check the gather order and prefetch; evaluation gathers as it
  // goes. Back to training, the units evaluation left gathered (held for the step in a
  // pipeline, which no end_step() follows) are released.
  void begin_pass(bool training, int64_t) override;
  void end_step(int64_t) override;  // a training step is over: the next gather is the order's first
  void refresh_working(bool updated_too) override;  // the 16-bit shard (host masters)

 protected:
  std::pair<void*, DType> working_at(nn::Range r) override;

 private:
  struct Resident {
    Tensor memory;
    comm::Work work;             // an all-gather in flight into memory (done: resident)
    comm::NcclWork device_work;  // the same through the device collectives
  };
  void require(int unit, nn::Phase phase, size_t block);  // resident when this returns
  void start_gather(int unit, bool async);
  void release(int unit);
  bool used_by(int unit, size_t block) const;
  std::string gather_name(int unit) const;

  nn::Model& model_;
  const Units& units_;
  comm::Communicator& dp_;
  comm::DeviceCollectives* device_;
  bool prefetch_;
  bool hold_for_step_;
  DType type_;
  bool training_ = true;
  Tensor shard_;                    // this rank's shards, the master values
  Tensor shard16_;                  // host masters: their 16-bit copy on the device
  std::vector<Resident> resident_;  // per unit (memory undefined: not gathered)
  std::vector<Tensor> free_;        // gather buffers not in use
  int64_t buffer_numel_ = 0;
  std::vector<int> order_;  // the first training step's gathers
  bool recorded_ = false;
  size_t next_ = 0;  // this step's gathers so far
  int64_t steps_ = 0;
  double wait_s_ = 0, optimizer_s_ = 0, bytes_ = 0;
};

}  // namespace tessel::parallel
