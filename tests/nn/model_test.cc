// Model contract: arena layout and names, deterministic init, block slicing and the
// after_block callback, builder validation, FLOPs, and buffer reuse in steady state.
#include <gtest/gtest.h>

#include <cmath>

#include "nn_testing.h"
#include "tessel/nn/layers.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/models.h"

namespace tessel::nn {
namespace {

using testing::randn;
using testing::random_ids;

const Context kTrain{true, 77, 5, 0};

ModelSpec mlp_spec() {
  ModelSpec s;
  s.input_shape = {784};
  s.num_classes = 10;
  return s;
}

ModelSpec cnn_spec() {
  ModelSpec s;
  s.kind = "cnn";
  s.input_shape = {1, 28, 28};
  s.num_classes = 10;
  return s;
}

ModelSpec gpt_spec() {
  ModelSpec s;
  s.kind = "gpt";
  s.input_shape = {8};
  s.num_classes = 11;
  s.layers = 2;
  s.heads = 2;
  s.embed = 16;
  return s;
}

bool inside(const Tensor& view, const Tensor& flat) {
  const char* b = static_cast<const char*>(flat.raw());
  const char* p = static_cast<const char*>(view.raw());
  return p >= b && p + view.nbytes() <= b + flat.nbytes();
}

TEST(ModelArena, ParametersAreNamedViewsOfOneArena) {
  for (const ModelSpec& spec : {mlp_spec(), cnn_spec(), gpt_spec()}) {
    auto m = build_model(spec, 1);
    const auto& entries = m->params().entries();
    ASSERT_EQ(entries.size(), m->parameters().size());
    ASSERT_EQ(m->grads().entries().size(), entries.size());
    int64_t total = 0;
    for (size_t k = 0; k < entries.size(); ++k) {
      const Parameter& p = *m->parameters()[k];
      EXPECT_EQ(entries[k].name, p.name);
      EXPECT_EQ(m->grads().entries()[k].name, p.name);
      EXPECT_TRUE(inside(p.value, m->params().flat())) << p.name;
      EXPECT_TRUE(inside(p.grad, m->grads().flat())) << p.name;
      EXPECT_EQ(static_cast<const float*>(p.value.raw()) - m->params().flat().data<float>(),
                entries[k].offset);
      EXPECT_EQ(static_cast<const float*>(p.grad.raw()) - m->grads().flat().data<float>(),
                entries[k].offset);
      EXPECT_EQ(p.value.shape(), p.shape);
      total += p.value.numel();
    }
    EXPECT_EQ(m->num_parameters(), total);
    EXPECT_GE(m->params().numel(), total);
    // Block ranges tile the parameter list in order.
    size_t next = 0;
    for (size_t i = 0; i < m->num_blocks(); ++i) {
      auto [first, last] = m->block_parameters(i);
      EXPECT_EQ(first, next);
      EXPECT_EQ(last - first, m->block(i).parameters().size());
      for (size_t k = first; k < last; ++k)
        EXPECT_EQ(m->parameters()[k]->name.rfind(m->block_name(i) + ".", 0), 0u);
      next = last;
    }
    EXPECT_EQ(next, m->parameters().size());
  }
}

TEST(ModelArena, Names) {
  auto mlp = build_model(mlp_spec(), 1);
  std::vector<std::string> names;
  for (size_t i = 0; i < mlp->num_blocks(); ++i) names.push_back(mlp->block_name(i));
  EXPECT_EQ(names, (std::vector<std::string>{"fc1", "act1", "fc2", "act2", "fc3"}));
  names.clear();
  for (const Parameter* p : mlp->parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                             "fc3.weight", "fc3.bias"}));
  EXPECT_EQ(mlp->num_parameters(), 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);

