// Basic layers: each forward/backward validates shapes, takes its output from the cache (or fresh
// storage in inference) and calls one kernel pair of tessel/ops.
#include "tessel/nn/layers.h"

#include <algorithm>
#include <cmath>

#include "checks.h"
#include "tessel/ops/cpu.h"
#include "tessel/tensor/device.h"

namespace tessel::nn {
namespace {

// Activations may be f32, bf16 or f16 (train.precision); a layer computes in its parameters'
// type and keeps its input's.
void check_float(const Tensor& x, const char* layer) {
  if (!float_typed(x))
    throw InvalidArgument(str(layer, ": input must be an f32, bf16 or f16 tensor, got ",
                              x.defined() ? dtype_name(x.dtype()) : "an undefined tensor",
                              "; check the data loader's output and the model kind"));
}

void check_same_shape(const Tensor& dy, const Shape& expected, const char* layer,
                      DType type = DType::kF32) {
  if (!dy.defined() || dy.shape() != expected || dy.dtype() != type)
    throw InvalidArgument(str(layer, ": backward gradient must be ", dtype_name(type), " ",
                              shape_str(expected), ", got ", described(dy),
                              "; call backward() with the gradient of the last forward() output"));
}

// For the f32-only kernels (convolution, pooling) in a 16-bit precision: f32_in(x) is x or an
// f32 copy of it, f32_out(y) is y or f32 staging that to_out() rounds into y afterwards. The
// copies live in scratch slot `slot` of the cache (fresh storage without one), on the thread's
// current device, and are converted there.
Tensor f32_scratch(const Shape& shape, Cache* cache, size_t slot) {
  return cache ? cache->scratch(slot, shape) : Tensor::empty(shape, DType::kF32, current_device());
}

// dst = src converted to dst's type, both on dst's device.
void convert_into(const Tensor& dst, const Tensor& src) {
  if (dst.device() == Device::kCpu)
    return ops::convert(dst.raw(), dst.dtype(), src.raw(), src.dtype(), dst.numel());
  device_runtime(dst.device())
      .convert(dst.raw(), dst.dtype(), src.raw(), src.dtype(), dst.numel(), current_stream());
}

Tensor f32_in(const Tensor& x, Cache* cache, size_t slot) {
  if (x.dtype() == DType::kF32) return x;
  Tensor out = f32_scratch(x.shape(), cache, slot);
  convert_into(out, x);
  return out;
}

Tensor f32_out(const Tensor& y, Cache* cache, size_t slot) {
  return y.dtype() == DType::kF32 ? y : f32_scratch(y.shape(), cache, slot);
}

void to_out(const Tensor& y, const Tensor& staged) {
  if (staged.raw() != y.raw()) convert_into(y, staged);
}

Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

}  // namespace

// ---- Linear ----

Linear::Linear(int64_t in, int64_t out, bool bias, TpCut tp)
    : in_(in), out_(out), has_bias_(bias), tp_(tp) {
  TESSEL_CHECK(in > 0 && out > 0, "linear: sizes must be positive, got in ", in, ", out ", out);
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  weight_ = {"weight", {out, in}, Init::kUniform, bound, {}, {}, {}};
  bias_ = {"bias", {out}, Init::kUniform, bound, {}, {}, {}};
  if (tp_.tp == nullptr || tp_.cut == Cut::kNone) {
    tp_ = {};
    return;
  }
  const int rank = tp_.tp->rank(), size = tp_.tp->size();
  TESSEL_CHECK((tp_.cut == Cut::kColumn ? out / tp_.groups : in) % size == 0,
               "linear: ", tp_.cut == Cut::kColumn ? "output" : "input", " features ",
               tp_.cut == Cut::kColumn ? out : in, " (in ", tp_.groups,
               " groups) do not split over ", size, " tensor-parallel ranks");
  if (tp_.cut == Cut::kColumn) {
    weight_.cut(0, tp_.groups, rank, size);
    bias_.cut(0, tp_.groups, rank, size);
    out_ = weight_.shape[0];
  } else {
    weight_.cut(1, 1, rank, size);
    in_ = weight_.shape[1];
  }
}

void Linear::freeze(bool values_too) {
  Tensor& w = weight_.value;
  if (frozen_ || !w.defined() || w.dtype() != DType::kF32 || w.device() != Device::kCpu) return;
  frozen_ = true;
  if (!values_too) return;
  // [out, in] to [in, out] in place, along the permutation's cycles (element o * in + i goes
  // to i * out + o); a bit per element marks those moved, where a copy would double the
  // weight's memory for a moment.
  float* v = w.data<float>();
  const int64_t n = in_ * out_;
  std::vector<bool> moved(static_cast<size_t>(n));
  for (int64_t start = 0; start < n; ++start) {
    if (moved[static_cast<size_t>(start)]) continue;
    float carry = v[start];
    int64_t p = start;
    do {
      p = p % in_ * out_ + p / in_;
      std::swap(carry, v[p]);
      moved[static_cast<size_t>(p)] = true;
    } while (p != start);
  }
}

std::vector<Parameter*> Linear::parameters() {
  if (has_bias_) return {&weight_, &bias_};
  return {&weight_};
}

// Buffer and scratch slots: 0 the output / input gradient; 1 this rank's part of them under
// sequence parallelism (tp_leave's, tp_enter_backward's). A column-cut layer keeps its input
// as it came (its sequence part) and gathers it again in the backward.
Tensor Linear::forward(const Tensor& x, const Context& /*ctx*/, Cache* cache) {
  check_float(x, "linear");
  const bool row = tp_.cut == Cut::kRow;
  const Tensor in = tp_.cut == Cut::kColumn ? tp_enter(tp_.tp, x) : x;
  if (in.ndim() < 1 || in.dim(-1) != in_)
    throw InvalidArgument(str("linear: input's last dimension must be ", in_, ", got shape ",
                              shape_str(in.shape()), "; check the model's input size"));
  if (cache) cache->keep(0, x);
  const DType t = weight_.value.dtype();
  const Shape shape = with_last(in.shape(), out_);
  Tensor y = row ? tp_whole_output(tp_.tp, cache, 0, shape, t) : output(cache, 0, shape, t);
  const bool add_bias = has_bias_ && (!row || tp_.tp->rank() == 0);
  if (frozen_) {
    TESSEL_CHECK(in.dtype() == DType::kF32, "linear: a frozen f32 layer got a ",
                 dtype_name(in.dtype()), " input");
    ops::linear_forward(y.data<float>(), in.data<float>(), weight_.value.data<float>(),
                        add_bias ? bias_.value.data<float>() : nullptr, in.numel() / in_, in_, out_,
                        /*w_t=*/true);
  } else {
    ops::linear_forward(y.raw(), in.raw(), in.dtype(), weight_.value.raw(),
                        add_bias ? bias_.value.raw() : nullptr, t, in.numel() / in_, in_, out_);
  }
  return row ? tp_leave(tp_.tp, y, cache, 1) : y;
}

// Deferred (zero-bubble B): dy goes to buffer 2 and kept slot 1 for backward_weights(), which
// also gathers a column-cut layer's input, so that B moves no input.
Tensor Linear::backward(const Tensor& dy_in, Cache& cache) {
  TESSEL_CHECK(!frozen_, "linear: a frozen layer (a serving replica's) has no backward");
  const bool row = tp_.cut == Cut::kRow, column = tp_.cut == Cut::kColumn;
  const DType t = weight_.value.dtype();
  // A row-cut layer's bias sees its output split along the sequence under sequence
  // parallelism: its gradient is this rank's part, summed over the group at the step like
  // every whole parameter's (parallel/engine.h).
  float* db = has_bias_ ? bias_.grad.kernel_data<float>() : nullptr;
  if (row && sequence_split(tp_.tp) && db) {  // the bias part of linear_backward alone
    const Tensor dy32 = f32_in(dy_in, &cache, 2);
    ops::linear_backward(nullptr, DType::kF32, nullptr, db, dy32.raw(), nullptr, nullptr,
                         DType::kF32, dy_in.numel() / out_, in_, out_);
    db = nullptr;
  }
  const Tensor dy = row ? tp_leave_backward(tp_.tp, dy_in) : dy_in;
  const Shape x_shape =
      column ? tp_entered_shape(tp_.tp, cache.kept(0).shape()) : cache.kept(0).shape();
  const DType x_type = cache.kept(0).dtype();
  check_same_shape(dy, with_last(x_shape, out_), "linear", t);
  Tensor x;
  if (defer_weights_) {
    cache.release({0});  // the output, which neither B nor W reads, goes before dy's copy comes
    Tensor kept = cache.buffer(2, dy.shape(), t);
    kept.copy_from(dy);
    cache.keep(1, kept);
  } else {
    x = column ? tp_enter(tp_.tp, cache.kept(0)) : cache.kept(0);
  }
  Tensor dx;
  if (input_grad_)
    dx = column ? tp_whole_grad(tp_.tp, cache, 0, x_shape, x_type)
                : cache.scratch(0, x_shape, x_type);
  ops::linear_backward(input_grad_ ? dx.raw() : nullptr, x_type,
                       defer_weights_ ? nullptr : weight_.grad.kernel_data<float>(), db, dy.raw(),
                       defer_weights_ ? nullptr : x.raw(), weight_.value.raw(), t,
                       shape_numel(x_shape) / in_, in_, out_);
  return column ? tp_enter_backward(tp_.tp, dx, cache, 1) : dx;
}

void Linear::backward_weights(Cache& cache) {
  if (!defer_weights_) return;
  const Tensor x = tp_.cut == Cut::kColumn ? tp_enter(tp_.tp, cache.kept(0)) : cache.kept(0);
  const Tensor& dy = cache.kept(1);
  ops::linear_backward(nullptr, x.dtype(), weight_.grad.kernel_data<float>(), nullptr, dy.raw(),
                       x.raw(), weight_.value.raw(), weight_.value.dtype(), x.numel() / in_, in_,
                       out_);
}

void Linear::release_for_weights(Cache& cache) { cache.release({0, 1}); }  // x and dy

double Linear::forward_flops(int64_t batch) const {
  return 2.0 * static_cast<double>(batch) * rows_per_sample_ * in_ * out_;
}

// ---- ReLU, GELU ----

Tensor ReLU::forward(const Tensor& x, const Context& /*ctx*/, Cache* cache) {
  check_float(x, "relu");
  Tensor y = output(cache, 0, x.shape(), x.dtype());
  ops::relu_forward(y.raw(), x.raw(), x.numel(), x.dtype());
  if (cache) cache->keep(0, y);
  return y;
}

Tensor ReLU::backward(const Tensor& dy, Cache& cache) {
  const Tensor& y = cache.kept(0);
  check_same_shape(dy, y.shape(), "relu", y.dtype());
  if (!input_grad_) return {};
  Tensor dx = cache.scratch(0, dy.shape(), y.dtype());
  ops::relu_backward(dx.raw(), dy.raw(), y.raw(), dy.numel(), y.dtype());
  return dx;
}

Tensor GELU::forward(const Tensor& x, const Context& /*ctx*/, Cache* cache) {
  check_float(x, "gelu");
  if (cache) cache->keep(0, x);
  Tensor y = output(cache, 0, x.shape(), x.dtype());
  ops::gelu_forward(y.raw(), x.raw(), x.numel(), x.dtype());
  return y;
}

Tensor GELU::backward(const Tensor& dy, Cache& cache) {
  const Tensor& x = cache.kept(0);
  check_same_shape(dy, x.shape(), "gelu", x.dtype());
  if (!input_grad_) return {};
  Tensor dx = cache.scratch(0, dy.shape(), x.dtype());
  ops::gelu_backward(dx.raw(), dy.raw(), x.raw(), dy.numel(), x.dtype());
  return dx;
}

// ---- Dropout ----

Dropout::Dropout(float p, int64_t first_col) : p_(p), first_col_(first_col) {
  if (!(p >= 0.0f && p < 1.0f))
    throw InvalidArgument(str("dropout: probability must be in [0, 1), got ", p,
                              "; set model.dropout to e.g. 0.1, or 0 to disable it"));
}

// The cache keeps the context (the mask is regenerated from it) and the input's shape; a
// forward that applied no mask keeps ctx.training = false.
Tensor Dropout::forward(const Tensor& x, const Context& ctx, Cache* cache) {
  check_float(x, "dropout");
  const bool active = ctx.training && p_ > 0.0f && x.numel() > 0;
  if (cache) {
    cache->ctx = ctx;
    cache->ctx.training = active;
    cache->shape = x.shape();
  }
  if (!active) return x;
  const int64_t rows = x.ndim() > 0 ? x.dim(0) : 1;
  Tensor y = output(cache, 0, x.shape(), x.dtype());
  ops::dropout_forward(y.raw(), x.raw(), rows, x.numel() / rows, p_, ctx.seed, ctx.step,
                       ctx.first_sample, first_col_, x.dtype());
  return y;
}

Tensor Dropout::backward(const Tensor& dy, Cache& cache) {
  const int64_t n = shape_numel(cache.shape);
  TESSEL_CHECK(dy.defined() && dy.numel() == n && !cache.shape.empty(),
               "dropout: backward gradient of ", dy.defined() ? dy.numel() : 0,
               " elements after a forward of ", n);
  if (!cache.ctx.training || !input_grad_) return input_grad_ ? dy : Tensor();
  const int64_t rows = cache.shape[0];
  Tensor dx = cache.scratch(0, dy.shape(), dy.dtype());
  const Context& c = cache.ctx;
  ops::dropout_backward(dx.raw(), dy.raw(), rows, n / rows, p_, c.seed, c.step, c.first_sample,
                        first_col_, dy.dtype());
  return dx;
}

// ---- Flatten ----

Tensor Flatten::forward(const Tensor& x, const Context& /*ctx*/, Cache* cache) {
  TESSEL_CHECK(x.defined() && x.ndim() >= 1, "flatten: input needs a batch dimension");
  if (cache) cache->shape = x.shape();
  return x.reshape({x.dim(0), -1});
}

Tensor Flatten::backward(const Tensor& dy, Cache& cache) {
  const Shape& in = cache.shape;
  TESSEL_CHECK(dy.defined() && !in.empty() && dy.numel() == shape_numel(in),
               "flatten: backward of ", dy.defined() ? dy.numel() : 0,
               " elements after a forward of ", shape_str(in));
  if (!input_grad_) return {};
  return dy.reshape(in);
}

// ---- Conv2d ----

namespace {

// A convolution's parameters, initialised as PyTorch does: U(-1/sqrt(C*k*k), 1/sqrt(C*k*k)).
void conv_parameters(int64_t C, int64_t OC, int64_t k, Parameter& weight, Parameter& bias) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(C * k * k));
  weight = {"weight", {OC, C, k, k}, Init::kUniform, bound, {}, {}, {}};
  bias = {"bias", {OC}, Init::kUniform, bound, {}, {}, {}};
}

}  // namespace

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride,
               int64_t pad, int64_t in_h, int64_t in_w)
    : C_(in_channels),
      OC_(out_channels),
      k_(kernel),
      stride_(stride),
      pad_(pad),
      in_h_(in_h),
      in_w_(in_w) {
  TESSEL_CHECK(C_ > 0 && OC_ > 0 && k_ > 0 && stride_ > 0 && pad_ >= 0,
               "conv2d: sizes must be positive, got in ", C_, ", out ", OC_, ", kernel ", k_,
               ", stride ", stride_, ", pad ", pad_);
  conv_parameters(C_, OC_, k_, weight_, bias_);
}

