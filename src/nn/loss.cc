#include "tessel/nn/loss.h"

#include <algorithm>
#include <cmath>

#include "checks.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"

namespace tessel::nn {

namespace {

// Checks logits [..., C] of a type in `types` and one i32 label per row; returns the rows.
int64_t check_inputs(const Tensor& logits, const Tensor& labels,
                     std::initializer_list<DType> types = {DType::kF32}) {
  const bool typed =
      logits.defined() && std::find(types.begin(), types.end(), logits.dtype()) != types.end();
  if (!typed || logits.ndim() < 1 || logits.dim(-1) < 1)
    throw InvalidArgument(str("cross_entropy: logits must be ",
                              types.size() > 1 ? "f32, bf16 or f16" : "f32", " [..., C], got ",
                              described(logits), "; pass the model's output"));
  const int64_t N = logits.numel() / logits.dim(-1);
  if (!labels.defined() || labels.dtype() != DType::kI32 || labels.numel() != N)
    throw InvalidArgument(str("cross_entropy: labels must be i32 with one per logits row (", N,
                              " for logits ", shape_str(logits.shape()), "), got ",
                              labels.defined() ? dtype_name(labels.dtype()) : "undefined", " ",
                              labels.defined() ? shape_str(labels.shape()) : "",
                              "; check the dataset's label shape and num_classes"));
  return N;
}

void reuse(Tensor& t, const Shape& shape) {
  if (!t.defined() || t.shape() != shape) t = Tensor::empty(shape);
}

// t holds `shape` of `type` on `device`, made anew when it does not.
void reuse_on(Tensor& t, const Shape& shape, DType type, Device device) {
  if (!t.defined() || t.shape() != shape || t.dtype() != type || t.device() != device)
    t = Tensor::empty(shape, type, device);
}

// A tensor-parallel rank's classes of logits [..., C]: [lo, lo + C), the first `valid` real
// (the last ranks' pad the vocabulary V to a multiple of the group).
struct ClassSlice {
  int64_t lo, valid;
};
ClassSlice class_slice(const TensorParallel& tp, int64_t V, int64_t C) {
  const int64_t lo = tp.rank() * C;
  return {lo, std::clamp<int64_t>(V - lo, 0, C)};
}

// x as f32: itself, or (16-bit) widened into `wide`.
Tensor widened(const Tensor& x, Tensor& wide) {
  if (x.dtype() == DType::kF32) return x;
  reuse(wide, x.shape());
  ops::convert(wide.raw(), DType::kF32, x.raw(), x.dtype(), x.numel());
  return wide;
}

// An f32 gradient in `type`: itself, or rounded into `narrow`.
Tensor narrowed(const Tensor& g, DType type, Tensor& narrow) {
  if (type == DType::kF32) return g;
  if (!narrow.defined() || narrow.shape() != g.shape() || narrow.dtype() != type)
    narrow = Tensor::empty(g.shape(), type);
  ops::convert(narrow.raw(), type, g.raw(), DType::kF32, g.numel());
  return narrow;
}

}  // namespace

// Logits of a 16-bit precision are widened first: the softmax, the loss and the row statistics
// are always f32; the gradient goes back in the logits' type.
// On a device the fused kernels: the loss and the count read back, lse (no probabilities) kept
// with the logits for the backward.
LossValue CrossEntropyLoss::forward(const Tensor& logits_in, const Tensor& labels) {
  const int64_t N = check_inputs(logits_in, labels, {DType::kF32, DType::kBF16, DType::kF16});
  const int64_t C = logits_in.dim(-1);
  type_ = logits_in.dtype();
  labels_ = labels;
  if (logits_in.device() != Device::kCpu) {
    logits_ = logits_in;
    if (!lse_.defined() || lse_.numel() != N || lse_.device() != logits_in.device())
      lse_ = Tensor::empty({N}, DType::kF32, logits_in.device());
    int64_t correct = 0;
    const float loss =
        ops::cross_entropy_forward_device(lse_.device_data<float>(), &correct, logits_in.raw(),
                                          labels.device_data<int32_t>(), N, C, type_);
    return {loss, correct, N};
  }
  logits_ = Tensor();
  const Tensor logits = widened(logits_in, wide_);
  reuse(probs_, logits.shape());
  const float loss = ops::cross_entropy_forward(probs_.data<float>(), logits.data<float>(),
                                                labels.data<int32_t>(), N, C);
  return {loss, ops::count_correct(logits.data<float>(), labels.data<int32_t>(), N, C), N};
}

Tensor CrossEntropyLoss::backward(float dloss) {
  if (logits_.defined()) {  // on the device
    const int64_t C = logits_.dim(-1), N = logits_.numel() / C;
    reuse_on(dlogits_, logits_.shape(), type_, logits_.device());
    ops::cross_entropy_backward_device(dlogits_.raw(), logits_.raw(), lse_.device_data<float>(),
                                       labels_.device_data<int32_t>(), N, C, dloss, 0, type_);
    return dlogits_;
  }
  TESSEL_CHECK(probs_.defined() && labels_.defined(), "cross_entropy: backward() before forward()");
  const int64_t C = probs_.dim(-1), N = probs_.numel() / C;
  reuse(dlogits_, probs_.shape());
  ops::cross_entropy_backward(dlogits_.data<float>(), probs_.data<float>(), labels_.data<int32_t>(),
                              N, C, dloss);
  return narrowed(dlogits_, type_, narrow_);
}

// The output widened to f32 (in diff_), less the targets; the loss sums in double.
LossValue MseLoss::forward(const Tensor& output, const Tensor& targets) {
  if (!float_typed(output) || output.ndim() != 2 || output.dim(1) != 1)
    throw InvalidArgument(str("mse: output must be f32, bf16 or f16 [N, 1], got ",
                              described(output), "; a regression model has one output per row"));
  const int64_t N = output.dim(0);
  if (!targets.defined() || targets.dtype() != DType::kF32 || targets.numel() != N)
    throw InvalidArgument(str("mse: targets must be f32 with one per row (", N, "), got ",
                              targets.defined() ? dtype_name(targets.dtype()) : "undefined", " ",
                              targets.defined() ? shape_str(targets.shape()) : "",
                              "; regression needs a dataset of f32 targets (data.task)"));
  type_ = output.dtype();
  reuse(diff_, {N});
  float* d = diff_.data<float>();
  ops::convert(d, DType::kF32, output.raw(), type_, N);
  const float* t = targets.data<float>();
  double sum = 0;
  for (int64_t r = 0; r < N; ++r) {
    d[r] -= t[r];
    sum += static_cast<double>(d[r]) * d[r];
  }
  return {N > 0 ? static_cast<float>(sum / static_cast<double>(N)) : 0.0f, 0, N};
}

Tensor MseLoss::backward(float dloss) {
  TESSEL_CHECK(diff_.defined(), "mse: backward() before forward()");
  const int64_t N = diff_.numel();
  reuse(grad_, {N, 1});
  const float scale = N > 0 ? 2.0f * dloss / static_cast<float>(N) : 0.0f;
  for (int64_t r = 0; r < N; ++r) grad_.data<float>()[r] = scale * diff_.data<float>()[r];
  return narrowed(grad_, type_, narrow_);
}

// The logits widened to f32 in grad_, which then holds sigmoid(z) - y; the loss sums in double.
LossValue BceWithLogitsLoss::forward(const Tensor& logits, const Tensor& labels) {
  if (!float_typed(logits) || logits.ndim() != 2)
    throw InvalidArgument(str("bce: logits must be f32, bf16 or f16 [N, K], got ",
                              described(logits), "; a multilabel model has one output per label"));
  const int64_t N = logits.dim(0), K = logits.dim(1), n = N * K;
  if (!labels.defined() || labels.dtype() != DType::kF32 || labels.numel() != n)
    throw InvalidArgument(str("bce: labels must be f32 [N, K] = ", shape_str(logits.shape()),
                              ", got ", labels.defined() ? dtype_name(labels.dtype()) : "undefined",
                              " ", labels.defined() ? shape_str(labels.shape()) : "",
                              "; multilabel needs a dataset of 0/1 label columns (data.task)"));
  type_ = logits.dtype();
  reuse(grad_, {N, K});
  float* g = grad_.data<float>();
  ops::convert(g, DType::kF32, logits.raw(), type_, n);
  const float* y = labels.data<float>();
  double sum = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float z = g[i], e = std::exp(-std::abs(z));  // e in (0, 1]: no overflow
    sum += static_cast<double>(std::max(z, 0.0f) - z * y[i] + std::log1p(e));
    correct += (z > 0) == (y[i] > 0.5f);
    g[i] = (z >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e)) - y[i];
  }
  return {n > 0 ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f, correct, n};
}

