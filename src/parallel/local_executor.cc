#include <cmath>

#include "offload.h"
#include "tessel/core/clock.h"
#include "tessel/parallel/executor.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

Piece on_current_device(const Piece& piece) {
  if (current_device() == Device::kCpu) return piece;
  Piece out = piece;
  out.x = piece.x.to_device(current_device());
  out.y = piece.y.to_device(current_device());
  return out;
}

void check_loss(double loss, int64_t step) {
  if (!std::isfinite(loss))
    throw Error(
        str("train: loss is ", loss, " at step ", step, "; lower optim.lr or set train.clip_norm"));
}

LocalExecutor::LocalExecutor(nn::Model& model, nn::Recompute recompute, Offload offload)
    : model_(model), local_(model.num_blocks(), true) {
  if (offloads_activations(offload)) offload_ = std::make_unique<ActivationOffload>();
  acts_.recompute = recompute;
  if (recompute == nn::Recompute::kNone) return;
  acts_.caches.resize(model.num_blocks());
  for (nn::Cache& c : acts_.caches) c.share_scratch(&acts_.scratch);
}

LocalExecutor::~LocalExecutor() = default;

PieceStats LocalExecutor::train(const Piece& host_piece, nn::Loss& loss, const Hooks& hooks) {
  const nn::BlockHook hook = [&](nn::Phase p, size_t b) {
    hooks(p, b, host_piece.last);
    if (offload_) offload_->on_block(p, b, acts_);
  };
  MemoryScope scope(MemCategory::kActivations);
  const Piece piece = on_current_device(host_piece);
  const double t0 = now_seconds();
  const nn::LossValue v = loss.forward(model_.forward(piece.x, piece.ctx, &acts_, hook), piece.y);
  check_loss(v.mean, piece.ctx.step);
  const Tensor dy = loss.backward(static_cast<float>(piece.weight));
  if (offload_) offload_->computed();
  const double t1 = now_seconds();
  model_.backward(dy, acts_, hook);
  forward_s_ += t1 - t0;
  backward_s_ += now_seconds() - t1;
  const int64_t rows = piece.y.dim(0);
  return {static_cast<double>(v.mean) * rows,
          static_cast<double>(v.correct) * rows / static_cast<double>(v.positions), rows};
}

PieceStats LocalExecutor::eval(const Piece& host_piece, nn::Loss& loss, const Hooks& hooks) {
  const nn::BlockHook hook = [&](nn::Phase p, size_t b) { hooks(p, b, false); };
  acts_.release_all();
  const Piece piece = on_current_device(host_piece);
  const nn::LossValue v = loss.forward(model_.forward(piece.x, piece.ctx, nullptr, hook), piece.y);
  const int64_t rows = piece.y.dim(0);
  return {static_cast<double>(v.mean) * rows,
          static_cast<double>(v.correct) * rows / static_cast<double>(v.positions), rows};
}

void LocalExecutor::idle(const Hooks& hooks, bool training, bool last) {
  const size_t n = model_.num_blocks();
  for (size_t b = 0; b < n; ++b) {
    hooks(nn::Phase::kBeforeForward, b, last);
    hooks(nn::Phase::kAfterForward, b, last);
  }
  if (!training) return;
  for (size_t b = n; b-- > 0;) {
    hooks(nn::Phase::kBeforeBackward, b, last);
    hooks(nn::Phase::kAfterBackward, b, last);
  }
}

void LocalExecutor::take_stats(RankStats& s) {
  s.forward_s += forward_s_;
  s.backward_s += backward_s_;
  forward_s_ = backward_s_ = 0;
}

}  // namespace tessel::parallel
