#include "tessel/parallel/param_store.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <tuple>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/optim/schedule.h"
#include "tessel/tensor/device.h"
#include "working_copy.h"

namespace tessel::parallel {

int64_t ParamStore::update_numel() const {
  int64_t n = 0;
  for (const nn::Range& r : update_) n += r.size();
  return n;
}

int64_t ParamStore::state_offset(nn::Range r) const {
  int64_t offset = 0;
  for (const nn::Range& u : update_) {
    if (r.lo >= u.lo && r.hi <= u.hi) return offset + (r.lo - u.lo);
    offset += u.size();
  }
  throw Error(
      str("parallel: range [", r.lo, ", ", r.hi, ") is not updated by this rank (this is a bug)"));
}

StateView ParamStore::state(optim::Optimizer* opt) {
  StateView view{owned_,  loaded(),
                 update_, [this](nn::Range r) { return values(r); },
                 opt,     [this](nn::Range r) { return state_offset(r); },
                 {}};
  const Device device = current_device();
  if (device == Device::kCpu || host_masters_) return view;
  // Values on a device: each range asked for is read back into host memory that lives as long
  // as the view; write_back() uploads every such copy again. values(r) is this rank's own memory
  // (not copy_values, which gathers sharded values over the dp group).
  auto copies = std::make_shared<std::deque<std::pair<nn::Range, std::vector<float>>>>();
  view.values = [this, copies, device](nn::Range r) {
    copies->push_back({r, std::vector<float>(static_cast<size_t>(r.size()))});
    float* host = copies->back().second.data();
    device_runtime(device).copy(host, Device::kCpu, values(r), device,
                                copies->back().second.size() * sizeof(float), current_stream());
    return host;
  };
  view.write_back = [this, copies, device] {
    for (const auto& [r, host] : *copies)
      device_runtime(device).copy(values(r), device, host.data(), Device::kCpu,
                                  host.size() * sizeof(float), current_stream());
  };
  return view;
}

std::vector<optim::Segment> ParamStore::segments(GradSync& sync) {
  std::vector<optim::Segment> out;
  for (const nn::Range& r : update_) {
    out.push_back({values(r), sync.grads(r), r.size(), state_offset(r)});
    std::tie(out.back().working, out.back().working_type) = working_at(r);
  }
  return out;
}

std::pair<void*, DType> ParamStore::working_at(nn::Range r) {
  if (!working_) return {nullptr, DType::kF32};
  return {working_->at(r), working_->type()};
}

void ParamStore::refresh_working(bool updated_too) {
  if (!working_) return;
  const Device from = host_masters_ ? Device::kCpu : current_device();
  auto refresh = [&](nn::Range r) { working_->refresh(r, values(r), from); };
  if (updated_too) {
    for (const nn::Range& h : held_) refresh(h);
    return;
  }
  // held_ and update_ are sorted and update_ lies inside held_: refresh the gaps.
  size_t u = 0;
  for (const nn::Range& h : held_) {
    int64_t at = h.lo;
    for (; u < update_.size() && update_[u].lo < h.hi; ++u) {
      if (update_[u].lo > at) refresh({at, update_[u].lo});
      at = std::max(at, update_[u].hi);
    }
    if (at < h.hi) refresh({at, h.hi});
  }
}

}  // namespace tessel::parallel