Tensor Conv2d::forward(const Tensor& x, const Context& /*ctx*/, Cache* cache) {
  check_float(x, "conv2d");
  const bool size_ok = x.ndim() == 4 && x.dim(1) == C_ && (in_h_ == 0 || x.dim(2) == in_h_) &&
                       (in_w_ == 0 || x.dim(3) == in_w_) && x.dim(2) + 2 * pad_ >= k_ &&
                       x.dim(3) + 2 * pad_ >= k_;
  if (!size_ok)
    throw InvalidArgument(str("conv2d: input must be [N, ", C_, ", H, W] with H, W + 2*", pad_,
                              " >= ", k_, ", got shape ", shape_str(x.shape()),
                              "; images need data.flatten = false"));
  if (cache) cache->keep(0, x);
  const ops::Conv2dShape s{x.dim(0), C_, x.dim(2), x.dim(3), OC_, k_, k_, stride_, pad_};
  Tensor y = output(cache, 0, {s.N, OC_, s.OH(), s.OW()}, weight_.value.dtype());
  Tensor y32 = f32_out(y, cache, 5);
  const Shape scratch_shape{ops::conv2d_scratch_floats(s)};
  Tensor scratch = f32_scratch(scratch_shape, cache, 0);
  ops::conv2d_forward(y32.kernel_data<float>(), f32_in(x, cache, 6).kernel_data<float>(),
                      f32_in(weight_.value, cache, 7).kernel_data<float>(),
                      f32_in(bias_.value, cache, 8).kernel_data<float>(), s,
                      scratch.kernel_data<float>());
  to_out(y, y32);
  return y;
}

