// kind = sequential: a model stated layer by layer in the config (model.stack). Each layer's
// settings are checked by name and value, and each layer's input shape is followed from the
// dataset's sample shape to the loss, so that every mistake is reported at start naming the
// layer (model.stack[i], 0-based) and what to change. A stack of text layers (embedding,
// transformer, lm_head) is a gpt stated layer by layer: the same blocks in the same order.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include "builders.h"
#include "tessel/nn/layers.h"
#include "tessel/nn/models.h"

namespace tessel::nn {
namespace {

// The settings each layer type takes (all numbers) and their meaning, for messages.
const std::map<std::string, std::vector<std::string>>& layer_types() {
  static const std::map<std::string, std::vector<std::string>> types = {
      {"linear", {"out"}},
      {"conv", {"channels", "kernel", "stride", "pad"}},
      {"pool", {"kernel", "stride"}},
      {"relu", {}},
      {"gelu", {}},
      {"dropout", {"p"}},
      {"flatten", {}},
      {"layernorm", {}},
      {"embedding", {"channels"}},
      {"transformer", {"heads"}},
      {"lm_head", {}}};
  return types;
}

std::string type_list() {
  std::string s;
  for (const auto& [name, args] : layer_types()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

// One layer's settings, read with defaults; `where` names it in messages.
class Layer {
 public:
  Layer(const LayerSpec& spec, size_t index) : spec_(spec) {
    where_ = str("model.stack[", index, "] (", spec.type, ")");
    const auto type = layer_types().find(spec.type);
    if (type == layer_types().end())
      throw InvalidArgument(str("model: model.stack[", index, "] has type '", excerpt(spec.type),
                                "', which is no layer tessel has; use one of ", type_list()));
    for (const auto& [name, _] : spec.args) {
      const std::vector<std::string>& known = type->second;
      if (std::find(known.begin(), known.end(), name) == known.end())
        throw InvalidArgument(str("model: ", where_, " has no setting '", excerpt(name), "'; ",
                                  known.empty() ? str("a ", spec.type, " takes none")
                                                : str("a ", spec.type, " takes ", join(known))));
    }
  }

  const std::string& where() const { return where_; }
  // An integer setting in [min, max], or `fallback` when absent (required when fallback is 0).
  // The bounds keep every product of sizes the model forms inside int64.
  int64_t size(const std::string& name, int64_t fallback, int64_t min = 1,
               int64_t max = int64_t{1} << 20) const {
    const double* v = find(name);
    if (v == nullptr && fallback == 0)
      throw InvalidArgument(str("model: ", where_, " needs ", name, ", e.g. {type = \"", spec_.type,
                                "\", ", name, " = 16}"));
    if (v == nullptr) return fallback;
    if (!(*v >= static_cast<double>(min) && *v <= static_cast<double>(max) && std::floor(*v) == *v))
      throw InvalidArgument(str("model: ", where_, " needs ", name, " to be an integer in [", min,
                                ", ", max, "], got ", *v));
    return static_cast<int64_t>(*v);
  }
  double number(const std::string& name) const {
    const double* v = find(name);
    if (v == nullptr)
      throw InvalidArgument(
          str("model: ", where_, " needs ", name, ", e.g. {type = \"", spec_.type, "\", p = 0.1}"));
    return *v;
  }

 private:
  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  }
  const double* find(const std::string& name) const {
    for (const auto& [n, v] : spec_.args)
      if (n == name) return &v;
    return nullptr;
  }

  const LayerSpec& spec_;
  std::string where_;
};

[[noreturn]] void wrong_input(const Layer& l, const char* needs, const Shape& got,
                              const char* fix) {
  throw InvalidArgument(
      str("model: ", l.where(), " needs ", needs, ", got input shape ", shape_str(got), "; ", fix));
}

// The image layers: conv, pool, and conv -> relu -> pool fused (ConvReluPool: the same
// parameters and results, the unpooled output never written) when the stack allows it.
// Returns the layers consumed.
size_t add_image_layer(const ModelSpec& spec, size_t i, Shape& shape, Model& m) {
  const Layer l(spec.stack[i], i);
  if (shape.size() != 3)
    wrong_input(l, "an image [C, H, W]", shape,
                "set data.flatten = false, and put conv and pool layers before flatten");
  const int64_t c = shape[0], h = shape[1], w = shape[2];
  const std::string name = str(spec.stack[i].type, i);
  if (spec.stack[i].type == "pool") {
    const int64_t k = l.size("kernel", 2, 1, 1024), stride = l.size("stride", k, 1, 1024);
    if (k > h || k > w)
      wrong_input(l, str("an image of at least ", k, "x", k).c_str(), shape,
                  "use a smaller pool kernel or fewer pooling layers");
    m.add(name, std::make_unique<MaxPool2d>(k, stride));
    shape = {c, (h - k) / stride + 1, (w - k) / stride + 1};
    return 1;
  }
  const int64_t oc = l.size("channels", 0, 1, 1 << 16), k = l.size("kernel", 3, 1, 1024),
                stride = l.size("stride", 1, 1, 1024), pad = l.size("pad", k / 2, 0, 1024);
  if (k > h + 2 * pad || k > w + 2 * pad)
    wrong_input(l, str("an image of at least ", k, "x", k, " with its padding").c_str(), shape,
                "use a smaller kernel or fewer pooling layers before it");
  const int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  if (i + 2 < spec.stack.size() && stride == 1 && spec.stack[i + 1].type == "relu" &&
      spec.stack[i + 2].type == "pool") {
    const Layer pool(spec.stack[i + 2], i + 2);
    const int64_t pk = pool.size("kernel", 2, 1, 1024), ps = pool.size("stride", pk, 1, 1024);
    if (ps == pk && pk <= oh && pk <= ow) {
      m.add(name, std::make_unique<ConvReluPool>(c, oc, k, pad, pk, h, w));
      shape = {oc, (oh - pk) / pk + 1, (ow - pk) / pk + 1};
      return 3;
    }
  }
  m.add(name, std::make_unique<Conv2d>(c, oc, k, stride, pad, h, w));
  shape = {oc, oh, ow};
  return 1;
}

// Tensor parallelism over the linear layers, as the mlp's: a linear layer that is not the last
// one opens a column cut and the next linear layer closes it as its row partner; the last one
// is whole unless it closes a cut. Between the two each rank holds a slice of the features.
struct TpCuts {
  TensorParallel* tp = nullptr;
  size_t last_linear = 0;
  size_t open = SIZE_MAX;  // the column-cut layer awaiting its row partner
  int64_t first_col = 0;   // this rank's first feature inside an open cut
};

// A linear layer, cut by tp as TpCuts says.
void add_linear(const ModelSpec& spec, size_t i, const Layer& l, Shape& shape, Model& m,
                TpCuts& tp) {
  const bool last = i + 1 == spec.stack.size();
  const int64_t out = l.size("out", last ? spec.num_classes : 0);
  if (shape.back() > (int64_t{1} << 30))
    wrong_input(l, "at most 2^30 features", shape, "add a pool layer before it");
  Cut cut = Cut::kNone;
  if (tp.tp && tp.open != SIZE_MAX) {
    cut = Cut::kRow;
    tp.open = SIZE_MAX;
  } else if (tp.tp && i != tp.last_linear) {
    const int parts = tp.tp->size();
    if (out % parts != 0)
      throw InvalidArgument(str("model: ", l.where(), " has out = ", out,
                                ", which does not split over tp.size = ", parts,
                                " ranks; use a multiple of ", parts));
    cut = Cut::kColumn;
    tp.open = i;
    tp.first_col = tp.tp->rank() * (out / parts);
  }
  auto linear = std::make_unique<Linear>(shape.back(), out, true, TpCut{tp.tp, cut});
  linear->set_rows_per_sample(shape_numel(shape) / shape.back());
  m.add(str("linear", i), std::move(linear));
  shape.back() = out;
}

// Every other layer; returns the layers consumed (1).
size_t add_layer(const ModelSpec& spec, size_t i, Shape& shape, Model& m, TpCuts& tp) {
  const LayerSpec& s = spec.stack[i];
  if (tp.tp && s.type != "linear" && s.type != "relu" && s.type != "gelu" && s.type != "dropout" &&
      (tp.open != SIZE_MAX || s.type == "conv" || s.type == "pool"))
    throw InvalidArgument(
        str("model: tensor parallelism (tp.size > 1) cuts a sequential model's linear layers, with "
            "only relu, gelu and dropout between a column-cut one and the next, got model.stack[",
            i, "] (", s.type, ")",
            tp.open != SIZE_MAX ? str(" after the column-cut model.stack[", tp.open, "]") : "",
            "; move it, or set tp.size = 1 and use data, ZeRO or pipeline parallelism"));
  if (s.type == "conv" || s.type == "pool") return add_image_layer(spec, i, shape, m);
  const Layer l(s, i);
  const std::string name = str(s.type, i);
  if (s.type == "linear") {
    add_linear(spec, i, l, shape, m, tp);
  } else if (s.type == "relu") {
    m.add(name, std::make_unique<ReLU>());
  } else if (s.type == "gelu") {
    m.add(name, std::make_unique<GELU>());
  } else if (s.type == "dropout") {
    const double p = l.number("p");
    if (!(p >= 0 && p < 1))
      throw InvalidArgument(str("model: ", l.where(), " needs p in [0, 1), got ", p));
    m.add(name,
          std::make_unique<Dropout>(static_cast<float>(p), tp.open != SIZE_MAX ? tp.first_col : 0));
  } else if (s.type == "flatten") {
    m.add(name, std::make_unique<Flatten>());
    shape = {shape_numel(shape)};
  } else {  // layernorm
    m.add(name, std::make_unique<LayerNorm>(shape.back()));
  }
  return 1;
}

// model.stack[i], an embedding: token ids [T] -> [T, C]; returns its token table.
Parameter* add_embedding(const ModelSpec& spec, const Layer& l, size_t i, TensorParallel* tp,
                         TextKeys& keys, Shape& shape, Model& m) {
  if (i != 0)
    throw InvalidArgument(str("model: ", l.where(),
                              " must be the first layer: it reads the token ids; move it to "
                              "model.stack[0]"));
  if (shape.size() != 1)
    wrong_input(l, "token input [T]", shape,
                "use a text or token dataset (data.kind = text or tokens)");
  const int64_t C = l.size("channels", 0, 1, 1 << 16);
  keys.embed = str(l.where(), " channels");
  check_text_sizes(spec, C, text_sizes(spec).layers, keys, tp);
  auto embed =
      std::make_unique<Embedding>(spec.num_classes, shape[0], C, tp, gpt_variant(spec).position);
  Parameter* table = embed->token_table();
  m.add(str("embedding", i), std::move(embed));
  shape = {shape[0], C};
  return table;
}

// A stack of text layers: embedding first (token ids [T] -> [T, C]), transformer blocks
// ([T, C] -> [T, C]), lm_head last ([T, C] -> [T, vocab], tied to the embedding's table): the
// blocks of a gpt, built in its order so that the same seed gives the same parameters. The
// number of transformer entries plays model.layers' part in the blocks' initial scale.
void build_text_stack(const ModelSpec& spec, TensorParallel* tp, Model& m) {
  const std::vector<LayerSpec>& stack = spec.stack;
  const auto text = std::find_if(stack.begin(), stack.end(),
                                 [](const LayerSpec& l) { return is_text_layer(l.type); });
  const std::string text_where = str("model.stack[", text - stack.begin(), "] (", text->type, ")");
  const TextSizes sizes = text_sizes(spec);
  const GptVariant variant = gpt_variant(spec);
  Shape shape = spec.input_shape;
  Parameter* table = nullptr;
  TextKeys keys{"", "", "the transformer layers of model.stack"};
  for (size_t i = 0; i < stack.size(); ++i) {
    const Layer l(stack[i], i);
    const std::string& type = stack[i].type;
    if (!is_text_layer(type))
      throw InvalidArgument(str("model: ", l.where(), " is no text layer, but ", text_where,
                                " makes this a stack of text layers, which holds embedding, "
                                "transformer and lm_head layers only; state image and feature "
                                "models without them"));
    const std::string name = str(type, i);
    if (type == "embedding") {
      table = add_embedding(spec, l, i, tp, keys, shape, m);
    } else if (type == "transformer") {
      if (table == nullptr)
        wrong_input(l, "activations [T, C]", shape,
                    "put {type = \"embedding\", channels = 64} first");
      const int64_t heads = l.size("heads", 0, 1, 1 << 16);
      keys.heads = str(l.where(), " heads");
      check_heads(spec, shape[1], heads, keys, tp);
      m.add(name, std::make_unique<TransformerBlock>(shape[1], heads, shape[0], sizes.layers, tp,
                                                     variant));
    } else {  // lm_head
      if (table == nullptr)
        throw InvalidArgument(str("model: ", l.where(),
                                  " ties its output to an embedding's token table, but none comes "
                                  "before it; put {type = \"embedding\", channels = 64} first"));
      if (i + 1 != stack.size())
        throw InvalidArgument(str("model: ", l.where(), " must be the last layer, got ",
                                  stack.size() - i - 1, " after it; move it to the end"));
      m.add(name,
            std::make_unique<LmHead>(table, spec.num_classes, shape[1], shape[0], tp, variant.norm),
            {table});
      return;
    }
  }
  throw InvalidArgument(str("model: model.stack ends with ", stack.back().type,
                            ", but a stack of text layers ends with {type = \"lm_head\"} (the "
                            "next token's scores, tied to the embedding's token table)"));
}

std::string number_text(double v) {
  char buf[64];
  std::string s(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
  return s;
}

}  // namespace

bool is_text_layer(const std::string& type) {
  return type == "embedding" || type == "transformer" || type == "lm_head";
}

void build_sequential(const ModelSpec& spec, TensorParallel* tp, Model& m) {
  if (spec.stack.empty())
    throw InvalidArgument(
        "model: model.kind = sequential needs its layers in model.stack, got none; e.g. "
        "stack = [{type = \"flatten\"}, {type = \"linear\", out = 128}, {type = \"relu\"}, "
        "{type = \"linear\"}]");
  if (reads_tokens(spec)) return build_text_stack(spec, tp, m);
  TpCuts cuts{tp};
  for (size_t i = 0; i < spec.stack.size(); ++i)
    if (spec.stack[i].type == "linear") cuts.last_linear = i;
  Shape shape = spec.input_shape;
  for (size_t i = 0; i < spec.stack.size();) i += add_layer(spec, i, shape, m, cuts);
  if (shape != Shape{spec.num_classes})
    throw InvalidArgument(str("model: model.stack ends with shape ", shape_str(shape),
                              ", but the loss needs [", spec.num_classes,
                              "] (the dataset's classes or targets); end with flatten (for "
                              "images) and {type = \"linear\"}, whose out defaults to that"));
}

std::string stack_toml(const std::vector<LayerSpec>& stack) {
  std::string s = "[";
  for (size_t i = 0; i < stack.size(); ++i) {
    s += str(i ? ", " : "", "{type = \"", stack[i].type, "\"");
    for (const auto& [name, value] : stack[i].args) s += str(", ", name, " = ", number_text(value));
    s += "}";
  }
  return s + "]";
}

}  // namespace tessel::nn
