// The model builder: spec validation, add/finalize checks, wrong inputs at forward, a backward
// without its forward, and forward FLOPs.
#include <gtest/gtest.h>

#include "nn_testing.h"
#include "tessel/nn/layers.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/models.h"

namespace tessel::nn {
namespace {

using testing::batch_for;
using testing::cnn_spec;
using testing::gpt_spec;
using testing::materialized;
using testing::mlp_spec;
using testing::randn;
using testing::random_ids;
using testing::small_specs;

const Context kTrain{true, 77, 5, 0};

// ---- builder ----

void expect_invalid(const ModelSpec& s, const std::string& needle) {
  try {
    build_model(s);
    ADD_FAILURE() << "no error for " << needle;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(BuildModel, ValidatesTheSpec) {
  ModelSpec s = mlp_spec();
  s.hidden = {};
  expect_invalid(s, "model.hidden");
  s.hidden = {64, 0};
  expect_invalid(s, "model.hidden");
  s = mlp_spec();
  s.num_classes = 0;
  expect_invalid(s, "num_classes");
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
  s.channels = {8, 8, 8, 8, 8};  // the 5x5 kernel outgrows the image at stage 4
  expect_invalid(s, "is larger than the 3x3 image of cnn stage 4");
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

TEST(BuildModel, AddAndFinalizeAreChecked) {
  Model m;
  m.add("fc", std::make_unique<Linear>(2, 2));
  EXPECT_THROW(m.add("fc", std::make_unique<ReLU>()), Error);
  EXPECT_THROW(m.add("null", nullptr), Error);
  EXPECT_THROW(m.bind_values({0, 4}, Tensor::empty({4})), Error);  // before finalize
  EXPECT_THROW(m.forward(randn({1, 2}, 1), kTrain, nullptr), Error);
  m.finalize();
  EXPECT_THROW(m.finalize(), Error);
  EXPECT_THROW(m.add("late", std::make_unique<ReLU>()), Error);
}

TEST(BuildModel, RejectsWrongInputsAtForward) {
  auto gpt = materialized(gpt_spec(), 1);
  EXPECT_THROW(gpt->forward(randn({2, 8}, 1), kTrain, nullptr), InvalidArgument);  // not ids
  EXPECT_THROW(gpt->forward(random_ids({2, 9}, 11, 1), kTrain, nullptr), InvalidArgument);
  EXPECT_THROW(gpt->forward(random_ids({2, 8}, 12, 1), kTrain, nullptr), InvalidArgument);
  auto mlp = materialized(mlp_spec(), 1);
  EXPECT_THROW(mlp->forward(randn({2, 783}, 1), kTrain, nullptr), InvalidArgument);
  auto cnn = materialized(cnn_spec(), 1);
  EXPECT_THROW(cnn->forward(randn({2, 784}, 1), kTrain, nullptr), InvalidArgument);
}

TEST(BuildModel, BackwardWithoutItsForwardThrows) {
  for (const ModelSpec& spec : small_specs()) {
    auto m = materialized(spec, 1);
    const auto [x, labels] = batch_for(spec, 2, 1);
    Activations none;
    const Tensor dy = randn(m->forward(x, kTrain, nullptr).shape(), 1);
    EXPECT_THROW(m->backward(dy, none), Error) << name_of(spec.kind);
    // Caches of the right count but no forward kept in them (inference kept nothing).
    none.caches.resize(m->num_blocks());
    EXPECT_THROW(m->backward(dy, none), Error) << name_of(spec.kind);
    // A forward of the second half only: the first half's backward has nothing to read.
    Activations half;
    const size_t cut = m->num_blocks() / 2;
    const Tensor h = m->forward(x, kTrain, nullptr, {}, 0, cut);
    const Tensor y = m->forward(h, kTrain, &half, {}, cut);
    EXPECT_TRUE(m->backward(randn(y.shape(), 3), half, {}, cut).defined());
    EXPECT_THROW(m->backward(randn(h.shape(), 2), half, {}, 0, cut), Error) << name_of(spec.kind);
  }
  MaxPool2d pool(2, 2);
  Cache empty;
  EXPECT_THROW(pool.backward(randn({1, 1, 2, 2}, 1), empty), Error);
}

TEST(BuildModel, ForwardFlops) {
  auto mlp = build_model(mlp_spec());
  EXPECT_DOUBLE_EQ(mlp->forward_flops(32), 2.0 * 32 * (784 * 512 + 512 * 256 + 256 * 10));
  auto cnn = build_model(cnn_spec());
  const double conv = 2.0 * (16 * 28 * 28 * 25 + 32 * 14 * 14 * 16 * 25);
  EXPECT_DOUBLE_EQ(cnn->forward_flops(2), 2 * (conv + 2.0 * (32 * 7 * 7 * 128 + 128 * 10)));
  auto gpt = build_model(gpt_spec());
  const double C = 16, T = 8, V = 11;
  const double block = 2 * T * 12 * C * C + 4 * T * T * C;
  const double per_seq = 2 * block + 2 * T * C * V;
  EXPECT_DOUBLE_EQ(gpt->forward_flops(3), 3 * per_seq);
}

}  // namespace
}  // namespace tessel::nn