Tensor Conv2d::backward(const Tensor& dy, Cache& cache) {
  const Tensor& x = cache.kept(0);
  const ops::Conv2dShape s{x.dim(0), C_, x.dim(2), x.dim(3), OC_, k_, k_, stride_, pad_};
  check_same_shape(dy, {s.N, OC_, s.OH(), s.OW()}, "conv2d", weight_.value.dtype());
  Tensor dx, dx32;
  if (input_grad_) {
    dx = cache.scratch(1, x.shape(), x.dtype());
    dx32 = f32_out(dx, &cache, 5);
  }
  Tensor scratch = cache.scratch(0, {ops::conv2d_scratch_floats(s)});
  ops::conv2d_backward(
      input_grad_ ? dx32.kernel_data<float>() : nullptr, weight_.grad.kernel_data<float>(),
      bias_.grad.kernel_data<float>(), f32_in(dy, &cache, 6).kernel_data<float>(),
      f32_in(x, &cache, 7).kernel_data<float>(),
      f32_in(weight_.value, &cache, 8).kernel_data<float>(), s, scratch.kernel_data<float>());
  if (input_grad_) to_out(dx, dx32);
  return dx;
}

double Conv2d::forward_flops(int64_t batch) const {
  if (in_h_ == 0 || in_w_ == 0) return 0;
  const ops::Conv2dShape s{batch, C_, in_h_, in_w_, OC_, k_, k_, stride_, pad_};
  return 2.0 * static_cast<double>(batch) * OC_ * s.OH() * s.OW() * C_ * k_ * k_;
}

