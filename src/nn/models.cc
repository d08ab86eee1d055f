// Model builders: validate the [model] section against the dataset's shapes, then lay out the
// blocks. Every problem is reported before any block is built.
#include "tessel/nn/models.h"

#include <unistd.h>

#include <algorithm>

#include "builders.h"
#include "tessel/nn/layers.h"
#include "tessel/nn/modern.h"

namespace tessel::nn {
namespace {

std::string list_str(const std::vector<int64_t>& v) { return excerpt(shape_str(v)); }

// a x b x ... for the size of a layer built from `key`; an overflow is an error naming it.
int64_t checked_size(std::initializer_list<int64_t> factors, const std::string& key,
                     const std::string& what) {
  int64_t n = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(n, f, &n))
      throw InvalidArgument(
          str("model: ", key, " makes ", what, " larger than fits in 64 bits; use smaller sizes"));
  return n;
}

// The keys that size a model of this kind, with their values, for messages.
std::string size_keys(const ModelSpec& spec) {
  if (spec.kind == ModelKind::kSequential)
    return str("model.stack = ", excerpt(stack_toml(spec.stack)));
  if (spec.kind == ModelKind::kMlp) return str("model.hidden = ", list_str(spec.hidden));
  if (spec.kind == ModelKind::kCnn)
    return str("model.channels = ", list_str(spec.channels), ", model.kernel = ", spec.kernel,
               ", model.fc_hidden = ", spec.fc_hidden);
  return str("model.layers = ", spec.layers, ", model.embed = ", spec.embed);
}

int64_t machine_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

// The whole model's f32 parameters must fit this machine's memory: tessel eval and checkpoint
// export hold them in one process.
void check_fits_memory(const ModelSpec& spec, const Model& m) {
  const double bytes = static_cast<double>(m.logical_numel()) * 4.0;  // all tp parts
  const int64_t memory = machine_memory_bytes();
  if (memory > 0 && bytes > static_cast<double>(memory))
    throw InvalidArgument(str("model: the ", name_of(spec.kind), " of ", size_keys(spec), " has ",
                              static_cast<double>(m.num_parameters()), " parameters (",
                              bytes / (1ull << 30), " GiB as f32), more than the ", memory >> 30,
                              " GiB of memory of this machine; lower ",
                              size_keys(spec).substr(0, size_keys(spec).find(" =")),
                              " (the whole model must fit one process for eval and export)"));
}

void require_positive(int64_t value, const char* key) {
  if (value <= 0)
    throw InvalidArgument(
        str("model: ", key, " must be positive, got ", value, "; fix it in the [model] section"));
}

void require_positive_list(const std::vector<int64_t>& v, const char* key) {
  if (v.empty())
    throw InvalidArgument(
        str("model: ", key, " must list at least one size, got []; e.g. ", key, " = [128]"));
  for (int64_t x : v)
    if (x <= 0)
      throw InvalidArgument(str("model: every entry of ", key, " must be positive, got ",
                                list_str(v), "; fix it in the [model] section"));
}

void check_common(const ModelSpec& spec) {
  if (spec.input_shape.empty())
    throw InvalidArgument("model: input_shape is empty, got []; it comes from the dataset");
  for (int64_t d : spec.input_shape)
    if (d <= 0)
      throw InvalidArgument(str("model: input_shape must be positive, got ",
                                shape_str(spec.input_shape), "; check the dataset"));
  if (spec.num_classes <= 0)
    throw InvalidArgument(str("model: num_classes must be positive, got ", spec.num_classes,
                              "; check the dataset's labels"));
  const GptVariant classic;
  if (!reads_tokens(spec) &&
      (spec.norm != classic.norm || spec.position != classic.position || spec.mlp != classic.mlp))
    throw InvalidArgument(
        str("model: model.norm, model.position and model.mlp choose the transformer parts of a "
            "gpt or of a stack of text layers, got model.kind = ",
            name_of(spec.kind), spec.kind == ModelKind::kSequential ? " with no text layers" : "",
            "; leave them at their defaults or use model.kind = gpt"));
  if (spec.kind != ModelKind::kSequential && !spec.stack.empty())
    throw InvalidArgument(
        str("model: model.stack lists the layers of a sequential model, got "
            "model.kind = ",
            name_of(spec.kind), "; set model.kind = \"sequential\" or remove model.stack"));
  if (!(spec.dropout >= 0.0f && spec.dropout < 1.0f))
    throw InvalidArgument(str("model: model.dropout must be in [0, 1), got ", spec.dropout,
                              "; use e.g. 0.1, or 0 to disable it"));
}

std::unique_ptr<Module> make_activation(Activation a) {
  if (a == Activation::kGelu) return std::make_unique<GELU>();
  return std::make_unique<ReLU>();
}

void build_mlp(const ModelSpec& spec, TensorParallel* tp, Model& m) {
  if (spec.input_shape.size() != 1)
    throw InvalidArgument(str("model: mlp needs a flat input [features], got input_shape ",
                              shape_str(spec.input_shape), "; set data.flatten = true"));
  require_positive_list(spec.hidden, "model.hidden");
  const int parts = tp ? tp->size() : 1;
  int64_t in = spec.input_shape[0];
  for (size_t i = 0; i < spec.hidden.size(); ++i) {
    const std::string n = std::to_string(i + 1);
    checked_size({in, spec.hidden[i]}, str("model.hidden = ", list_str(spec.hidden)),
                 str("fc", n, ".weight (", in, " x ", spec.hidden[i], ")"));
    const bool column = i % 2 == 0;  // hidden layers cut column, row, column, ...
    if (tp && column && spec.hidden[i] % parts != 0)
      throw InvalidArgument(str("model: model.hidden[", i, "] = ", spec.hidden[i],
                                " does not split over tp.size = ", parts,
                                " ranks; use a multiple of ", parts, " (e.g. ",
                                (spec.hidden[i] / parts + 1) * parts, ")"));
    m.add("fc" + n, std::make_unique<Linear>(in, spec.hidden[i], true,
                                             TpCut{tp, column ? Cut::kColumn : Cut::kRow}));
    m.add("act" + n, make_activation(spec.activation));
    const int64_t first_col = tp && column ? tp->rank() * (spec.hidden[i] / parts) : 0;
    if (spec.dropout > 0.0f) m.add("drop" + n, std::make_unique<Dropout>(spec.dropout, first_col));
    in = spec.hidden[i];
  }
  // The output layer is the row partner of an odd last hidden layer, else whole.
  const bool row = spec.hidden.size() % 2 == 1;
  m.add("fc" + std::to_string(spec.hidden.size() + 1),
        std::make_unique<Linear>(in, spec.num_classes, true,
                                 TpCut{tp, row ? Cut::kRow : Cut::kNone}));
}

void build_cnn(const ModelSpec& spec, Model& m) {
  if (spec.input_shape.size() != 3)
    throw InvalidArgument(str("model: cnn needs an image input [C, H, W], got input_shape ",
                              shape_str(spec.input_shape), "; set data.flatten = false"));
  require_positive_list(spec.channels, "model.channels");
  require_positive(spec.kernel, "model.kernel");
  require_positive(spec.fc_hidden, "model.fc_hidden");
  int64_t c = spec.input_shape[0], h = spec.input_shape[1], w = spec.input_shape[2];
  const int64_t k = spec.kernel, pad = k / 2;
  for (size_t i = 0; i < spec.channels.size(); ++i) {
    const std::string n = std::to_string(i + 1);
    if (k > h || k > w)
      throw InvalidArgument(str("model: model.kernel = ", k, " is larger than the ", h, "x", w,
                                " image of cnn stage ", n,
                                "; use a small odd kernel such as 3 or 5"));
    const int64_t oh = h + 2 * pad - k + 1, ow = w + 2 * pad - k + 1;
    checked_size({spec.channels[i], c, k, k}, str("model.channels = ", list_str(spec.channels)),
                 str("conv", n, ".weight"));
    if (oh < 2 || ow < 2)
      throw InvalidArgument(
          str("model: cnn stage ", n, " gets a ", h, "x", w, " image, too small for a ", k, "x", k,
              " conv and a 2x2 pool, got input_shape ", shape_str(spec.input_shape),
              "; use fewer model.channels entries or a smaller model.kernel"));
    m.add("conv" + n, std::make_unique<ConvReluPool>(c, spec.channels[i], k, pad, 2, h, w));
    c = spec.channels[i];
    h = (oh - 2) / 2 + 1;
    w = (ow - 2) / 2 + 1;
  }
  m.add("flatten", std::make_unique<Flatten>());
  checked_size({c, h, w, spec.fc_hidden}, str("model.fc_hidden = ", spec.fc_hidden), "fc1.weight");
  m.add("fc1", std::make_unique<Linear>(c * h * w, spec.fc_hidden));
  m.add("relu" + std::to_string(spec.channels.size() + 1), std::make_unique<ReLU>());
  if (spec.dropout > 0.0f) m.add("dropout", std::make_unique<Dropout>(spec.dropout));
  m.add("fc2", std::make_unique<Linear>(spec.fc_hidden, spec.num_classes));
}

void build_gpt(const ModelSpec& spec, TensorParallel* tp, Model& m) {
  check_token_input(spec, "gpt");
  require_positive(spec.layers, "model.layers");
  require_positive(spec.heads, "model.heads");
  require_positive(spec.embed, "model.embed");
  const TextKeys keys{"model.embed", "model.heads", "model.layers"};
  check_heads(spec, spec.embed, spec.heads, keys, tp);
  check_text_sizes(spec, spec.embed, spec.layers, keys, tp);
  const GptVariant variant = gpt_variant(spec);
  const int64_t T = spec.input_shape[0], V = spec.num_classes, C = spec.embed;
  auto embed = std::make_unique<Embedding>(V, T, C, tp, variant.position);
  Parameter* table = embed->token_table();
  m.add("embed", std::move(embed));
  for (int64_t l = 0; l < spec.layers; ++l)
    m.add("block" + std::to_string(l),
          std::make_unique<TransformerBlock>(C, spec.heads, T, spec.layers, tp, variant));
  m.add("head", std::make_unique<LmHead>(table, V, C, T, tp, variant.norm), {table});
}

}  // namespace

