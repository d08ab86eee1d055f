#include "wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "tessel/core/clock.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TESSEL_CPU_RELAX() _mm_pause()
#else
#define TESSEL_CPU_RELAX() \
  do {                     \
  } while (0)
#endif

namespace tessel::comm {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, double timeout_s) {
  if (!(timeout_s > 0)) return;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout_s);
  ts.tv_nsec = static_cast<long>((timeout_s - std::floor(timeout_s)) * 1e9);
  // std::atomic<uint32_t> is a plain 32-bit word on Linux, which is what futex needs.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr,
          0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
          nullptr, 0);
}

namespace {
thread_local bool t_progress_thread = false;
}  // namespace

void set_progress_thread(bool on) { t_progress_thread = on; }

WaitPolicy effective_policy(const WaitPolicy& base) {
  if (!t_progress_thread) return base;
  WaitPolicy p = base;
  p.yield_us = std::min(p.yield_us, 50.0);
  return p;
}

namespace {
thread_local double t_spin_us = -1;  // this thread's learned spin budget
}  // namespace

Backoff::Backoff(const WaitPolicy& policy) : policy_(policy), start_(now_seconds()) {
  if (t_spin_us < 0) t_spin_us = policy.spin_us;
  spin_us_ = policy.oversubscribed ? 0 : std::min(policy.spin_us, t_spin_us);
}

Backoff::~Backoff() {
  if (policy_.oversubscribed || policy_.spin_us <= 0) return;
  double us = elapsed_s() * 1e6;
  if (us <= spin_us_)
    t_spin_us = std::min(policy_.spin_us, t_spin_us + 1);
  else if (us < spin_us_ + 200)  // ended just after the spin: spinning longer would not help
    t_spin_us = std::max(kMinSpinUs, t_spin_us / 2);
  // A long wait (a busy peer) says nothing about hand-offs: keep the budget.
}

double Backoff::elapsed_s() const { return now_seconds() - start_; }

bool Backoff::should_sleep() { return elapsed_s() * 1e6 >= spin_us_ + policy_.yield_us; }

void Backoff::pause() {
  double us = elapsed_s() * 1e6;
  if (us < spin_us_) {
    for (int i = 0; i < 16; ++i) TESSEL_CPU_RELAX();
  } else if (us < spin_us_ + policy_.yield_us) {
    sched_yield();
  } else {
    // Nap: short at first so a late peer costs little, longer when the wait drags on.
    timespec ts{0, us < 100000 ? 50000 : 1000000};
    nanosleep(&ts, nullptr);
  }
}

void Event::set() noexcept {
  if (word_.exchange(kSet, std::memory_order_acq_rel) & kSleeper) futex_wake_all(&word_);
}

void Event::signal() noexcept {
  if (word_.fetch_or(kSignal, std::memory_order_acq_rel) & kSleeper) futex_wake_all(&word_);
}

}  // namespace tessel::comm