// ---- ConvReluPool ----

ConvReluPool::ConvReluPool(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t pad,
                           int64_t pool, int64_t in_h, int64_t in_w)
    : C_(in_channels),
      OC_(out_channels),
      k_(kernel),
      pad_(pad),
      pool_(pool),
      in_h_(in_h),
      in_w_(in_w) {
  TESSEL_CHECK(C_ > 0 && OC_ > 0 && k_ > 0 && pad_ >= 0 && pool_ > 0 && in_h_ > 0 && in_w_ > 0,
               "conv2d_relu_maxpool: sizes must be positive, got in ", C_, ", out ", OC_,
               ", kernel ", k_, ", pad ", pad_, ", pool ", pool_, ", input ", in_h_, "x", in_w_);
  conv_parameters(C_, OC_, k_, weight_, bias_);
}

ops::Conv2dShape ConvReluPool::shape(int64_t batch) const {
  return {batch, C_, in_h_, in_w_, OC_, k_, k_, 1, pad_};
}

Tensor ConvReluPool::forward(const Tensor& x, const Context& /*ctx*/, Cache* cache) {
  check_float(x, "conv2d_relu_maxpool");
  if (x.ndim() != 4 || x.dim(1) != C_ || x.dim(2) != in_h_ || x.dim(3) != in_w_)
    throw InvalidArgument(str("conv2d_relu_maxpool: input must be [N, ", C_, ", ", in_h_, ", ",
                              in_w_, "], got shape ", shape_str(x.shape()),
                              "; images need data.flatten = false"));
  const ops::Conv2dShape s = shape(x.dim(0));
  const Shape out{s.N, OC_, (s.OH() - pool_) / pool_ + 1, (s.OW() - pool_) / pool_ + 1};
  Tensor y = output(cache, 0, out, weight_.value.dtype());
  Tensor argmax = output(cache, 1, out, DType::kI32), y32 = f32_out(y, cache, 5);
  const Shape scratch_shape{ops::conv2d_relu_maxpool_scratch_floats(s, pool_, pool_)};
  Tensor scratch = f32_scratch(scratch_shape, cache, 0);
  ops::conv2d_relu_maxpool_forward(y32.kernel_data<float>(), argmax.kernel_data<int32_t>(),
                                   f32_in(x, cache, 6).kernel_data<float>(),
                                   f32_in(weight_.value, cache, 7).kernel_data<float>(),
                                   f32_in(bias_.value, cache, 8).kernel_data<float>(), s, pool_,
                                   pool_, scratch.kernel_data<float>());
  to_out(y, y32);
  if (cache) {
    cache->keep(0, x);
    cache->keep(1, y);
    cache->keep(2, argmax);
  }
  return y;
}