  ModelSpec c = cnn_spec();
  c.dropout = 0.5f;
  auto cnn = build_model(c, 1);
  names.clear();
  for (size_t i = 0; i < cnn->num_blocks(); ++i) names.push_back(cnn->block_name(i));
  EXPECT_EQ(names, (std::vector<std::string>{"conv1", "relu1", "pool1", "conv2", "relu2", "pool2",
                                             "flatten", "fc1", "relu3", "dropout", "fc2"}));
  // 28 -> conv(pad 2) 28 -> pool 14 -> 14 -> 7: fc1 sees 32 * 7 * 7.
  EXPECT_EQ(cnn->parameters()[4]->name, "fc1.weight");
  EXPECT_EQ(cnn->parameters()[4]->shape, (Shape{128, 32 * 7 * 7}));

  auto gpt = build_model(gpt_spec(), 1);
  names.clear();
  for (size_t i = 0; i < gpt->num_blocks(); ++i) names.push_back(gpt->block_name(i));
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "block0", "block1", "head"}));
  names.clear();
  for (const Parameter* p : gpt->parameters()) names.push_back(p->name);
  EXPECT_EQ(names.front(), "embed.wte");
  EXPECT_EQ(names[2], "block0.ln1.weight");
  EXPECT_EQ(names[4], "block0.attn.qkv.weight");
  EXPECT_EQ(names.back(), "head.ln.bias");
  // Tied head: V*C counted once. Per block 12 C^2 + 13 C; embeddings (V + T) C; final LN 2C.
  const int64_t C = 16, V = 11, T = 8;
  EXPECT_EQ(gpt->num_parameters(), (V + T) * C + 2 * (12 * C * C + 13 * C) + 2 * C);
}

TEST(ModelInit, DeterministicAndKeyedOnlyBySeed) {
  EXPECT_EQ(build_model(mlp_spec(), 7)->params_sha256(),
            build_model(mlp_spec(), 7)->params_sha256());
  EXPECT_NE(build_model(mlp_spec(), 7)->params_sha256(),
            build_model(mlp_spec(), 8)->params_sha256());
  EXPECT_EQ(build_model(gpt_spec(), 7)->params_sha256(),
            build_model(gpt_spec(), 7)->params_sha256());
  // Dropout blocks shift block indices but not parameter indices: same values.
  ModelSpec with_dropout = mlp_spec();
  with_dropout.dropout = 0.2f;
  EXPECT_EQ(build_model(with_dropout, 7)->params_sha256(),
            build_model(mlp_spec(), 7)->params_sha256());
  // Training changes the hash.
  auto m = build_model(mlp_spec(), 7);
  const std::string before = m->params_sha256();
  m->parameters()[0]->value.data<float>()[0] += 1.0f;
  EXPECT_NE(m->params_sha256(), before);
}

TEST(ModelInit, Distributions) {
  auto mlp = build_model(mlp_spec(), 3);
  const Tensor w = mlp->parameters()[0]->value;
  const float bound = 1.0f / std::sqrt(784.0f);
  float lo = 1, hi = -1;
  double mean = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    lo = std::min(lo, w.data<float>()[i]);
    hi = std::max(hi, w.data<float>()[i]);
    mean += w.data<float>()[i];
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -0.99f * bound);
  EXPECT_GT(hi, 0.99f * bound);
  EXPECT_NEAR(mean / w.numel(), 0.0, 1e-3);

  auto gpt = build_model(gpt_spec(), 3);
  auto stddev = [](const Tensor& t) {
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += double{t.data<float>()[i]} * t.data<float>()[i];
    return std::sqrt(s / t.numel());
  };
  for (const Parameter* p : gpt->parameters()) {
    const std::string& n = p->name;
    const bool ln_weight = n.find("ln") != std::string::npos && n.ends_with(".weight");
    if (ln_weight || n.ends_with(".bias")) {
      const float expect = ln_weight ? 1.0f : 0.0f;
      for (int64_t i = 0; i < p->value.numel(); ++i)
        ASSERT_EQ(p->value.data<float>()[i], expect) << n;
    } else if (n.ends_with("proj.weight")) {
      EXPECT_NEAR(stddev(p->value), 0.02 / std::sqrt(4.0), 0.002) << n;
    } else {
      EXPECT_NEAR(stddev(p->value), 0.02, 0.003) << n;
    }
  }
}

