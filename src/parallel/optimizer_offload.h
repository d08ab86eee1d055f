// OffloadedOptimizer (train.offload = optimizer | all, docs/gpu.md "Optimizer offload"): a device
// rank's optimizer whose state (AdamW's moments, SGD's momentum) lives in host memory, charged to
// the ledger as optimizer_offloaded (not in the rank's device total). Where the precision keeps
// f32 master values apart from a 16-bit working copy (bf16, fp16) the masters live in pinned
// host memory only (the store puts them there: masters_on_host), and each step moves just the
// reduced gradients down and the 16-bit copy up. In fp32 the device's values are the ones the
// forward reads: they come down with the gradients and go up after the step.
// The step overlaps the copies with the CPU kernel, segment by segment (a segment: one update
// range of the store, optim::Segment, cut into pieces of at most 1 MiB of gradients): every
// segment's downloads are queued on a copy stream of its own after an event of the compute stream
// (the reductions that wrote the gradients); the CPU steps segment i as soon as its downloads have
// arrived (segment i + 1's are in flight) and queues its upload, which runs while segment i + 1
// steps; the compute stream waits for the last upload's event before its next work reads the
// values. The same elementwise kernel as the stand-in device's, so the same bits; a real GPU's
// AdamW may differ in the last bit. Internal to the parallel area; built by the Engine on a device
// rank; one thread.
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
  // segments' working copies (kF32: none). masters_on_host: the segments' values are pinned
  // host memory (their only home), else device memory.
  OffloadedOptimizer(const optim::OptimSpec& spec, int64_t n, DType working, bool masters_on_host);
  ~OffloadedOptimizer() override;  // waits for every copy, then gives back the stream and events
  OffloadedOptimizer(const OffloadedOptimizer&) = delete;
  OffloadedOptimizer& operator=(const OffloadedOptimizer&) = delete;

  void step(std::span<const optim::Segment> segments, float lr, float grad_scale) override;
  std::vector<optim::StateBuffer> state() override { return host_->state(); }

 private:
  // Segment s's host buffers, its downloads queued on the copy stream.
  optim::Segment download(const optim::Segment& s);
  void upload(const optim::Segment& device, const optim::Segment& host);
  void copy(void* dst, Device to, const void* src, Device from, int64_t bytes);

  DeviceRuntime& runtime_;
  Device device_;
  DType working_;
  bool masters_on_host_;
  std::unique_ptr<optim::Optimizer> host_;  // the CPU optimizer over the host buffers
  PinnedBuffer values_, grads_;             // f32, n long (values_: 0 bytes, masters_on_host)
  PinnedBuffer working_copy_;               // 16-bit, n long (none: 0 bytes)
  void* stream_;                            // the copy stream
  void* reduced_;                           // on the compute stream: the gradients are written
  std::vector<void*> arrived_;              // per segment: its downloads are done
  void* uploaded_;                          // after the step's last upload
};

}  // namespace tessel::parallel
