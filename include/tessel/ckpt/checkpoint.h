// Checkpoints: a folder per save, committed atomically.
//   RUN/checkpoints/step-000123/model.safetensors      weights, named as Model::parameters()
//                               optimizer.safetensors  optimizer state (flat, arena layout)
//                               trainer.json           step, epoch, batch in epoch, RNG seed,
//                                                      config digest, params_sha256
//   RUN/checkpoints/latest                              text: the name of the newest folder
// A save writes into "step-N.tmp-<pid>", fsyncs every file and the folder, renames it to
// "step-N", then replaces "latest" by write-temp + fsync + rename. A crash at any point leaves
// the previous checkpoint intact and readable. keep_last bounds how many folders remain.
#pragma once

#include <cstdint>
#include <string>

#include "tessel/ckpt/safetensors.h"

namespace tessel::ckpt {

struct Checkpoint {
  TensorFile model;
  TensorFile optimizer;
  std::string trainer_json;  // opaque to ckpt; the Trainer defines its fields
};

// Saves under run_dir/checkpoints and returns the committed folder's path.
std::string save_checkpoint(const std::string& run_dir, int64_t step, const Checkpoint& ckpt,
                            int keep_last = 2);
// `path` is a run folder (uses checkpoints/latest), a checkpoints folder, or one step folder.
// Throws IoError naming what is missing or corrupt.
Checkpoint load_checkpoint(const std::string& path);
// Resolves `path` as load_checkpoint does, without reading tensors.
std::string resolve_checkpoint_dir(const std::string& path);

// Writes `bytes` to path via a temporary file in the same folder, fsync and rename.
void write_file_atomic(const std::string& path, const std::string& bytes);
// fsync a folder so a rename inside it is durable.
void fsync_dir(const std::string& dir);

}  // namespace tessel::ckpt
