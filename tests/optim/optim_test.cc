// Optimizers against PyTorch 1.13 trajectories (tests/fixtures/optim.json, written by
// gen_optim_fixtures.py), stepping over segments (non-contiguous runs with arbitrary state
// offsets equal one run over their concatenation), grad_scale (equal to pre-multiplied
// gradients, which are never modified), state accounting, schedules and clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/memory.h"
#include "tessel/optim/optimizer.h"
#include "tessel/optim/schedule.h"

namespace tessel::optim {
namespace {

using nlohmann::json;

const json& fixtures() {
  static const json j = [] {
    std::ifstream in(TESSEL_SOURCE_DIR "/tests/fixtures/optim.json");
    if (!in) throw IoError("optim_test: cannot open tests/fixtures/optim.json");
    return json::parse(in);
  }();
  return j;
}

Tensor tensor_of(const json& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.data<float>()[i] = values[i].get<float>();
  return t;
}

OptimSpec spec_of(const json& s, float lr) {
  OptimSpec spec;
  spec.kind = *value_of<OptimKind>(s["kind"].get<std::string>());
  spec.lr = lr;
  spec.weight_decay = s["weight_decay"].get<float>();
  if (spec.kind == OptimKind::kSgd) {
    spec.momentum = s["momentum"].get<float>();
    spec.nesterov = s["nesterov"].get<bool>();
  } else {
    spec.beta1 = s["beta1"].get<float>();
    spec.beta2 = s["beta2"].get<float>();
    spec.eps = s["eps"].get<float>();
  }
  return spec;
}

void expect_close(const Tensor& got, const json& want, const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  const float* g = got.data<float>();
  for (size_t i = 0; i < want.size(); ++i) {
    const float w = want[i].get<float>();
    // A few ulp: PyTorch's vectorised kernels may round intermediate products differently.
    EXPECT_NEAR(g[i], w, 1e-6f * std::max(1.0f, std::fabs(w))) << what << " element " << i;
  }
}

// One segment over all of p and g, state at offset 0.
void step_all(Optimizer& opt, Tensor& p, const Tensor& g, float lr, float grad_scale = 1.0f) {
  const Segment seg{p.data<float>(), g.data<float>(), p.numel(), 0};
  opt.step({&seg, 1}, lr, grad_scale);
}

::testing::AssertionResult same_bits(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel())
    return ::testing::AssertionFailure() << a.numel() << " vs " << b.numel() << " elements";
  return same_bits(a.data<float>(), b.data<float>(), a.numel());
}

class PytorchReference : public ::testing::TestWithParam<std::string> {
 protected:
  const json& c() const { return fixtures()["cases"][GetParam()]; }
  int64_t n() const { return fixtures()["n"]; }
  size_t steps() const { return c()["grads"].size(); }
  float lr(size_t s) const { return c()["lrs"][s].get<float>(); }
};

TEST_P(PytorchReference, FiveStepsMatchTorchOptim) {
  auto opt = make_optimizer(spec_of(c()["spec"], lr(0)), n());
  EXPECT_EQ(opt->numel(), n());
  Tensor p = tensor_of(c()["params0"]);
  for (size_t s = 0; s < steps(); ++s) {
    step_all(*opt, p, tensor_of(c()["grads"][s]), lr(s));
    expect_close(p, c()["params_after"][s], GetParam() + " step " + std::to_string(s + 1));
  }
  EXPECT_EQ(opt->steps(), static_cast<int64_t>(steps()));
  for (const StateBuffer& b : opt->state()) {
    ASSERT_TRUE(c()["state"].contains(b.name)) << b.name;
    expect_close(b.values, c()["state"][b.name], GetParam() + " state " + b.name);
  }
  EXPECT_EQ(opt->state().size(), c()["state"].size());
}

// A run restored from (state, steps) after 2 steps continues bit for bit like the original.
TEST_P(PytorchReference, ResumeFromStateIsExact) {
  const OptimSpec spec = spec_of(c()["spec"], 0.1f);
  auto a = make_optimizer(spec, n());
  Tensor pa = tensor_of(c()["params0"]);
  for (size_t s = 0; s < 2; ++s) step_all(*a, pa, tensor_of(c()["grads"][s]), lr(s));

  auto b = make_optimizer(spec, n());
  auto sa = a->state();
  auto sb = b->state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].name, sb[i].name);
    sb[i].values.copy_from(sa[i].values);
  }
  b->set_steps(a->steps());
  Tensor pb = pa.clone();
  for (size_t s = 2; s < steps(); ++s) {
    const Tensor g = tensor_of(c()["grads"][s]);
    step_all(*a, pa, g, lr(s));
    step_all(*b, pb, g, lr(s));
  }
  EXPECT_TRUE(same_bits(pa, pb));
}