Tensor ConvReluPool::backward(const Tensor& dy, Cache& cache) {
  const Tensor &x = cache.kept(0), &y = cache.kept(1), &argmax = cache.kept(2);
  check_same_shape(dy, y.shape(), "conv2d_relu_maxpool", y.dtype());
  const ops::Conv2dShape s = shape(x.dim(0));
  Tensor dx, dx32;
  if (input_grad_) {
    dx = cache.scratch(1, x.shape(), x.dtype());
    dx32 = f32_out(dx, &cache, 5);
  }
  Tensor scratch = cache.scratch(0, {ops::conv2d_relu_maxpool_scratch_floats(s, pool_, pool_)});
  ops::conv2d_relu_maxpool_backward(
      input_grad_ ? dx32.kernel_data<float>() : nullptr, weight_.grad.kernel_data<float>(),
      bias_.grad.kernel_data<float>(), f32_in(dy, &cache, 6).kernel_data<float>(),
      argmax.kernel_data<int32_t>(), f32_in(y, &cache, 9).kernel_data<float>(),
      f32_in(x, &cache, 7).kernel_data<float>(),
      f32_in(weight_.value, &cache, 8).kernel_data<float>(), s, pool_, pool_,
      scratch.kernel_data<float>());
  if (input_grad_) to_out(dx, dx32);
  return dx;
}

