// Checkpoints: a folder per save, written by every rank that owns part of the model and
// committed atomically by one.
//   RUN/checkpoints/step-000123/shard-00003.safetensors  one writer's slices of parameters and
//                                                          optimizer state (see ShardSlice)
//                              manifest.json             format, parameters (name, shape),
//                                                          optimizer (kind, steps, buffers),
//                                                          tokenizer (a language model's),
//                                                          model_io (input shape and dtype,
//                                                          classes: what inference needs),
//                                                          every shard file with its SHA-256
//                              trainer.json              the Trainer's position (opaque here)
//   RUN/checkpoints/latest                               text: the name of the newest folder
// A save: the committing rank picks the temporary folder "step-N.tmp-<pid>" (begin), every
// writer puts its shard file in it (write_shard: written, fsynced, hashed), then the committing
// rank writes the manifest and trainer.json, fsyncs the folder, renames it to "step-N" and
// replaces "latest" by write-temp + fsync + rename (commit). A crash at any point leaves the
// previous checkpoint intact and readable. keep_last bounds how many folders remain.
// Loading reads any slice of any tensor, whatever the layout that wrote it: that is how a
// checkpoint of one world size, ZeRO stage or pipeline split resumes on another.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/ckpt/safetensors.h"
#include "tessel/data/task.h"
#include "tessel/text/tokenizer.h"

namespace tessel::ckpt {

// A slice of a checkpointed tensor: elements [begin, begin + data.numel()) of the flattened
// tensor `name` -- a parameter ("fc1.weight") or a per-element optimizer buffer of one
// ("exp_avg/fc1.weight"). data is 1-D f32.
struct ShardSlice {
  std::string name;
  int64_t begin = 0;
  Tensor data;
};

// What write_shard produced: the file's name in the folder, its size and SHA-256.
struct ShardFile {
  std::string file;
  int64_t bytes = 0;
  std::string sha256;
};

struct TensorSpec {
  std::string name;
  Shape shape;
};

// What a model reads and predicts, so that inference needs no dataset: one sample's input shape
// and dtype (f32 features, i32 token ids), the number of classes (a language model: its
// vocabulary size) and, for a table dataset, the per-feature map the training data went
// through, x -> (x - input_mean) / input_std, which inference applies to raw rows (empty: none).
struct ModelIo {
  Shape input_shape;
  DType input_dtype = DType::kF32;
  int64_t num_classes = 0;
  std::vector<float> input_mean = {}, input_std = {};
  // outputs: class logits, predicted values (regression) or per-label logits (multilabel)
  data::Task task = data::Task::kClassification;
  // A CSV-trained model's feature columns (one per input value, in order) and target columns
  // by name, so that predict reads a CSV by its header; empty otherwise.
  std::vector<std::string> input_names = {}, target_names = {};
  bool operator==(const ModelIo&) const = default;
};

struct Manifest {
  // 2 added the tokenizer, 3 model_io; versions 1 and 2 still load (without them).
  static constexpr int kVersion = 3;
  std::string model_kind;     // "mlp", "cnn", "gpt"
  std::optional<ModelIo> io;  // always written; absent in version 1-2 manifests
  // A language model's tokenizer (a byte vocabulary or BPE ranks); null for other models, a
  // model trained on token files without data.tokenizer, and in version 1 manifests.
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::vector<TensorSpec> parameters;  // in model order
  std::string optimizer_kind;          // "sgd", "adamw"
  int64_t optimizer_steps = 0;
  std::vector<std::string> state_buffers;  // per-element optimizer buffers, e.g. "exp_avg"
  std::vector<ShardFile> shards;
};

// Creates the temporary folder of step `step` under run_dir/checkpoints (removing an own
// leftover of the same name) and returns its path. The committing rank calls it; every writer
// then writes into the same folder (on storage every writer sees).
std::string begin_checkpoint(const std::string& run_dir, int64_t step);
// Writes writer `rank`'s slices into dir as "shard-<rank>.safetensors", fsynced; returns its
// name, size and SHA-256. Slices of one tensor must not overlap.
ShardFile write_shard(const std::string& dir, int rank, const std::vector<ShardSlice>& slices);
// Writes manifest.json and trainer.json into dir, makes everything durable, renames dir to
// step-N, points `latest` at it and prunes to keep_last folders. Returns the committed path.
std::string commit_checkpoint(const std::string& run_dir, const std::string& dir, int64_t step,
                              const Manifest& manifest, const std::string& trainer_json,
                              int keep_last = 2);

// What restoring needs of a checkpoint, wherever it is: its manifest, trainer.json and any
// slice of any tensor. CheckpointReader reads a step folder; MemoryCheckpoint is held in memory.
class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  virtual const std::string& dir() const = 0;  // where it is, for messages
  virtual const Manifest& manifest() const = 0;
  virtual const std::string& trainer_json() const = 0;
  // Elements [begin, begin + count) of the flattened tensor `name` into dst. Throws IoError
  // naming the tensor and the missing elements when the checkpoint does not cover them all.
  virtual void read(const std::string& name, int64_t begin, int64_t count, float* dst) const = 0;
};

