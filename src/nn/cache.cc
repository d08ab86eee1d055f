#include "tessel/nn/cache.h"

#include <algorithm>
#include <cstring>

#include "tessel/ops/cpu.h"
#include "tessel/tensor/device.h"

namespace tessel::nn {

Tensor Cache::buffer(size_t k, const Shape& shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  auto it =
      std::find_if(buffers_.begin(), buffers_.end(), [k](const auto& b) { return b.first == k; });
  if (it == buffers_.end()) it = buffers_.insert(buffers_.end(), {k, Tensor()});
  Tensor& s = it->second;
  if (!s.defined() || s.dtype() != dtype || s.numel() < n || s.device() != current_device())
    s = Tensor::empty({std::max<int64_t>(n, 1)}, dtype, current_device());
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

void Cache::release(std::initializer_list<size_t> keep) {
  buffers_.clear();
  for (size_t k = 0; k < kept_.size(); ++k)
    if (std::find(keep.begin(), keep.end(), k) == keep.end()) kept_[k] = Tensor();
}

void Cache::release_all() {
  release();
  for (Cache& c : children_) c.release_all();
}

void Cache::release_scratch() {
  std::erase_if(buffers_, [](const auto& b) { return b.first >= kScratchBase; });
  for (Cache& c : children_) c.release_scratch();
}

int64_t Cache::bytes() const {
  int64_t total = 0;
  for (const auto& [slot, t] : buffers_) total += static_cast<int64_t>(t.storage().bytes());
  for (const Cache& c : children_) total += c.bytes();
  return total;
}

void Cache::for_each_tensor(const std::function<void(const Tensor&)>& f) const {
  for (const auto& [slot, t] : buffers_) f(t);
  for (const Tensor& t : kept_)
    if (t.defined()) f(t);
  for (const Cache& c : children_) c.for_each_tensor(f);
}

Tensor output(Cache* cache, size_t k, const Shape& shape, DType dtype) {
  return cache ? cache->buffer(k, shape, dtype) : Tensor::empty(shape, dtype, current_device());
}

// ---- KvCache ----

int64_t KvCache::add() {
  int64_t id;
  if (free_seqs_.empty()) {
    id = static_cast<int64_t>(seqs_.size());
    seqs_.emplace_back();
  } else {
    id = free_seqs_.back();
    free_seqs_.pop_back();
  }
  seqs_[static_cast<size_t>(id)].live = true;
  return id;
}

KvCache::Seq& KvCache::seq(int64_t id) {
  TESSEL_CHECK(id >= 0 && id < static_cast<int64_t>(seqs_.size()) && seqs_[id].live,
               "kv_cache: no sequence ", id);
  return seqs_[static_cast<size_t>(id)];
}

void KvCache::release(int64_t id) {
  Seq& s = seq(id);
  free_pages_.insert(free_pages_.end(), s.pages.begin(), s.pages.end());
  s = Seq();
  free_seqs_.push_back(id);
}

int64_t KvCache::length(int64_t id) const {
  TESSEL_CHECK(id >= 0 && id < static_cast<int64_t>(seqs_.size()) && seqs_[id].live,
               "kv_cache: no sequence ", id);
  return seqs_[static_cast<size_t>(id)].length;
}

void KvCache::set_step(std::vector<Run> runs) {
  for (const Run& r : runs) {
    Seq& s = seq(r.seq);
    TESSEL_CHECK(r.rows >= 0, "kv_cache: a run of ", r.rows, " rows");
    while (static_cast<int64_t>(s.pages.size()) * kPage < s.length + r.rows) {
      if (free_pages_.empty()) {
        free_pages_.push_back(static_cast<int32_t>(pages_.size()));
        pages_.emplace_back();
      }
      s.pages.push_back(free_pages_.back());
      free_pages_.pop_back();
    }
  }
  step_ = std::move(runs);
}

int64_t KvCache::step_rows() const {
  int64_t n = 0;
  for (const Run& r : step_) n += r.rows;
  return n;
}

float* KvCache::page_rows(int32_t page, size_t block, int kv, int64_t C) {
  Tensor& p = pages_[static_cast<size_t>(page)];
  if (!p.defined()) p = Tensor::empty({static_cast<int64_t>(blocks_), 2, kPage, C});
  TESSEL_CHECK(p.dim(3) == C, "kv_cache: pages of ", p.dim(3), " channels, got ", C);
  return p.data<float>() + ((static_cast<int64_t>(block) * 2 + kv) * kPage) * C;
}

// Per run: gather positions [0, length) into keys_ / values_ [length + rows, C], let the
// kernel append the run's own and attend, then copy those into the run's pages.
void KvCache::attend(size_t block, float* out, const float* qkv, int64_t C, int64_t NH) {
  TESSEL_CHECK(block < blocks_, "kv_cache: block ", block, " of ", blocks_);
  for (const Run& r : step_) {
    Seq& s = seq(r.seq);
    const int64_t keys = s.length + r.rows;
    if (static_cast<int64_t>(keys_.size()) < keys * C) {
      keys_.resize(static_cast<size_t>(keys * C));
      values_.resize(static_cast<size_t>(keys * C));
    }
    auto copy = [&](int64_t lo, int64_t hi, bool to_pages) {
      for (int64_t p = lo; p < hi;) {
        const int64_t n = std::min(hi, (p / kPage + 1) * kPage) - p;
        const int32_t page = s.pages[static_cast<size_t>(p / kPage)];
        const size_t bytes = static_cast<size_t>(n * C) * sizeof(float);
        for (int kv = 0; kv < 2; ++kv) {
          float* paged = page_rows(page, block, kv, C) + (p % kPage) * C;
          float* flat = (kv == 0 ? keys_.data() : values_.data()) + p * C;
          std::memcpy(to_pages ? paged : flat, to_pages ? flat : paged, bytes);
        }
        p += n;
      }
    };
    copy(0, s.length, false);
    ops::attention_forward_kv(out, qkv, keys_.data(), values_.data(), 1, r.rows, s.length, C, NH,
                              keys);
    copy(s.length, keys, true);
    out += r.rows * C;
    qkv += r.rows * 3 * C;
  }
}

void KvCache::finish_step() {
  for (const Run& r : step_) seq(r.seq).length += r.rows;
  step_.clear();
}

int64_t KvCache::bytes() const {
  int64_t total = 0;
  for (const Tensor& p : pages_)
    if (p.defined()) total += static_cast<int64_t>(p.nbytes());
  return total;
}

int64_t KvCache::bytes_held() const {
  int64_t total = 0;
  for (const Seq& s : seqs_)
    for (int32_t p : s.pages)
      if (pages_[static_cast<size_t>(p)].defined())
        total += static_cast<int64_t>(pages_[static_cast<size_t>(p)].nbytes());
  return total;
}

}  // namespace tessel::nn
