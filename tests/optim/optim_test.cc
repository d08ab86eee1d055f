#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
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
  spec.kind = s["kind"];
  spec.lr = lr;
  spec.weight_decay = s["weight_decay"].get<float>();
  if (spec.kind == "sgd") {
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

class PytorchReference : public testing::TestWithParam<std::string> {};

TEST_P(PytorchReference, FiveStepsMatchTorchOptim) {
  const json& c = fixtures()["cases"][GetParam()];
  const int64_t n = fixtures()["n"];
  auto opt = make_optimizer(spec_of(c["spec"], c["lrs"][0].get<float>()), n);
  Tensor p = tensor_of(c["params0"]);
  for (size_t s = 0; s < c["grads"].size(); ++s) {
    Tensor g = tensor_of(c["grads"][s]);
    opt->step(p, g, c["lrs"][s].get<float>());
    expect_close(p, c["params_after"][s], GetParam() + " step " + std::to_string(s + 1));
  }
  EXPECT_EQ(opt->steps(), static_cast<int64_t>(c["grads"].size()));
  for (auto& [name, t] : opt->state()) {
    ASSERT_TRUE(c["state"].contains(name)) << name;
    expect_close(t, c["state"][name], GetParam() + " state " + name);
  }
  EXPECT_EQ(opt->state().size(), c["state"].size());
}

// A run restored from (state, steps) after 2 steps continues bit for bit like the original.
TEST_P(PytorchReference, ResumeFromStateIsExact) {
  const json& c = fixtures()["cases"][GetParam()];
  const int64_t n = fixtures()["n"];
  const OptimSpec spec = spec_of(c["spec"], 0.1f);
  auto a = make_optimizer(spec, n);
  Tensor pa = tensor_of(c["params0"]);
  for (int s = 0; s < 2; ++s) a->step(pa, tensor_of(c["grads"][s]), c["lrs"][s].get<float>());

  auto b = make_optimizer(spec, n);
  auto sa = a->state();
  auto sb = b->state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    sb[i].second.copy_from(sa[i].second);
  }
  b->set_steps(a->steps());
  Tensor pb = pa.clone();
  for (size_t s = 2; s < c["grads"].size(); ++s) {
    Tensor g = tensor_of(c["grads"][s]);
    a->step(pa, g, c["lrs"][s].get<float>());
    b->step(pb, g, c["lrs"][s].get<float>());
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(pa.data<float>()[i], pb.data<float>()[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Cases, PytorchReference,
                         testing::Values("sgd_plain", "sgd_momentum", "sgd_nesterov",
                                         "sgd_weight_decay", "sgd_nesterov_weight_decay", "adamw",
                                         "adamw_weight_decay", "adamw_betas"));

TEST(Optimizer, FixtureCoversEveryCase) {
  EXPECT_EQ(fixtures()["cases"].size(), 8u);
  EXPECT_EQ(fixtures()["steps"], 5);
}

TEST(Optimizer, StateNamesAndSizes) {
  OptimSpec spec;
  auto sgd = make_optimizer(spec, 10);
  auto st = sgd->state();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].first, "momentum");
  EXPECT_EQ(st[0].second.numel(), 10);
  spec.kind = "adamw";
  auto adam = make_optimizer(spec, 3);
  st = adam->state();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].first, "exp_avg");
  EXPECT_EQ(st[1].first, "exp_avg_sq");
  EXPECT_EQ(st[1].second.numel(), 3);
}

TEST(Optimizer, EmptyRangeIsANoOp) {
  OptimSpec spec;
  spec.kind = "adamw";
  auto opt = make_optimizer(spec, 0);
  Tensor p = Tensor::empty({0}), g = Tensor::empty({0});
  opt->step(p, g, 0.1f);
  EXPECT_EQ(opt->steps(), 1);
}

TEST(Optimizer, StepRejectsMismatchedRange) {
  auto opt = make_optimizer(OptimSpec{}, 4);
  Tensor p = Tensor::zeros({4}), g = Tensor::zeros({5});
  EXPECT_THROW(opt->step(p, g, 0.1f), Error);
  Tensor g4 = Tensor::zeros({4});
  EXPECT_THROW(opt->step(p, g4, -1.0f), InvalidArgument);
  EXPECT_THROW(opt->step(p, g4, std::numeric_limits<float>::quiet_NaN()), InvalidArgument);
  EXPECT_EQ(opt->steps(), 0);
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
  s.kind = "adamw";
  s.beta1 = 1.0f;
  EXPECT_NE(error_of(s).find("optim.beta1 must be in [0, 1)"), std::string::npos);
  s.beta1 = 0.9f;
  s.beta2 = -0.5f;
  EXPECT_NE(error_of(s).find("optim.beta2"), std::string::npos);
  s.beta2 = 0.999f;
  s.eps = 0.0f;
  EXPECT_NE(error_of(s).find("optim.eps must be > 0"), std::string::npos);
  s = {};
  s.kind = "adam";
  EXPECT_NE(error_of(s).find("optim.kind must be one of sgd, adamw, got 'adam'"),
            std::string::npos);
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
  s.kind = "step";
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
  s.kind = "cosine";
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
  s.kind = "linear";
  try {
    lr_at(s, 0.1f, 0, 10);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("constant, step, cosine, got 'linear'"),
              std::string::npos);
  }
  s = {};
  s.kind = "step";
  s.step_size = 0;
  EXPECT_THROW(lr_at(s, 0.1f, 0, 10), InvalidArgument);
  s = {};
  s.warmup_steps = -1;
  EXPECT_THROW(lr_at(s, 0.1f, 0, 10), InvalidArgument);
  s = {};
  s.kind = "cosine";
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

TEST(Clip, ScalesOnlyAboveMaxNorm) {
  std::vector<float> g = {3.0f, 4.0f, 0.0f};
  const double norm = std::sqrt(sum_squares(g.data(), 3));
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_FLOAT_EQ(clip_scale(g.data(), 3, norm, 10.0f), 1.0f);
  EXPECT_EQ(g[0], 3.0f);
  EXPECT_FLOAT_EQ(clip_scale(g.data(), 3, norm, 0.0f), 1.0f);  // 0 disables clipping
  EXPECT_EQ(g[1], 4.0f);
  EXPECT_FLOAT_EQ(clip_scale(g.data(), 3, norm, 1.0f), 0.2f);
  EXPECT_FLOAT_EQ(g[0], 0.6f);
  EXPECT_FLOAT_EQ(g[1], 0.8f);
  EXPECT_NEAR(std::sqrt(sum_squares(g.data(), 3)), 1.0, 1e-6);
  EXPECT_THROW(clip_scale(g.data(), 3, std::numeric_limits<double>::infinity(), 1.0f),
               InvalidArgument);
}

}  // namespace
}  // namespace tessel::optim
