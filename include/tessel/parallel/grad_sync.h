// The parts an Engine composes (engine.h), as interfaces:
//   BlockHooks  acts around every block's forward and backward (ZeRO-3 gathers, bucket launches);
//   GradSync    holds this rank's gradient memory and turns it into the global gradient:
//               all-reduced buckets (zero.stage 0), reduce-scattered buckets (1; 2 and 3 into a
//               gradient shard), an exact integer sum (deterministic mode), or sums read
//               straight from the other ranks' memory (ZeRO-1 on one host);
//   ParamStore  holds the parameter values and the optimizer over the elements this rank
//               updates (param_store.h).
// The element ranges a rank updates and writes are shards of Units (units.h).
#pragma once

#include <cstddef>
#include <vector>

#include "tessel/nn/model.h"
#include "tessel/parallel/stats.h"

namespace tessel::parallel {

class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  // Around local block `block`'s forward or backward. `last`: this is the block's last backward
  // of the step (no accumulation pass or micro-batch follows).
  virtual void on_block(nn::Phase phase, size_t block, bool last) = 0;
};

class GradSync {
 public:
  virtual ~GradSync() = default;
  // At the step, after the last backward: on return grads(r) of every range this rank updates
  // holds the gradient summed over every rank's rows.
  virtual void reduce() = 0;
  // The squared norm of the global gradient (collective over the training ranks).
  virtual double sq_norm() = 0;
  // The reduced gradient of arena range r (r inside what this rank updates).
  virtual float* grads(nn::Range r) = 0;
  // After the update: the next step's gradients start from zero.
  virtual void clear() = 0;
  // Adds this part's measurements since the last call and resets them.
  virtual void take_stats(RankStats& s) = 0;
  // State that must survive a checkpoint (compression residuals, PowerSGD's Q) as one vector,
  // its length first; empty (the default) when there is none.
  virtual std::vector<float> save_state() { return {}; }
  // Restores save_state()'s vector; throws IoError when it does not fit this layout.
  virtual void load_state(const std::vector<float>& state) { (void)state; }
};

}  // namespace tessel::parallel
