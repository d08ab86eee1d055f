// Replica: what one rank runs of a forward-only model -- the whole model (LocalExecutor) or its
// stage of a pipeline (PipelineExecutor over the pp communicator), either one cut over a
// tensor-parallel group. It holds the values of its own blocks' parameters (its cut) only,
// read from a checkpoint of any layout, and no gradients, optimizer state or activation caches
// (the executors' forward-only path passes no Cache).
// Rows go through in batches of infer.batch rows, each a piece of pp.microbatches micro-batches
// on a pipeline; the outputs land on the last stage. One per rank, used by its thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/comm/communicator.h"
#include "tessel/config/config.h"
#include "tessel/nn/model.h"
#include "tessel/nn/models.h"
#include "tessel/parallel/executor.h"

namespace tessel::infer {

// The model a config describes, with the shapes it was trained on (input, classes), for a
// text dataset the tokenizer, for a table dataset the per-feature normalisation its training
// rows went through, all from the checkpoint's manifest;
// a checkpoint from before manifest version 3 has no shapes, and the config's training data is
// loaded to learn them. The checkpoint is opened once and shared by the process's replicas
// (its reads are thread safe). Built once per process.
struct ModelInfo {
  nn::ModelSpec spec;
  DType input_dtype = DType::kF32;
  std::shared_ptr<const text::Tokenizer> tokenizer;    // null: the model reads no text
  std::vector<float> input_mean, input_std;            // raw row x -> (x - mean) / std; empty: none
  std::vector<std::string> input_names, target_names;  // a CSV-trained model's columns
  std::shared_ptr<const ckpt::CheckpointReader> checkpoint;
  bool generates() const { return nn::reads_tokens(spec); }
};
ModelInfo model_info(const train::Config& config, const std::string& checkpoint);

class Replica {
 public:
  // The model of info.checkpoint. pp: this rank's pipeline (null: the whole model here); tp:
  // its tensor-parallel group (null: none), whose ranks each hold their cut of every layer and
  // run every row together. Collective over pp and tp. Throws MemoryLimitError (naming
  // pp.stages and tp.size) when this rank's part passes runtime.memory_limit_mb.
  Replica(const train::Config& config, const ModelInfo& info, comm::Communicator* pp,
          comm::Communicator* tp);
  // The whole model over `weights`' parameter values, without a copy: modules of its own, for
  // another thread, that read the same memory (forward reads parameters only). `weights` holds
  // the whole model of the same info and outlives this replica, which holds 0 parameter bytes.
  Replica(const train::Config& config, const ModelInfo& info, const Replica& weights);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ + 1 == stages_; }
  // The outputs of `rows` rows, global rows [first_row, first_row + rows): x [rows, ...] on the
  // first stage (ignored elsewhere), raw rows that go through the model's input normalisation.
  // Returns [rows, ...] on the last stage, an undefined tensor elsewhere. Collective over the
  // pipeline.
  Tensor forward(const Tensor& x, int64_t rows, int64_t first_row);
  // The whole model (generation); only when it runs here without a pipeline.
  nn::Model& model();
  // Bytes of parameter values this rank holds (measured by its allocations).
  int64_t parameter_bytes() const { return parameter_bytes_; }

 private:
  void load(const ckpt::CheckpointReader& checkpoint);
  // Freezes the model's blocks (nn::Module::freeze): a replica's values never change.
  void freeze(bool values_too);

  const train::Config& config_;
  std::unique_ptr<nn::TensorParallel> tp_;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<parallel::Executor> executor_;
  std::vector<float> input_mean_, input_std_;
  int stage_ = 0, stages_ = 1;
  std::vector<Tensor> values_;     // one tensor per run of local blocks
  std::vector<nn::Range> ranges_;  // the arena range of each
  int64_t parameter_bytes_ = 0;
};

}  // namespace tessel::infer