double ConvReluPool::forward_flops(int64_t batch) const {
  const ops::Conv2dShape s = shape(batch);
  return 2.0 * static_cast<double>(batch) * OC_ * s.OH() * s.OW() * C_ * k_ * k_;
}

// ---- MaxPool2d ----

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride) : k_(kernel), stride_(stride) {
  TESSEL_CHECK(k_ > 0 && stride_ > 0, "maxpool2d: kernel and stride must be positive, got ", k_,
               ", ", stride_);
}

Tensor MaxPool2d::forward(const Tensor& x, const Context& /*ctx*/, Cache* cache) {
  check_float(x, "maxpool2d");
  if (x.ndim() != 4 || x.dim(2) < k_ || x.dim(3) < k_)
    throw InvalidArgument(str("maxpool2d: input must be [N, C, H, W] with H, W >= ", k_,
                              ", got shape ", shape_str(x.shape()),
                              "; use a larger image or fewer pooling stages"));
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const Shape out{N, C, (H - k_) / stride_ + 1, (W - k_) / stride_ + 1};
  Tensor y = output(cache, 0, out, x.dtype()), y32 = f32_out(y, cache, 5);
  Tensor argmax = output(cache, 1, out, DType::kI32);
  ops::maxpool2d_forward(y32.kernel_data<float>(), argmax.kernel_data<int32_t>(),
                         f32_in(x, cache, 6).kernel_data<float>(), N, C, H, W, k_, stride_);
  to_out(y, y32);
  if (cache) {
    cache->shape = x.shape();
    cache->keep(0, argmax);
  }
  return y;
}

