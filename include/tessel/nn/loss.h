// Losses: turn a model's output and the targets into a scalar to minimise, and its gradient.
// The Trainer and the executors see only the Loss interface; CrossEntropyLoss serves both
// classification (logits [N, C], labels [N]) and language modelling (logits [B, T, V], next
// tokens [B, T]). A loss keeps what its backward needs from the last forward.
#pragma once

#include <cstdint>
#include <memory>

#include "tessel/nn/tensor_parallel.h"
#include "tessel/tensor/tensor.h"

namespace tessel::nn {

// One forward's result: the mean over the positions scored (rows, or tokens) and how many of
// them the argmax got right.
struct LossValue {
  float mean = 0;
  int64_t correct = 0;
  int64_t positions = 0;
};

class Loss {
 public:
  virtual ~Loss() = default;
  virtual LossValue forward(const Tensor& output, const Tensor& targets) = 0;
  // d(dloss x mean loss)/d(output) of the last forward; a buffer reused by the next call.
  virtual Tensor backward(float dloss) = 0;
};

// Cross-entropy over logits [..., C] (f32, bf16 or f16; computed in f32) and int32 labels
// [...], mean over all label positions. The gradient has the logits' type. Logits on a device
// take its fused kernels (ops::cross_entropy_forward_device): lse kept instead of the
// probabilities, the loss and the count of correct rows read back.
class CrossEntropyLoss final : public Loss {
 public:
  LossValue forward(const Tensor& logits, const Tensor& labels) override;
  Tensor backward(float dloss) override;

 private:
  DType type_ = DType::kF32;  // the logits'
  Tensor wide_;               // 16-bit logits widened to f32
  Tensor probs_;
  Tensor labels_;
  Tensor dlogits_;
  Tensor narrow_;  // dlogits in the logits' type
  Tensor logits_;  // on a device: the logits and each row's log-sum-exp (the fused backward's)
  Tensor lse_;
};

// Mean squared error of outputs [N, 1] (f32, bf16 or f16; computed in f32) against f32
// targets [N], mean over the rows. No row counts as "correct" (LossValue::correct = 0).
class MseLoss final : public Loss {
 public:
  LossValue forward(const Tensor& output, const Tensor& targets) override;
  Tensor backward(float dloss) override;

 private:
  DType type_ = DType::kF32;  // the output's
  Tensor diff_;               // output - target, f32
  Tensor grad_;               // f32
  Tensor narrow_;             // the gradient in the output's type
};

// Binary cross-entropy of logits [N, K] (f32, bf16 or f16; computed in f32) against f32 0/1
// labels [N, K], each label's probability the sigmoid of its logit (multilabel, as PyTorch's
// BCEWithLogitsLoss): mean over all N x K labels of max(z, 0) - z y + log(1 + exp(-|z|)), which
// neither overflows nor loses a small loss to rounding. A label counts as correct when
// (z > 0) == (y = 1), so LossValue's accuracy is the mean over rows and labels.
class BceWithLogitsLoss final : public Loss {
 public:
  LossValue forward(const Tensor& logits, const Tensor& labels) override;
  Tensor backward(float dloss) override;

 private:
  DType type_ = DType::kF32;  // the logits'
  Tensor grad_;               // sigmoid(z) - y, f32, scaled in backward
  Tensor scaled_;             // the gradient, f32
  Tensor narrow_;             // the gradient in the logits' type
};

// Cross-entropy over logits cut by vocabulary across a tensor-parallel group (an LmHead's):
// this rank holds the logits of vocabulary [rank x Vl, (rank + 1) x Vl) of `vocab` (past it:
// padding, left out). The forward reduces three values per position over the group (the max,
// the target's logit, the sum of exponentials); the backward communicates nothing. A position
// counts as correct when its target's logit is the group's max. 16-bit logits are widened
// first (the reductions are f32); the gradient has the logits' type.
class VocabParallelCrossEntropy final : public Loss {
 public:
  VocabParallelCrossEntropy(TensorParallel& tp, int64_t vocab) : tp_(tp), V_(vocab) {}
  LossValue forward(const Tensor& logits, const Tensor& labels) override;
  Tensor backward(float dloss) override;

 private:
  // On a device: the sliced steps' kernels, the row statistics reduced over the group in
  // stats_ [3, N] (row max, sums, target), read back once for the loss; the backward recomputes
  // the probabilities from the logits kept in logits_.
  LossValue forward_device(const Tensor& logits, const Tensor& labels);

  TensorParallel& tp_;
  int64_t V_;
  DType type_ = DType::kF32;  // the logits'
  Tensor wide_, narrow_;      // 16-bit logits widened, the gradient in their type
  Tensor probs_, labels_, dlogits_;
  Tensor row_max_, sums_, target_;
  Tensor logits_, stats_;  // on a device
};

}  // namespace tessel::nn
