// Engine: everything one rank runs of a layout, composed from small parts the Layout chooses:
//   executor    whole model (LocalExecutor) or a pipeline stage (PipelineExecutor);
//   grad sync   where the gradients live and how they are reduced over the dp group: all-reduced
//               buckets (zero.stage 0), reduce-scattered buckets (1; 2-3 into a gradient shard),
//               shared memory (ZeRO-1 on one host), the exact sum (deterministic mode), a
//               parameter-server worker's own gradient (the servers sum the pushes);
//   store       where the parameters live and who updates which elements: replicated (0-2),
//               sharded with gathers around each block (3), shared memory, or the parameter
//               servers (ps.servers > 0: a worker pushes and pulls, a server rank serves);
//   optimizer   over exactly the elements this rank updates (its state allocated that size).
//   tp group    tensor parallelism (tp.size > 1): the model is built cut across it
//               (nn/tensor_parallel.h), and its layers communicate inside their forward and
//               backward; the other parts see only this rank's part of the model.
// The Engine holds the parts by their interfaces only and drives each through the same
// lifecycle hooks (start, passes, step ends, checkpoint state, report), whose defaults do
// nothing. A step is: every piece's forward and backward (the executor, with the sync's and
// store's hooks around each block), then reduce (sync; under sequence parallelism also the
// whole parameters' gradients over the tp group), clip with the global norm and update
// (store), then the parts' step ends. The debug.* fault injections (a sleeping sync, an
// inf-injecting loss: fault_injection.h) wrap the real parts where the spec asks for them.
// The Trainer runs the loop and calls only this; its work source is data_rank() of data_size()
// of every batch, or, where claims() is set, the batches handed out one at a time.
// One Engine per rank, used by that rank's thread.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/comm/communicator.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/model.h"
#include "tessel/nn/models.h"
#include "tessel/optim/loss_scaler.h"
#include "tessel/optim/optimizer.h"
#include "tessel/parallel/composition.h"
#include "tessel/parallel/executor.h"
#include "tessel/parallel/layout.h"
#include "tessel/parallel/param_store.h"
#include "tessel/parallel/spec.h"
#include "tessel/parallel/units.h"

namespace tessel {
class Tracer;
}
namespace tessel::comm {
class DeviceCollectives;
}

namespace tessel::parallel {

class WorkingCopy;
class TpGroup;
struct DevicePlacement;

// Work handed out one batch at a time (a parameter-server worker in async or ssp mode): the
// Trainer trains the whole worker batches it claims instead of its slice of every batch.
class BatchClaims {
 public:
  // Batches [first, limit) of epoch `epoch` (in worker batches); `step` is the global step at
  // `first` (W worker batches make one step).
  struct Range {
    int64_t epoch = 0, first = 0, limit = 0, step = 0;
    bool open = false;  // false: claim nothing more (e.g. stopping)
  };
  virtual ~BatchClaims() = default;
  // Sets the range this worker claims from; the next step claims one more batch of it in the
  // same exchange. Local (no communication).
  virtual void set_claims(const Range& range) = 0;
  // The batch of the range this worker trains next (each batch goes to exactly one worker): the
  // one claimed with the last step, or, none asked for yet, one claimed now; -1 once every
  // batch of the range has been handed out or the range is closed.
  virtual int64_t claim() = 0;
};

// This rank's part of a checkpoint: its owned values (copied) and optimizer state (views of
// the live buffers), sliced by parameter.
std::vector<ckpt::ShardSlice> state_slices(const StateView& view, const nn::Model& model);
// Writes this rank's shard of a checkpoint (state_slices) into dir as writer `rank`.
ckpt::ShardFile write_state_shard(const std::string& dir, int rank, const StateView& view,
                                  const nn::Model& model);

class Engine {
 public:
  // Collective over world. Builds this rank's part of the model `model` describes (and its
  // loss); the engine's parts allocate what this rank holds and initialise it from seed.
  // Throws InvalidArgument for a layout or model that cannot run, MemoryLimitError when this
  // rank's state passes the memory limit.
  Engine(const ParallelSpec& spec, const optim::OptimSpec& optim, comm::Communicator& world,
         const nn::ModelSpec& model, uint64_t seed);
  // The same with a model the caller built (finalized, no memory; tp.size = 1): custom blocks
  // in tests and benchmarks. The loss is cross-entropy.
  Engine(const ParallelSpec& spec, const optim::OptimSpec& optim, comm::Communicator& world,
         std::unique_ptr<nn::Model> model, uint64_t seed);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Layout& layout() const { return mesh_.layout(); }
  int rank() const { return mesh_.rank(); }
  bool is_main() const { return mesh_.rank() == 0; }
  // Whether this rank trains; one that does not (a parameter server) runs serve() instead.
  bool trains() const { return executor_ != nullptr; }
  // A rank that does not train: serves the training ranks until they finish (lr(step): the
  // schedule) and returns its figures.
  nlohmann::json serve(const std::function<float(int64_t)>& lr) { return store_->serve(lr); }
  // This rank's share of every global batch: slice data_rank() of data_size(), unless claims()
  // hands out whole worker batches (null: every rank trains its slice of every batch).
  int data_rank() const;
  int data_size() const;
  BatchClaims* claims() { return claims_; }
  // Throws InvalidArgument when a replica's slice of a full batch of `batch` rows cannot run.
  void check_batch(int64_t batch) const;
  // This rank's part of the model (its layout; the values live in the engine's parts).
  nn::Model& model() { return model_; }
  const Executor& executor() const { return *executor_; }
  // What each block's tensor-parallel collectives moved (empty without tensor parallelism).
  nlohmann::json tp_counters() const;

