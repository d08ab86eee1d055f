#include "tessel/nn/loss.h"

#include "tessel/ops/cpu.h"

namespace tessel::nn {

LossValue CrossEntropyLoss::forward(const Tensor& logits, const Tensor& labels) {
  if (!logits.defined() || logits.dtype() != DType::kF32 || logits.ndim() < 1 || logits.dim(-1) < 1)
    throw InvalidArgument(str("cross_entropy: logits must be f32 [..., C], got ",
                              logits.defined() ? shape_str(logits.shape()) : "undefined",
                              "; pass the model's output"));
  const int64_t C = logits.dim(-1), N = logits.numel() / C;
  if (!labels.defined() || labels.dtype() != DType::kI32 || labels.numel() != N)
    throw InvalidArgument(str("cross_entropy: labels must be i32 with one per logits row (", N,
                              " for logits ", shape_str(logits.shape()), "), got ",
                              labels.defined() ? dtype_name(labels.dtype()) : "undefined", " ",
                              labels.defined() ? shape_str(labels.shape()) : "",
                              "; check the dataset's label shape and num_classes"));
  if (!probs_.defined() || probs_.shape() != logits.shape()) probs_ = Tensor::empty(logits.shape());
  labels_ = labels;
  const float loss = ops::cross_entropy_forward(probs_.data<float>(), logits.data<float>(),
                                                labels.data<int32_t>(), N, C);
  return {loss, ops::count_correct(logits.data<float>(), labels.data<int32_t>(), N, C), N};
}

Tensor CrossEntropyLoss::backward(float dloss) {
  TESSEL_CHECK(probs_.defined() && labels_.defined(), "cross_entropy: backward() before forward()");
  const int64_t C = probs_.dim(-1), N = probs_.numel() / C;
  if (!dlogits_.defined() || dlogits_.shape() != probs_.shape())
    dlogits_ = Tensor::empty(probs_.shape());
  ops::cross_entropy_backward(dlogits_.data<float>(), probs_.data<float>(), labels_.data<int32_t>(),
                              N, C, dloss);
  return dlogits_;
}

}  // namespace tessel::nn
