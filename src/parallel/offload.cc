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
    reclaim_host();
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
      // The forward's workspace (a convolution's unpooled output) waits neither on the device
      // nor on the host: the backward allocates its own.
      acts.caches[block].release_scratch();
      swap_out_before(block, acts);
      release_outgoing(1);  // block - 1's copies ran beside this block's forward
      break;
    case nn::Phase::kBeforeBackward:
      release_outgoing(0);
      wait_for(block, acts.caches[block]);
      if (block > 0) bring_in(block - 1, acts.caches[block - 1]);  // beside this backward
      break;
    case nn::Phase::kAfterBackward:
      acts.caches[block].release_all();
      break;
  }
}

void ActivationOffload::swap_out_before(size_t block, nn::Activations& acts) {
  reclaim_host();
  // What stays on the device: block's cache and its output.
  std::vector<const Storage*> stay;
  acts.caches[block].for_each_tensor([&](const Tensor& t) { stay.push_back(&t.storage()); });
  if (acts.output.defined()) stay.push_back(&acts.output.storage());
  std::vector<Tensor> out;  // one view of each storage to move
  for (size_t c = 0; c < block; ++c) {
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
  Outgoing going{event(), {}};
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

void ActivationOffload::bring_in(size_t block, const nn::Cache& cache) {
  Incoming in{block, nullptr, {}};
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
// block's never left): the compute stream waits for those copies.
void ActivationOffload::wait_for(size_t block, const nn::Cache& cache) {
  cache.for_each_tensor([&](const Tensor& t) {
    TESSEL_CHECK(!t.storage().swapped_out(), "offload: block ", block,
                 "'s activations are not back before its backward (a block was skipped)");
  });
  auto in = std::find_if(incoming_.rbegin(), incoming_.rend(),
                         [&](const Incoming& i) { return i.block == block; });
  if (in != incoming_.rend()) runtime_.stream_wait(current_stream(), in->event);
}

void ActivationOffload::reclaim_host() {
  for (Incoming& in : incoming_) {
    runtime_.event_synchronize(in.event);
    for (PinnedBuffer& h : in.host) free_host_.push_back(std::move(h));
    give_back(in.event);
  }
  incoming_.clear();
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
