// Model builders from a ModelSpec (the [model] section of a config): MLP, CNN, GPT (classic or
// modern), or a sequential stack of layers stated in the config (docs/models.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/data/task.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/model.h"
#include "tessel/nn/modern.h"
#include "tessel/nn/tensor_parallel.h"

namespace tessel::nn {

// One layer of a sequential model: its type ("conv", "linear", ...) and its numeric settings in
// the order given (e.g. {"channels", 16}, {"kernel", 5}); sequential.cc checks both.
struct LayerSpec {
  std::string type;
  std::vector<std::pair<std::string, double>> args;
};

enum class ModelKind { kMlp, kCnn, kGpt, kSequential };
enum class Activation { kRelu, kGelu };  // an mlp's hidden activation

struct ModelSpec {
  ModelKind kind = ModelKind::kMlp;
  // Filled from the dataset: per-sample input shape ([784], [1,28,28] or [T]) and classes/vocab.
  Shape input_shape;
  int64_t num_classes = 0;  // regression: 1 output; multilabel: the labels K (outputs)
  // data.task: the loss (make_loss): cross-entropy, mean squared error, or sigmoid + binary
  // cross-entropy per label
  data::Task task = data::Task::kClassification;

  // mlp: Linear(in, hidden[0]) act ... Linear(hidden[-1], classes)
  std::vector<int64_t> hidden = {512, 256};
  Activation activation = Activation::kRelu;
  float dropout = 0.0f;  // after each hidden activation (mlp, cnn fc)

  // cnn: [Conv(k, pad k/2) ReLU MaxPool(2)] (one fused block each) per channel count, then Flatten,
  // Linear(fc_hidden) ReLU, Linear(classes)
  std::vector<int64_t> channels = {16, 32};
  int64_t kernel = 5;
  int64_t fc_hidden = 128;

  // gpt: token + position embedding, `layers` pre-LN transformer blocks, final LayerNorm,
  // LM head tied to the token embedding. context = input_shape[0], vocab = num_classes.
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t embed = 64;
  // gpt variant (modern.h): layernorm | rmsnorm, learned | rotary, gelu | swiglu; also the
  // blocks of a sequential stack of text layers.
  Norm norm = Norm::kLayerNorm;
  Position position = Position::kLearned;
  Mlp mlp = Mlp::kGelu;

  // sequential: the layers in order, from the input to the output (model.stack).
  std::vector<LayerSpec> stack;
};

// A model that reads token ids and predicts the next token at every position: a gpt, or a
// sequential stack of text layers (embedding, transformer, lm_head).
bool reads_tokens(const ModelSpec& spec);
// A token model's width and number of transformer blocks: a gpt's model.embed and model.layers,
// a text stack's embedding channels and transformer entries.
struct TextSizes {
  int64_t embed = 0, layers = 0;
};
TextSizes text_sizes(const ModelSpec& spec);

// Builds and finalises the model: blocks and parameter layout, no parameter memory yet (see
// Model::materialize and the parameter stores of tessel/parallel). With a tensor-parallel
// group, this rank's part of it: an mlp's hidden layers cut column then row (an odd last one
// with the output layer as its row partner), a gpt's blocks, embedding and head as
// tensor_parallel.h describes; whole parameters are replicas on every rank but the group's 0.
std::unique_ptr<Model> build_model(const ModelSpec& spec, TensorParallel* tp = nullptr);
// The loss a model trains with: cross-entropy, vocabulary-parallel for a token model cut by tp; the
// mean squared error for regression; sigmoid + binary cross-entropy for multilabel.
std::unique_ptr<Loss> make_loss(const ModelSpec& spec, TensorParallel* tp = nullptr);

// sequential.cc: lays out spec.stack's blocks into m (build_model's part for kind sequential),
// checking each layer's settings and its input's shape; errors name the layer's index. With a
// tensor-parallel group, its linear layers are cut column then row as an mlp's (docs/models.md).
void build_sequential(const ModelSpec& spec, TensorParallel* tp, Model& m);
// model.stack as TOML (an array of inline tables), as `tessel config` prints it.
std::string stack_toml(const std::vector<LayerSpec>& stack);

}  // namespace tessel::nn

namespace tessel {
TESSEL_NAMES(nn::ModelKind, "mlp", "cnn", "gpt", "sequential");
TESSEL_NAMES(nn::Activation, "relu", "gelu");
}  // namespace tessel