TEST(ModelSlices, AfterBlockRunsInReverseAndSlicesCompose) {
  ModelSpec s = mlp_spec();
  s.input_shape = {20};
  s.hidden = {16, 12};
  s.dropout = 0.1f;
  auto m = build_model(s, 1);
  m->set_input_grad(true);
  const Tensor x = randn({4, 20}, 1);
  const Tensor full_y = m->forward(x, kTrain).clone();
  const Tensor r = randn(full_y.shape(), 2);
  m->zero_grad();
  std::vector<size_t> order;
  const Tensor full_dx = m->backward(r, [&](size_t i) { order.push_back(i); }).clone();
  const Tensor full_g = m->grads().flat().clone();
  std::vector<size_t> expect;
  for (size_t i = m->num_blocks(); i-- > 0;) expect.push_back(i);
  EXPECT_EQ(order, expect);

  const size_t cut = 3;
  Tensor h = m->forward(x, kTrain, 0, cut);
  const Tensor y = m->forward(h, kTrain, cut);
  m->zero_grad();
  order.clear();
  auto record = [&](size_t i) { order.push_back(i); };
  const Tensor dh = m->backward(r, record, cut);
  const Tensor dx = m->backward(dh, record, 0, cut);
  EXPECT_EQ(order, expect);
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.data<float>()[i], full_y.data<float>()[i]);
  for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_EQ(dx.data<float>()[i], full_dx.data<float>()[i]);
  for (int64_t i = 0; i < full_g.numel(); ++i)
    ASSERT_EQ(m->grads().flat().data<float>()[i], full_g.data<float>()[i]);
}

TEST(ModelSlices, FirstBlockInputGradientIsOffByDefault) {
  auto m = build_model(mlp_spec(), 1);
  const Tensor x = randn({3, 784}, 3);
  const Tensor r = randn({3, 10}, 4);
  m->forward(x, kTrain);
  m->zero_grad();
  EXPECT_FALSE(m->backward(r).defined());
  const Tensor without = m->grads().flat().clone();
  m->set_input_grad(true);
  m->forward(x, kTrain);
  m->zero_grad();
  const Tensor dx = m->backward(r);
  ASSERT_TRUE(dx.defined());
  EXPECT_EQ(dx.shape(), x.shape());
  for (int64_t i = 0; i < without.numel(); ++i)
    ASSERT_EQ(m->grads().flat().data<float>()[i], without.data<float>()[i]);
}

