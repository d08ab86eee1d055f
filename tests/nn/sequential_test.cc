// model.kind = sequential: a stack of conv-relu-pool layers is the cnn model (same parameters,
// same bits), a stack of text layers is the gpt (classic and modern), the layers' gradients
// match finite differences, and every mistake in a stack is refused at build time naming the
// layer and what to change.
#include <gtest/gtest.h>

#include "nn_testing.h"
#include "tessel/nn/models.h"

namespace tessel::nn {
namespace {

using testing::batch_for;
using testing::check_model_grads;
using testing::gpt_spec;
using testing::materialized;
using testing::random_ids;
using testing::same_bits;

const Context kTrain{true, 1234, 3, 40};

LayerSpec layer(std::string type, std::vector<std::pair<std::string, double>> args = {}) {
  return {std::move(type), std::move(args)};
}

ModelSpec sequential(Shape input, std::vector<LayerSpec> stack, int64_t classes = 4) {
  ModelSpec s;
  s.kind = ModelKind::kSequential;
  s.input_shape = std::move(input);
  s.num_classes = classes;
  s.stack = std::move(stack);
  return s;
}

// The cnn of model.kind = cnn, stated layer by layer.
std::vector<LayerSpec> cnn_stack(int64_t c1, int64_t c2, int64_t k, int64_t fc) {
  return {layer("conv", {{"channels", c1}, {"kernel", k}}),
          layer("relu"),
          layer("pool"),
          layer("conv", {{"channels", c2}, {"kernel", k}}),
          layer("relu"),
          layer("pool"),
          layer("flatten"),
          layer("linear", {{"out", fc}}),
          layer("relu"),
          layer("linear")};
}

TEST(Sequential, ConvReluPoolStackIsTheCnnBitForBit) {
  ModelSpec cnn;
  cnn.kind = ModelKind::kCnn;
  cnn.input_shape = {1, 12, 12};
  cnn.num_classes = 4;
  cnn.channels = {3, 5};
  cnn.kernel = 3;
  cnn.fc_hidden = 7;
  auto a = materialized(cnn, 5);
  auto b = materialized(sequential({1, 12, 12}, cnn_stack(3, 5, 3, 7)), 5);
  ASSERT_EQ(a->num_blocks(), b->num_blocks());  // conv, relu, pool fused into one block
  EXPECT_EQ(b->block(0).kind(), "conv2d_relu_maxpool");
  EXPECT_EQ(b->num_parameters(), a->num_parameters());
  EXPECT_TRUE(same_bits(a->values(), b->values()));
  const auto [x, y] = batch_for(cnn, 3, 8);
  EXPECT_TRUE(same_bits(a->forward(x, kTrain, nullptr), b->forward(x, kTrain, nullptr)));
}

TEST(Sequential, ImageLayersGradients) {
  // Unfused conv (stride 2), pool of stride 1, gelu, layernorm, dropout, a linear on rows.
  auto m = materialized(
      sequential({2, 8, 8}, {layer("conv", {{"channels", 3}, {"kernel", 3}, {"stride", 2}}),
                             layer("gelu"), layer("pool", {{"kernel", 2}, {"stride", 1}}),
                             layer("linear", {{"out", 5}}), layer("flatten"), layer("layernorm"),
                             layer("dropout", {{"p", 0.2}}), layer("linear")}),
      3);
  EXPECT_EQ(m->block(0).kind(), "conv2d");
  check_model_grads(*m, testing::randn({3, 2, 8, 8}, 34), random_ids({3}, 4, 35), kTrain,
                    {.eps = 1e-3, .rtol = 3e-2, .max_coords = 12, .skip_kinks = true});
}

TEST(Sequential, FlatLayersGradients) {
  auto m = materialized(sequential({6}, {layer("linear", {{"out", 5}}), layer("relu"),
                                         layer("layernorm"), layer("linear", {{"out", 4}})}),
                        2);
  check_model_grads(*m, testing::randn({5, 6}, 30), random_ids({5}, 4, 31), kTrain,
                    {.eps = 1e-3, .rtol = 3e-2, .skip_kinks = true});
}

// build_model's message for spec contains every one of `parts`.
void expect_refused(const ModelSpec& spec, std::vector<std::string> parts,
                    TensorParallel* tp = nullptr) {
  try {
    build_model(spec, tp);
    ADD_FAILURE() << "accepted; expected: " << parts[0];
  } catch (const InvalidArgument& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(Sequential, MistakesNameTheLayerAndTheFix) {
  expect_refused(sequential({4}, {layer("lstm")}), {"model.stack[0]", "'lstm'", "conv, dropout"});
  expect_refused(sequential({4}, {layer("linear", {{"outs", 3}})}),
                 {"model.stack[0] (linear)", "'outs'", "takes out"});
  expect_refused(sequential({4}, {layer("relu", {{"p", 1}})}), {"takes none"});
  expect_refused(sequential({784}, {layer("conv", {{"channels", 4}}), layer("linear")}),
                 {"model.stack[0] (conv)", "[C, H, W]", "[784]", "data.flatten = false"});
  expect_refused(sequential({1, 8, 8}, {layer("conv", {{"kernel", 3}})}),
                 {"model.stack[0] (conv)", "needs channels"});
  expect_refused(sequential({1, 8, 8}, {layer("conv", {{"channels", 2.5}})}),
                 {"channels to be an integer", "2.5"});
  expect_refused(sequential({4}, {layer("linear", {{"out", 3}}), layer("dropout", {{"p", 1.5}})}),
                 {"model.stack[1] (dropout)", "p in [0, 1)"});
  expect_refused(sequential({4}, {layer("linear", {{"out", 3}}), layer("relu")}),
                 {"ends with shape [3]", "needs [4]", "{type = \"linear\"}"});
  expect_refused(sequential({1, 4, 4}, {layer("pool", {{"kernel", 8}}), layer("linear")}),
                 {"model.stack[0] (pool)", "smaller pool kernel"});
  expect_refused(sequential({4}, {}), {"model.stack", "got none"});
  ModelSpec mlp;
  mlp.input_shape = {4};
  mlp.num_classes = 2;
  mlp.stack = {layer("linear")};
  expect_refused(mlp, {"model.kind = mlp", "sequential"});
}

// gpt_spec()'s gpt (context 8, vocabulary 11, 2 blocks of 2 heads, width 16) layer by layer.
std::vector<LayerSpec> text_stack(std::vector<int64_t> heads = {2, 2}) {
  std::vector<LayerSpec> stack = {layer("embedding", {{"channels", 16}})};
  for (int64_t h : heads) stack.push_back(layer("transformer", {{"heads", h}}));
  stack.push_back(layer("lm_head"));
  return stack;
}

TEST(Sequential, TextStackIsTheGptBitForBit) {
  for (bool modern : {false, true}) {
    ModelSpec gpt = gpt_spec();
    ModelSpec stack = sequential({8}, text_stack(), 11);
    if (modern)
      for (ModelSpec* s : {&gpt, &stack}) {
        s->norm = Norm::kRmsNorm;
        s->position = Position::kRotary;
        s->mlp = Mlp::kSwiglu;
      }
    EXPECT_TRUE(reads_tokens(stack));
    EXPECT_EQ(text_sizes(stack).embed, 16);
    EXPECT_EQ(text_sizes(stack).layers, 2);
    auto a = materialized(gpt, 5);
    auto b = materialized(stack, 5);
    ASSERT_EQ(a->num_blocks(), b->num_blocks());
    EXPECT_EQ(b->block(3).kind(), "lm_head");
    EXPECT_EQ(b->borrowed(3), (std::vector<Parameter*>{b->parameters()[0]}));  // the tied table
    EXPECT_EQ(b->num_parameters(), a->num_parameters());
    EXPECT_TRUE(same_bits(a->values(), b->values())) << "modern " << modern;
    const auto [x, y] = batch_for(gpt, 3, 8);
    EXPECT_TRUE(same_bits(a->forward(x, kTrain, nullptr), b->forward(x, kTrain, nullptr)));
  }
}

// Blocks of different head counts (which a gpt cannot state), through the tied head.
TEST(Sequential, TextLayersGradients) {
  auto m = materialized(sequential({6}, text_stack({2, 4}), 7), 3);
  check_model_grads(*m, random_ids({2, 6}, 7, 36), random_ids({2, 6}, 7, 37), kTrain,
                    {.max_coords = 8});
}

TEST(Sequential, TextMistakesNameTheLayerAndTheFix) {
  auto stack = [](std::vector<LayerSpec> layers, Shape input = {8}) {
    return sequential(std::move(input), std::move(layers), 11);
  };
  const LayerSpec embed = layer("embedding", {{"channels", 16}}),
                  block = layer("transformer", {{"heads", 2}}), head = layer("lm_head");
  expect_refused(stack({block, head}),
                 {"model.stack[0] (transformer)", "[T, C]", "[8]", "embedding"});
  expect_refused(stack({embed, embed, head}), {"model.stack[1] (embedding)", "first layer"});
  expect_refused(stack({embed, head}, {1, 8, 8}),
                 {"model.stack[0] (embedding)", "token input [T]", "[1, 8, 8]", "data.kind"});
  expect_refused(stack({layer("embedding")}), {"model.stack[0] (embedding)", "needs channels"});
  expect_refused(stack({embed, layer("transformer", {{"heads", 3}}), head}),
                 {"model.stack[1] (transformer) heads must divide model.stack[0] (embedding) "
                  "channels",
                  "heads 3"});
  expect_refused(stack({embed, head, block}), {"model.stack[1] (lm_head)", "last layer"});
  expect_refused(stack({head}), {"model.stack[0] (lm_head)", "token table", "embedding"});
  expect_refused(stack({embed, block}), {"ends with transformer", "{type = \"lm_head\"}"});
  expect_refused(stack({embed, layer("linear", {{"out", 16}}), head}),
                 {"model.stack[1] (linear) is no text layer", "model.stack[0] (embedding)"});
  expect_refused(
      stack({layer("conv", {{"channels", 2}}), layer("flatten"), block, head}, {1, 8, 8}),
      {"model.stack[0] (conv) is no text layer", "model.stack[2] (transformer)"});
  // The gpt variant's keys choose a text stack's parts, not an image stack's.
  ModelSpec image = sequential({4}, {layer("linear")});
  image.norm = Norm::kRmsNorm;
  expect_refused(image, {"model.norm", "stack of text layers"});
  ModelSpec rotary = stack({embed, layer("transformer", {{"heads", 16}}), head});
  rotary.position = Position::kRotary;  // heads of one channel: no pair to rotate
  expect_refused(rotary, {"model.position = rotary", "model.stack[1] (transformer) heads", "odd"});
}

}  // namespace
}  // namespace tessel::nn
