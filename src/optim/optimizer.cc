// SGD and AdamW with PyTorch 1.13's update rules (torch.optim.SGD with dampening 0,
// torch.optim.AdamW without amsgrad), so a tessel run and a PyTorch run from the same
// weights and gradients follow the same trajectory. Each step is one fused pass over memory;
// the per-step scalars are computed once outside the loops so that the loops vectorise.
#include "tessel/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

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

// Runs update(part) over parts of seg of a few thousand elements, each followed by the rewrite
// of its working copy (if any) while its new values are in L1.
template <typename F>
void for_parts(const Segment& seg, F update) {
  constexpr int64_t kPart = 2048;
  const size_t half = dtype_size(seg.working_type);
  for (int64_t i = 0; i < seg.count; i += kPart) {
    const int64_t n = std::min(kPart, seg.count - i);
    update(Segment{seg.params + i, seg.grads + i, n, seg.state_offset + i});
    if (seg.working != nullptr)
      ops::convert(static_cast<char*>(seg.working) + i * static_cast<int64_t>(half),
                   seg.working_type, seg.params + i, DType::kF32, n);
  }
}

void check_lr(float lr, const char* who) {
  // 0 is legal here: a warm-up that starts from 0 asks for it on step 0.
  if (!(lr >= 0.0f) || !std::isfinite(lr))
    throw InvalidArgument(str(who, ": step lr must be finite and >= 0, got ", lr,
                              "; check the learning-rate schedule"));
}

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimSpec& spec, int64_t n)
      : Optimizer(n), spec_(spec), momentum_(Tensor::zeros({n})) {}

  void step(std::span<const Segment> segments, float lr, float grad_scale) override {
    check_segments(segments, numel_, "optim.sgd");
    check_lr(lr, "optim.sgd");
    for (const Segment& seg : segments)
      for_parts(seg, [&](const Segment& part) { update(part, lr, grad_scale); });
    ++steps_;
  }

  std::vector<StateBuffer> state() override { return {{"momentum", momentum_}}; }

 private:
  void update(const Segment& seg, float lr, float gs) {
    float* __restrict p = seg.params;
    const float* __restrict g = seg.grads;
    float* __restrict buf = momentum_.data<float>() + seg.state_offset;
    const float wd = spec_.weight_decay, mu = spec_.momentum, neg_lr = -lr;
    const int64_t n = seg.count;
    if (mu == 0.0f) {
      for (int64_t i = 0; i < n; ++i) p[i] += neg_lr * (g[i] * gs + wd * p[i]);
    } else if (steps_ == 0) {
      // PyTorch seeds the buffer with the first gradient instead of decaying a zero buffer.
      for (int64_t i = 0; i < n; ++i) {
        const float d = g[i] * gs + wd * p[i];
        buf[i] = d;
        p[i] += neg_lr * (spec_.nesterov ? d + mu * d : d);
      }
    } else if (spec_.nesterov) {
      for (int64_t i = 0; i < n; ++i) {
        const float d = g[i] * gs + wd * p[i];
        const float b = mu * buf[i] + d;
        buf[i] = b;
        p[i] += neg_lr * (d + mu * b);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const float d = g[i] * gs + wd * p[i];
        const float b = mu * buf[i] + d;
        buf[i] = b;
        p[i] += neg_lr * b;
      }
    }
  }

  OptimSpec spec_;
  Tensor momentum_;
};

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimSpec& spec, int64_t n)
      : Optimizer(n), spec_(spec), exp_avg_(Tensor::zeros({n})), exp_avg_sq_(Tensor::zeros({n})) {}

  void step(std::span<const Segment> segments, float lr, float grad_scale) override {
    check_segments(segments, numel_, "optim.adamw");
    check_lr(lr, "optim.adamw");
    const int64_t t = steps_ + 1;
    // Scalars in double as PyTorch computes them in Python, then rounded once to f32.
    const double bc1 = 1.0 - std::pow(static_cast<double>(spec_.beta1), static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(static_cast<double>(spec_.beta2), static_cast<double>(t));
    Scalars k;
    k.step_size = static_cast<float>(static_cast<double>(lr) / bc1);
    k.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    k.decay = static_cast<float>(1.0 - static_cast<double>(lr) * spec_.weight_decay);
    k.gs = grad_scale;
    for (const Segment& seg : segments)
      for_parts(seg, [&](const Segment& part) { update(part, k); });
    ++steps_;
  }

  std::vector<StateBuffer> state() override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }

 private:
  struct Scalars {
    float step_size, bc2_sqrt, decay, gs;
  };

  void update(const Segment& seg, const Scalars& k) {
    const float b1 = spec_.beta1, b2 = spec_.beta2, eps = spec_.eps;
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
    const float step_size = k.step_size, bc2_sqrt = k.bc2_sqrt, decay = k.decay, gs = k.gs;
    float* __restrict p = seg.params;
    const float* __restrict g = seg.grads;
    float* __restrict m = exp_avg_.data<float>() + seg.state_offset;
    float* __restrict v = exp_avg_sq_.data<float>() + seg.state_offset;
    const int64_t n = seg.count;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * gs;
      const float mi = b1 * m[i] + c1 * gi;
      const float vi = b2 * v[i] + c2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      p[i] = p[i] * decay - step_size * (mi / denom);
    }
  }

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

std::unique_ptr<Optimizer> make_optimizer(const OptimSpec& spec, int64_t n) {
  validate(spec, n);
  MemoryScope scope(MemCategory::kOptimizer);
  if (spec.kind == OptimKind::kSgd) return std::make_unique<Sgd>(spec, n);
  return std::make_unique<AdamW>(spec, n);
}

}  // namespace tessel::optim
