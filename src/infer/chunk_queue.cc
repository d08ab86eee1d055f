#include "tessel/infer/chunk_queue.h"

#include <algorithm>
#include <chrono>

#include "tessel/core/clock.h"
#include "tessel/core/log.h"

namespace tessel::infer {

ChunkQueue::ChunkQueue(InputReader& input, int64_t chunk_rows, int64_t first_chunk, int replicas,
                       double timeout_s)
    : input_(input),
      chunk_rows_(chunk_rows),
      window_(2 * replicas + 2),
      timeout_s_(timeout_s),
      next_read_(first_chunk),
      next_write_(first_chunk),
      dead_(static_cast<size_t>(replicas), false),
      alive_(replicas) {
  // A resumed job: the committed chunks' rows are not read again.
  std::lock_guard lock(mu_);
  const int64_t want = first_chunk * chunk_rows;
  if (want > 0 && input_.skip(want) < want)
    error_ = std::make_exception_ptr(InvalidArgument(
        str("predict: --resume: the progress file counts ", first_chunk, " chunks of ", chunk_rows,
            " rows but the input is shorter; resume with the same input")));
}

bool ChunkQueue::over() const {
  return error_ != nullptr || (input_done_ && next_write_ == next_read_);
}

// Reads the next chunk without holding mu_ (`lock`), so that replicas finishing chunks and the
// writer are not held up by the input's decompression; reading_ keeps the reads one at a time,
// in input order.
bool ChunkQueue::read_next(std::unique_lock<std::mutex>& lock, int replica, Chunk& out) {
  reading_ = true;
  lock.unlock();
  Rows rows;
  std::exception_ptr error;
  try {
    rows = input_.read(chunk_rows_);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  reading_ = false;
  cv_.notify_all();
  if (error) {
    if (!error_) error_ = error;
    return false;
  }
  if (rows.count == 0) {
    input_done_ = true;
    return false;
  }
  out.id = next_read_++;
  out.rows = std::move(rows);
  const double now = now_seconds();
  held_[out.id] = Held{out, replica, now, false};
  if (started_ == 0) started_ = now;
  return !over();  // an abort while reading ends the job here too
}

bool ChunkQueue::take(int replica, Chunk& out) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (over() || dead_[static_cast<size_t>(replica)]) return false;
    if (!retry_.empty()) {
      Held& h = held_.at(retry_.front());
      retry_.pop_front();
      h.holder = replica;
      h.since = now_seconds();
      h.queued = false;
      ++reruns_;
      out = h.chunk;  // the rows are shared, not copied
      return true;
    }
    if (!input_done_ && !reading_ && next_read_ < next_write_ + window_) {
      if (read_next(lock, replica, out)) return true;
      continue;
    }
    cv_.wait(lock);
  }
}

bool ChunkQueue::finish(int /*replica*/, int64_t id, std::string bytes, int64_t rows) {
  std::lock_guard lock(mu_);
  auto it = held_.find(id);
  if (it == held_.end()) return false;
  held_.erase(it);
  retry_.erase(std::remove(retry_.begin(), retry_.end(), id), retry_.end());
  done_[id] = {std::move(bytes), rows};
  cv_.notify_all();
  return true;
}

void ChunkQueue::fail(int replica, const std::string& why) {
  std::lock_guard lock(mu_);
  if (dead_[static_cast<size_t>(replica)]) return;
  dead_[static_cast<size_t>(replica)] = true;
  --alive_;
  if (first_failure_.empty()) first_failure_ = why;
  for (auto& [id, h] : held_)
    if (h.holder == replica && !h.queued) {
      h.queued = true;
      retry_.push_back(id);
      log_warn("predict: worker ", replica, " failed holding chunk ", id, " (", why,
               "); another worker re-runs it");
    }
  cv_.notify_all();
}

void ChunkQueue::abort(std::exception_ptr error) {
  std::lock_guard lock(mu_);
  if (!error_) error_ = error;
  cv_.notify_all();
}

void ChunkQueue::requeue_stalled() {
  const double now = now_seconds();
  for (auto& [id, h] : held_)
    if (!h.queued && now - h.since > timeout_s_ && alive_ > 1) {
      h.queued = true;
      retry_.push_back(id);
      log_warn("predict: worker ", h.holder, " has held chunk ", id, " for ", now - h.since,
               " s (infer.chunk_timeout_s = ", timeout_s_, "); another worker re-runs it");
      cv_.notify_all();
    }
}

bool ChunkQueue::next(std::vector<Output>& ready) {
  std::unique_lock lock(mu_);
  const auto poll = std::chrono::duration<double>(std::clamp(timeout_s_ / 4, 0.001, 0.1));
  ready.clear();
  for (;;) {
    if (error_) std::rethrow_exception(error_);
    for (auto it = done_.find(next_write_); it != done_.end(); it = done_.find(next_write_)) {
      ready.push_back({it->first, std::move(it->second.first), it->second.second});
      done_.erase(it);
      ++next_write_;
    }
    if (!ready.empty()) {
      cv_.notify_all();  // the window moved
      return true;
    }
    if (over()) {
      cv_.notify_all();
      return false;
    }
    if (alive_ == 0) throw Error(str("predict: every worker failed; the first: ", first_failure_));
    requeue_stalled();
    cv_.wait_for(lock, poll);
  }
}

void ChunkQueue::sleep(double seconds) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return over(); });
}

int64_t ChunkQueue::reruns() const {
  std::lock_guard lock(mu_);
  return reruns_;
}

double ChunkQueue::started() const {
  std::lock_guard lock(mu_);
  return started_;
}

std::vector<int> ChunkQueue::failed() const {
  std::lock_guard lock(mu_);
  std::vector<int> out;
  for (size_t r = 0; r < dead_.size(); ++r)
    if (dead_[r]) out.push_back(static_cast<int>(r));
  return out;
}

}  // namespace tessel::infer
