// Layer and model gradient checks (finite differences), the layers against PyTorch fixtures,
// and dropout and loss behaviour.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nn_testing.h"
#include "tessel/nn/layers.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/models.h"
#include "tessel/ops/cpu.h"

namespace tessel::nn {
namespace {

using testing::away_from_zero;
using testing::check_model_grads;
using testing::check_module_grads;
using testing::distinct;
using testing::dot;
using testing::FdOptions;
using testing::materialized;
using testing::param_grad;
using testing::randn;
using testing::random_ids;
using testing::same_bits;

const Context kTrain{true, 1234, 3, 40};
const Context kEval{false, 1234, 3, 40};

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

TEST(LayerGrad, ConvReluPool) {
  check_module_grads(std::make_unique<ConvReluPool>(2, 3, 3, 1, 2, 6, 6),
                     distinct({2, 2, 6, 6}, 11), kTrain, {.eps = 1e-2, .skip_kinks = true});
}

// The fused block gives the three blocks' outputs and gradients (its parameters bound to the
// same values), whatever kernel path the shape takes.
TEST(ConvReluPool, EqualsConvThenReluThenPool) {
  for (int64_t size : {28, 14, 7}) {
    Model fused, three;
    fused.add("conv", std::make_unique<ConvReluPool>(3, 8, 5, 2, 2, size, size));
    three.add("conv", std::make_unique<Conv2d>(3, 8, 5, 1, 2, size, size));
    three.add("relu", std::make_unique<ReLU>());
    three.add("pool", std::make_unique<MaxPool2d>(2, 2));
    for (Model* m : {&fused, &three}) {
      m->set_input_grad(true);
      m->finalize();
      m->materialize(3);
    }
    const Tensor x = randn({4, 3, size, size}, 12);
    Activations a, b;
    const Tensor y1 = fused.forward(x, kTrain, &a), y2 = three.forward(x, kTrain, &b);
    ASSERT_EQ(y1.shape(), y2.shape());
    for (int64_t i = 0; i < y1.numel(); ++i)
      ASSERT_NEAR(y1.data<float>()[i], y2.data<float>()[i], 1e-5) << size;
    const Tensor dy = randn(y1.shape(), 13);
    const Tensor dx1 = fused.backward(dy, a), dx2 = three.backward(dy, b);
    for (int64_t i = 0; i < dx1.numel(); ++i)
      ASSERT_NEAR(dx1.data<float>()[i], dx2.data<float>()[i], 1e-4) << size;
    for (int64_t i = 0; i < fused.grads().numel(); ++i)
      ASSERT_NEAR(fused.grads().data<float>()[i], three.grads().data<float>()[i], 1e-3) << size;
  }
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
// hold both the head's and the embedding's share; finite differences see both uses. The model
// knows of the borrow, so the layout queries name both blocks as the table's users.
TEST(LayerGrad, EmbeddingAndTiedHead) {
  const int64_t V = 7, T = 4, C = 8;
  Model m;
  auto embed = std::make_unique<Embedding>(V, T, C);
  Parameter* table = embed->token_table();
  m.add("embed", std::move(embed));
  m.add("head", std::make_unique<LmHead>(table, V, C, T), {table});
  m.finalize();
  ASSERT_EQ(m.parameters().size(), 4u);  // the head does not list the table
  EXPECT_EQ(m.parameters()[0]->name, "embed.wte");
  EXPECT_EQ(m.parameters()[0], table);
  EXPECT_EQ(m.parameters()[2]->name, "head.ln.weight");
  EXPECT_EQ(m.blocks_using(0), (std::vector<size_t>{0, 1}));
  EXPECT_EQ(m.blocks_using(1), (std::vector<size_t>{1}));
  EXPECT_EQ(m.blocks_used_by(0), (std::vector<size_t>{0}));
  EXPECT_EQ(m.blocks_used_by(1), (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(m.borrowed(0).empty());
  EXPECT_EQ(m.borrowed(1), (std::vector<Parameter*>{table}));
  m.materialize(3);
  testing::jitter_params(m);
  const Tensor ids = random_ids({2, 3}, V, 14);
  const Tensor r = randn({2, 3, V}, 15);
  Activations acts;
  auto objective = [&] { return dot(r, m.forward(ids, kTrain, nullptr)); };
  m.forward(ids, kTrain, &acts);
  m.zero_grad();
  EXPECT_FALSE(m.backward(r, acts).defined());  // token ids have no gradient
  const Tensor full = m.grads().clone();
  for (size_t k = 0; k < m.parameters().size(); ++k) {
    Parameter& p = *m.parameters()[k];
    testing::check_grad(p.name, p.value, param_grad(m, full, k), objective);
  }
  // The head alone contributes to the table gradient, and the embedding adds to it.
  m.zero_grad();
  m.forward(ids, kTrain, &acts);
  m.backward(r, acts, {}, 1, 2);
  Tensor head_only = table->grad.clone();
  double head_norm = 0, diff = 0;
  for (int64_t i = 0; i < head_only.numel(); ++i) {
    head_norm += std::abs(head_only.data<float>()[i]);
    diff += std::abs(head_only.data<float>()[i] - full.data<float>()[i]);
  }
  EXPECT_GT(head_norm, 1e-3);
  EXPECT_GT(diff, 1e-3);
}

TEST(LayerGrad, BorrowingAParameterNoBlockOwnsIsRejected) {
  Embedding outside(5, 4, 3);
  Model m;
  m.add("embed", std::make_unique<Embedding>(5, 4, 3));
  m.add("head", std::make_unique<LmHead>(outside.token_table(), 5, 3, 4), {outside.token_table()});
  try {
    m.finalize();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'head' borrows a parameter that no block owns"),
              std::string::npos)
        << e.what();
  }
}

TEST(LayerGrad, EmbeddingAlone) {
  Model m;
  m.add("embed", std::make_unique<Embedding>(5, 4, 3));
  m.finalize();
  m.materialize(1);
  const Tensor ids = random_ids({3, 4}, 5, 16);
  const Tensor r = randn({3, 4, 3}, 17);
  auto objective = [&] { return dot(r, m.forward(ids, kTrain, nullptr)); };
  Activations acts;
  m.forward(ids, kTrain, &acts);
  m.zero_grad();
  EXPECT_FALSE(m.backward(r, acts).defined());
  for (Parameter* p : m.parameters())
    testing::check_grad(p->name, p->value, p->grad.clone(), objective);
}

TEST(LayerGrad, BackwardAccumulatesParameterGradients) {
  Model m;
  m.add("fc", std::make_unique<Linear>(4, 3));
  m.finalize();
  m.materialize(1);
  const Tensor x = randn({2, 4}, 18), r = randn({2, 3}, 19);
  Activations acts;
  m.forward(x, kTrain, &acts);
  m.zero_grad();
  m.backward(r, acts);
  const Tensor once = m.grads().clone();
  m.backward(r, acts);  // the cache still holds the forward: a second backward adds again
  for (int64_t i = 0; i < once.numel(); ++i)
    EXPECT_FLOAT_EQ(m.grads().data<float>()[i], 2 * once.data<float>()[i]);
}

// A frozen Linear (a serving replica's: its weight's values transposed in place, read as they
// are) answers with the bits of the training forward, for one tile of rows to several, and for
// shapes whose product runs transposed (10 outputs) or not; a model sharing its values, frozen
// without rearranging them, too.
TEST(LayerFrozen, LinearForwardHasTheBitsOfTheTrainingForward) {
  for (const auto& [in, out] :
       std::vector<std::pair<int64_t, int64_t>>{{784, 512}, {512, 10}, {37, 5}, {700, 130}}) {
    auto model = [in, out] {
      auto m = std::make_unique<Model>();
      m->add("fc", std::make_unique<Linear>(in, out));
      m->finalize();
      return m;
    };
    const auto trained = model(), frozen = model(), sharing = model();
    trained->materialize(7);
    frozen->materialize(7);
    frozen->block(0).freeze(true);
    sharing->bind_values({0, trained->values().numel()}, frozen->values());
    sharing->block(0).freeze(false);
    EXPECT_FALSE(same_bits(frozen->values(), trained->values()));  // rearranged
    for (const int64_t rows : {1, 3, 17, 64, 200}) {
      const Tensor x = randn({rows, in}, static_cast<uint64_t>(20 + rows));
      const Tensor want = trained->forward(x, kEval, nullptr).clone();
      EXPECT_TRUE(same_bits(frozen->forward(x, kEval, nullptr).clone(), want))
          << in << " -> " << out << ", " << rows << " rows";
      EXPECT_TRUE(same_bits(sharing->forward(x, kEval, nullptr).clone(), want));
    }
    Activations acts;
    frozen->forward(randn({2, in}, 6), kTrain, &acts);
    EXPECT_THROW(frozen->backward(randn({2, out}, 7), acts), Error);  // "has no backward"
  }
}

// A frozen GPT (each block's four projections a frozen Linear) has the training forward's
// logits, bit for bit.
TEST(LayerFrozen, GptForwardHasTheBitsOfTheTrainingForward) {
  const auto trained = materialized(testing::gpt_spec(), 4);
  const auto frozen = materialized(testing::gpt_spec(), 4);
  for (size_t i = 0; i < frozen->num_blocks(); ++i) frozen->block(i).freeze(true);
  EXPECT_FALSE(same_bits(frozen->values(), trained->values()));  // rearranged
  const Tensor ids = random_ids({3, 8}, 11, 38);
  EXPECT_TRUE(same_bits(frozen->forward(ids, kEval, nullptr).clone(),
                        trained->forward(ids, kEval, nullptr).clone()));
}

// ---- Layers against PyTorch (tests/fixtures, written by gen_fixtures.py) ----
// The kernels are checked against these fixtures in tests/ops; here the same numbers go through
// the Module interface: parameters bound by a Model, outputs and input gradients in the cache.

using Json = nlohmann::json;

Json load_fixture(const std::string& name) {
  const std::string path = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/" + name;
  std::ifstream in(path);
  if (!in) throw IoError("nn_test: cannot open " + path + "; regenerate it with gen_fixtures.py");
  return Json::parse(in);
}

Tensor tensor_of(const Json& values, Shape shape) {
  Tensor t = Tensor::empty(std::move(shape));
  const std::vector<float> v = values.get<std::vector<float>>();
  EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// |got - want| <= 1e-5 * (|want| + max|want|), as tests/ops/reference_test.cc.
void expect_close(const std::string& what, const Tensor& got, const Json& want_json) {
  const std::vector<double> want = want_json.get<std::vector<double>>();
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(got.data<float>()[i] - want[i]);
    if (!(err <= 1e-5 * (std::abs(want[i]) + scale)) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got.data<float>()[i] << ", PyTorch "
                    << want[i];
  }
}

// A one-block model holding `block`, materialized and with the input gradient on.
std::unique_ptr<Model> one_block(std::unique_ptr<Module> block) {
  auto m = std::make_unique<Model>();
  m->add("m", std::move(block));
  m->finalize();
  m->materialize(1);
  m->set_input_grad(true);
  m->zero_grad();
  return m;
}

TEST(ModuleVsPyTorch, Linear) {
  const Json f = load_fixture("linear.json");
  const int64_t N = f["N"], C = f["C"], OC = f["OC"];
  auto m = one_block(std::make_unique<Linear>(C, OC));
  m->parameters()[0]->value.copy_from(tensor_of(f["w"], {OC, C}));
  m->parameters()[1]->value.copy_from(tensor_of(f["b"], {OC}));
  Activations acts;
  expect_close("y", m->forward(tensor_of(f["x"], {N, C}), kTrain, &acts), f["y"]);
  expect_close("dx", m->backward(tensor_of(f["dy"], {N, OC}), acts), f["dx"]);
  expect_close("dw", m->parameters()[0]->grad, f["dw"]);
  expect_close("db", m->parameters()[1]->grad, f["db"]);
}

TEST(ModuleVsPyTorch, LayerNorm) {
  const Json f = load_fixture("layernorm.json");
  const int64_t N = f["N"], C = f["C"];
  auto m = one_block(std::make_unique<LayerNorm>(C));
  m->parameters()[0]->value.copy_from(tensor_of(f["w"], {C}));
  m->parameters()[1]->value.copy_from(tensor_of(f["b"], {C}));
  Activations acts;
  expect_close("y", m->forward(tensor_of(f["x"], {N, C}), kTrain, &acts), f["y"]);
  expect_close("dx", m->backward(tensor_of(f["dy"], {N, C}), acts), f["dx"]);
  expect_close("dw", m->parameters()[0]->grad, f["dw"]);
  expect_close("db", m->parameters()[1]->grad, f["db"]);
}

TEST(ModuleVsPyTorch, Gelu) {
  const Json f = load_fixture("gelu.json");
  const int64_t n = f["n"];
  auto m = one_block(std::make_unique<GELU>());
  Activations acts;
  expect_close("y", m->forward(tensor_of(f["x"], {n}), kTrain, &acts), f["y"]);
  expect_close("dx", m->backward(tensor_of(f["dy"], {n}), acts), f["dx"]);
}

TEST(ModuleVsPyTorch, CrossEntropyLossThroughTheLossInterface) {
  const Json f = load_fixture("cross_entropy.json");
  const int64_t N = f["N"], C = f["C"];
  Tensor labels = Tensor::empty({N}, DType::kI32);
  const std::vector<int32_t> l = f["labels"].get<std::vector<int32_t>>();
  std::copy(l.begin(), l.end(), labels.data<int32_t>());
  std::unique_ptr<Loss> loss = std::make_unique<CrossEntropyLoss>();
  const LossValue v = loss->forward(tensor_of(f["logits"], {N, C}), labels);
  const double want = f["loss"];
  EXPECT_NEAR(v.mean, want, 1e-5 * std::abs(want));
  EXPECT_EQ(v.correct, f["correct"].get<int64_t>());
  EXPECT_EQ(v.positions, N);
  expect_close("dlogits", loss->backward(f["dloss"].get<float>()), f["dlogits"]);
}

// ---- Dropout semantics ----

TEST(Dropout, IdentityWhenNotTrainingOrZero) {
  const Tensor x = randn({4, 6}, 20);
  Dropout d(0.5f);
  Cache c;
  EXPECT_EQ(d.forward(x, kEval, &c).raw(), x.raw());
  EXPECT_EQ(d.forward(x, kEval, nullptr).raw(), x.raw());
  const Tensor dy = randn({4, 6}, 21);
  EXPECT_EQ(d.backward(dy, c).raw(), dy.raw());
  Dropout zero(0.0f);
  EXPECT_EQ(zero.forward(x, kTrain, &c).raw(), x.raw());
  EXPECT_EQ(zero.backward(dy, c).raw(), dy.raw());
  EXPECT_THROW(Dropout(1.0f), InvalidArgument);
}

TEST(Dropout, ScalesKeptValuesAndIsKeyedBySample) {
  const float p = 0.25f;
  Tensor x = Tensor::empty({200, 50});
  x.fill_(1.0f);
  Dropout d(p);
  Cache c;
  const Tensor y = d.forward(x, kTrain, &c).clone();
  int64_t zeros = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const float v = y.data<float>()[i];
    if (v == 0.0f)
      ++zeros;
    else
      EXPECT_FLOAT_EQ(v, 1.0f / (1.0f - p));
  }
  EXPECT_NEAR(static_cast<double>(zeros) / y.numel(), p, 0.02);
  // Inference with the same context draws the same mask.
  EXPECT_TRUE(same_bits(d.forward(x, kTrain, nullptr), y));
  // Rows 100.. of the batch computed as their own batch (first_sample shifted) match.
  Context second = kTrain;
  second.first_sample += 100;
  const Tensor tail = d.forward(x.view(100 * 50, {100, 50}), second, nullptr);
  for (int64_t i = 0; i < tail.numel(); ++i)
    ASSERT_EQ(tail.data<float>()[i], y.data<float>()[100 * 50 + i]);
  // Another step draws another mask.
  Context next = kTrain;
  next.step += 1;
  const Tensor other = d.forward(x, next, nullptr);
  int64_t differ = 0;
  for (int64_t i = 0; i < y.numel(); ++i) differ += other.data<float>()[i] != y.data<float>()[i];
  EXPECT_GT(differ, 100);
}

// Two forwards in flight (two caches, two steps): each backward applies its own forward's mask.
TEST(Dropout, BackwardUsesTheMaskOfItsOwnForward) {
  Tensor x = Tensor::empty({20, 10});
  x.fill_(1.0f);
  Dropout d(0.5f);
  Context next = kTrain;
  next.step += 1;
  Cache a, b;
  const Tensor ya = d.forward(x, kTrain, &a).clone();
  const Tensor yb = d.forward(x, next, &b).clone();
  EXPECT_FALSE(same_bits(ya, yb));
  // With x and dy all ones, dx = mask / (1 - p) = y.
  EXPECT_TRUE(same_bits(d.backward(x, a), ya));
  EXPECT_TRUE(same_bits(d.backward(x, b), yb));
}

// ---- Loss ----

TEST(CrossEntropyLoss, MatchesDirectFormulaOnSequences) {
  const Tensor logits = randn({2, 3, 5}, 22, 2.0f);
  const Tensor labels = random_ids({2, 3}, 5, 23);
  CrossEntropyLoss loss;
  const LossValue v = loss.forward(logits, labels);
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
  EXPECT_NEAR(v.mean, expect / 6, 1e-5);
  EXPECT_EQ(v.positions, 6);
  EXPECT_EQ(v.correct, correct);
  const Tensor d = loss.backward(1.0f);
  EXPECT_EQ(d.shape(), logits.shape());
  const Tensor d1 = d.clone();
  testing::check_grad("dlogits", logits, d1, [&] {
    CrossEntropyLoss l2;
    return static_cast<double>(l2.forward(logits, labels).mean);
  });
  // backward(dloss) scales linearly and reuses its buffer.
  const Tensor d3 = loss.backward(3.0f);
  EXPECT_EQ(d3.raw(), d.raw());
  for (int64_t i = 0; i < d3.numel(); ++i)
    EXPECT_NEAR(d3.data<float>()[i], 3.0f * d1.data<float>()[i], 1e-6f);
}

TEST(CrossEntropyLoss, RejectsMismatchedLabelsAndBackwardBeforeForward) {
  CrossEntropyLoss loss;
  EXPECT_THROW(loss.backward(1.0f), Error);
  EXPECT_THROW(loss.forward(randn({4, 3}, 1), random_ids({5}, 3, 1)), InvalidArgument);
  EXPECT_THROW(loss.forward(randn({4, 3}, 1), randn({4}, 1)), InvalidArgument);
}

TEST(MseLoss, MatchesTheFormulaAndFiniteDifferences) {
  const Tensor out = randn({7, 1}, 24, 2.0f), targets = randn({7}, 25, 3.0f);
  MseLoss loss;
  const LossValue v = loss.forward(out, targets);
  double expect = 0;
  for (int64_t r = 0; r < 7; ++r) {
    const double d = out.data<float>()[r] - targets.data<float>()[r];
    expect += d * d;
  }
  EXPECT_NEAR(v.mean, expect / 7, 1e-5);
  EXPECT_EQ(v.positions, 7);
  EXPECT_EQ(v.correct, 0);
  const Tensor d = loss.backward(1.0f).clone();
  EXPECT_EQ(d.shape(), out.shape());
  testing::check_grad("doutput", out, d, [&] {
    MseLoss l2;
    return static_cast<double>(l2.forward(out, targets).mean);
  });
  const Tensor d3 = loss.backward(3.0f);
  for (int64_t i = 0; i < 7; ++i)
    EXPECT_NEAR(d3.data<float>()[i], 3.0f * d.data<float>()[i], 1e-5f);
  // 16-bit outputs: the loss in f32, the gradient back in the output's type.
  Tensor half = Tensor::empty({7, 1}, DType::kBF16);
  ops::convert(half.raw(), DType::kBF16, out.raw(), DType::kF32, 7);
  MseLoss l16;
  EXPECT_NEAR(l16.forward(half, targets).mean, v.mean, 0.05 * v.mean);
  EXPECT_EQ(l16.backward(1.0f).dtype(), DType::kBF16);
  EXPECT_THROW(MseLoss().backward(1.0f), Error);
  EXPECT_THROW(MseLoss().forward(randn({7, 2}, 1), targets), InvalidArgument);
  EXPECT_THROW(MseLoss().forward(out, random_ids({7}, 3, 1)), InvalidArgument);
}

TEST(MseLoss, RegressionMlpGradientsMatchFiniteDifferences) {
  ModelSpec s;
  s.kind = ModelKind::kMlp;
  s.input_shape = {4};
  s.num_classes = 1;
  s.hidden = {5};
  s.activation = Activation::kGelu;  // smooth, so that finite differences see no kinks
  s.task = data::Task::kRegression;
  EXPECT_NE(dynamic_cast<MseLoss*>(make_loss(s).get()), nullptr);
  auto m = build_model(s);
  m->materialize(3);
  testing::check_model_grads<MseLoss>(*m, randn({6, 4}, 26), randn({6}, 27), Context{true});
}

// ---- Whole models through the loss ----

ModelSpec small_mlp() {
  ModelSpec s;
  s.kind = ModelKind::kMlp;
  s.input_shape = {6};
  s.num_classes = 4;
  s.hidden = {5, 3};
  return s;
}

TEST(ModelGrad, MlpReluWithDropout) {
  ModelSpec s = small_mlp();
  s.dropout = 0.3f;
  auto m = materialized(s, 1);
  check_model_grads(*m, randn({5, 6}, 30), random_ids({5}, 4, 31), kTrain,
                    {.eps = 1e-3, .rtol = 3e-2, .skip_kinks = true});
}

TEST(ModelGrad, MlpGelu) {
  ModelSpec s = small_mlp();
  s.activation = Activation::kGelu;
  auto m = materialized(s, 2);
  check_model_grads(*m, randn({5, 6}, 32), random_ids({5}, 4, 33), kTrain);
}

TEST(ModelGrad, Cnn) {
  ModelSpec s;
  s.kind = ModelKind::kCnn;
  s.input_shape = {1, 8, 8};
  s.num_classes = 4;
  s.channels = {2, 3};
  s.kernel = 3;
  s.fc_hidden = 5;
  auto m = materialized(s, 3);
  check_model_grads(*m, randn({3, 1, 8, 8}, 34), random_ids({3}, 4, 35), kTrain,
                    {.eps = 1e-3, .rtol = 3e-2, .max_coords = 12, .skip_kinks = true});
}

ModelSpec small_gpt() {
  ModelSpec s;
  s.kind = ModelKind::kGpt;
  s.input_shape = {4};
  s.num_classes = 7;
  s.layers = 2;
  s.heads = 2;
  s.embed = 8;
  return s;
}

// The tied head (borrowing the embedding's table through build_model) included.
TEST(ModelGrad, Gpt) {
  auto m = materialized(small_gpt(), 4);
  const size_t head = m->num_blocks() - 1;
  EXPECT_EQ(m->borrowed(head), (std::vector<Parameter*>{m->parameters()[0]}));
  EXPECT_EQ(m->blocks_using(0), (std::vector<size_t>{0, head}));
  check_model_grads(*m, random_ids({2, 4}, 7, 36), random_ids({2, 4}, 7, 37), kTrain,
                    {.max_coords = 8});
}

}  // namespace
}  // namespace tessel::nn
