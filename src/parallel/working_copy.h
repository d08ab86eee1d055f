// WorkingCopy: train.precision = bf16 | fp16 with parameters held whole on this rank (zero.stage
// 0-2, the shared-memory step, a bf16 parameter-server worker): a 16-bit copy of the f32 master
// values over the local units, which the blocks read (bound to the model in place of the
// masters). The optimizer writes the shards it updates while they are in cache
// (optim::Segment::working); refresh() converts the rest after they arrive (all-gathers, the
// shared-memory barrier, a pull, a restore). ZeRO-3 needs none: it gathers 16-bit values per
// unit. Charged to the parameters' memory. On a device rank the masters may live on the host
// (optimizer offload): then this copy is the device's only copy of the values. Internal to the
// parallel area.
#pragma once

#include <vector>

#include "tessel/nn/model.h"
#include "tessel/parallel/units.h"

namespace tessel::parallel {

class WorkingCopy {
 public:
  WorkingCopy(nn::Model& model, const Units& units, DType type);

  DType type() const { return type_; }
  // Where arena range r (inside the local units) of the copy lives.
  void* at(nn::Range r) const;
  // The copy of range r from the f32 values at src, in the memory of `from` (the part of r
  // inside the local units). Masters on the host (optimizer offload) are rounded there and go up.
  void refresh(nn::Range r, const float* src, Device from);

 private:
  const Units& units_;
  DType type_;
  Tensor values_;  // units_.span
};

}  // namespace tessel::parallel