// The fixture's elements cut into three runs held in separate memory, stepped in another order
// than the state order, with state at arbitrary offsets of a larger optimizer (what a ZeRO
// rank's optimizer over its pieces of every unit does), plus an empty run: parameters and state
// equal one step over the concatenation bit for bit, and state outside the runs stays zero.
TEST_P(PytorchReference, SegmentsEqualOneStepOverTheConcatenation) {
  const int64_t N = n();
  struct Piece {
    int64_t lo, hi, state_offset;
    Tensor p, g;
  };
  std::vector<Piece> pieces = {{30, N, 3, {}, {}}, {0, 11, 40, {}, {}}, {11, 30, 14, {}, {}}};
  const int64_t state_n = 60;
  auto seg_opt = make_optimizer(spec_of(c()["spec"], lr(0)), state_n);
  auto ref_opt = make_optimizer(spec_of(c()["spec"], lr(0)), N);
  Tensor ref = tensor_of(c()["params0"]);
  for (Piece& q : pieces) q.p = ref.view(q.lo, {q.hi - q.lo}).clone();
  for (size_t s = 0; s < steps(); ++s) {
    const Tensor g = tensor_of(c()["grads"][s]);
    std::vector<Segment> segs;
    for (Piece& q : pieces) {
      q.g = g.view(q.lo, {q.hi - q.lo}).clone();
      segs.push_back({q.p.data<float>(), q.g.data<float>(), q.hi - q.lo, q.state_offset});
    }
    segs.insert(segs.begin() + 1, Segment{nullptr, nullptr, 0, 7});
    seg_opt->step(segs, lr(s));
    step_all(*ref_opt, ref, g, lr(s));
    for (const Piece& q : pieces)
      ASSERT_TRUE(same_bits(q.p.data<float>(), ref.data<float>() + q.lo, q.hi - q.lo))
          << GetParam() << " step " << s + 1 << ", run at " << q.lo;
  }
  EXPECT_EQ(seg_opt->steps(), static_cast<int64_t>(steps()));  // steps, not segments
  const auto seg_state = seg_opt->state();
  const auto ref_state = ref_opt->state();
  ASSERT_EQ(seg_state.size(), ref_state.size());
  for (size_t b = 0; b < seg_state.size(); ++b) {
    ASSERT_EQ(seg_state[b].values.numel(), state_n);
    std::vector<bool> covered(state_n, false);
    for (const Piece& q : pieces) {
      EXPECT_TRUE(same_bits(seg_state[b].values.data<float>() + q.state_offset,
                            ref_state[b].values.data<float>() + q.lo, q.hi - q.lo))
          << seg_state[b].name;
      for (int64_t i = 0; i < q.hi - q.lo; ++i) covered[q.state_offset + i] = true;
    }
    for (int64_t i = 0; i < state_n; ++i) {
      if (!covered[i]) {
        EXPECT_EQ(seg_state[b].values.data<float>()[i], 0.0f) << i;
      }
    }
  }
}

// grad_scale (how clipping reaches the optimizer) equals multiplying the gradients first, bit
// for bit, and leaves the gradients as they were.
TEST_P(PytorchReference, GradScaleEqualsPremultipliedGradients) {
  for (const float scale : {0.37f, 1.0f / 3.0f, 2.5f}) {
    auto a = make_optimizer(spec_of(c()["spec"], lr(0)), n());
    auto b = make_optimizer(spec_of(c()["spec"], lr(0)), n());
    Tensor pa = tensor_of(c()["params0"]), pb = pa.clone();
    for (size_t s = 0; s < steps(); ++s) {
      const Tensor g = tensor_of(c()["grads"][s]);
      const Tensor g_before = g.clone();
      Tensor scaled = g.clone();
      for (int64_t i = 0; i < n(); ++i) scaled.data<float>()[i] = g.data<float>()[i] * scale;
      step_all(*a, pa, g, lr(s), scale);
      step_all(*b, pb, scaled, lr(s));
      EXPECT_TRUE(same_bits(g, g_before)) << "gradients modified";
      ASSERT_TRUE(same_bits(pa, pb)) << GetParam() << " scale " << scale << " step " << s + 1;
    }
    const auto sa = a->state(), sb = b->state();
    for (size_t i = 0; i < sa.size(); ++i)
      EXPECT_TRUE(same_bits(sa[i].values, sb[i].values)) << sa[i].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PytorchReference,
                         ::testing::Values("sgd_plain", "sgd_momentum", "sgd_nesterov",
                                           "sgd_weight_decay", "sgd_nesterov_weight_decay", "adamw",
                                           "adamw_weight_decay", "adamw_betas"));

TEST(Optimizer, FixtureCoversEveryCase) {
  EXPECT_EQ(fixtures()["cases"].size(), 8u);
  EXPECT_EQ(fixtures()["steps"], 5);
}

TEST(Optimizer, StateNamesAndSizes) {
  OptimSpec spec;
  auto sgd = make_optimizer(spec, 10);
  EXPECT_EQ(sgd->numel(), 10);
  auto st = sgd->state();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].name, "momentum");
  EXPECT_EQ(st[0].values.numel(), 10);
  spec.kind = OptimKind::kAdamw;
  auto adam = make_optimizer(spec, 3);
  st = adam->state();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].name, "exp_avg");
  EXPECT_EQ(st[1].name, "exp_avg_sq");
  EXPECT_EQ(st[0].values.numel(), 3);
  EXPECT_EQ(st[1].values.numel(), 3);
  // state() hands out the buffers themselves (a checkpoint restores through them).
  st[0].values.data<float>()[1] = 5.0f;
  EXPECT_EQ(adam->state()[0].values.data<float>()[1], 5.0f);
}

