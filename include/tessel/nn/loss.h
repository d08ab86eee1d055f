// Cross-entropy loss over logits [..., C] and int32 labels [...] (classification: [N,C] and
// [N]; language model: [B,T,V] and [B,T]), mean over all label positions.
#pragma once

#include "tessel/tensor/tensor.h"

namespace tessel::nn {

class CrossEntropyLoss {
 public:
  // Returns the mean loss and caches the probabilities for backward().
  float forward(const Tensor& logits, const Tensor& labels);
  // dlogits of (dloss x mean loss); same shape as the logits. A buffer reused by the next call.
  Tensor backward(float dloss = 1.0f);
  // Positions whose argmax equals the label, in the last forward().
  int64_t correct() const { return correct_; }
  int64_t count() const { return labels_.numel(); }

 private:
  Tensor probs_;
  Tensor labels_;
  Tensor dlogits_;
  int64_t correct_ = 0;
};

}  // namespace tessel::nn