void check_token_input(const ModelSpec& spec, const std::string& what) {
  if (spec.input_shape.size() != 1)
    throw InvalidArgument(str("model: ", what, " needs token input [T], got input_shape ",
                              shape_str(spec.input_shape),
                              "; use a text or token dataset (data.kind = text or tokens)"));
}

void check_heads(const ModelSpec& spec, int64_t embed, int64_t heads, const TextKeys& keys,
                 TensorParallel* tp) {
  if (embed % heads != 0)
    throw InvalidArgument(str("model: ", keys.heads, " must divide ", keys.embed, ", got heads ",
                              heads, " and embed ", embed, "; pick heads among the divisors of ",
                              embed));
  if (spec.position == Position::kRotary && (embed / heads) % 2 != 0)
    throw InvalidArgument(
        str("model: model.position = rotary rotates pairs of a head's channels, "
            "but ",
            keys.embed, " / ", keys.heads, " = ", embed, " / ", heads, " = ", embed / heads,
            " is odd; pick heads so that each head has an even size"));
  if (tp && heads % tp->size() != 0)
    throw InvalidArgument(
        str("model: ", keys.heads, " = ", heads, " does not split over tp.size = ", tp->size(),
            " ranks; use a multiple of ", tp->size(), " heads or a tp.size dividing ", heads));
}