Tensor MaxPool2d::backward(const Tensor& dy, Cache& cache) {
  const Tensor& argmax = cache.kept(0);
  const Shape& in = cache.shape;
  const int64_t N = in[0], C = in[1], H = in[2], W = in[3];
  check_same_shape(dy, argmax.shape(), "maxpool2d", dy.defined() ? dy.dtype() : DType::kF32);
  if (!input_grad_) return {};
  // The output (and its gradient) has the input's type.
  Tensor dx = cache.scratch(0, in, dy.dtype()), dx32 = f32_out(dx, &cache, 5);
  ops::maxpool2d_backward(dx32.kernel_data<float>(), f32_in(dy, &cache, 6).kernel_data<float>(),
                          argmax.kernel_data<int32_t>(), N, C, H, W, k_, stride_);
  to_out(dx, dx32);
  return dx;
}

// ---- LayerNorm ----

LayerNorm::LayerNorm(int64_t channels) : C_(channels) {
  TESSEL_CHECK(C_ > 0, "layernorm: channels must be positive, got ", C_);
  weight_ = {"weight", {C_}, Init::kOnes, 0.0f, {}, {}, {}};
  bias_ = {"bias", {C_}, Init::kZeros, 0.0f, {}, {}, {}};
}

Tensor LayerNorm::forward(const Tensor& x, const Context& /*ctx*/, Cache* cache) {
  check_float(x, "layernorm");
  if (x.ndim() < 1 || x.dim(-1) != C_)
    throw InvalidArgument(str("layernorm: input's last dimension must be ", C_, ", got shape ",
                              shape_str(x.shape()), "; check the model's embedding size"));
  const DType t = weight_.value.dtype();
  if (x.dtype() != t)
    throw InvalidArgument(str("layernorm: input must be ", dtype_name(t),
                              " like the parameters, got ", dtype_name(x.dtype()),
                              "; the blocks of a model share one precision"));
  const int64_t N = x.numel() / C_;
  Tensor y = output(cache, 0, x.shape(), t);
  Tensor mean = output(cache, 1, {N}), rstd = output(cache, 2, {N});
  ops::layernorm_forward(y.raw(), mean.kernel_data<float>(), rstd.kernel_data<float>(), x.raw(),
                         weight_.value.raw(), bias_.value.raw(), N, C_, t);
  if (cache) {
    cache->keep(0, x);
    cache->keep(1, mean);
    cache->keep(2, rstd);
  }
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy, Cache& cache) {
  const Tensor& x = cache.kept(0);
  check_same_shape(dy, x.shape(), "layernorm", x.dtype());
  const int64_t N = x.numel() / C_;
  Tensor dx;
  if (input_grad_) dx = cache.scratch(0, x.shape(), x.dtype());
  ops::layernorm_backward(input_grad_ ? dx.raw() : nullptr, weight_.grad.kernel_data<float>(),
                          bias_.grad.kernel_data<float>(), dy.raw(), x.raw(), weight_.value.raw(),
                          cache.kept(1).kernel_data<float>(), cache.kept(2).kernel_data<float>(), N,
                          C_, x.dtype());
  return dx;
}

}  // namespace tessel::nn
