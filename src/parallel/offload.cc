#include "offload.h"

#include <algorithm>
#include <utility>

#include "tessel/core/memory.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

// ---- PinnedBuffer ----

PinnedBuffer::PinnedBuffer(DeviceRuntime& runtime, size_t bytes, MemCategory category)
    : runtime_(&runtime),
      data_(runtime.allocate_pinned(bytes)),
      bytes_(bytes),
      category_(category) {
  if ((ledger_ = current_ledger())) ledger_->charge(category_, static_cast<int64_t>(bytes));
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ == nullptr) return;
  runtime_->free_pinned(data_, bytes_);
  if (ledger_) ledger_->release(category_, static_cast<int64_t>(bytes_));
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : runtime_(o.runtime_),
      data_(std::exchange(o.data_, nullptr)),
      bytes_(o.bytes_),
      category_(o.category_),
      ledger_(std::move(o.ledger_)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  std::swap(runtime_, o.runtime_);
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  std::swap(category_, o.category_);
  std::swap(ledger_, o.ledger_);
  return *this;
}

// ---- ActivationOffload ----

ActivationOffload::ActivationOffload()
    : runtime_(device_runtime(current_device())),
      copy_stream_(runtime_.create_stream()),
      compute_event_(runtime_.create_event()) {}

ActivationOffload::~ActivationOffload() {
  try {
    release_outgoing(0);
    reclaim_host(true);
  } catch (...) {  // a failed wait: the device's error was thrown where it happened
  }
  waiting_.clear();
  free_host_.clear();
  for (void* e : free_events_) runtime_.destroy_event(e);
  runtime_.destroy_event(compute_event_);
  runtime_.destroy_stream(copy_stream_);
}

void ActivationOffload::on_block(nn::Phase phase, size_t block, nn::Activations& acts) {
  switch (phase) {
    case nn::Phase::kBeforeForward:
      break;
    case nn::Phase::kAfterForward:
      ++computed_;
      // The forward's workspace (a convolution's unpooled output) waits neither on the device
      // nor on the host: the backward allocates its own.
      acts.caches[block].release_scratch();
      swap_out(acts, block, &acts.caches[block]);
      release_beside();  // the copies queued before ran beside this block's forward
      break;
    case nn::Phase::kBeforeBackward:
      release_beside();  // the rest after this block's backward, which runs beside them
      wait_for(block, acts.caches[block]);
      if (block > 0) bring_in(acts.caches[block - 1]);  // beside this backward
      break;
    case nn::Phase::kAfterBackward:
      ++computed_;
      release_beside();
      acts.caches[block].release_all();
      break;
  }
}

// The copies queued after the last block's forward and these are released by the next task's
// hooks, once they ran beside its kernels.
void ActivationOffload::swap_out_all(nn::Activations& acts) {
  swap_out(acts, acts.caches.size(), nullptr);
  release_beside();
}

void ActivationOffload::swap_out(nn::Activations& acts, size_t end, const nn::Cache* stay_cache) {
  reclaim_host();
  std::vector<const Storage*> stay = {resident_};
  if (stay_cache)
    stay_cache->for_each_tensor([&](const Tensor& t) { stay.push_back(&t.storage()); });
  if (acts.output.defined()) stay.push_back(&acts.output.storage());
  std::vector<Tensor> out;  // one view of each storage to move
  for (size_t c = 0; c < end; ++c) {
    acts.caches[c].for_each_tensor([&](const Tensor& t) {
      const Storage& s = t.storage();
      const auto same = [&](const Tensor& o) { return &o.storage() == &s; };
      if (s.device() == Device::kCpu || s.swapped_out() ||
          std::find(stay.begin(), stay.end(), &s) != stay.end() ||
          std::find_if(out.begin(), out.end(), same) != out.end())
        return;
      out.push_back(t);
    });
  }
  if (out.empty()) return;
  std::vector<PinnedBuffer> host;  // first, so that no copy is queued when one fails
  for (const Tensor& t : out) host.push_back(host_buffer(t.storage().bytes()));
  copy_after_compute();
  Outgoing going{event(), {}, computed_};
  for (size_t i = 0; i < out.size(); ++i) {
    going.blocks.push_back(out[i].storage().swap_out(host[i].data(), copy_stream_));
    waiting_.push_back({std::move(out[i]), std::move(host[i])});
  }
  runtime_.record_event(going.event, copy_stream_);
  outgoing_.push_back(std::move(going));
}

