#include <utility>

#include "comm_state.h"
#include "tessel/core/error.h"
#include "tessel/core/trace.h"

namespace tessel::comm {
namespace detail {

bool WorkState::poll() noexcept {
  if (done.is_set()) return true;
  try {
    if (!request->test()) return false;
  } catch (const std::exception& e) {
    error = std::current_exception();
    transport->abort(e.what());
  }
  request.reset();
  done.set();
  return true;
}

Progress::Progress(const WaitPolicy& policy) : policy_(policy), thread_([this] { loop(); }) {}

Progress::~Progress() {
  stop_.store(true, std::memory_order_release);
  signal_.fetch_add(1, std::memory_order_acq_rel);
  futex_wake_all(&signal_);
  thread_.join();
}

void Progress::submit(std::shared_ptr<WorkState> work) {
  {
    std::lock_guard<SpinLock> lock(mu_);
    queue_.push_back(work);
    last_ = std::move(work);
  }
  signal_.fetch_add(1, std::memory_order_acq_rel);
  if (sleeping_.load(std::memory_order_acquire)) futex_wake_all(&signal_);
}

void Progress::drain() {
  std::shared_ptr<WorkState> last;
  {
    std::lock_guard<SpinLock> lock(mu_);
    last = last_;
  }
  if (last) last->done.wait(Deadline::never(), policy_, [] { return false; });
}

void Progress::loop() {
  set_progress_thread(true);
  set_trace_thread_name("comm progress");
  for (;;) {
    uint32_t seen = signal_.load(std::memory_order_acquire);
    std::shared_ptr<WorkState> work;
    {
      std::lock_guard<SpinLock> lock(mu_);
      if (!queue_.empty()) {
        work = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (work) {
      try {
        work->task();
      } catch (...) {
        work->error = std::current_exception();
      }
      work->task = nullptr;  // drop captured state before completing
      work->done.set();
      continue;
    }
    if (stop_.load(std::memory_order_acquire)) return;
    // Idle: spin a little for the next bucket, then sleep until submit() wakes us.
    Backoff backoff(policy_);
    while (signal_.load(std::memory_order_acquire) == seen &&
           backoff.elapsed_s() * 1e6 < policy_.spin_us)
      backoff.pause();
    if (signal_.load(std::memory_order_acquire) != seen) continue;
    sleeping_.store(true, std::memory_order_seq_cst);
    if (signal_.load(std::memory_order_seq_cst) == seen) futex_wait(&signal_, seen, 0.1);
    sleeping_.store(false, std::memory_order_relaxed);
  }
}

}  // namespace detail

bool Work::done() const { return !s_ || (s_->p2p ? s_->poll() : s_->done.is_set()); }

void Work::wait() const { wait(Deadline::never()); }

void Work::wait(Deadline deadline) const {
  if (!s_) return;
  detail::WorkState& w = *s_;
  if (w.p2p) {
    // Point to point: the waiter drives the request itself.
    if (!w.done.is_set()) {
      try {
        w.request->wait(deadline);
      } catch (const std::exception& e) {
        w.error = std::current_exception();
        w.transport->abort(e.what());
      }
      w.request.reset();
      w.done.set();
    }
  } else if (!w.done.wait(deadline, w.policy, [] { return false; })) {
    // Stop the call (it still uses the caller's buffers) before reporting.
    std::string msg = str("comm: ", w.what, ": not finished before the wait's deadline");
    w.transport->abort(msg);
    w.done.wait(Deadline::never(), w.policy, [] { return false; });
    throw CommError(msg);
  }
  if (w.error) std::rethrow_exception(w.error);
}

}  // namespace tessel::comm
