// data.task = multilabel: BceWithLogitsLoss against the formula in double (PyTorch's
// BCEWithLogitsLoss, mean over rows and labels), finite and exact at logits far past exp's
// range, its accuracy per label, 16-bit logits, and a multilabel MLP's gradients against
// central differences through it.
#include <gtest/gtest.h>

#include <cmath>

#include "nn_testing.h"
#include "tessel/ops/cpu.h"

namespace tessel::nn {
namespace {

using testing::randn;

// Labels [N, K] of 0 and 1, from the signs of a random draw.
Tensor random_labels(const Shape& shape, uint64_t seed) {
  Tensor y = randn(shape, seed);
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = y.data<float>()[i] > 0 ? 1.f : 0.f;
  return y;
}

TEST(BceWithLogits, MatchesTheFormulaAndCountsLabels) {
  const Tensor z = randn({5, 3}, 1, 2.0f), y = random_labels({5, 3}, 2);
  BceWithLogitsLoss loss;
  const LossValue v = loss.forward(z, y);
  double want = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < 15; ++i) {
    const double zi = z.data<float>()[i], yi = y.data<float>()[i];
    const double p = 1 / (1 + std::exp(-zi));
    want -= yi * std::log(p) + (1 - yi) * std::log(1 - p);
    correct += (zi > 0) == (yi == 1);
  }
  EXPECT_NEAR(v.mean, want / 15, 1e-6);
  EXPECT_EQ(v.correct, correct);
  EXPECT_EQ(v.positions, 15);
  // d(mean)/dz = (sigmoid(z) - y) / (N K), scaled by dloss.
  const Tensor g = loss.backward(2.0f);
  for (int64_t i = 0; i < 15; ++i) {
    const double zi = z.data<float>()[i], yi = y.data<float>()[i];
    EXPECT_NEAR(g.data<float>()[i], 2.0 * (1 / (1 + std::exp(-zi)) - yi) / 15, 1e-7) << i;
  }
}

// A naive log(sigmoid(z)) is -inf at z = -200 and log(1 + exp(z)) overflows at z = 200; the
// stable form gives |z| for a confident wrong label and log1p(exp(-|z|)) (not a rounded 0) for a
// right one.
TEST(BceWithLogits, StableFarOutside) {
  auto row = [](std::initializer_list<float> v) {
    Tensor t = Tensor::empty({1, static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), t.data<float>());
    return t;
  };
  BceWithLogitsLoss loss;
  LossValue v = loss.forward(row({200.f, -200.f}), row({0.f, 1.f}));
  EXPECT_FLOAT_EQ(v.mean, 200.f);  // confidently wrong: |z| each
  EXPECT_EQ(v.correct, 0);
  Tensor g = loss.backward(1.0f);
  EXPECT_FLOAT_EQ(g.data<float>()[0], 0.5f);   // (sigmoid(200) - 0) / 2
  EXPECT_FLOAT_EQ(g.data<float>()[1], -0.5f);  // (sigmoid(-200) - 1) / 2
  v = loss.forward(row({30.f, -30.f}), row({1.f, 0.f}));
  EXPECT_FLOAT_EQ(v.mean, std::exp(-30.f));  // confidently right: log(1 + e^-30), not 0
  EXPECT_EQ(v.correct, 2);
  g = loss.backward(1.0f);
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(g.data<float>()[i], 0.0, 1e-13) << i;
}

TEST(BceWithLogits, Bf16LogitsGiveABf16Gradient) {
  const Tensor z = randn({4, 3}, 3), y = random_labels({4, 3}, 4);
  Tensor zb = Tensor::empty({4, 3}, DType::kBF16);
  ops::convert(zb.raw(), DType::kBF16, z.raw(), DType::kF32, 12);
  BceWithLogitsLoss f32, bf16;
  EXPECT_NEAR(bf16.forward(zb, y).mean, f32.forward(z, y).mean, 1e-2);
  const Tensor g = bf16.backward(1.0f);
  EXPECT_EQ(g.dtype(), DType::kBF16);
  EXPECT_EQ(g.shape(), zb.shape());
}

TEST(BceWithLogits, WrongLabelsAreNamed) {
  BceWithLogitsLoss loss;
  try {
    loss.forward(randn({4, 3}, 5), randn({4}, 6));
    ADD_FAILURE() << "labels [4] for logits [4, 3] were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("labels must be f32 [N, K] = [4, 3]"), std::string::npos)
        << e.what();
  }
}

TEST(BceWithLogits, MultilabelMlpGradientsMatchFiniteDifferences) {
  ModelSpec s;
  s.kind = ModelKind::kMlp;
  s.input_shape = {4};
  s.num_classes = 3;
  s.hidden = {5};
  s.activation = Activation::kGelu;  // smooth, so that finite differences see no kinks
  s.task = data::Task::kMultilabel;
  EXPECT_NE(dynamic_cast<BceWithLogitsLoss*>(make_loss(s).get()), nullptr);
  auto m = build_model(s);
  m->materialize(3);
  testing::check_model_grads<BceWithLogitsLoss>(*m, randn({6, 4}, 7), random_labels({6, 3}, 8),
                                                Context{true});
}

}  // namespace
}  // namespace tessel::nn
