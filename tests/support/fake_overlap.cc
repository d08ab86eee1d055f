// The fake runtime's overlap slots (tests/support/fake_device.h): pinned host blocks, lazy
// copy streams and events.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "fake_device.h"

namespace tessel::fakes {

void* FakeRuntime::allocate_pinned(size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  // 64-byte aligned, as Storage::rebind asks (cudaHostAlloc gives whole pages)
  const size_t size = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, size);
  std::memset(p, 0xFF, size);
  pinned[p] = bytes;
  pinned_in_use += static_cast<int64_t>(bytes);
  pinned_peak = std::max(pinned_peak, pinned_in_use);
  return p;
}

void FakeRuntime::free_pinned(void* p, size_t bytes) noexcept {
  std::lock_guard<std::recursive_mutex> lock(mu);
  EXPECT_EQ(pinned[p], bytes);
  EXPECT_FALSE(cancel_pending(p, bytes)) << "pinned memory freed while a queued copy still uses it";
  pinned_in_use -= static_cast<int64_t>(bytes);
  pinned.erase(p);
  std::free(p);
}

void* FakeRuntime::create_stream() {
  std::lock_guard<std::recursive_mutex> lock(mu);
  void* s = new char;
  queues_[s];
  return s;
}

void FakeRuntime::destroy_stream(void* stream) noexcept {
  std::lock_guard<std::recursive_mutex> lock(mu);
  const Queue& q = queues_[stream];
  EXPECT_EQ(q.ran, q.copies.size()) << "a stream destroyed with copies nobody waited for";
  queues_.erase(stream);
  delete static_cast<char*>(stream);
}

void* FakeRuntime::create_event() {
  std::lock_guard<std::recursive_mutex> lock(mu);
  void* e = new char;
  events_[e];
  return e;
}

void FakeRuntime::destroy_event(void* event) noexcept {
  std::lock_guard<std::recursive_mutex> lock(mu);
  EXPECT_EQ(events_.erase(event), 1u);
  delete static_cast<char*>(event);
}

void FakeRuntime::record_event(void* event, void* stream) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  ASSERT_EQ(events_.count(event), 1u) << "record_event of an unknown event";
  auto q = queues_.find(stream);
  events_[event] = q == queues_.end() ? Mark{} : Mark{stream, q->second.copies.size()};
}

// The stream waiting runs at once or later; either way the event's work must have run before
// the stream's next work, so it runs now.
void FakeRuntime::stream_wait(void*, void* event) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  ASSERT_EQ(events_.count(event), 1u) << "stream_wait on an unknown event";
  run_until(events_[event]);
}

void FakeRuntime::event_synchronize(void* event) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  ASSERT_EQ(events_.count(event), 1u) << "event_synchronize on an unknown event";
  const Mark& mark = events_[event];
  run_until(mark);
  if (mark.stream != nullptr && queues_.at(mark.stream).ran < queues_.at(mark.stream).copies.size())
    ++waits_with_copies_behind;
}

void FakeRuntime::copy_async(void* dst, Device dst_device, const void* src, Device src_device,
                             size_t bytes, void* stream) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  const bool to_host = dst_device == Device::kCpu;
  EXPECT_NE(to_host, src_device == Device::kCpu) << "copy_async is between host and device";
  EXPECT_TRUE(owns(to_host ? src : dst, bytes));
  EXPECT_TRUE(owns_pinned(to_host ? dst : src, bytes)) << "copy_async of pageable host memory";
  async_streams.push_back(stream);
  AsyncCopies& counts = to_host ? async_to_host : async_to_device;
  ++counts.queued;
  counts.bytes += static_cast<int64_t>(bytes);
  if (to_host) to_host_bytes += static_cast<int64_t>(bytes);
  const Queued c{
      dst, src, bytes, to_host, std::this_thread::get_id(), kernels_[std::this_thread::get_id()]};
  auto q = queues_.find(stream);
  if (q == queues_.end()) {
    std::memmove(dst, src, bytes);
    return;
  }
  q->second.copies.push_back(c);
}

void FakeRuntime::run_until(const Mark& mark) {
  if (mark.stream == nullptr) return;
  Queue& q = queues_.at(mark.stream);
  for (; q.ran < mark.position; ++q.ran) {
    const Queued& c = q.copies[q.ran];
    std::memmove(c.dst, c.src, c.bytes);
    if (kernels_[c.thread] > c.kernels_before)
      ++(c.to_host ? async_to_host : async_to_device).overlapped;
  }
}

bool FakeRuntime::pending(const void* p, size_t bytes) const {
  std::lock_guard<std::recursive_mutex> lock(mu);
  for (const auto& [stream, q] : queues_)
    for (size_t i = q.ran; i < q.copies.size(); ++i)
      if (q.copies[i].uses(p, bytes)) return true;
  return false;
}

// Whether a queued copy uses [p, p + bytes); such copies are emptied, so that a test that
// frees memory under them fails its check instead of writing freed memory later.
bool FakeRuntime::cancel_pending(const void* p, size_t bytes) {
  bool found = false;
  for (auto& [stream, q] : queues_)
    for (size_t i = q.ran; i < q.copies.size(); ++i)
      if (q.copies[i].uses(p, bytes)) {
        q.copies[i].bytes = 0;
        found = true;
      }
  return found;
}

bool FakeRuntime::Queued::uses(const void* p, size_t n) const {
  const auto overlaps = [&](const void* base) {
    const char *lo = static_cast<const char*>(p), *b = static_cast<const char*>(base);
    return lo < b + bytes && b < lo + n;
  };
  return bytes > 0 && (overlaps(dst) || overlaps(src));
}

void FakeRuntime::count_kernel() {
  std::lock_guard<std::recursive_mutex> lock(mu);
  ++kernels_[std::this_thread::get_id()];
}

bool FakeRuntime::owns_pinned(const void* p, size_t bytes) const {
  for (const auto& [base, size] : pinned)
    if (p >= base && static_cast<const char*>(p) + bytes <= static_cast<char*>(base) + size)
      return true;
  return false;
}

}  // namespace tessel::fakes
