#include "tessel/nn/cache.h"

#include <algorithm>

namespace tessel::nn {

Tensor Cache::buffer(size_t k, const Shape& shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  auto it =
      std::find_if(buffers_.begin(), buffers_.end(), [k](const auto& b) { return b.first == k; });
  if (it == buffers_.end()) it = buffers_.insert(buffers_.end(), {k, Tensor()});
  Tensor& s = it->second;
  if (!s.defined() || s.dtype() != dtype || s.numel() < n)
    s = Tensor::empty({std::max<int64_t>(n, 1)}, dtype);
  return s.view(0, shape);
}

Tensor Cache::scratch(size_t k, const Shape& shape, DType dtype) {
  return shared_ ? shared_->buffer(k, shape, dtype) : buffer(kScratchBase + k, shape, dtype);
}

void Cache::keep(size_t k, Tensor t) {
  if (kept_.size() <= k) kept_.resize(k + 1);
  kept_[k] = std::move(t);
}

const Tensor& Cache::kept(size_t k) const {
  TESSEL_CHECK(k < kept_.size() && kept_[k].defined(),
               "cache: backward() before forward() (nothing kept in slot ", k, ")");
  return kept_[k];
}

Cache& Cache::child(size_t k) {
  while (children_.size() <= k) {
    children_.emplace_back();
    if (shared_) children_.back().shared_ = &shared_->child(children_.size() - 1);
  }
  return children_[k];
}

void Cache::share_scratch(Cache* shared) {
  shared_ = shared;
  for (size_t k = 0; k < children_.size(); ++k)
    children_[k].share_scratch(shared ? &shared->child(k) : nullptr);
}

void Cache::clear() {
  kept_.clear();
  for (Cache& c : children_) c.clear();
}

int64_t Cache::bytes() const {
  int64_t total = 0;
  for (const auto& [slot, t] : buffers_) total += static_cast<int64_t>(t.storage().bytes());
  for (const Cache& c : children_) total += c.bytes();
  return total;
}

Tensor output(Cache* cache, size_t k, const Shape& shape, DType dtype) {
  return cache ? cache->buffer(k, shape, dtype) : Tensor::empty(shape, dtype);
}

}  // namespace tessel::nn
