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

// The most elements one piece of a step moves (1 MiB of f32 gradients): a segment longer than
// this -- the whole arena at stage 0 -- is stepped in pieces, each overlapping the next one's
// copies.
constexpr int64_t kPiece = int64_t{1} << 18;

// The segments cut into pieces of at most kPiece elements.
std::vector<optim::Segment> pieces(std::span<const optim::Segment> segments) {
  std::vector<optim::Segment> out;
  for (const optim::Segment& s : segments)
    for (int64_t at = 0; at == 0 || at < s.count; at += kPiece) {
      const int64_t skip = s.working ? at * static_cast<int64_t>(dtype_size(s.working_type)) : 0;
      out.push_back({s.params + at, s.grads + at, std::min(kPiece, s.count - at),
                     s.state_offset + at,
                     s.working ? static_cast<char*>(s.working) + skip : nullptr, s.working_type});
    }
  return out;
}

// n elements of `type` (at least one, so that every buffer is a block).
size_t bytes_of(int64_t n, DType type) {
  return static_cast<size_t>(std::max<int64_t>(n, 1)) * dtype_size(type);
}

}  // namespace

OffloadedOptimizer::OffloadedOptimizer(const optim::OptimSpec& spec, int64_t n, DType working,
                                       bool masters_on_host)
    : Optimizer(n),
      runtime_(device_runtime(current_device())),
      device_(current_device()),
      working_(working),
      masters_on_host_(masters_on_host),
      host_(host_optimizer(spec, n)),
      values_(runtime_, masters_on_host ? 0 : bytes_of(n, DType::kF32),
              MemCategory::kOptimizerOffloaded),
      grads_(runtime_, bytes_of(n, DType::kF32), MemCategory::kOptimizerOffloaded),
      working_copy_(runtime_, working == DType::kF32 ? 0 : bytes_of(n, working),
                    MemCategory::kOptimizerOffloaded),
      stream_(runtime_.create_stream()),
      reduced_(runtime_.create_event()),
      uploaded_(runtime_.create_event()) {
  TESSEL_CHECK(!masters_on_host || working != DType::kF32,
               "optimizer offload: master values on the host need a 16-bit working copy on the "
               "device, got none (this is a bug)");
}

OffloadedOptimizer::~OffloadedOptimizer() {
  try {  // a step that threw may have left copies queued
    runtime_.record_event(uploaded_, stream_);
    runtime_.event_synchronize(uploaded_);
  } catch (...) {  // the device failed; the error was reported where it happened
  }
  for (void* e : arrived_) runtime_.destroy_event(e);
  runtime_.destroy_event(uploaded_);
  runtime_.destroy_event(reduced_);
  runtime_.destroy_stream(stream_);
}

void OffloadedOptimizer::copy(void* dst, Device to, const void* src, Device from, int64_t bytes) {
  if (bytes > 0) runtime_.copy_async(dst, to, src, from, static_cast<size_t>(bytes), stream_);
}

optim::Segment OffloadedOptimizer::download(const optim::Segment& s) {
  TESSEL_CHECK(s.state_offset >= 0 && s.count >= 0 && s.state_offset + s.count <= numel_,
               "optimizer offload: segment of ", s.count, " elements at state offset ",
               s.state_offset, " is not inside the optimizer's ", numel_, " elements");
  TESSEL_CHECK(s.working == nullptr || s.working_type == working_,
               "optimizer offload: a working copy of ", dtype_name(s.working_type),
               ", got buffers for ", dtype_name(working_));
  TESSEL_CHECK(!masters_on_host_ || s.working != nullptr,
               "optimizer offload: master values on the host but no working copy to upload for ",
               s.count, " elements at state offset ", s.state_offset, " (this is a bug)");
  const int64_t at = s.state_offset;
  float* grads = static_cast<float*>(grads_.data()) + at;
  copy(grads, Device::kCpu, s.grads, device_, s.count * 4);
  float* values = s.params;  // masters on the host: stepped where they live
  if (!masters_on_host_) {
    values = static_cast<float*>(values_.data()) + at;
    copy(values, Device::kCpu, s.params, device_, s.count * 4);
  }
  void* working = s.working ? static_cast<char*>(working_copy_.data()) +
                                  at * static_cast<int64_t>(dtype_size(working_))
                            : nullptr;
  return {values, grads, s.count, at, working, s.working_type};
}

void OffloadedOptimizer::upload(const optim::Segment& device, const optim::Segment& host) {
  if (!masters_on_host_) copy(device.params, device_, host.params, Device::kCpu, host.count * 4);
  if (device.working)
    copy(device.working, device_, host.working, Device::kCpu,
         host.count * static_cast<int64_t>(dtype_size(working_)));
}

void OffloadedOptimizer::step(std::span<const optim::Segment> whole, float lr, float grad_scale) {
  const std::vector<optim::Segment> segments = pieces(whole);
  while (arrived_.size() < segments.size()) arrived_.push_back(runtime_.create_event());
  // Every segment's downloads, in order, once the reductions on the compute stream are done.
  runtime_.record_event(reduced_, current_stream());
  runtime_.stream_wait(stream_, reduced_);
  std::vector<optim::Segment> host;
  host.reserve(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    host.push_back(download(segments[i]));
    runtime_.record_event(arrived_[i], stream_);
  }
  // Segment i steps once its downloads are in (i + 1's still in flight); its upload is queued
  // behind them and runs while i + 1 steps.
  for (size_t i = 0; i < segments.size(); ++i) {
    runtime_.event_synchronize(arrived_[i]);
    {
      DeviceScope cpu(Device::kCpu, nullptr);
      host_->set_steps(steps_);
      host_->step({&host[i], 1}, lr, grad_scale);
    }
    upload(segments[i], host[i]);
  }
  // The next forward (or gather) reads the values only after the last upload.
  runtime_.record_event(uploaded_, stream_);
  runtime_.stream_wait(current_stream(), uploaded_);
  ++steps_;
}

}  // namespace tessel::parallel
