#include "optimizer_offload.h"

#include <algorithm>

#include "tessel/tensor/device.h"

namespace tessel::parallel {

namespace {

// The host optimizer's state, allocated in host memory as optimizer_offloaded.
std::unique_ptr<optim::Optimizer> host_optimizer(const optim::OptimSpec& spec, int64_t n) {
  DeviceScope host(Device::kCpu, nullptr);
  return optim::make_optimizer(spec, n, MemCategory::kOptimizerOffloaded);
}

// n elements of `type` (at least one, so that every buffer is a block).
size_t bytes_of(int64_t n, DType type) {
  return static_cast<size_t>(std::max<int64_t>(n, 1)) * dtype_size(type);
}

}  // namespace

OffloadedOptimizer::OffloadedOptimizer(const optim::OptimSpec& spec, int64_t n, DType working)
    : Optimizer(n),
      runtime_(device_runtime(current_device())),
      device_(current_device()),
      working_(working),
      host_(host_optimizer(spec, n)),
      values_(runtime_, bytes_of(n, DType::kF32), MemCategory::kOptimizerOffloaded),
      grads_(runtime_, bytes_of(n, DType::kF32), MemCategory::kOptimizerOffloaded),
      working_copy_(runtime_, working == DType::kF32 ? 0 : bytes_of(n, working),
                    MemCategory::kOptimizerOffloaded) {}

void OffloadedOptimizer::copy(void* dst, Device to, const void* src, Device from, int64_t bytes) {
  if (bytes > 0) runtime_.copy(dst, to, src, from, static_cast<size_t>(bytes), current_stream());
}

void OffloadedOptimizer::step(std::span<const optim::Segment> segments, float lr,
                              float grad_scale) {
  auto* values = static_cast<float*>(values_.data());
  auto* grads = static_cast<float*>(grads_.data());
  const size_t wsize = dtype_size(working_);
  std::vector<optim::Segment> host;
  host.reserve(segments.size());
  for (const optim::Segment& s : segments) {  // the reduced gradients and the values, down
    TESSEL_CHECK(s.state_offset >= 0 && s.count >= 0 && s.state_offset + s.count <= numel_,
                 "optimizer offload: segment of ", s.count, " elements at state offset ",
                 s.state_offset, " is not inside the optimizer's ", numel_, " elements");
    TESSEL_CHECK(s.working == nullptr || s.working_type == working_,
                 "optimizer offload: a working copy of ", dtype_name(s.working_type),
                 ", got buffers for ", dtype_name(working_));
    const int64_t at = s.state_offset;
    copy(grads + at, Device::kCpu, s.grads, device_, s.count * 4);
    copy(values + at, Device::kCpu, s.params, device_, s.count * 4);
    void* working = s.working ? static_cast<char*>(working_copy_.data()) + at * wsize : nullptr;
    host.push_back({values + at, grads + at, s.count, at, working, s.working_type});
  }
  {
    DeviceScope cpu(Device::kCpu, nullptr);  // the CPU kernel over the host buffers
    host_->set_steps(steps_);
    host_->step(host, lr, grad_scale);
  }
  for (size_t i = 0; i < segments.size(); ++i) {  // the updated values (and 16-bit copy), up
    const optim::Segment& s = segments[i];
    copy(s.params, device_, host[i].params, Device::kCpu, s.count * 4);
    if (s.working)
      copy(s.working, device_, host[i].working, Device::kCpu,
           s.count * static_cast<int64_t>(wsize));
  }
  ++steps_;
}

}  // namespace tessel::parallel
