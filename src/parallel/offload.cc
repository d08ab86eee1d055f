#include "offload.h"

#include <algorithm>

#include "tessel/core/memory.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

void ActivationOffload::on_block(nn::Phase phase, size_t block, nn::Activations& acts) {
  switch (phase) {
    case nn::Phase::kBeforeForward:
      break;
    case nn::Phase::kAfterForward:
      swap_out_before(block, acts);
      break;
    case nn::Phase::kBeforeBackward:
      swap_in(acts.caches[block]);
      break;
    case nn::Phase::kAfterBackward:
      acts.caches[block].release_all();
      break;
  }
}

void ActivationOffload::swap_out_before(size_t block, nn::Activations& acts) {
  // What stays on the device: block's cache and its output.
  std::vector<const Storage*> stay;
  acts.caches[block].for_each_tensor([&](const Tensor& t) { stay.push_back(&t.storage()); });
  if (acts.output.defined()) stay.push_back(&acts.output.storage());
  for (size_t c = 0; c < block; ++c) {
    acts.caches[c].for_each_tensor([&](const Tensor& t) {
      Storage& s = t.storage();
      if (s.device() == Device::kCpu || s.swapped_out() ||
          std::find(stay.begin(), stay.end(), &s) != stay.end())
        return;
      Tensor host = host_buffer(s.bytes());
      s.swap_out(host.raw(), current_stream());
      swapped_.push_back({t, std::move(host)});
    });
  }
}

void ActivationOffload::swap_in(const nn::Cache& cache) {
  cache.for_each_tensor([&](const Tensor& t) {
    Storage& s = t.storage();
    if (!s.swapped_out()) return;
    auto it = std::find_if(swapped_.begin(), swapped_.end(),
                           [&](const Swapped& w) { return &w.device.storage() == &s; });
    TESSEL_CHECK(it != swapped_.end(), "offload: a swapped-out activation of unknown origin");
    s.swap_in(it->host.raw(), current_stream());
    free_host_.push_back(std::move(it->host));
    swapped_.erase(it);
  });
}

// The smallest free host buffer that holds `bytes`, else a new one.
Tensor ActivationOffload::host_buffer(size_t bytes) {
  auto best = free_host_.end();
  for (auto it = free_host_.begin(); it != free_host_.end(); ++it)
    if (it->nbytes() >= bytes && (best == free_host_.end() || it->nbytes() < best->nbytes()))
      best = it;
  if (best == free_host_.end()) {
    MemoryScope scope(MemCategory::kOffloaded);
    return Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, Device::kCpu);
  }
  Tensor out = std::move(*best);
  free_host_.erase(best);
  return out;
}

}  // namespace tessel::parallel
