#include "tessel/train/snapshots.h"

#include <algorithm>

namespace tessel::train {

void Snapshots::add(int64_t step, int rank, const ckpt::Manifest& manifest,
                    const std::vector<ckpt::ShardSlice>& slices, int64_t optimizer_steps,
                    const std::string& trainer_json) {
  std::shared_ptr<ckpt::MemoryCheckpoint> target;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_step_ != step || !pending_) {
      pending_ = std::make_shared<ckpt::MemoryCheckpoint>(
          str("the in-memory snapshot of step ", step), manifest);
      pending_step_ = step;
      pending_parts_ = 0;
      pending_optimizer_steps_ = 0;
    }
    target = pending_;
  }
  target->add(slices);  // outside the lock: the ranks copy their parts at the same time
  std::lock_guard<std::mutex> lock(mu_);
  if (target != pending_) return;  // abandoned meanwhile
  if (rank == 0) target->set_trainer_json(trainer_json);
  pending_optimizer_steps_ = std::max(pending_optimizer_steps_, optimizer_steps);
  if (++pending_parts_ < ranks_) return;
  target->set_optimizer_steps(pending_optimizer_steps_);
  latest_ = std::move(pending_);
  latest_step_ = step;
  pending_step_ = -1;
}

void Snapshots::abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.reset();
  pending_step_ = -1;
}

std::shared_ptr<const ckpt::MemoryCheckpoint> Snapshots::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

int64_t Snapshots::latest_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_step_;
}

}  // namespace tessel::train
