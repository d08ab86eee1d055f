// ParamStore: where this rank's parameter values live and which elements its optimizer
// updates. Replicated (zero.stage 0-2: every dp rank holds the values of its blocks; 1 and 2
// update their pieces and all-gather them), sharded (3: a rank holds only its pieces and
// gathers a unit for the blocks that read it), or shared (ZeRO-1 on one host: one copy in shared
// memory). A parameter-server worker has no store: ParameterServer (parameter_server.h) holds
// its values, pushes its gradients and pulls the servers' updates itself.
// Ranges are arena element ranges (units.h); the optimizer's state follows update_ranges() in
// order, so state_offset() maps a range to its state.
#pragma once

#include <vector>

#include "tessel/optim/optimizer.h"
#include "tessel/parallel/grad_sync.h"

namespace tessel::parallel {

class WorkingCopy;

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // One optimizer step over update_ranges() with sync's reduced gradients read multiplied by
  // grad_scale (clipping, loss scaling), then the new values become visible where the next
  // forward reads them.
  virtual void update(optim::Optimizer& opt, float lr, float grad_scale, GradSync& sync) = 0;
  // This rank's memory for the values of arena range r (r inside held()).
  virtual float* values(nn::Range r) = 0;
  // Copies the values of arena range r (inside the local units) into dst; collective over the
  // dp group where the values are sharded.
  virtual void copy_values(nn::Range r, float* dst) = 0;
  // Adds this part's measurements since the last call and resets them.
  virtual void take_stats(RankStats& s) = 0;

  const std::vector<nn::Range>& update_ranges() const { return update_; }  // optimizer order
  const std::vector<nn::Range>& owned() const { return owned_; }           // written to checkpoints
  const std::vector<nn::Range>& held() const { return held_; }             // values held
  // The values this rank reads from a checkpoint: held(), except where a host's ranks share one
  // copy (each then loads its own pieces, and before_start() waits for the others').
  virtual const std::vector<nn::Range>& loaded() const { return held_; }
  // Before the first forward, after any restore (collective over the store's ranks).
  virtual void before_start() {}
  int64_t update_numel() const;
  // Offset of range r (inside one update range) in the optimizer's state.
  int64_t state_offset(nn::Range r) const;
  // train.precision bf16 | fp16 (null: f32): the 16-bit copy of held() that the blocks read.
  // The optimizer rewrites the pieces it updates; the store refreshes whatever else changes.
  void set_working(WorkingCopy* working) { working_ = working; }
  // Rewrites the working copy (if any) of every held range from the master values (after a
  // restore), or with updated_too = false of those outside update_ranges() (values that came
  // from other ranks).
  void refresh_working(bool updated_too);

 protected:
  // The optimizer's segments over update_ranges() with sync's gradients.
  std::vector<optim::Segment> segments(GradSync& sync);

  std::vector<nn::Range> update_, owned_, held_;
  WorkingCopy* working_ = nullptr;
};

}  // namespace tessel::parallel
