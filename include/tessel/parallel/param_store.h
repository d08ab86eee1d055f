// ParamStore: where this rank's parameter values live and which elements its optimizer
// updates. Replicated (zero.stage 0-2: every dp rank holds the values of its blocks; 1 and 2
// update their shards and all-gather them), sharded (3: a rank holds only its shards and
// gathers a unit for the blocks that read it), shared (ZeRO-1 on one host: one copy in shared
// memory), or remote (the parameter servers, parameter_server.h: a worker holds a copy of the
// values, its update pushes the gradient and pulls the servers' values; a server rank holds
// its range and serves the workers). The Engine drives every store alike: the lifecycle hooks
// below (start, passes, step ends, checkpoint state, report, serve) default to nothing.
// Ranges are arena element ranges (units.h); the optimizer's state follows update_ranges() in
// order, so state_offset() maps a range to its state.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/optim/optimizer.h"
#include "tessel/parallel/grad_sync.h"

namespace tessel::parallel {

class WorkingCopy;

// What a rank holds of the model's state, as checkpoints see it.
struct StateView {
  std::vector<nn::Range> owned;    // written by this rank (every element by exactly one rank)
  std::vector<nn::Range> held;     // values this rank loads when restoring
  std::vector<nn::Range> updated;  // elements of its optimizer (state loaded when restoring)
  // A range's values in host memory: the store's own on the CPU; on a device a host copy,
  // which write_back() uploads again (a restore writes into it).
  std::function<float*(nn::Range)> values;
  optim::Optimizer* optimizer = nullptr;
  std::function<int64_t(nn::Range)> state_offset;  // a range's place in the optimizer state
  std::vector<ckpt::ShardSlice> extra;  // more of this rank's state (compression), written as is
  std::function<void()> write_back = [] {};  // see values
};

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // Optimizer step `step` (0-based) over update_ranges() with sync's reduced gradients read
  // multiplied by grad_scale (clipping, loss scaling), then the new values become visible where
  // the next forward reads them.
  virtual void update(optim::Optimizer& opt, float lr, float grad_scale, GradSync& sync,
                      int64_t step) = 0;
  // This rank's memory for the values of arena range r (r inside held()).
  virtual float* values(nn::Range r) = 0;
  // Copies the values of arena range r (inside the local units) into dst; collective over the
  // dp group where the values are sharded.
  virtual void copy_values(nn::Range r, float* dst) = 0;
  // Adds this part's measurements since the last call and resets them.
  virtual void take_stats(RankStats& s) = 0;

  const std::vector<nn::Range>& update_ranges() const { return update_; }  // optimizer order
  // The values this rank reads from a checkpoint: the values it holds, except where a host's
  // ranks share one copy (each then loads its own shards, and before_start() waits for the
  // others').
  virtual const std::vector<nn::Range>& loaded() const { return held_; }

  // Optional hooks (the defaults do nothing):
  // Before the first forward, after any restore (collective over the store's ranks).
  virtual void before_start() {}
  // Before each training (or evaluation) piece of a step; after each step's update.
  virtual void begin_pass(bool /*training*/, int64_t /*step*/) {}
  virtual void end_step(int64_t /*step*/) {}
  // After the last step: nothing more is asked of other ranks.
  virtual void finish() {}
  // What checkpoints see of this rank's state: by default the ranges it writes, loaded() and
  // update_ranges() with the state of `opt`, this rank's optimizer.
  virtual StateView state(optim::Optimizer* opt);
  // State beside the values that must survive a checkpoint (compressed pushes' residuals) as one
  // vector, its length first; empty when there is none. load_state() throws IoError when the
  // vector does not fit this layout.
  virtual std::vector<float> save_state() { return {}; }
  virtual void load_state(const std::vector<float>& /*state*/) {}
  // Rank 0, state held outside the training ranks (the parameter servers'): writes its shards of
  // a checkpoint into dir (returns them, sets the optimizer step count); feeds its values in
  // arena order to consume(range, values).
  virtual std::vector<ckpt::ShardFile> write_remote(const std::string& /*dir*/,
                                                    int64_t* /*optimizer_steps*/) {
    return {};
  }
  virtual void read_remote(const std::function<void(nn::Range, const float*)>& /*consume*/) {}
  // This part's figures for the per-rank report (collective over the training ranks).
  virtual nlohmann::json report() { return nlohmann::json::object(); }
  // A rank that does not train (a parameter server): serves the training ranks until they
  // finish (lr(step): the schedule) and returns its figures.
  virtual nlohmann::json serve(const std::function<float(int64_t)>& /*lr*/) { return {}; }
  int64_t update_numel() const;
  // Offset of range r (inside one update range) in the optimizer's state.
  int64_t state_offset(nn::Range r) const;
  // train.precision bf16 | fp16 (null: f32): the 16-bit copy of held() that the blocks read.
  // The optimizer rewrites the shards it updates; the store refreshes whatever else changes.
  void set_working(WorkingCopy* working) { working_ = working; }
  // Rewrites the working copy (if any) of every held range from the master values (after a
  // restore), or with updated_too = false of those outside update_ranges() (values that came
  // from other ranks).
  virtual void refresh_working(bool updated_too);

 protected:
  // The optimizer's segments over update_ranges() with sync's gradients.
  std::vector<optim::Segment> segments(GradSync& sync);
  // The 16-bit copy of update range r that the optimizer rewrites (null: none) and its type.
  virtual std::pair<void*, DType> working_at(nn::Range r);

  std::vector<nn::Range> update_, owned_, held_;
  WorkingCopy* working_ = nullptr;
  // The f32 master values live in pinned host memory on a device rank (optimizer offload in
  // bf16 | fp16, docs/gpu.md): values() is host memory, the blocks read a 16-bit device copy.
  bool host_masters_ = false;
};

}  // namespace tessel::parallel
