#include "tessel/infer/batcher.h"

#include <chrono>

#include "tessel/core/clock.h"

namespace tessel::infer {

Batcher::Batcher(const BatchOptions& options, int workers, RunBatch run, ServeMetrics& metrics)
    : options_(options), run_(std::move(run)), metrics_(metrics) {
  for (int w = 0; w < workers; ++w) workers_.emplace_back([this, w] { work(w); });
}

Batcher::~Batcher() { close(); }

bool Batcher::submit(Request request, Answer answer) {
  std::lock_guard lock(mu_);
  if (closed_ || queued_rows_ + request.rows() > options_.max_queue) return false;
  const bool was_empty = queue_.empty();
  queued_rows_ += request.rows();
  queue_.push_back(Pending{std::move(request), std::move(answer), now_seconds()});
  metrics_.queue(static_cast<int64_t>(queue_.size()), queued_rows_);
  // Wake a worker only when it has something new to do: start the max_wait clock of a first
  // request, or take a full batch (waking threads costs tens of microseconds on small VMs).
  if (was_empty || queued_rows_ >= options_.max_batch) cv_.notify_one();
  return true;
}

void Batcher::close() {
  {
    std::lock_guard lock(mu_);
    if (closed_ && workers_.empty()) return;
    closed_ = true;
    cv_.notify_all();
  }
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

// The oldest requests up to max_batch rows (at least one), once enough rows wait, the oldest
// has waited max_wait, another worker left rows for this one, or the batcher closes; shared
// with the other idle workers (a cap of the waiting rows over them), so that no worker idles
// while one runs everything that waits. Empty when another worker took them first.
std::vector<Batcher::Pending> Batcher::take_batch(std::unique_lock<std::mutex>& lock) {
  ++idle_;
  cv_.wait(lock, [this] { return !queue_.empty() || closed_; });
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration<double>(std::max(
          0.0,
          queue_.empty() ? 0.0 : queue_.front().arrival + options_.max_wait_s - now_seconds()));
  cv_.wait_until(lock, deadline, [this] {
    return queue_.empty() || queued_rows_ >= options_.max_batch || handed_ || closed_;
  });
  const int64_t cap = std::min(options_.max_batch, (queued_rows_ + idle_ - 1) / idle_);
  --idle_;
  std::vector<Pending> batch;
  int64_t rows = 0;
  while (!queue_.empty() && (batch.empty() || rows + queue_.front().request.rows() <= cap)) {
    rows += queue_.front().request.rows();
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  queued_rows_ -= rows;
  metrics_.queue(static_cast<int64_t>(queue_.size()), queued_rows_);
  // What is left is for the next worker: at once when it was left to share the work.
  handed_ =
      !queue_.empty() && idle_ > 0 && rows + queue_.front().request.rows() <= options_.max_batch;
  if (!queue_.empty()) cv_.notify_one();
  return batch;
}

void Batcher::work(int worker) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (queue_.empty() && closed_) return;
    std::vector<Pending> batch = take_batch(lock);
    if (batch.empty()) continue;
    lock.unlock();
    std::vector<const Request*> requests;
    int64_t rows = 0;
    for (const Pending& p : batch) {
      requests.push_back(&p.request);
      rows += p.request.rows();
    }
    BatchOutput out;
    std::exception_ptr error;
    try {
      out = run_(worker, requests);
      TESSEL_CHECK(out.rows() == rows, "serve: a batch of ", rows, " rows gave ", out.rows(),
                   " outputs");
    } catch (...) {
      error = std::current_exception();
    }
    int64_t at = 0;
    for (Pending& p : batch) {
      const int64_t n = p.request.rows();
      p.answer(error ? BatchRows{} : BatchRows{&out, at, n}, error);
      at += n;
    }
    metrics_.batch(rows);
    lock.lock();
  }
}

}  // namespace tessel::infer
