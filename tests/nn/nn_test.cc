// Layer and model gradient checks (finite differences), plus dropout and loss behaviour.
#include <gtest/gtest.h>

#include <cmath>

#include "nn_testing.h"
#include "tessel/nn/layers.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/models.h"

namespace tessel::nn {
namespace {

using testing::away_from_zero;
using testing::check_model_grads;
using testing::check_module_grads;
using testing::distinct;
using testing::dot;
using testing::FdOptions;
using testing::randn;
using testing::random_ids;

const Context kTrain{true, 1234, 3, 40};

// ---- Layers ----

TEST(LayerGrad, Linear2D) {
  check_module_grads(std::make_unique<Linear>(5, 3), randn({4, 5}, 1), kTrain);
}

TEST(LayerGrad, Linear3DTreatsLeadingDimsAsRows) {
  check_module_grads(std::make_unique<Linear>(6, 4), randn({2, 3, 6}, 2), kTrain);
}

TEST(LayerGrad, LinearWithoutBias) {
  auto l = std::make_unique<Linear>(5, 3, false);
  EXPECT_EQ(l->parameters().size(), 1u);
  check_module_grads(std::move(l), randn({4, 5}, 3), kTrain);
}

TEST(LayerGrad, ReLU) {
  check_module_grads(std::make_unique<ReLU>(), away_from_zero({3, 7}, 4), kTrain,
                     {.eps = 1e-2, .skip_kinks = true});
}

TEST(LayerGrad, GELU) {
  check_module_grads(std::make_unique<GELU>(), randn({3, 7}, 5, 2.0f), kTrain);
}

TEST(LayerGrad, DropoutTraining) {
  check_module_grads(std::make_unique<Dropout>(0.4f), randn({6, 5}, 6), kTrain);
}

TEST(LayerGrad, Flatten) {
  check_module_grads(std::make_unique<Flatten>(), randn({2, 3, 2, 2}, 7), kTrain);
}

TEST(LayerGrad, Conv2d) {
  check_module_grads(std::make_unique<Conv2d>(2, 3, 3, 1, 1), randn({2, 2, 5, 5}, 8), kTrain);
}

TEST(LayerGrad, Conv2dStridedEvenKernel) {
  check_module_grads(std::make_unique<Conv2d>(3, 2, 2, 2, 1), randn({1, 3, 6, 5}, 9), kTrain);
}

TEST(LayerGrad, MaxPool2d) {
  check_module_grads(std::make_unique<MaxPool2d>(2, 2), distinct({2, 2, 4, 6}, 10), kTrain,
                     {.eps = 1e-2, .skip_kinks = true});
}

TEST(LayerGrad, LayerNorm) {
  check_module_grads(std::make_unique<LayerNorm>(6), randn({2, 3, 6}, 11, 2.0f), kTrain);
}

TEST(LayerGrad, TransformerBlock) {
  check_module_grads(std::make_unique<TransformerBlock>(8, 2, 4, 2), randn({2, 4, 8}, 12), kTrain,
                     {.max_coords = 12});
}

TEST(LayerGrad, TransformerBlockShorterSequence) {
  check_module_grads(std::make_unique<TransformerBlock>(8, 4, 6, 1), randn({1, 3, 8}, 13), kTrain,
                     {.max_coords = 8});
}

// Embedding and tied head: the head borrows the embedding's table, so the table's gradient must
// hold both the head's and the embedding's share; finite differences see both uses.
TEST(LayerGrad, EmbeddingAndTiedHead) {
  const int64_t V = 7, T = 4, C = 8;
  Model m;
  auto embed = std::make_unique<Embedding>(V, T, C);
  Parameter* table = embed->token_table();
  m.add("embed", std::move(embed));
  m.add("head", std::make_unique<LmHead>(table, V, C, T));
  m.finalize(3);
  EXPECT_EQ(m.parameters().size(), 4u);  // the head does not list the table
  EXPECT_EQ(m.parameters()[0]->name, "embed.wte");
  EXPECT_EQ(m.parameters()[2]->name, "head.ln.weight");
  testing::jitter_params(m);
  const Tensor ids = random_ids({2, 3}, V, 14);
  const Tensor r = randn({2, 3, V}, 15);
  auto objective = [&] { return dot(r, m.forward(ids, kTrain)); };
  objective();
  m.zero_grad();
  m.backward(r);
  const Tensor full = m.grads().flat().clone();
  for (size_t k = 0; k < m.parameters().size(); ++k) {
    Parameter& p = *m.parameters()[k];
    testing::check_grad(p.name, p.value, full.view(m.params().entries()[k].offset, p.shape),
                        objective);
  }
  // The head alone contributes to the table gradient, and the embedding adds to it.
  m.zero_grad();
  objective();
  m.backward(r, {}, 1, 2);
  Tensor head_only = table->grad.clone();
  double head_norm = 0, diff = 0;
  for (int64_t i = 0; i < head_only.numel(); ++i) {
    head_norm += std::abs(head_only.data<float>()[i]);
    diff += std::abs(head_only.data<float>()[i] - full.data<float>()[i]);
  }
  EXPECT_GT(head_norm, 1e-3);
  EXPECT_GT(diff, 1e-3);
}

TEST(LayerGrad, EmbeddingAlone) {
  Model m;
  m.add("embed", std::make_unique<Embedding>(5, 4, 3));
  m.finalize(1);
  const Tensor ids = random_ids({3, 4}, 5, 16);
  const Tensor r = randn({3, 4, 3}, 17);
  auto objective = [&] { return dot(r, m.forward(ids, kTrain)); };
  objective();
  m.zero_grad();
  EXPECT_FALSE(m.backward(r).defined());
  for (Parameter* p : m.parameters())
    testing::check_grad(p->name, p->value, p->grad.clone(), objective);
}

TEST(LayerGrad, BackwardAccumulatesParameterGradients) {
  Model m;
  m.add("fc", std::make_unique<Linear>(4, 3));
  m.finalize(1);
  const Tensor x = randn({2, 4}, 18), r = randn({2, 3}, 19);
  m.forward(x, kTrain);
  m.zero_grad();
  m.backward(r);
  const Tensor once = m.grads().flat().clone();
  m.backward(r);
  for (int64_t i = 0; i < once.numel(); ++i)
    EXPECT_FLOAT_EQ(m.grads().flat().data<float>()[i], 2 * once.data<float>()[i]);
}

// ---- Dropout semantics ----

TEST(Dropout, IdentityWhenNotTrainingOrZero) {
  const Tensor x = randn({4, 6}, 20);
  Dropout d(0.5f);
  Context eval = kTrain;
  eval.training = false;
  EXPECT_EQ(d.forward(x, eval).raw(), x.raw());
  Dropout zero(0.0f);
  EXPECT_EQ(zero.forward(x, kTrain).raw(), x.raw());
  const Tensor dy = randn({4, 6}, 21);
  EXPECT_EQ(zero.backward(dy).raw(), dy.raw());
}

TEST(Dropout, ScalesKeptValuesAndIsKeyedBySample) {
  const float p = 0.25f;
  Tensor x = Tensor::empty({200, 50});
  x.fill_(1.0f);
  Dropout d(p);
  const Tensor y = d.forward(x, kTrain).clone();
  int64_t zeros = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const float v = y.data<float>()[i];
    if (v == 0.0f)
      ++zeros;
    else
      EXPECT_FLOAT_EQ(v, 1.0f / (1.0f - p));
  }
  EXPECT_NEAR(static_cast<double>(zeros) / y.numel(), p, 0.02);
  // Rows 100.. of the batch computed as their own batch (first_sample shifted) match.
  Context second = kTrain;
  second.first_sample += 100;
  Dropout d2(p);
  const Tensor tail = d2.forward(x.view(100 * 50, {100, 50}), second);
  for (int64_t i = 0; i < tail.numel(); ++i)
    ASSERT_EQ(tail.data<float>()[i], y.data<float>()[100 * 50 + i]);
  // Another step draws another mask.
  Context next = kTrain;
  next.step += 1;
  const Tensor other = d.forward(x, next);
  int64_t differ = 0;
  for (int64_t i = 0; i < y.numel(); ++i) differ += other.data<float>()[i] != y.data<float>()[i];
  EXPECT_GT(differ, 100);
}

// ---- Loss ----

TEST(CrossEntropyLoss, MatchesDirectFormulaOnSequences) {
  const Tensor logits = randn({2, 3, 5}, 22, 2.0f);
  const Tensor labels = random_ids({2, 3}, 5, 23);
  CrossEntropyLoss loss;
  const float l = loss.forward(logits, labels);
  double expect = 0;
  int64_t correct = 0;
  for (int64_t r = 0; r < 6; ++r) {
    const float* row = logits.data<float>() + r * 5;
    double z = 0;
    int64_t arg = 0;
    for (int64_t c = 0; c < 5; ++c) {
      z += std::exp(static_cast<double>(row[c]));
      if (row[c] > row[arg]) arg = c;
    }
    const int32_t y = labels.data<int32_t>()[r];
    expect += std::log(z) - row[y];
    correct += arg == y;
  }
  EXPECT_NEAR(l, expect / 6, 1e-5);
  EXPECT_EQ(loss.count(), 6);
  EXPECT_EQ(loss.correct(), correct);
  const Tensor d = loss.backward();
  EXPECT_EQ(d.shape(), logits.shape());
  testing::check_grad("dlogits", logits, d.clone(), [&] {
    CrossEntropyLoss l2;
    return static_cast<double>(l2.forward(logits, labels));
  });
}

TEST(CrossEntropyLoss, RejectsMismatchedLabels) {
  CrossEntropyLoss loss;
  EXPECT_THROW(loss.forward(randn({4, 3}, 1), random_ids({5}, 3, 1)), InvalidArgument);
  EXPECT_THROW(loss.forward(randn({4, 3}, 1), randn({4}, 1)), InvalidArgument);
}

// ---- Whole models through the loss ----

ModelSpec small_mlp() {
  ModelSpec s;
  s.kind = "mlp";
  s.input_shape = {6};
  s.num_classes = 4;
  s.hidden = {5, 3};
  return s;
}

TEST(ModelGrad, MlpReluWithDropout) {
  ModelSpec s = small_mlp();
  s.dropout = 0.3f;
  auto m = build_model(s, 1);
  check_model_grads(*m, randn({5, 6}, 30), random_ids({5}, 4, 31), kTrain,
                    {.eps = 1e-3, .rtol = 3e-2, .skip_kinks = true});
}

TEST(ModelGrad, MlpGelu) {
  ModelSpec s = small_mlp();
  s.activation = "gelu";
  auto m = build_model(s, 2);
  check_model_grads(*m, randn({5, 6}, 32), random_ids({5}, 4, 33), kTrain);
}

TEST(ModelGrad, Cnn) {
  ModelSpec s;
  s.kind = "cnn";
  s.input_shape = {1, 8, 8};
  s.num_classes = 4;
  s.channels = {2, 3};
  s.kernel = 3;
  s.fc_hidden = 5;
  auto m = build_model(s, 3);
  check_model_grads(*m, randn({3, 1, 8, 8}, 34), random_ids({3}, 4, 35), kTrain,
                    {.eps = 1e-3, .rtol = 3e-2, .max_coords = 12, .skip_kinks = true});
}

ModelSpec small_gpt() {
  ModelSpec s;
  s.kind = "gpt";
  s.input_shape = {4};
  s.num_classes = 7;
  s.layers = 2;
  s.heads = 2;
  s.embed = 8;
  return s;
}

TEST(ModelGrad, Gpt) {
  auto m = build_model(small_gpt(), 4);
  check_model_grads(*m, random_ids({2, 4}, 7, 36), random_ids({2, 4}, 7, 37), kTrain,
                    {.max_coords = 8});
}

}  // namespace
}  // namespace tessel::nn