  // Before the first step, fresh or resumed (collective): the pipeline's stages agree, the
  // replicas are checked to hold the same values.
  void start();
  // Forward, loss and backward (evaluation: forward and loss) of one piece. Loss sums are
  // counted once per data-parallel replica (a tp group's rank 0).
  PieceStats train_piece(const Piece& piece);
  PieceStats eval_piece(const Piece& piece);
  // The optimizer step `step` (0-based) at learning rate lr: reduce the gradients, clip the
  // global norm to clip_norm (0: off), update, and check the replicas every ddp.check_every.
  // fp16: a step whose gradient overflowed anywhere is skipped on every rank (loss_scaler()).
  void step(float lr, float clip_norm, int64_t step);
  // After the last step: nothing more is asked of other ranks (a parameter-server worker says
  // goodbye, so that the servers' serve() returns).
  void finish() { store_->finish(); }
  // train.precision = fp16: the dynamic loss scale (null otherwise); its state is checkpointed.
  optim::LossScaler* loss_scaler() { return scaler_.get(); }

  // Collectives over the training ranks (metrics, evaluation).
  void sum(double* values, int n);
  void max(double* values, int n);
  std::vector<double> gather(double value);
  // Every training rank's measurements since the last call (collective over the training
  // ranks); step_s and steps are this rank's time in training steps and steps trained.
  std::vector<RankStats> take_stats(double step_s, double steps = 0);
  // The parts' figures for the per-rank report (collective over the training ranks): the
  // pipeline's stages, the parameter servers' counters; ranks: every rank's measurements.
  nlohmann::json report(const std::vector<RankStats>& ranks);
  // What `tessel config` prints of the parts beyond parts(): the pipeline's chunks.
  nlohmann::json plan() const;
  // SHA-256 of the whole model's values in arena order (padding zero), the same bytes in every
  // layout; collective over the world, streamed unit by unit so no rank holds the model.
  std::string params_sha256();
  StateView state();
  // compress.kind != none: reads this rank's compression state (residuals, Q; a parameter
  // server worker's push residuals) from a checkpoint (a checkpoint without it, e.g. one from
  // another worker count, leaves it fresh, warned).
  void restore_compression(const ckpt::CheckpointSource& reader);
  // Collective over the training ranks (and, with a parameter server, the servers through
  // rank 0): every rank that owns part of the model writes its shard of a checkpoint into
  // rank 0's `dir`. Returns every shard on rank 0 (nothing elsewhere) and the optimizer's
  // step count.
  std::vector<ckpt::ShardFile> write_shards(const std::string& dir, int64_t* optimizer_steps);
  // Which parts this rank runs, for summaries and logs: the decision table's choice
  // (composition.h: executor, grad_sync, store, compress, overlap, prefetch, ...) as built.
  const nlohmann::json& parts() const { return parts_; }

