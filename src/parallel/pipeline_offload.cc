// Activation offload between a pipeline stage's tasks (train.offload = activations,
// docs/gpu.md "Activation offload"): inside each micro-batch's forward and backward the
// ActivationOffload moves the caches block by block, as in the local executor; between the
// tasks a micro-batch's last block goes out after its forward and comes back, prefetched
// beside the task before its backward. The schedule's order says which backward is next.
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

}  // namespace tessel::parallel
