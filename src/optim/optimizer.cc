// SGD and AdamW with PyTorch 1.13's update rules (torch.optim.SGD with dampening 0,
// torch.optim.AdamW without amsgrad), so a tessel run and a PyTorch run from the same
// weights and gradients follow the same trajectory. Each step is one fused pass over memory;
// the loops are ops' (optim_step.h), and on a device (inside a DeviceScope) the device's kernel
// table's, over the same flat arenas, with the state allocated on that device.
#include "tessel/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"

namespace tessel::optim {
namespace {

// Checks that every segment lies inside the state buffers.
void check_segments(std::span<const Segment> segments, int64_t n, const char* who) {
  for (const Segment& s : segments)
    TESSEL_CHECK(s.count >= 0 && s.state_offset >= 0 && s.state_offset + s.count <= n &&
                     (s.count == 0 || (s.params && s.grads)),
                 who, ": segment of ", s.count, " elements at state offset ", s.state_offset,
                 " is not inside the optimizer's ", n, " elements");
}

void check_lr(float lr, const char* who) {
  // 0 is legal here: a warm-up that starts from 0 asks for it on step 0.
  if (!(lr >= 0.0f) || !std::isfinite(lr))
    throw InvalidArgument(str(who, ": step lr must be finite and >= 0, got ", lr,
                              "; check the learning-rate schedule"));
}

// Runs cpu(segment) on the CPU, or device(segment, stream) on the current device (inside a
// DeviceScope: its kernel table's step over the same flat arenas), for every segment.
template <typename Cpu, typename Dev>
void each_segment(std::span<const Segment> segments, Cpu cpu, Dev device) {
  for (const Segment& seg : segments) {
    if (ops::on_device())
      device(seg, current_stream());
    else
      cpu(seg);
  }
}

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimSpec& spec, int64_t n)
      : Optimizer(n), spec_(spec), momentum_(Tensor::zeros({n}, DType::kF32, current_device())) {}

  void step(std::span<const Segment> segments, float lr, float grad_scale) override {
    check_segments(segments, numel_, "optim.sgd");
    check_lr(lr, "optim.sgd");
    ops::SgdStep k;
    k.lr = lr;
    k.momentum = spec_.momentum;
    k.weight_decay = spec_.weight_decay;
    k.nesterov = spec_.nesterov;
    k.first = steps_ == 0;
    k.grad_scale = grad_scale;
    float* buf = static_cast<float*>(momentum_.raw());
    each_segment(
        segments,
        [&](const Segment& s) {
          ops::sgd_step(s.params, s.grads, buf + s.state_offset, s.working, s.working_type, s.count,
                        k);
        },
        [&](const Segment& s, void* stream) {
          ops::device_kernel(&ops::DeviceKernels::sgd_step, "sgd_step")(
              s.params, s.grads, buf + s.state_offset, s.working, s.working_type, s.count, k,
              stream);
        });
    ++steps_;
  }

  std::vector<StateBuffer> state() override { return {{"momentum", momentum_}}; }

 private:
  OptimSpec spec_;
  Tensor momentum_;
};

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimSpec& spec, int64_t n)
      : Optimizer(n),
        spec_(spec),
        exp_avg_(Tensor::zeros({n}, DType::kF32, current_device())),
        exp_avg_sq_(Tensor::zeros({n}, DType::kF32, current_device())) {}

  void step(std::span<const Segment> segments, float lr, float grad_scale) override {
    check_segments(segments, numel_, "optim.adamw");
    check_lr(lr, "optim.adamw");
    ops::AdamWStep k;
    k.lr = lr;
    k.beta1 = spec_.beta1;
    k.beta2 = spec_.beta2;
    k.eps = spec_.eps;
    k.weight_decay = spec_.weight_decay;
    k.step = steps_ + 1;
    k.grad_scale = grad_scale;
    float* m = static_cast<float*>(exp_avg_.raw());
    float* v = static_cast<float*>(exp_avg_sq_.raw());
    each_segment(
        segments,
        [&](const Segment& s) {
          ops::adamw_step(s.params, s.grads, m + s.state_offset, v + s.state_offset, s.working,
                          s.working_type, s.count, k);
        },
        [&](const Segment& s, void* stream) {
          ops::device_kernel(&ops::DeviceKernels::adamw_step, "adamw_step")(
              s.params, s.grads, m + s.state_offset, v + s.state_offset, s.working, s.working_type,
              s.count, k, stream);
        });
    ++steps_;
  }

  std::vector<StateBuffer> state() override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }

 private:
  OptimSpec spec_;
  Tensor exp_avg_;
  Tensor exp_avg_sq_;
};

void require(bool ok, const std::string& key, const std::string& rule, float got,
             const std::string& fix) {
  if (!ok) throw InvalidArgument(str("optim.", key, " must be ", rule, ", got ", got, "; ", fix));
}

void validate(const OptimSpec& s, int64_t n) {
  require(s.lr > 0.0f && std::isfinite(s.lr), "lr", "> 0", s.lr,
          "set a positive learning rate such as 0.05");
  require(s.weight_decay >= 0.0f && std::isfinite(s.weight_decay), "weight_decay", ">= 0",
          s.weight_decay, "use 0 to disable weight decay");
  if (s.kind == OptimKind::kSgd) {
    require(s.momentum >= 0.0f && s.momentum < 1.0f, "momentum", "in [0, 1)", s.momentum,
            "typical values are 0 or 0.9");
    require(!s.nesterov || s.momentum > 0.0f, "momentum", "> 0 when nesterov is on", s.momentum,
            "set momentum (e.g. 0.9) or turn nesterov off");
  } else {
    require(s.beta1 >= 0.0f && s.beta1 < 1.0f, "beta1", "in [0, 1)", s.beta1,
            "the usual value is 0.9");
    require(s.beta2 >= 0.0f && s.beta2 < 1.0f, "beta2", "in [0, 1)", s.beta2,
            "the usual value is 0.999");
    require(s.eps > 0.0f && std::isfinite(s.eps), "eps", "> 0", s.eps, "the usual value is 1e-8");
  }
  if (n < 0) throw InvalidArgument(str("optim: range length must be >= 0, got ", n));
}

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimSpec& spec, int64_t n, MemCategory category) {
  validate(spec, n);
  MemoryScope scope(category);
  if (spec.kind == OptimKind::kSgd) return std::make_unique<Sgd>(spec, n);
  return std::make_unique<AdamW>(spec, n);
}

}  // namespace tessel::optim
