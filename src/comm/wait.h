// How the comm area waits. Sleeping and waking a thread costs milliseconds on small VMs (an
// idle vCPU exits to the hypervisor), while a busy-poll costs a core that, with 2 cores and N
// ranks, a peer may need. So every wait goes through three phases: spin (pause instruction)
// for spin_us, then sched_yield() until yield_us (the core goes to any runnable peer, but the
// vCPU never idles), then sleep: on a futex where a waker exists, else short naps. With more
// polling threads than cores the spin phase is skipped. Internal to the comm area.
#pragma once

#include <atomic>
#include <cstdint>

#include "tessel/comm/types.h"

namespace tessel::comm {

struct WaitPolicy {
  double spin_us = 20;
  double yield_us = 2000;
  bool oversubscribed = false;  // skip the spin phase
};

// Async calls run on progress threads that overlap with compute. There, a waiter yields only
// briefly before sleeping: when the cores are busy computing, a sleeper woken by its peer's
// futex wake preempts the computing thread at once, while a yielder waits for the next
// scheduler tick (milliseconds). effective_policy applies that on progress threads.
void set_progress_thread(bool on);
WaitPolicy effective_policy(const WaitPolicy& base);

// Blocks while *word == expected, at most timeout_s; may return early (spuriously).
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, double timeout_s);
void futex_wake_all(std::atomic<uint32_t>* word);

// Polling helper: call pause() after each unsuccessful check. The spin phase adapts per thread
// (additive increase, multiplicative decrease, like an adaptive mutex): a wait that ends soon
// after its spin ran out says the spin did not help (the peer was slower, or needed this very
// core), so the next spin is halved, down to kMinSpinUs; a wait that ends while spinning lets
// the spin grow back to policy.spin_us. Under other load this turns a 20 us busy-wait per
// hand-off into a yield; on idle cores it keeps the sub-microsecond hand-off.
class Backoff {
 public:
  explicit Backoff(const WaitPolicy& policy);
  ~Backoff();
  Backoff(const Backoff&) = delete;
  Backoff& operator=(const Backoff&) = delete;
  // Spins, yields or naps depending on how long the wait has lasted.
  void pause();
  // True once spinning and yielding are over: a futex waiter should sleep now.
  bool should_sleep();
  double elapsed_s() const;

 private:
  static constexpr double kMinSpinUs = 2;
  WaitPolicy policy_;  // a copy: callers pass temporaries (effective_policy)
  double start_;
  double spin_us_;  // this wait's spin budget
};

// A one-shot completion flag that a waiter can sleep on. signal() wakes the waiter without
// completing: it says there is work the waiter should do itself (see the threads transport).
class Event {
 public:
  bool is_set() const { return (word_.load(std::memory_order_acquire) & kSet) != 0; }
  bool is_signalled() const { return (word_.load(std::memory_order_acquire) & kSignal) != 0; }
  void set() noexcept;
  void signal() noexcept;
  // Waits until set or signalled (returns true), the deadline passes (returns false) or stop()
  // returns true (returns false); stop is checked every few milliseconds while asleep.
  template <typename Stop>
  bool wait(Deadline deadline, const WaitPolicy& policy, Stop&& stop);

 private:
  static constexpr uint32_t kSet = 1, kSleeper = 2, kSignal = 4;
  std::atomic<uint32_t> word_{0};
};

template <typename Stop>
bool Event::wait(Deadline deadline, const WaitPolicy& policy, Stop&& stop) {
  Backoff backoff(policy);
  for (uint32_t i = 0;; ++i) {
    if (word_.load(std::memory_order_acquire) & (kSet | kSignal)) return true;
    bool sleeping = backoff.should_sleep();
    if ((sleeping || (i & 63) == 0) && (stop() || deadline.expired()))
      return (word_.load(std::memory_order_acquire) & (kSet | kSignal)) != 0;
    if (!sleeping) {
      backoff.pause();
      continue;
    }
    uint32_t w = 0;
    if (word_.compare_exchange_strong(w, kSleeper, std::memory_order_acq_rel) || w == kSleeper) {
      double t = deadline.remaining_s();
      futex_wait(&word_, kSleeper, t < 0.005 ? (t > 0 ? t : 0) : 0.005);
    }
  }
}

}  // namespace tessel::comm