Tensor BceWithLogitsLoss::backward(float dloss) {
  TESSEL_CHECK(grad_.defined(), "bce: backward() before forward()");
  const int64_t n = grad_.numel();
  reuse(scaled_, grad_.shape());
  const float scale = n > 0 ? dloss / static_cast<float>(n) : 0.0f;
  for (int64_t i = 0; i < n; ++i) scaled_.data<float>()[i] = scale * grad_.data<float>()[i];
  return narrowed(scaled_, type_, narrow_);
}

LossValue VocabParallelCrossEntropy::forward(const Tensor& logits_in, const Tensor& labels) {
  const int64_t N = check_inputs(logits_in, labels, {DType::kF32, DType::kBF16, DType::kF16});
  const int64_t C = logits_in.dim(-1);
  type_ = logits_in.dtype();
  if (logits_in.device() != Device::kCpu) return forward_device(logits_in, labels);
  logits_ = Tensor();
  const Tensor logits = widened(logits_in, wide_);
  const auto [lo, valid] = class_slice(tp_, V_, C);
  const int32_t* y = labels.data<int32_t>();
  for (int64_t r = 0; r < N; ++r)
    if (y[r] < 0 || y[r] >= V_)
      throw InvalidArgument(str("cross_entropy: label of row ", r, " must be in [0, ", V_,
                                "), got ", y[r], "; check the dataset's vocabulary"));
  reuse(probs_, logits.shape());
  for (Tensor* t : {&row_max_, &sums_, &target_}) reuse(*t, {N});
  labels_ = labels;
  float *mx = row_max_.data<float>(), *sums = sums_.data<float>(), *target = target_.data<float>();
  ops::sliced_row_max(mx, logits.data<float>(), N, C, valid);
  tp_.all_reduce_max(mx, N);
  ops::sliced_exp(probs_.data<float>(), sums, target, logits.data<float>(), y, mx, N, C, valid, lo);
  tp_.all_reduce_sum(target, N, DType::kF32);
  tp_.all_reduce_sum(sums, N, DType::kF32);
  ops::sliced_normalize(probs_.data<float>(), sums, N, C, valid);
  int64_t correct = 0;
  const float loss = ops::sliced_loss(sums, target, mx, N, &correct);
  return {loss, correct, N};
}