void check_text_sizes(const ModelSpec& spec, int64_t embed, int64_t layers, const TextKeys& keys,
                      TensorParallel* tp) {
  const int64_t T = spec.input_shape[0], V = spec.num_classes, C = embed;
  if (tp && spec.mlp == Mlp::kSwiglu && swiglu_hidden(C) % tp->size() != 0)
    throw InvalidArgument(str("model: model.mlp = swiglu has ", swiglu_hidden(C),
                              " hidden units for ", keys.embed, " = ", C,
                              ", which do not split over tp.size = ", tp->size(),
                              " ranks; use a tp.size dividing it"));
  checked_size({V, C}, str(keys.embed, " = ", C), "the token embedding");
  checked_size({T, C}, str(keys.embed, " = ", C, " with data.context = ", T),
               "the position embedding");
  checked_size({12, C, C, layers}, str(keys.embed, " = ", C, " with ", keys.layers, " = ", layers),
               "the transformer blocks");
  if (sequence_split(tp) && T % tp->size() != 0)
    throw InvalidArgument(str("model: tp.sequence_parallel splits the context of ", T,
                              " tokens over tp.size = ", tp->size(),
                              " ranks, which does not divide it; "
                              "use a context (data.context) that is a multiple of ",
                              tp->size()));
}

bool reads_tokens(const ModelSpec& spec) {
  if (spec.kind == ModelKind::kGpt) return true;
  return spec.kind == ModelKind::kSequential &&
         std::any_of(spec.stack.begin(), spec.stack.end(),
                     [](const LayerSpec& l) { return is_text_layer(l.type); });
}

TextSizes text_sizes(const ModelSpec& spec) {
  if (spec.kind == ModelKind::kGpt) return {spec.embed, spec.layers};
  TextSizes s;
  for (const LayerSpec& l : spec.stack) {
    if (l.type == "transformer") ++s.layers;
    for (const auto& [name, value] : l.args)
      if (l.type == "embedding" && name == "channels") s.embed = static_cast<int64_t>(value);
  }
  return s;
}

std::unique_ptr<Model> build_model(const ModelSpec& spec, TensorParallel* tp) {
  check_common(spec);
  if (tp && spec.kind == ModelKind::kCnn)
    throw InvalidArgument(
        "model: tensor parallelism (tp.size > 1) cuts mlp and gpt models, not a "
        "cnn; set tp.size = 1 or use data/pipeline parallelism");
  auto m = std::make_unique<Model>();
  switch (spec.kind) {
    case ModelKind::kMlp:
      build_mlp(spec, tp, *m);
      break;
    case ModelKind::kCnn:
      build_cnn(spec, *m);
      break;
    case ModelKind::kGpt:
      build_gpt(spec, tp, *m);
      break;
    case ModelKind::kSequential:
      build_sequential(spec, tp, *m);
      break;
  }
  m->finalize();
  if (tp && tp->rank() > 0)
    for (Parameter* p : m->parameters()) p->split.replica = !p->is_split();
  check_fits_memory(spec, *m);
  return m;
}

std::unique_ptr<Loss> make_loss(const ModelSpec& spec, TensorParallel* tp) {
  if (spec.task == data::Task::kRegression) return std::make_unique<MseLoss>();
  if (spec.task == data::Task::kMultilabel) return std::make_unique<BceWithLogitsLoss>();
  if (reads_tokens(spec) && tp != nullptr)
    return std::make_unique<VocabParallelCrossEntropy>(*tp, spec.num_classes);
  return std::make_unique<CrossEntropyLoss>();
}

}  // namespace tessel::nn
