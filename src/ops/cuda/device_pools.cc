#include "device_pools.h"

#include <algorithm>

#include "tessel/core/error.h"

namespace tessel::ops::cuda {

size_t pool_size_class(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20;
  const size_t step = bytes <= (size_t{1} << 20) ? kSmall : kLarge;
  return (std::max<size_t>(bytes, 1) + step - 1) / step * step;
}

Pool::~Pool() {
  try {
    raw_.set_current(device_);
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) raw_.release(p);
  } catch (...) {  // at exit: errors have nobody to report to
  }
}

void* Pool::allocate(size_t bytes) {
  const size_t size = pool_size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
  } else {
    p = raw_.allocate(size, stats_.in_use, false);
    if (p == nullptr) {  // give the cache back, then try once more
      release_cached();
      p = raw_.allocate(size, stats_.in_use, true);
    }
    stats_.reserved += static_cast<int64_t>(size);
  }
  live_.insert(p);
  stats_.in_use += static_cast<int64_t>(size);
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return p;
}

bool Pool::free(void* p, size_t bytes) noexcept {
  const size_t size = pool_size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (live_.erase(p) == 0) return false;
  stats_.in_use -= static_cast<int64_t>(size);
  free_[size].push_back(p);
  return true;
}

PoolStats Pool::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Pool::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use = stats_.in_use;
}

void Pool::release_cached() {
  raw_.synchronize();  // the cached blocks' last work is done before they go
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) raw_.release(p);
    stats_.reserved -= static_cast<int64_t>(size * blocks.size());
    blocks.clear();
  }
}

Pool& DevicePools::current() {
  // A process that sees no GPU still gets GPU 0's pool: its first cudaMalloc names the error.
  std::call_once(made_, [this] {
    for (int d = 0; d < std::max(raw_.count(), 1); ++d)
      pools_.push_back(std::make_unique<Pool>(raw_, d));
  });
  const int device = raw_.current();
  TESSEL_CHECK(device >= 0 && device < static_cast<int>(pools_.size()),
               "cuda: the current GPU is not one cudaGetDeviceCount counts, got ", device, " of ",
               pools_.size());
  return *pools_[static_cast<size_t>(device)];
}

void DevicePools::free(void* p, size_t bytes) noexcept {
  const size_t mine = static_cast<size_t>(raw_.current());
  if (mine < pools_.size() && pools_[mine]->free(p, bytes)) return;
  for (const std::unique_ptr<Pool>& pool : pools_)
    if (pool->free(p, bytes)) return;
}

}  // namespace tessel::ops::cuda
