// OffloadedOptimizer (train.offload = optimizer | all, docs/gpu.md "Optimizer offload"): a device
// rank's optimizer whose state (AdamW's moments, SGD's momentum) lives in host memory, charged to
// the ledger as optimizer_offloaded (not in the rank's device total). Each step copies the
// segments' reduced gradients and f32 master values (this rank's shards under ZeRO 1-3, the
// whole arena at stage 0) from the device into pinned host buffers, runs the CPU kernel over
// them (which also writes a host 16-bit working copy where the segments have one), and copies
// the updated values (and the 16-bit copy) back to the device. The same elementwise kernel as
// the stand-in device's, so the same bits; a real GPU's AdamW may differ in the last bit.
// Internal to the parallel area; built by the Engine on a device rank.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "offload.h"
#include "tessel/optim/optimizer.h"

namespace tessel::parallel {

class OffloadedOptimizer final : public optim::Optimizer {
 public:
  // Over n elements, on the thread's current device; `working`: the 16-bit type of the
  // segments' working copies (kF32: none).
  OffloadedOptimizer(const optim::OptimSpec& spec, int64_t n, DType working);

  void step(std::span<const optim::Segment> segments, float lr, float grad_scale) override;
  std::vector<optim::StateBuffer> state() override { return host_->state(); }

 private:
  void copy(void* dst, Device to, const void* src, Device from, int64_t bytes);

  DeviceRuntime& runtime_;
  Device device_;
  DType working_;
  std::unique_ptr<optim::Optimizer> host_;  // the CPU optimizer over the host buffers
  PinnedBuffer values_, grads_;             // f32, n long
  PinnedBuffer working_copy_;               // 16-bit, n long (none: 0 bytes)
};

}  // namespace tessel::parallel
