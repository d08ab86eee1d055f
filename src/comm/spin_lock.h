// A test-and-test-and-set lock for the few-instruction critical sections of mailboxes and
// queues. It yields the core after a short spin so that a holder preempted on an
// oversubscribed machine gets to run. Internal to the comm area.
#pragma once

#include <sched.h>

#include <atomic>

namespace tessel::comm {

class SpinLock {
 public:
  void lock() noexcept {
    for (int i = 0; locked_.exchange(true, std::memory_order_acquire); ++i) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++i > 64) sched_yield();
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace tessel::comm
