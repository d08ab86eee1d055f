// Snapshots: in-memory copies of a run's whole state, taken every checkpoint.snapshot_steps
// steps and at every checkpoint, so that with ranks as threads a failed rank costs at most that
// many steps and no disk I/O: the ranks restart from the newest complete snapshot
// (train/recovery.h). Each rank adds its own part -- its owned values and optimizer state --
// straight into one shared copy; the last part completes the snapshot, which then replaces the
// previous one, so a failure while a snapshot is being taken leaves the previous one intact.
// Memory: one copy of the model's values and optimizer state, two while a snapshot is taken.
// Thread safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/ckpt/checkpoint.h"

namespace tessel::train {

class Snapshots {
 public:
  explicit Snapshots(int ranks) : ranks_(ranks) {}

  // Rank `rank`'s part of the snapshot of step `step`: `manifest` describes the model (equal on
  // every rank), `slices` are copied, trainer_json counts from rank 0 only.
  void add(int64_t step, int rank, const ckpt::Manifest& manifest,
           const std::vector<ckpt::ShardSlice>& slices, int64_t optimizer_steps,
           const std::string& trainer_json);
  // Drops a snapshot that failed ranks left incomplete (before the ranks restart).
  void abandon();
  // The newest complete snapshot (null if none) and its step (-1 if none).
  std::shared_ptr<const ckpt::MemoryCheckpoint> latest() const;
  int64_t latest_step() const;

 private:
  mutable std::mutex mu_;
  int ranks_;
  int64_t pending_step_ = -1, latest_step_ = -1;
  int pending_parts_ = 0;
  int64_t pending_optimizer_steps_ = 0;
  std::shared_ptr<ckpt::MemoryCheckpoint> pending_, latest_;
};

}  // namespace tessel::train