LossValue VocabParallelCrossEntropy::forward_device(const Tensor& logits, const Tensor& labels) {
  const int64_t C = logits.dim(-1), N = logits.numel() / C;
  const auto [lo, valid] = class_slice(tp_, V_, C);
  logits_ = logits;
  labels_ = labels;
  reuse_on(stats_, {3, N}, DType::kF32, logits.device());
  float* mx = stats_.device_data<float>();
  float *sums = mx + N, *target = mx + 2 * N;
  ops::device_kernel(&ops::DeviceKernels::sliced_row_max, "sliced_row_max")(
      mx, logits.raw(), N, C, valid, type_, current_stream());
  tp_.all_reduce_max(mx, N);
  ops::device_kernel(&ops::DeviceKernels::sliced_exp_sum, "sliced_exp_sum")(
      sums, target, logits.raw(), labels.device_data<int32_t>(), mx, N, C, valid, lo, V_, type_,
      current_stream());
  tp_.all_reduce_sum(target, N, DType::kF32);
  tp_.all_reduce_sum(sums, N, DType::kF32);
  const Tensor host = stats_.to_device(Device::kCpu);
  const float* h = host.data<float>();
  int64_t correct = 0;
  const float loss = ops::sliced_loss(h + N, h + 2 * N, h, N, &correct);
  return {loss, correct, N};
}

Tensor VocabParallelCrossEntropy::backward(float dloss) {
  if (logits_.defined()) {  // on the device
    const int64_t C = logits_.dim(-1), N = logits_.numel() / C;
    const auto [lo, valid] = class_slice(tp_, V_, C);
    reuse_on(dlogits_, logits_.shape(), type_, logits_.device());
    const float* mx = stats_.device_data<float>();
    ops::device_kernel(&ops::DeviceKernels::sliced_cross_entropy_backward,
                       "sliced_cross_entropy_backward")(dlogits_.raw(), logits_.raw(), mx, mx + N,
                                                        labels_.device_data<int32_t>(), N, C, valid,
                                                        lo, dloss, type_, current_stream());
    return dlogits_;
  }
  TESSEL_CHECK(probs_.defined() && labels_.defined(), "cross_entropy: backward() before forward()");
  const int64_t C = probs_.dim(-1), N = probs_.numel() / C;
  reuse(dlogits_, probs_.shape());
  ops::cross_entropy_backward(dlogits_.data<float>(), probs_.data<float>(), labels_.data<int32_t>(),
                              N, C, dloss, tp_.rank() * C);
  return narrowed(dlogits_, type_, narrow_);
}

}  // namespace tessel::nn
