// Activation offload between a pipeline stage's tasks (train.offload = activations,
// docs/gpu.md "Activation offload"): inside each micro-batch's forward and backward the
// ActivationOffload moves the caches block by block, as in the local executor; between the
// tasks a micro-batch's last block goes out after its forward and comes back, prefetched
// beside the task before its backward. The schedule's order says which backward is next.
// Each block's own cache leaves after its forward, and the shared scratch is held only while
// its block runs (offload_block).
#include <algorithm>

#include "offload.h"
#include "tessel/parallel/pipeline.h"

namespace tessel::parallel {

namespace {

// Whether the backward of order[k]'s micro-batch is one of the next two tasks: its last block
// would come back (beside the task before that backward) as soon as it went out.
bool backward_soon(const std::vector<Task>& order, size_t k) {
  const Task& f = order[k];
  for (size_t i = k + 1; i < std::min(order.size(), k + 3); ++i)
    if (order[i].op == TaskOp::kBackward && order[i].chunk == f.chunk && order[i].micro == f.micro)
      return true;
  return false;
}

}  // namespace

void PipelineExecutor::offload_before(const std::vector<Task>& order, size_t k) {
  if (!offload_ || k + 1 == order.size() || order[k + 1].op != TaskOp::kBackward) return;
  const Task& next = order[k + 1];
  nn::Activations* acts = inflight_acts(next.chunk, next.micro);
  if (!acts) return;  // its forward is this task: nothing went out
  offload_->prefetch(acts->caches[part_.begin[next.chunk + 1] - 1]);
}

void PipelineExecutor::offload_after(const std::vector<Task>& order, size_t k) {
  if (!offload_ || order[k].op != TaskOp::kForward || backward_soon(order, k)) return;
  offload_->swap_out_all(*inflight_acts(order[k].chunk, order[k].micro));
}

// Around each block of a micro-batch, beyond the local executor's moves:
// - After block b's forward, not the chunk's last, b's own cache goes out too (but its output):
//   its copies run beside block b + 1's forward and are released after it, so that the copies
//   out left after the chunk's last forward (with no kernels beside them until the next task)
//   are the last block's alone.
// - The chunk's micro-batches share one scratch cache per block (acquire), which without
//   offload keeps each block's backward outputs and temporaries for the next micro-batch; here,
//   as the local executor's caches release their own scratch slots, it holds them only while
//   its block runs. The gradient a backward returns lives on while the block below reads it (a
//   reference).
void PipelineExecutor::offload_block(nn::Phase p, size_t b, int chunk, nn::Activations& acts) {
  offload_->on_block(p, b, acts);
  if (p == nn::Phase::kAfterForward && b + 1 < part_.begin[chunk + 1])
    offload_->swap_out_own(acts, b);
  if (p == nn::Phase::kAfterForward || p == nn::Phase::kAfterBackward)
    scratch_[chunk].caches[b].release_all();
}

}  // namespace tessel::parallel