void expect_invalid(const ModelSpec& s, const std::string& needle) {
  try {
    build_model(s, 1);
    ADD_FAILURE() << "no error for " << needle;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(BuildModel, ValidatesTheSpec) {
  ModelSpec s = mlp_spec();
  s.kind = "rnn";
  expect_invalid(s, "mlp, cnn, gpt");
  s = mlp_spec();
  s.hidden = {};
  expect_invalid(s, "model.hidden");
  s.hidden = {64, 0};
  expect_invalid(s, "model.hidden");
  s = mlp_spec();
  s.num_classes = 0;
  expect_invalid(s, "num_classes");
  s = mlp_spec();
  s.activation = "tanh";
  expect_invalid(s, "relu, gelu");
  s = mlp_spec();
  s.dropout = 1.0f;
  expect_invalid(s, "model.dropout");
  s = mlp_spec();
  s.input_shape = {1, 28, 28};
  expect_invalid(s, "data.flatten = true");
  s = cnn_spec();
  s.input_shape = {784};
  expect_invalid(s, "data.flatten = false");
  s = cnn_spec();
  s.kernel = 0;
  expect_invalid(s, "model.kernel");
  s = cnn_spec();
  s.channels = {8, 8, 8, 8, 8};
  expect_invalid(s, "too small");
  s = cnn_spec();
  s.input_shape = {1, -3, 28};
  expect_invalid(s, "input_shape");
  s = gpt_spec();
  s.heads = 3;
  expect_invalid(s, "model.heads must divide model.embed, got");
  s = gpt_spec();
  s.layers = 0;
  expect_invalid(s, "model.layers");
  s = gpt_spec();
  s.input_shape = {1, 28, 28};
  expect_invalid(s, "token");
}

TEST(BuildModel, RejectsWrongInputsAtForward) {
  auto gpt = build_model(gpt_spec(), 1);
  EXPECT_THROW(gpt->forward(randn({2, 8}, 1), kTrain), InvalidArgument);           // not token ids
  EXPECT_THROW(gpt->forward(random_ids({2, 9}, 11, 1), kTrain), InvalidArgument);  // T > context
  EXPECT_THROW(gpt->forward(random_ids({2, 8}, 12, 1), kTrain), InvalidArgument);  // id >= vocab
  auto mlp = build_model(mlp_spec(), 1);
  EXPECT_THROW(mlp->forward(randn({2, 783}, 1), kTrain), InvalidArgument);
  auto cnn = build_model(cnn_spec(), 1);
  EXPECT_THROW(cnn->forward(randn({2, 784}, 1), kTrain), InvalidArgument);
}

TEST(BuildModel, BackwardBeforeForwardThrows) {
  for (const ModelSpec& spec : {mlp_spec(), cnn_spec(), gpt_spec()}) {
    auto m = build_model(spec, 1);
    EXPECT_THROW(m->backward(randn({2, 10}, 1)), Error) << spec.kind;
  }
  MaxPool2d pool(2, 2);
  EXPECT_THROW(pool.backward(randn({1, 1, 2, 2}, 1)), Error);
}

TEST(BuildModel, ForwardFlops) {
  auto mlp = build_model(mlp_spec(), 1);
  EXPECT_DOUBLE_EQ(mlp->forward_flops(32), 2.0 * 32 * (784 * 512 + 512 * 256 + 256 * 10));
  auto cnn = build_model(cnn_spec(), 1);
  const double conv = 2.0 * (16 * 28 * 28 * 25 + 32 * 14 * 14 * 16 * 25);
  EXPECT_DOUBLE_EQ(cnn->forward_flops(2), 2 * (conv + 2.0 * (32 * 7 * 7 * 128 + 128 * 10)));
  auto gpt = build_model(gpt_spec(), 1);
  const double C = 16, T = 8, V = 11;
  const double block = 2 * T * 12 * C * C + 4 * T * T * C;
  const double per_seq = 2 * block + 2 * T * C * V;
  EXPECT_DOUBLE_EQ(gpt->forward_flops(3), 3 * per_seq);
}

// A second step with the same shapes reuses every buffer and gives the same results.
TEST(SteadyState, SecondStepReusesBuffersWithSameResults) {
  for (const ModelSpec& spec : {mlp_spec(), cnn_spec(), gpt_spec()}) {
    auto m = build_model(spec, 2);
    const bool tokens = spec.kind == "gpt";
    Shape in_shape{3};
    in_shape.insert(in_shape.end(), spec.input_shape.begin(), spec.input_shape.end());
    const Tensor xin = tokens ? random_ids(in_shape, 11, 5) : randn(in_shape, 6);
    const Tensor labels = tokens ? random_ids({3, 8}, 11, 7) : random_ids({3}, 10, 7);
    CrossEntropyLoss loss;
    auto step = [&](const void** out_ptr, const void** dlogits_ptr) {
      const Tensor y = m->forward(xin, kTrain);
      const float l = loss.forward(y, labels);
      m->zero_grad();
      const Tensor d = loss.backward();
      m->backward(d);
      *out_ptr = y.raw();
      *dlogits_ptr = d.raw();
      return l;
    };
    const void *y1, *d1, *y2, *d2;
    const float l1 = step(&y1, &d1);
    const Tensor g1 = m->grads().flat().clone();
    const float l2 = step(&y2, &d2);
    EXPECT_EQ(l1, l2) << spec.kind;
    EXPECT_EQ(y1, y2) << spec.kind;
    EXPECT_EQ(d1, d2) << spec.kind;
    for (int64_t i = 0; i < g1.numel(); ++i)
      ASSERT_EQ(m->grads().flat().data<float>()[i], g1.data<float>()[i]) << spec.kind;
  }
}

}  // namespace
}  // namespace tessel::nn
