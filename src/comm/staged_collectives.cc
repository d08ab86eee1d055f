#include "tessel/comm/staged_collectives.h"

namespace tessel::comm {

StagedCollectives::StagedCollectives(Communicator& group, Device device, void* stream)
    : group_(group), runtime_(device_runtime(device)), device_(device), stream_(stream) {}

NcclWork StagedCollectives::allreduce(void* buf, size_t count, ElemType elem, ReduceOp op,
                                      const CallOptions& call) {
  const size_t bytes = count * elem_size(elem);
  if (host_.size() < bytes) host_.resize(bytes);
  // Device -> host returns once the host copy may be read (after the kernels that wrote buf).
  runtime_.copy(host_.data(), Device::kCpu, buf, device_, bytes, stream_);
  group_.allreduce(host_.data(), count, elem, op, call);
  runtime_.copy(buf, device_, host_.data(), Device::kCpu, bytes, stream_);
  return NcclWork();  // done already
}

}  // namespace tessel::comm
