#include "buckets.h"

#include <algorithm>

#include "tessel/core/clock.h"

namespace tessel::parallel {

void Buckets::finish(InFlight& b, double now) {
  b.work.wait();
  if (b.finished == 0) b.finished = now;
  overlapped_s_ += std::max(0.0, std::min(b.finished, now) - b.launched);
  if (b.done) b.done();
}

void Buckets::launch(const Start& start, double bytes, Done done, size_t max_in_flight) {
  bytes_ += bytes;
  if (!async_) {  // blocking: the collective runs now, on the compute thread
    const double t0 = now_seconds();
    start(false);
    exposed_s_ += now_seconds() - t0;
    if (done) done();
    return;
  }
  while (max_in_flight > 0 && in_flight_.size() >= max_in_flight) {
    const double t0 = now_seconds();
    InFlight b = std::move(in_flight_.front());
    in_flight_.pop_front();
    const bool was_done = b.work.done();
    finish(b, t0);
    if (!was_done) exposed_s_ += now_seconds() - t0;
  }
  in_flight_.push_back({start(true), std::move(done), now_seconds(), 0});
}

void Buckets::poll() {
  const double now = now_seconds();
  for (InFlight& b : in_flight_)
    if (b.finished == 0 && b.work.done()) b.finished = now;
}

void Buckets::wait_all() {
  const double end_of_backward = now_seconds();
  for (InFlight& b : in_flight_)
    if (b.finished == 0 && b.work.done()) b.finished = end_of_backward;
  for (InFlight& b : in_flight_) finish(b, end_of_backward);
  in_flight_.clear();
  exposed_s_ += now_seconds() - end_of_backward;
}

void Buckets::take_stats(RankStats& s) {
  s.comm_exposed_s += exposed_s_;
  s.comm_overlapped_s += overlapped_s_;
  s.comm_bytes += bytes_;
  exposed_s_ = overlapped_s_ = bytes_ = 0;
}

}  // namespace tessel::parallel
