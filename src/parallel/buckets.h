// Buckets: the gradient units of one step on their way through their collective. A sync
// launches a unit as soon as the backward pass is done with it; with overlap the collective
// runs on the communicator's progress thread while earlier blocks still compute, without it
// the collective runs right there on the compute thread. wait_all() at the step completes them
// all and splits the time into exposed (waited for) and overlapped (hidden behind the backward).
// The one bucket implementation every gradient sync shares. Internal to the parallel area.
#pragma once

#include <deque>
#include <functional>

#include "tessel/comm/communicator.h"
#include "tessel/parallel/stats.h"

namespace tessel::parallel {

class Buckets {
 public:
  // Starts a unit's collective: returns its Work (async) or completes it (blocking).
  using Start = std::function<comm::Work(bool async)>;
  // Runs once a unit's collective has completed (e.g. hands its buffer back).
  using Done = std::function<void()>;

  explicit Buckets(bool async) : async_(async) {}

  // Launches a collective of `bytes` bytes. With `max_in_flight` > 0, first waits for the
  // oldest collectives until fewer than that are in flight (bounding the buffers they hold).
  void launch(const Start& start, double bytes, Done done = {}, size_t max_in_flight = 0);
  // Notes collectives that finished in the background (call between blocks).
  void poll();
  // Completes every launched collective (the step): their time after the backward pass is
  // exposed, before it overlapped.
  void wait_all();
  bool async() const { return async_; }
  void take_stats(RankStats& s);

 private:
  struct InFlight {
    comm::Work work;
    Done done;
    double launched = 0, finished = 0;  // finished: first seen complete (0: not yet)
  };
  void finish(InFlight& b, double now);

  bool async_;
  std::deque<InFlight> in_flight_;
  double exposed_s_ = 0, overlapped_s_ = 0, bytes_ = 0;
};

}  // namespace tessel::parallel
