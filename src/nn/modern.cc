// The modern GPT variant's parts: RMSNorm, SwiGLU and the choices of model.norm,
// model.position and model.mlp.
#include "tessel/nn/modern.h"

#include "checks.h"
#include "tessel/nn/layers.h"
#include "tessel/ops/cpu.h"

namespace tessel::nn {
namespace {

// x must be of the parameters' float type t with last dimension `last`.
void check_input(const Tensor& x, DType t, int64_t last, const char* layer) {
  if (!x.defined() || x.dtype() != t || x.ndim() < 1 || x.dim(-1) != last)
    throw InvalidArgument(str(layer, ": input must be ", dtype_name(t), " [..., ", last, "], got ",
                              described(x),
                              "; check the model's embedding size and train.precision"));
}

}  // namespace

int64_t swiglu_hidden(int64_t channels) {
  return std::max<int64_t>(8, (8 * channels / 3 + 4) / 8 * 8);
}

std::unique_ptr<Module> make_norm(Norm norm, int64_t channels) {
  if (norm == Norm::kRmsNorm) return std::make_unique<RMSNorm>(channels);
  return std::make_unique<LayerNorm>(channels);
}

std::vector<int64_t> sequence_positions(int64_t B, int64_t T) {
  std::vector<int64_t> pos(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) pos[static_cast<size_t>(i)] = i % T;
  return pos;
}

// ---- RMSNorm ----

RMSNorm::RMSNorm(int64_t channels) : C_(channels) {
  TESSEL_CHECK(C_ > 0, "rmsnorm: channels must be positive, got ", C_);
  weight_ = {"weight", {C_}, Init::kOnes, 0.0f, {}, {}, {}};
}

Tensor RMSNorm::forward(const Tensor& x, const Context& /*ctx*/, Cache* cache) {
  const DType t = weight_.value.dtype();
  check_input(x, t, C_, "rmsnorm");
  const int64_t N = x.numel() / C_;
  Tensor y = output(cache, 0, x.shape(), t);
  Tensor rstd = output(cache, 1, {N});
  ops::rmsnorm_forward(y.raw(), rstd.kernel_data<float>(), x.raw(), weight_.value.raw(), N, C_, t);
  if (cache) {
    cache->keep(0, x);
    cache->keep(1, rstd);
  }
  return y;
}

Tensor RMSNorm::backward(const Tensor& dy, Cache& cache) {
  const Tensor& x = cache.kept(0);
  check_gradient(dy, x.shape(), x.dtype(), "rmsnorm");
  Tensor dx;
  if (input_grad_) dx = cache.scratch(0, x.shape(), x.dtype());
  ops::rmsnorm_backward(input_grad_ ? dx.raw() : nullptr, weight_.grad.kernel_data<float>(),
                        dy.raw(), x.raw(), weight_.value.raw(), cache.kept(1).kernel_data<float>(),
                        x.numel() / C_, C_, x.dtype());
  return dx;
}

// ---- SwiGLU ----

Tensor SwiGLU::forward(const Tensor& x, const Context& /*ctx*/, Cache* cache) {
  TESSEL_CHECK(x.defined() && x.ndim() >= 1 && x.dim(-1) % 2 == 0,
               "swiglu: input must be [..., 2H] (gate and up side by side), got ",
               x.defined() ? shape_str(x.shape()) : "undefined");
  const int64_t H = x.dim(-1) / 2, N = x.numel() / (2 * H);
  Shape shape = x.shape();
  shape.back() = H;
  Tensor y = output(cache, 0, shape, x.dtype());
  ops::swiglu_forward(y.raw(), x.raw(), N, H, x.dtype());
  if (cache) cache->keep(0, x);
  return y;
}

Tensor SwiGLU::backward(const Tensor& dy, Cache& cache) {
  const Tensor& x = cache.kept(0);
  Shape shape = x.shape();
  shape.back() /= 2;
  check_gradient(dy, shape, x.dtype(), "swiglu");
  if (!input_grad_) return {};
  Tensor dx = cache.scratch(0, x.shape(), x.dtype());
  ops::swiglu_backward(dx.raw(), dy.raw(), x.raw(), x.numel() / x.dim(-1), shape.back(), x.dtype());
  return dx;
}

}  // namespace tessel::nn
