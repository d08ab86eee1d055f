#include "tessel/nn/loss.h"

#include "tessel/ops/cpu.h"

namespace tessel::nn {

// Logits of a 16-bit precision are widened first: the softmax, the loss and the row statistics
// are always f32; the gradient goes back in the logits' type.
LossValue CrossEntropyLoss::forward(const Tensor& logits_in, const Tensor& labels) {
  const bool is_float = logits_in.defined() && (logits_in.dtype() == DType::kF32 ||
                                                logits_in.dtype() == DType::kBF16 ||
                                                logits_in.dtype() == DType::kF16);
  if (!is_float || logits_in.ndim() < 1 || logits_in.dim(-1) < 1)
    throw InvalidArgument(str("cross_entropy: logits must be f32, bf16 or f16 [..., C], got ",
                              logits_in.defined() ? shape_str(logits_in.shape()) : "undefined",
                              "; pass the model's output"));
  type_ = logits_in.dtype();
  Tensor logits = logits_in;
  if (type_ != DType::kF32) {
    if (!wide_.defined() || wide_.shape() != logits_in.shape()) wide_ = Tensor::empty(logits_in.shape());
    ops::convert(wide_.raw(), DType::kF32, logits_in.raw(), type_, logits_in.numel());
    logits = wide_;
  }
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
  if (type_ == DType::kF32) return dlogits_;
  if (!narrow_.defined() || narrow_.shape() != probs_.shape() || narrow_.dtype() != type_)
    narrow_ = Tensor::empty(probs_.shape(), type_);
  ops::convert(narrow_.raw(), type_, dlogits_.raw(), DType::kF32, narrow_.numel());
  return narrow_;
}

}  // namespace tessel::nn
