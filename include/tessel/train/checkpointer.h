// Checkpointer: a run's state into and out of sharded checkpoints (ckpt/checkpoint.h). Every
// rank writes what it owns -- its pieces of the parameters and of the optimizer state, named by
// parameter -- and rank 0 commits the folder, so no rank ever gathers the whole model. Restoring
// reads, on every rank, exactly the slices it holds, from whatever layout, world size or ZeRO
// stage wrote them.
#pragma once

#include <string>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/config/config.h"
#include "tessel/nn/model.h"
#include "tessel/parallel/engine.h"
#include "tessel/train/snapshots.h"

namespace tessel::train {

class Checkpointer {
 public:
  // tokenizer: a language model's (data::Splits), saved with every checkpoint and checked on
  // restore; null for other data. io: what the model reads and predicts, saved with every
  // checkpoint for inference.
  Checkpointer(const Config& config, parallel::Engine& engine,
               std::shared_ptr<const text::Tokenizer> tokenizer, ckpt::ModelIo io);

  // Collective over the training ranks (the engine reaches parameter servers): writes step
  // `step`'s checkpoint under run_dir with rank 0's trainer_json and returns the committed
  // folder (on rank 0; empty elsewhere).
  std::string save(const std::string& run_dir, int64_t step, const std::string& trainer_json);
  // Loads what this rank holds from the checkpoint at `path` (a run folder, checkpoints folder
  // or step folder) and returns its trainer.json; *dir receives the step folder used. When the
  // newest step folder of a run fails its checks, the newest older one that passes them is
  // used instead, with a warning (collective over the training ranks: all use the same one).
  std::string restore(const std::string& path, std::string* dir);
  // The same from a checkpoint anywhere (e.g. an in-memory snapshot).
  std::string restore(const ckpt::CheckpointSource& source);
  // This rank's part of the in-memory snapshot of step `step` (ranks as threads; no
  // communication). trainer_json counts from rank 0 only.
  void snapshot(Snapshots& snapshots, int64_t step, const std::string& trainer_json);

 private:
  ckpt::Manifest manifest() const;  // the model and optimizer, without shards and steps

  const Config& config_;
  parallel::Engine& engine_;
  nn::Model& model_;
  std::shared_ptr<const text::Tokenizer> tokenizer_;
  ckpt::ModelIo io_;
};

}  // namespace tessel::train