// The state is allocated when the optimizer is made, charged as optimizer state whatever the
// caller's category, and given back with the optimizer.
TEST(Optimizer, StateIsChargedAsOptimizerState) {
  auto ledger = std::make_shared<MemoryLedger>();
  MemoryScope scope(ledger, MemCategory::kActivations);
  for (OptimKind kind : {OptimKind::kSgd, OptimKind::kAdamw}) {
    OptimSpec spec;
    spec.kind = kind;
    {
      auto opt = make_optimizer(spec, 1024);
      const int64_t buffers = static_cast<int64_t>(opt->state().size());
      EXPECT_EQ(ledger->current(MemCategory::kOptimizer), buffers * 4096) << name_of(kind);
      EXPECT_EQ(ledger->total(), buffers * 4096) << name_of(kind);
      EXPECT_EQ(current_category(), MemCategory::kActivations);
    }
    EXPECT_EQ(ledger->total(), 0) << name_of(kind);
  }
}

TEST(Optimizer, EmptyStepIsANoOp) {
  OptimSpec spec;
  spec.kind = OptimKind::kAdamw;
  auto opt = make_optimizer(spec, 0);
  opt->step({}, 0.1f);
  EXPECT_EQ(opt->steps(), 1);
  const Segment empty{nullptr, nullptr, 0, 0};
  opt->step({&empty, 1}, 0.1f);
  EXPECT_EQ(opt->steps(), 2);
}