 private:
  // Builds this rank's model and loss from its tp group (null: none).
  using Build = std::function<std::pair<std::unique_ptr<nn::Model>, std::unique_ptr<nn::Loss>>(
      nn::TensorParallel*)>;
  Engine(const ParallelSpec& spec, const optim::OptimSpec& optim, comm::Communicator& world,
         const Build& build, uint64_t seed);
  void build_parameter_server(const ParallelSpec& spec, const optim::OptimSpec& optim,
                              uint64_t seed);
  void build_data_parallel(const ParallelSpec& spec, uint64_t seed);
  // Optimizer offload in bf16 | fp16: the f32 master values live on the host only (docs/gpu.md).
  bool host_masters(const ParallelSpec& spec) const {
    return offloads_optimizer(spec.offload) && type_ != DType::kF32;
  }
  void build_device_comms(comm::Communicator& group, comm::Communicator* across);
  void record_gpus();
  // The part whose state travels in checkpoints beside the values (compression residuals):
  // the gradient sync's, or else the store's (a parameter-server worker's pushes).
  std::vector<float> compression_state();
  void hook(nn::Phase phase, size_t block, bool last);
  // s on a tp group's rank 0, empty on the others: a replica's loss is counted once.
  PieceStats once_per_replica(const PieceStats& s) const;
  void sum_whole_grads_over_tp();
  void trace_block(Tracer& tracer, nn::Phase phase, size_t block);  // its span, memory counter

  ParallelSpec spec_;
  Mesh mesh_;
  // A device rank's GPU, set on its thread before anything is allocated there (null on the CPU).
  std::unique_ptr<const DevicePlacement> place_;
  bool overlap_ = false;      // bucket collectives on a progress thread (ddp.overlap resolved)
  Parts composed_;            // what the decision table chose (composition.h)
  DType type_ = DType::kF32;  // train.precision
  std::unique_ptr<WorkingCopy> working_;  // 16-bit values the blocks read (not ZeRO-3)
  std::unique_ptr<TpGroup> tp_;
  std::pair<std::unique_ptr<nn::Model>, std::unique_ptr<nn::Loss>> built_;
  nn::Model& model_;
  int64_t piece_step_ = 0;                 // the step of the piece in progress
  std::unique_ptr<nn::Loss> faulty_loss_;  // debug.overflow_steps around built_'s loss
  nn::Loss* loss_ = nullptr;
  bool training_ = true;
  std::unique_ptr<Executor> executor_;  // null on a rank that does not train
  Units units_, scale_buckets_;
  // A device rank with dp peers: its buckets' collectives on device memory (engine_device.h);
  // With zero.shard_size, device_comm_ is the shard group's; across_comm_ the replica group's
  // (the shards' all-reduces across the groups), or dp_comm_ all of dp's (the exact sum).
  std::unique_ptr<comm::DeviceCollectives> device_comm_, across_comm_, dp_comm_;
  std::unique_ptr<GradSync> sync_owner_;
  std::unique_ptr<ParamStore> store_owner_;
  std::unique_ptr<GradSync> faulty_sync_;    // debug.slow_rank around the sync
  std::unique_ptr<BlockHooks> slow_blocks_;  // debug.slow_factor, the last hook
  GradSync* sync_ = nullptr;
  ParamStore* store_ = nullptr;
  BatchClaims* claims_ = nullptr;
  std::vector<BlockHooks*> hooks_;  // in the order they act before a block
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LossScaler> scaler_;  // fp16
  Hooks hooks_fn_;
  std::vector<double> block_start_;  // traced: when each block's forward/backward started
  nlohmann::json parts_;
};

}  // namespace tessel::parallel