// A committed checkpoint opened for reading. Construction reads manifest.json and
// trainer.json and every shard file's header, and checks every shard file's size and SHA-256
// against the manifest; a mismatch is an IoError naming the file. Tensor data is read on
// demand, so no more than the slices asked for is ever in memory.
class CheckpointReader final : public CheckpointSource {
 public:
  // `path` is a run folder (uses checkpoints/latest), a checkpoints folder, or one step folder.
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader() override;
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& dir() const override { return dir_; }
  const Manifest& manifest() const override { return manifest_; }
  const std::string& trainer_json() const override { return trainer_json_; }
  bool has(const std::string& name) const;
  // From whichever shards hold the elements.
  void read(const std::string& name, int64_t begin, int64_t count, float* dst) const override;

 private:
  struct Piece;  // one slice in one shard file
  std::string dir_;
  Manifest manifest_;
  std::string trainer_json_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, std::vector<Piece>> index_;  // by tensor name, sorted by begin
};

// Writes the model's parameters of the checkpoint at `path`, each whole and named as the model
// names it (manifest order, f32), into one plain safetensors file at out_path (written to a
// temporary name, fsynced, renamed), reading one parameter at a time. PyTorch loads it with
// safetensors.torch.load_file, or by parsing the header (tests/fixtures/check_safetensors.py).
void export_model(const std::string& path, const std::string& out_path);

// `path` as CheckpointReader resolves it: the step folder, without reading tensors.
std::string resolve_checkpoint_dir(const std::string& path);
// The step folders a resume from `path` may use, best first: for a run or checkpoints folder,
// the one CheckpointReader resolves, then every other committed step folder, newest first
// (the fallbacks when it is damaged); for a step folder, just that one.
std::vector<std::string> checkpoint_candidates(const std::string& path);

// A checkpoint held in memory (an in-memory snapshot): a buffer per tensor of the manifest
// (parameters and per-element optimizer state), filled by any number of writers with their
// slices, which are copied. add() may run on several threads at once if their slices do not
// overlap. read() serves a tensor only once its every element was written.
class MemoryCheckpoint final : public CheckpointSource {
 public:
  MemoryCheckpoint(std::string name, Manifest manifest);
  void add(const std::vector<ShardSlice>& slices);
  void set_trainer_json(std::string text) { trainer_json_ = std::move(text); }
  void set_optimizer_steps(int64_t steps) { manifest_.optimizer_steps = steps; }

  const std::string& dir() const override { return name_; }
  const Manifest& manifest() const override { return manifest_; }
  const std::string& trainer_json() const override { return trainer_json_; }
  void read(const std::string& name, int64_t begin, int64_t count, float* dst) const override;

 private:
  struct Buffer {
    std::vector<float> values;
    std::atomic<int64_t> written{0};
  };
  std::string name_;
  Manifest manifest_;
  std::string trainer_json_;
  std::map<std::string, Buffer> buffers_;  // built in the constructor, never resized
};

// Writes `bytes` to path via a temporary file in the same folder, fsync and rename.
void write_file_atomic(const std::string& path, const std::string& bytes);
// fsync a folder so a rename inside it is durable.
void fsync_dir(const std::string& dir);

}  // namespace tessel::ckpt