void ActivationOffload::release_outgoing(size_t keep) {
  while (outgoing_.size() > keep) {
    Outgoing& o = outgoing_.front();
    runtime_.event_synchronize(o.event);
    o.blocks.clear();  // back to the pool: no copy reads them any more
    give_back(o.event);
    outgoing_.erase(outgoing_.begin());
  }
}

void ActivationOffload::release_beside() {
  size_t keep = outgoing_.size();
  while (keep > 0 && outgoing_[outgoing_.size() - keep].computed < computed_) --keep;
  release_outgoing(keep);
}

void ActivationOffload::bring_in(const nn::Cache& cache) {
  Incoming in{&cache, nullptr, {}};
  cache.for_each_tensor([&](const Tensor& t) {
    Storage& s = t.storage();
    if (!s.swapped_out()) return;
    auto it = std::find_if(waiting_.begin(), waiting_.end(),
                           [&](const Waiting& w) { return &w.device.storage() == &s; });
    TESSEL_CHECK(it != waiting_.end(), "offload: a swapped-out activation of unknown origin");
    if (in.host.empty()) copy_after_compute();  // the pool may hand out memory kernels used
    s.swap_in(it->host.data(), copy_stream_);
    in.host.push_back(std::move(it->host));
    waiting_.erase(it);
  });
  if (in.host.empty()) return;
  in.event = event();
  runtime_.record_event(in.event, copy_stream_);
  incoming_.push_back(std::move(in));
}

// Block b's storages came back with the prefetch during block b + 1's backward (the last
// block's never left, or came back beside the pipeline task before): the compute stream waits
// for those copies.
void ActivationOffload::wait_for(size_t block, const nn::Cache& cache) {
  cache.for_each_tensor([&](const Tensor& t) {
    TESSEL_CHECK(!t.storage().swapped_out(), "offload: block ", block,
                 "'s activations are not back before its backward (a block was skipped)");
  });
  for (Incoming& in : incoming_)
    if (in.cache == &cache && !in.waited) {
      runtime_.stream_wait(current_stream(), in.event);
      in.waited = true;
    }
}

void ActivationOffload::reclaim_host(bool all) {
  const auto reclaim = [&](Incoming& in) {
    if (!all && !in.waited) return false;  // a prefetch for a backward to come
    runtime_.event_synchronize(in.event);
    for (PinnedBuffer& h : in.host) free_host_.push_back(std::move(h));
    give_back(in.event);
    return true;
  };
  incoming_.erase(std::remove_if(incoming_.begin(), incoming_.end(), reclaim), incoming_.end());
}

// The compute stream's work so far (the forward that wrote what goes out; the kernels that
// used a device block the pool hands out again) before the copy stream's next.
void ActivationOffload::copy_after_compute() {
  runtime_.record_event(compute_event_, current_stream());
  runtime_.stream_wait(copy_stream_, compute_event_);
}

// The smallest free host buffer that holds `bytes`, else a new one.
PinnedBuffer ActivationOffload::host_buffer(size_t bytes) {
  auto best = free_host_.end();
  for (auto it = free_host_.begin(); it != free_host_.end(); ++it)
    if (it->bytes() >= bytes && (best == free_host_.end() || it->bytes() < best->bytes()))
      best = it;
  if (best == free_host_.end()) return PinnedBuffer(runtime_, bytes, MemCategory::kOffloaded);
  PinnedBuffer out = std::move(*best);
  free_host_.erase(best);
  return out;
}

void* ActivationOffload::event() {
  if (free_events_.empty()) return runtime_.create_event();
  void* e = free_events_.back();
  free_events_.pop_back();
  return e;
}

void ActivationOffload::give_back(void* event) { free_events_.push_back(event); }

}  // namespace tessel::parallel