TEST(Optimizer, StepRejectsBadSegmentsBeforeTouchingAnything) {
  for (OptimKind kind : {OptimKind::kSgd, OptimKind::kAdamw}) {
    OptimSpec spec;
    spec.kind = kind;
    auto opt = make_optimizer(spec, 4);
    Tensor p = Tensor::zeros({8}), g = Tensor::zeros({8});
    g.fill_(1.0f);
    float* pp = p.data<float>();
    const float* gp = g.data<float>();
    const Segment good{pp, gp, 2, 0};
    for (const Segment& bad :
         {Segment{pp, gp, 5, 0}, Segment{pp + 2, gp, 2, 3}, Segment{pp, gp, 1, -1},
          Segment{pp, gp, -1, 0}, Segment{nullptr, gp, 1, 0}, Segment{pp, nullptr, 1, 0}}) {
      const Segment both[] = {good, bad};
      EXPECT_THROW(opt->step(both, 0.1f), Error) << name_of(kind);
    }
    for (const float lr :
         {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
      EXPECT_THROW(opt->step({&good, 1}, lr), InvalidArgument) << name_of(kind) << " lr " << lr;
    EXPECT_EQ(opt->steps(), 0);
    for (int64_t i = 0; i < p.numel(); ++i)
      EXPECT_EQ(pp[i], 0.0f) << name_of(kind);  // not even `good`
    for (const StateBuffer& b : opt->state())
      for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(b.values.data<float>()[i], 0.0f) << b.name;
  }
}

std::string error_of(const OptimSpec& spec) {
  try {
    make_optimizer(spec, 4);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Optimizer, ValidationNamesTheKey) {
  OptimSpec s;
  s.lr = -1;
  EXPECT_NE(error_of(s).find("optim.lr must be > 0, got -1; "), std::string::npos) << error_of(s);
  s.lr = std::numeric_limits<float>::infinity();
  EXPECT_NE(error_of(s).find("optim.lr"), std::string::npos);
  s = {};
  s.momentum = 1.0f;
  EXPECT_NE(error_of(s).find("optim.momentum must be in [0, 1), got 1"), std::string::npos);
  s.momentum = 0.0f;
  s.nesterov = true;
  EXPECT_NE(error_of(s).find("optim.momentum"), std::string::npos);
  s = {};
  s.weight_decay = -0.1f;
  EXPECT_NE(error_of(s).find("optim.weight_decay must be >= 0"), std::string::npos);
  s = {};
  s.kind = OptimKind::kAdamw;
  s.beta1 = 1.0f;
  EXPECT_NE(error_of(s).find("optim.beta1 must be in [0, 1)"), std::string::npos);
  s.beta1 = 0.9f;
  s.beta2 = -0.5f;
  EXPECT_NE(error_of(s).find("optim.beta2"), std::string::npos);
  s.beta2 = 0.999f;
  s.eps = 0.0f;
  EXPECT_NE(error_of(s).find("optim.eps must be > 0"), std::string::npos);
  EXPECT_EQ(error_of(OptimSpec{}), "");
}

// ---- schedules ----

TEST(Schedule, ConstantWithWarmup) {
  ScheduleSpec s;
  s.warmup_steps = 4;
  s.warmup_start = 0.2f;
  EXPECT_FLOAT_EQ(lr_at(s, 1.0f, 0, 100), 0.2f);
  EXPECT_FLOAT_EQ(lr_at(s, 1.0f, 1, 100), 0.4f);
  EXPECT_FLOAT_EQ(lr_at(s, 1.0f, 2, 100), 0.6f);
  EXPECT_FLOAT_EQ(lr_at(s, 1.0f, 3, 100), 0.8f);
  EXPECT_FLOAT_EQ(lr_at(s, 1.0f, 4, 100), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(s, 1.0f, 99, 100), 1.0f);
  s.warmup_steps = 0;
  EXPECT_FLOAT_EQ(lr_at(s, 0.05f, 0, 100), 0.05f);
}

TEST(Schedule, StepDecay) {
  ScheduleSpec s;
  s.kind = ScheduleKind::kStep;
  s.step_size = 10;
  s.gamma = 0.5f;
  EXPECT_FLOAT_EQ(lr_at(s, 0.8f, 0, 100), 0.8f);
  EXPECT_FLOAT_EQ(lr_at(s, 0.8f, 9, 100), 0.8f);
  EXPECT_FLOAT_EQ(lr_at(s, 0.8f, 10, 100), 0.4f);
  EXPECT_FLOAT_EQ(lr_at(s, 0.8f, 25, 100), 0.2f);
  EXPECT_FLOAT_EQ(lr_at(s, 0.8f, 30, 100), 0.1f);
  s.warmup_steps = 5;  // warm-up overrides the first steps; decay boundaries do not move
  EXPECT_FLOAT_EQ(lr_at(s, 0.8f, 0, 100), 0.0f);
  EXPECT_FLOAT_EQ(lr_at(s, 0.8f, 1, 100), 0.16f);
  EXPECT_FLOAT_EQ(lr_at(s, 0.8f, 5, 100), 0.8f);
  EXPECT_FLOAT_EQ(lr_at(s, 0.8f, 10, 100), 0.4f);
}

TEST(Schedule, CosineWithWarmup) {
  ScheduleSpec s;
  s.kind = ScheduleKind::kCosine;
  s.warmup_steps = 10;
  s.min_lr = 0.01f;
  const float base = 0.1f;
  const int64_t total = 110;
  EXPECT_FLOAT_EQ(lr_at(s, base, 0, total), 0.0f);
  EXPECT_FLOAT_EQ(lr_at(s, base, 5, total), 0.05f);
  EXPECT_FLOAT_EQ(lr_at(s, base, 10, total), base);  // cosine starts at progress 0
  for (int64_t step : {10, 23, 35, 60, 85, 109, 110}) {
    const double progress = (step - 10) / 100.0;
    const double want = 0.01 + (0.1 - 0.01) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
    EXPECT_NEAR(lr_at(s, base, step, total), want, 1e-7) << step;
  }
  EXPECT_NEAR(lr_at(s, base, 60, total), 0.055, 1e-7);  // half way: the mean of base and min
  EXPECT_FLOAT_EQ(lr_at(s, base, 110, total), 0.01f);
  EXPECT_FLOAT_EQ(lr_at(s, base, 500, total), 0.01f);  // clamped past the end
  for (int64_t step = 11; step < total; ++step)
    EXPECT_LT(lr_at(s, base, step, total), lr_at(s, base, step - 1, total)) << step;
}

TEST(Schedule, Validation) {
  ScheduleSpec s;
  s.kind = ScheduleKind::kStep;
  s.step_size = 0;
  EXPECT_THROW(lr_at(s, 0.1f, 0, 10), InvalidArgument);
  s = {};
  s.warmup_steps = -1;
  EXPECT_THROW(lr_at(s, 0.1f, 0, 10), InvalidArgument);
  s = {};
  s.kind = ScheduleKind::kCosine;
  s.min_lr = 1.0f;
  EXPECT_THROW(lr_at(s, 0.1f, 0, 10), InvalidArgument);
}

TEST(Schedule, ScaledLr) {
  EXPECT_FLOAT_EQ(scaled_lr(0.1f, 512, 128), 0.4f);
  EXPECT_FLOAT_EQ(scaled_lr(0.1f, 64, 128), 0.05f);
  EXPECT_FLOAT_EQ(scaled_lr(0.1f, 512, 0), 0.1f);
  EXPECT_FLOAT_EQ(scaled_lr(0.1f, 512, -1), 0.1f);
  EXPECT_THROW(scaled_lr(0.1f, 0, 128), InvalidArgument);
}

// ---- clipping ----

TEST(Clip, SumSquaresAccumulatesInDouble) {
  std::vector<float> g(1003);
  double want = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = 0.001f * static_cast<float>(i % 97) - 0.03f;
    want += static_cast<double>(g[i]) * g[i];
  }
  EXPECT_NEAR(sum_squares(g.data(), static_cast<int64_t>(g.size())), want, want * 1e-14);
  EXPECT_EQ(sum_squares(g.data(), 0), 0.0);
  // 2^25 ones: a float accumulator stalls at 2^24, a double one does not.
  std::vector<float> ones(1 << 25, 1.0f);
  EXPECT_EQ(sum_squares(ones.data(), static_cast<int64_t>(ones.size())), double(1 << 25));
}

TEST(Clip, FactorOnlyBelowOneAboveMaxNorm) {
  std::vector<float> g = {3.0f, 4.0f, 0.0f};
  const double norm = std::sqrt(sum_squares(g.data(), 3));
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_EQ(clip_factor(norm, 10.0f), 1.0f);
  EXPECT_EQ(clip_factor(norm, 5.0f), 1.0f);  // at the limit: untouched
  EXPECT_EQ(clip_factor(norm, 0.0f), 1.0f);  // 0 disables clipping
  EXPECT_EQ(clip_factor(norm, -1.0f), 1.0f);
  EXPECT_EQ(clip_factor(norm, 1.0f), 0.2f);  // max_norm / norm, rounded once to f32
  EXPECT_EQ(clip_factor(7.0, 3.0f), static_cast<float>(3.0 / 7.0));
  EXPECT_EQ(clip_factor(0.0, 1.0f), 1.0f);
  EXPECT_THROW(clip_factor(std::numeric_limits<double>::infinity(), 1.0f), InvalidArgument);
  EXPECT_THROW(clip_factor(std::numeric_limits<double>::quiet_NaN(), 1.0f), InvalidArgument);
}

// A clipped step: the factor goes to the optimizer as grad_scale, the gradients stay as they
// are, and plain SGD with lr 1 then moves the parameters by exactly max_norm.
TEST(Clip, ClippedStepMovesByMaxNorm) {
  OptimSpec spec;
  spec.momentum = 0.0f;
  auto opt = make_optimizer(spec, 3);
  std::vector<float> p = {1.0f, 1.0f, 1.0f}, g = {3.0f, 4.0f, 12.0f};
  const double norm = std::sqrt(sum_squares(g.data(), 3));
  EXPECT_DOUBLE_EQ(norm, 13.0);
  const float factor = clip_factor(norm, 2.0f);
  const Segment seg{p.data(), g.data(), 3, 0};
  opt->step({&seg, 1}, 1.0f, factor);
  EXPECT_EQ(g, (std::vector<float>{3.0f, 4.0f, 12.0f}));
  double moved = 0;
  for (int i = 0; i < 3; ++i) moved += (1.0 - p[i]) * (1.0 - p[i]);
  EXPECT_NEAR(std::sqrt(moved), 2.0, 1e-6);
  EXPECT_NEAR(1.0f - p[0], 3.0f * 2.0f / 13.0f, 1e-6f);
}

}  // namespace
}  // namespace tessel::optim
