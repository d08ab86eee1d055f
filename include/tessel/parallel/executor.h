// Executor: runs this rank's blocks for one piece of a step: the whole model (LocalExecutor),
// or its stage of a pipeline schedule (pipeline.h). It owns the activation caches (one per
// block and micro-batch in flight; none in evaluation) and calls the engine's hooks around every
// block's forward and backward, which is where the gradient sync and the parameter store act.
// An executor holds no loop over steps and no collective of its own beyond the pipeline's
// point-to-point messages. The Engine drives every executor alike: its optional lifecycle hooks
// (start, end_step, check_batch_rows, plan, report) default to nothing.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "tessel/nn/loss.h"
#include "tessel/nn/model.h"
#include "tessel/parallel/spec.h"
#include "tessel/parallel/stats.h"

namespace tessel::parallel {

class ParamStore;
struct Layout;

// One piece of this rank's rows of a step (a batch slice, or one micro-shard of it).
struct Piece {
  Tensor x, y;
  nn::Context ctx;
  double weight = 1;  // the piece's share of the step's global rows: scales the loss gradient
  bool last = true;   // the step's last piece: no accumulation pass follows
};

// Loss and accuracy sums of a piece, counted where the loss is computed (a pipeline's last
// stage; elsewhere zero).
struct PieceStats {
  double loss_sum = 0;  // mean loss x rows
  double correct = 0;   // rows classified correctly (fractional for sequence models)
  int64_t rows = 0;
};

// (phase, block, last): `last` is the block's last backward of the step.
using Hooks = std::function<void(nn::Phase, size_t, bool)>;

class Executor {
 public:
  virtual ~Executor() = default;
  // Forward, loss and backward of a piece; gradients accumulate where the hooks bound them.
  virtual PieceStats train(const Piece& piece, nn::Loss& loss, const Hooks& hooks) = 0;
  // Forward and loss only; keeps no activations. First drops the caches training keeps between
  // steps, so that it peaks at its own working set, which it charges to the caller's memory
  // category (the Trainer's: other), not to the activations.
  virtual PieceStats eval(const Piece& piece, nn::Loss& loss, const Hooks& hooks) = 0;
  // A piece without rows on this rank: the hooks a piece would call (training: forward and
  // backward; else forward only), in the same order, so that every rank takes part in the
  // same collectives.
  virtual void idle(const Hooks& hooks, bool training, bool last) = 0;
  // The blocks this rank runs.
  virtual const std::vector<bool>& local_blocks() const = 0;
  virtual void take_stats(RankStats& s) = 0;

  // Optional hooks (the defaults do nothing):
  // Before the first step, fresh or resumed (collective over the executor's ranks), and after
  // each step's update; store: where the values live.
  virtual void start(ParamStore& /*store*/) {}
  virtual void end_step(ParamStore& /*store*/) {}
  // Throws InvalidArgument when `rows`, a replica's slice of a full batch, cannot run.
  virtual void check_batch_rows(int64_t /*rows*/) const {}
  // What `tessel config` prints of this part beyond Engine::parts().
  virtual nlohmann::json plan() const { return nlohmann::json::object(); }
  // This part's figures for the per-rank report, from every training rank's measurements.
  virtual nlohmann::json report(const std::vector<RankStats>& /*ranks*/,
                                const Layout& /*layout*/) const {
    return nlohmann::json::object();
  }
};

// Throws naming the step when a training loss is not finite.
void check_loss(double loss, int64_t step);

class ActivationOffload;

// The piece's inputs and targets on this thread's device: uploaded from the host loader's
// tensors (the one upload of a step's batch); the piece itself on the host.
Piece on_current_device(const Piece& piece);

class LocalExecutor final : public Executor {
 public:
  // recompute: train.recompute, what the forward keeps for the backward; offload:
  // train.offload, where it waits for the backward (src/parallel/offload.h).
  explicit LocalExecutor(nn::Model& model, nn::Recompute recompute = nn::Recompute::kNone,
                         Offload offload = Offload::kNone);
  ~LocalExecutor() override;
  PieceStats train(const Piece& piece, nn::Loss& loss, const Hooks& hooks) override;
  PieceStats eval(const Piece& piece, nn::Loss& loss, const Hooks& hooks) override;
  void idle(const Hooks& hooks, bool training, bool last) override;
  const std::vector<bool>& local_blocks() const override { return local_; }
  void take_stats(RankStats& s) override;

 private:
  nn::Model& model_;
  std::vector<bool> local_;
  nn::Activations acts_;
  std::unique_ptr<ActivationOffload> offload_;  // null: train.offload = none
  double forward_s_ = 0, backward_s_ = 0;
};

}  // namespace tessel::parallel
