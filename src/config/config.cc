#include "tessel/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "config_bounds.h"
#include "config_suggest.h"
#include "tessel/core/error.h"
#include "tessel/core/suggest.h"

namespace tessel::train {
namespace {

// Upper bounds shared by keys of one kind. Every numeric key has a range (its registry entry),
// chosen so that no product the trainer, the data or the model forms from config values can
// leave int64: steps (<= 2^40) x ranks (<= 2^20), batch (<= 2^24) x accumulate (<= 2^16),
// memory_limit_mb (<= 2^30) x 2^20 bytes, model widths (<= 2^20) multiplied pairwise, data
// sizes (<= 2^30). Times become integer clock ticks: <= 10^6 s. (train.epochs x batches per
// epoch, a dataset size, is checked where the trainer forms it.)
constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxSteps = int64_t{1} << 40;
constexpr int64_t kMaxRank = int64_t{1} << 20;
constexpr double kMaxSeconds = 1e6;

// The values a numeric key accepts: N is int64_t for integer keys, double for float keys (which
// may leave an end open). NaN is in no range.
template <typename N>
struct Range {
  N lo, hi;
  bool lo_open = false, hi_open = false;

  bool contains(N x) const { return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi); }
  std::string text() const {
    auto num = [](N x) {
      if constexpr (std::is_integral_v<N>) {
        return std::to_string(x);
      } else {
        char buf[400];  // fixed: 1000000 rather than 1e+06
        return std::string(buf,
                           std::to_chars(buf, buf + sizeof buf, x, std::chars_format::fixed).ptr);
      }
    };
    return str(lo_open ? "(" : "[", num(lo), ", ", num(hi), hi_open ? ")" : "]");
  }
};

// A key's value type: Number<T> is what its range is written in.
template <typename T>
struct NumberOf {
  using type = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
};
template <>
struct NumberOf<std::vector<int64_t>> {
  using type = int64_t;
};
template <typename T>
using Number = typename NumberOf<T>::type;
template <typename T>
constexpr bool kIsNumeric = (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) ||
                            std::is_same_v<T, std::vector<int64_t>>;

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, bool>) return "boolean";
  if constexpr (std::is_integral_v<T>) return "integer";
  if constexpr (std::is_floating_point_v<T>) return "number";
  if constexpr (std::is_same_v<T, std::string> || std::is_enum_v<T>) return "string";
  return "integer array";
}

// When a key applies (the resolved config lists only those): while the choice key `key` holds
// one of `values`; with no key, always.
struct Applies {
  std::string key;
  std::vector<std::string> values;
};

// One config key: where it lives, how to read it from TOML and how to print it back.
struct Key {
  KeyInfo info;
  std::function<void(Config&, const toml::node&)> set;
  std::function<std::string(const Config&)> get;
  Applies applies = {};

  Key when(std::string key, std::vector<std::string> values) && {
    applies = {std::move(key), std::move(values)};
    return std::move(*this);
  }
};

std::string type_error(const std::string& path, const char* want, const toml::node& v) {
  std::ostringstream os;
  v.visit([&os](auto&& x) { os << x; });
  return str("config: ", path, " must be ", want, ", got ", excerpt(os.str()));
}

// "a, b or c".
std::string either(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i)
    s += (i == 0 ? "" : i + 1 == v.size() ? " or " : ", ") + v[i];
  return s;
}

// "a, b, c": the values a choice key lists (docs/config.md's range column).
std::string comma_list(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The message for string s of a key that takes one of `values`, with the nearest one.
std::string not_one_of(const std::string& path, const std::vector<std::string>& values,
                       const std::string& s) {
  const std::string guess = nearest(s, values);
  return str("config: ", path, " must be ", either(values), ", got '", excerpt(s), "'",
             guess.empty() ? "" : str("; did you mean '", guess, "'?"));
}

template <typename E>
std::vector<std::string> names() {
  return {std::begin(Names<E>::values), std::end(Names<E>::values)};
}

// A number of key `path` (an entry of it for an array key) checked against its range, then as
// the key's type T stores it (a float key's 1e-50 would be 0 as a float).
template <typename T, typename N>
T in_range(const std::string& path, N x, const Range<N>& range, const char* what) {
  if (!range.contains(x) || !range.contains(static_cast<N>(static_cast<T>(x))))
    throw InvalidArgument(str("config: ", what, path, " must be in ", range.text(), ", got ", x,
                              "; docs/config.md gives each key's range"));
  return static_cast<T>(x);
}

template <typename T>
T read_value(const std::string& path, const toml::node& v, const Range<Number<T>>& range) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) throw InvalidArgument(type_error(path, "true or false", v));
    return *v.value<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_integer()) throw InvalidArgument(type_error(path, "an integer", v));
    return in_range<T>(path, *v.value<int64_t>(), range, "");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) throw InvalidArgument(type_error(path, "a number", v));
    return in_range<T>(path, *v.value<double>(), range, "");
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) throw InvalidArgument(type_error(path, "a string", v));
    return *v.value<std::string>();
  } else if constexpr (std::is_enum_v<T>) {  // a choice key: one of Names<T>
    const std::string s = read_value<std::string>(path, v, {0, 0});
    if (const std::optional<T> e = value_of<T>(s)) return *e;
    throw InvalidArgument(not_one_of(path, names<T>(), s));
  } else {
    static_assert(std::is_same_v<T, std::vector<int64_t>>);
    const toml::array* a = v.as_array();
    if (a == nullptr) throw InvalidArgument(type_error(path, "an array of integers", v));
    T out;
    for (const toml::node& e : *a) {
      if (!e.is_integer()) throw InvalidArgument(type_error(path, "an array of integers", v));
      out.push_back(in_range<int64_t>(path, *e.value<int64_t>(), range, "every entry of "));
    }
    return out;
  }
}

template <typename T>
std::string write_value(const T& x) {
  if constexpr (std::is_same_v<T, bool>) {
    return x ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(x);
  } else if constexpr (std::is_floating_point_v<T>) {
    // The shortest text that reads back as the same T: a float key set to 0.1 prints 0.1.
    char buf[64];
    std::string s(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it a TOML float
    return s;
  } else if constexpr (std::is_enum_v<T>) {
    return write_value(std::string(name_of(x)));
  } else if constexpr (std::is_same_v<T, std::string>) {
    std::ostringstream os;
    os << toml::value<std::string>(x);
    return os.str();
  } else {
    std::string s = "[";
    for (size_t i = 0; i < x.size(); ++i) s += (i ? ", " : "") + std::to_string(x[i]);
    return s + "]";
  }
}

template <typename Access>
using Member = std::remove_reference_t<decltype(std::declval<Access>()(std::declval<Config&>()))>;

// A numeric key stored by `access`, with the range of values it accepts.
template <typename Access>
Key make_key(std::string path, std::string doc, Access access,
             Range<Number<Member<Access>>> range) {
  using T = Member<Access>;
  static_assert(kIsNumeric<T>, "only a numeric key has a range");
  using E = std::conditional_t<std::is_same_v<T, std::vector<int64_t>>, int64_t, T>;
  bool fits = false;  // the range fits the member, so in_range's cast is defined
  if constexpr (std::is_integral_v<E>)
    fits = std::in_range<E>(range.lo) && std::in_range<E>(range.hi);
  else
    fits = -std::numeric_limits<E>::max() <= range.lo && range.hi <= std::numeric_limits<E>::max();
  TESSEL_CHECK(fits, "config: the range of ", path, " does not fit its type");
  KeyInfo info{path, std::move(doc), type_name<T>(), range.text()};
  return Key{std::move(info),
             [path, access, range](Config& c, const toml::node& v) {
               access(c) = read_value<T>(path, v, range);
             },
             [access](const Config& c) { return write_value(access(const_cast<Config&>(c))); }};
}

// A string or boolean key stored by `access`.
template <typename Access>
Key make_key(std::string path, std::string doc, Access access) {
  using T = Member<Access>;
  static_assert(!kIsNumeric<T>, "a numeric key needs a range");
  std::string listed;  // a choice key's values
  if constexpr (std::is_enum_v<T>) listed = comma_list(names<T>());
  KeyInfo info{path, std::move(doc), type_name<T>(), listed};
  return Key{std::move(info),
             [path, access](Config& c, const toml::node& v) {
               access(c) = read_value<T>(path, v, {0, 0});
             },
             [access](const Config& c) { return write_value(access(const_cast<Config&>(c))); }};
}

// model.stack: an array of tables, one layer each: a string `type` and numbers for its settings.
// What the types and settings mean is the model's (nn/sequential.cc), checked when it is built.
std::vector<nn::LayerSpec> read_stack(const std::string& path, const toml::node& v) {
  const toml::array* a = v.as_array();
  if (a == nullptr) throw InvalidArgument(type_error(path, "an array of tables", v));
  std::vector<nn::LayerSpec> out;
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string where = str(path, "[", i, "]");
    const toml::table* t = (*a)[i].as_table();
    if (t == nullptr)
      throw InvalidArgument(type_error(where, "a table such as {type = \"relu\"}", (*a)[i]));
    nn::LayerSpec layer;
    for (auto&& [key, value] : *t) {
      const std::string name(key.str());
      if (name == "type") {
        if (!value.is_string())
          throw InvalidArgument(type_error(where + ".type", "a string", value));
        layer.type = *value.value<std::string>();
      } else {
        if (!value.is_number())
          throw InvalidArgument(type_error(where + "." + name, "a number", value));
        layer.args.emplace_back(name, *value.value<double>());
      }
    }
    if (layer.type.empty())
      throw InvalidArgument(
          str("config: ", where, " has no type; e.g. {type = \"linear\", out = 128}"));
    out.push_back(std::move(layer));
  }
  return out;
}

Key stack_key(std::string doc) {
  const std::string path = "model.stack";
  KeyInfo info{path, std::move(doc), "array of tables", ""};
  return Key{std::move(info),
             [path](Config& c, const toml::node& v) { c.model.stack = read_stack(path, v); },
             [](const Config& c) { return nn::stack_toml(c.model.stack); }};
}

#define TESSEL_KEY(path, member, doc, ...) \
  make_key(                                \
      path, doc, [](Config & c) -> auto& { return c.member; } __VA_OPT__(, ) __VA_ARGS__)

const std::vector<Key>& registry() {
  // One line per key (a table to read down): clang-format leaves it as written.
  // clang-format off
  static const std::vector<Key> keys = {
      TESSEL_KEY("name", name, "run name; default: the config file name without .toml"),
      TESSEL_KEY("seed", seed, "seed of parameter init, data shuffle and dropout", {0, kMaxInt}),
      TESSEL_KEY("layout", layout, "manual (the layout keys as written) or auto: tessel train plans the layout for its ranks (tessel plan) and trains the fastest one predicted to fit runtime.memory_limit_mb, setting tp.size, pp.stages, pp.microbatches, zero.stage, ps.servers and train.recompute (train.precision stays); also --layout auto (docs/planning.md)"),
      TESSEL_KEY("model.kind", model.kind, "model family: a multi-layer perceptron, a convolutional network, a GPT, or a sequential stack of layers stated in model.stack (docs/models.md)"),
      TESSEL_KEY("model.hidden", model.hidden, "mlp: hidden layer widths", {1, 1 << 20}).when("model.kind", {"mlp"}),
      TESSEL_KEY("model.activation", model.activation, "mlp: the hidden layers' activation").when("model.kind", {"mlp"}),
      TESSEL_KEY("model.dropout", model.dropout, "mlp/cnn: dropout after hidden activations", {.lo = 0, .hi = 1, .hi_open = true}).when("model.kind", {"mlp", "cnn"}),
      TESSEL_KEY("model.channels", model.channels, "cnn: output channels of each conv block", {1, 1 << 16}).when("model.kind", {"cnn"}),
      TESSEL_KEY("model.kernel", model.kernel, "cnn: convolution kernel size (padding k/2)", {1, 1024}).when("model.kind", {"cnn"}),
      TESSEL_KEY("model.fc_hidden", model.fc_hidden, "cnn: width of the hidden fully connected layer", {1, 1 << 20}).when("model.kind", {"cnn"}),
      TESSEL_KEY("model.layers", model.layers, "gpt: transformer blocks", {1, 1024}).when("model.kind", {"gpt"}),
      TESSEL_KEY("model.heads", model.heads, "gpt: attention heads (must divide embed)", {1, 1 << 16}).when("model.kind", {"gpt"}),
      TESSEL_KEY("model.embed", model.embed, "gpt: embedding width", {1, 1 << 16}).when("model.kind", {"gpt"}),
      TESSEL_KEY("model.norm", model.norm, "gpt, text stack: the blocks' and the head's normalisation: layernorm (GPT-2) or rmsnorm (weight only, no centring)").when("model.kind", {"gpt", "sequential"}),
      TESSEL_KEY("model.position", model.position, "gpt, text stack: positions as a learned table added to the embedding (GPT-2) or rotary (queries and keys rotated by position inside attention, no table)").when("model.kind", {"gpt", "sequential"}),
      TESSEL_KEY("model.mlp", model.mlp, "gpt, text stack: the blocks' MLP: gelu (C -> 4C -> C) or swiglu (silu(x W1) * x W3 -> W2, hidden 8C/3 rounded to a multiple of 8: about the same parameters)").when("model.kind", {"gpt", "sequential"}),
      stack_key("sequential: the layers in order, an array of tables such as [{type = \"conv\", channels = 16, kernel = 5}, {type = \"relu\"}, {type = \"pool\"}]; types linear, conv, pool, relu, gelu, dropout, flatten, layernorm, or the text layers embedding, transformer, lm_head (docs/models.md)").when("model.kind", {"sequential"}),
      TESSEL_KEY("data.kind", data.kind, "the data: an IDX folder (fashion_mnist, mnist_idx), a text file (text), a token file (tokens), generated (spiral, synthetic) or a table of features and targets (npy: .npy or .npz, csv; docs/data.md)"),
      TESSEL_KEY("data.path", data.path, "IDX folder (fashion_mnist, mnist_idx), text file (text), token file (tokens, docs/tokenizer.md) or table file (npy: .npy/.npz, csv)"),
      TESSEL_KEY("data.target", data.target, "npy/csv: the targets: a CSV column's name, a 2-D .npy's column number, an .npz's array name (features: array x); empty: the last column, or array y; multilabel: CSV names or .npy numbers separated by commas (a CSV name ending in * takes every column it starts), or an .npz array [N, K]").when("data.kind", {"npy", "csv"}),
      TESSEL_KEY("data.task", data.task, "npy/csv: classification (integer class targets, cross-entropy), regression (one f32 target, mean squared error; the accuracy figures read 0) or multilabel (K 0/1 label columns named by data.target, K sigmoid outputs, binary cross-entropy; accuracy: the mean over rows and labels)").when("data.kind", {"npy", "csv"}),
      TESSEL_KEY("data.test_path", data.test_path, "npy/csv/text/tokens: the test set's file (a table of the same form, or text/tokens); empty: data.test_fraction of the rows drawn by data.seed (npy/csv), or the last data.test_fraction of data.path (text/tokens)").when("data.kind", {"npy", "csv", "text", "tokens"}),
      TESSEL_KEY("data.tokenizer", data.tokenizer_path, "text/tokens: a BPE tokenizer file (tessel tokenizer train) or a folder with GPT-2's encoder.json and vocab.bpe, stored in the checkpoint; empty: text is char-level (its distinct bytes), tokens have the largest id + 1 as vocabulary (docs/tokenizer.md)").when("data.kind", {"text", "tokens"}),
      TESSEL_KEY("data.flatten", data.flatten, "fashion_mnist/mnist_idx: images as [784] (true) or [1,28,28] (false)").when("data.kind", {"fashion_mnist", "mnist_idx"}),
      TESSEL_KEY("data.mean", data.mean, "fashion_mnist/mnist_idx: input normalisation x = (pixel/255 - mean) / std", {-1000, 1000}).when("data.kind", {"fashion_mnist", "mnist_idx"}),
      TESSEL_KEY("data.std", data.std, "fashion_mnist/mnist_idx: input normalisation scale", {.lo = 0, .hi = 1000, .lo_open = true}).when("data.kind", {"fashion_mnist", "mnist_idx"}),
      TESSEL_KEY("data.classes", data.classes, "number of classes; spiral/synthetic: 0 means 3; IDX, npy, csv: 0 means the data's largest label + 1, more adds unused classes; tokens without data.tokenizer: 0 means the largest id + 1, more pads the vocabulary with unused ids (GPT-2: 50304, its 50257 rounded up to a multiple of 128)", {0, 1 << 20}),
      TESSEL_KEY("data.points_per_class", data.points_per_class, "spiral: points per class", {1, 1 << 28}).when("data.kind", {"spiral"}),
      TESSEL_KEY("data.noise", data.noise, "spiral: angular noise", {0, 1000}).when("data.kind", {"spiral"}),
      TESSEL_KEY("data.context", data.context, "text/tokens: tokens per sample (GPT context length)", {1, 1 << 24}).when("data.kind", {"text", "tokens"}),
      TESSEL_KEY("data.test_fraction", data.test_fraction, "text/tokens/spiral/synthetic/npy/csv: share held out for test", {.lo = 0, .hi = 1, .hi_open = true}).when("data.kind", {"text", "tokens", "spiral", "synthetic", "npy", "csv"}),
      TESSEL_KEY("data.samples", data.samples, "synthetic: number of samples", {1, 1 << 30}).when("data.kind", {"synthetic"}),
      TESSEL_KEY("data.features", data.features, "synthetic: features per sample", {1, 1 << 30}).when("data.kind", {"synthetic"}),
      TESSEL_KEY("data.seed", data.seed, "spiral/synthetic: seed of the generated data; npy/csv: of the test rows drawn", {0, kMaxInt}).when("data.kind", {"spiral", "synthetic", "npy", "csv"}),
      TESSEL_KEY("optim.kind", optim.kind, "the optimizer: SGD with momentum or AdamW"),
      TESSEL_KEY("optim.lr", optim.lr, "base learning rate (> 0)", {.lo = 0, .hi = 1000, .lo_open = true}),
      TESSEL_KEY("optim.weight_decay", optim.weight_decay, "sgd: L2 penalty; adamw: decoupled decay", {0, 1000}),
      TESSEL_KEY("optim.momentum", optim.momentum, "sgd: momentum in [0, 1)", {.lo = 0, .hi = 1, .hi_open = true}).when("optim.kind", {"sgd"}),
      TESSEL_KEY("optim.nesterov", optim.nesterov, "sgd: Nesterov momentum").when("optim.kind", {"sgd"}),
      TESSEL_KEY("optim.beta1", optim.beta1, "adamw: first moment decay", {.lo = 0, .hi = 1, .hi_open = true}).when("optim.kind", {"adamw"}),
      TESSEL_KEY("optim.beta2", optim.beta2, "adamw: second moment decay", {.lo = 0, .hi = 1, .hi_open = true}).when("optim.kind", {"adamw"}),
      TESSEL_KEY("optim.eps", optim.eps, "adamw: denominator epsilon", {.lo = 0, .hi = 1, .lo_open = true}).when("optim.kind", {"adamw"}),
      TESSEL_KEY("schedule.kind", schedule.kind, "learning-rate schedule after the warm-up"),
      TESSEL_KEY("schedule.warmup_steps", schedule.warmup_steps, "linear warm-up steps", {0, kMaxSteps}),
      TESSEL_KEY("schedule.warmup_start", schedule.warmup_start, "warm-up starts at lr x this", {0, 1}),
      TESSEL_KEY("schedule.step_size", schedule.step_size, "step: steps between decays", {1, kMaxSteps}).when("schedule.kind", {"step"}),
      TESSEL_KEY("schedule.gamma", schedule.gamma, "step: decay factor", {.lo = 0, .hi = 1, .lo_open = true}).when("schedule.kind", {"step"}),
      TESSEL_KEY("schedule.min_lr", schedule.min_lr, "cosine: final learning rate", {0, 1000}).when("schedule.kind", {"cosine"}),
      TESSEL_KEY("train.epochs", train.epochs, "passes over the training set", {1, 1000000}),
      TESSEL_KEY("train.batch", train.batch, "global batch size", {1, 1 << 24}),
      TESSEL_KEY("train.max_steps", train.max_steps, "stop after this many steps (0: epochs decide); with ps.mode async or ssp a step is workers x worker batches, whoever trains them", {0, kMaxSteps}),
      TESSEL_KEY("train.clip_norm", train.clip_norm, "global gradient-norm clipping (0: off)", {0, 1e6}),
      TESSEL_KEY("train.base_batch", train.base_batch, "linear scaling rule: lr x batch / base_batch (0: off)", {0, int64_t{1} << 40}),
      TESSEL_KEY("train.accumulate", train.accumulate, "micro-batches summed per optimizer step (gradient accumulation); must be 1 with ps.mode async or ssp", {1, 1 << 16}),
      TESSEL_KEY("train.deterministic", parallel.deterministic, "bit-identical results for any worker count (fixed micro-shards, exact integer reduction)"),
      TESSEL_KEY("train.shuffle", train.shuffle, "shuffle the training set each epoch"),
      TESSEL_KEY("train.drop_last", train.drop_last, "drop a short last batch"),
      TESSEL_KEY("train.prefetch", train.prefetch, "batches loaded ahead by a background thread (0: none; -1: 2 when this host has a spare core for it, else 0)", {-1, 1024}),
      TESSEL_KEY("train.log_every", train.log_every, "steps between progress lines and metrics records", {1, kMaxSteps}),
      TESSEL_KEY("train.eval_train", train.eval_train, "also evaluate on the training set each epoch"),
      TESSEL_KEY("train.max_restarts", train.max_restarts, "ranks as threads: after a rank fails (an error, an injected fault, a rank stalled past comm.timeout_s), restart every rank from the newest in-memory snapshot or checkpoint, up to this many times (0: the run fails); under MPI use tessel launch --max-restarts", {0, 1000}),
      TESSEL_KEY("train.precision", parallel.precision, "fp32, bf16 or fp16: the type of activations, activation gradients, the parameter copy the blocks read and gradient messages; GEMMs in it with f32 sums; master weights, optimizer state, losses and norms f32; fp16 adds dynamic loss scaling (docs/mixed_precision.md)"),
      TESSEL_KEY("train.recompute", parallel.recompute, "none, full or selective: full keeps only each block's input and reruns its forward during the backward; selective drops the large cheap tensors (attention probabilities, GELU outputs) and recomputes them (docs/recompute.md)"),
      TESSEL_KEY("train.offload", parallel.offload, "none, activations, optimizer or all: on runtime.device = cuda, activations copies each block's activations to host memory after its forward and back before its backward (the last block's stay, unless a pipeline's micro-batch waits for its backward); optimizer keeps the optimizer state in host memory and runs the step on the CPU; all does both (docs/gpu.md)"),
      TESSEL_KEY("train.trace", observe.trace, "write trace.json, a per-rank timeline of the trace.steps window in Trace Event Format (Perfetto, chrome://tracing), into the run folder (also --trace)"),
      TESSEL_KEY("checkpoint.every_epochs", checkpoint.every_epochs, "save every N epochs (0: off)", {0, 1000000}),
      TESSEL_KEY("checkpoint.every_steps", checkpoint.every_steps, "save every N steps (0: off); not with ps.mode async or ssp, whose workers meet only at epoch ends", {0, kMaxSteps}),
      TESSEL_KEY("checkpoint.keep_last", checkpoint.keep_last, "checkpoints kept in the run folder", {1, 1000000}),
      TESSEL_KEY("checkpoint.snapshot_steps", checkpoint.snapshot_steps, "ranks as threads with train.max_restarts > 0: every N steps each rank copies its state into an in-memory snapshot, so that a rank failure loses at most N steps and reads no disk (0: off; restarts then use the newest checkpoint)", {0, kMaxSteps}),
      TESSEL_KEY("trace.steps", observe.trace_steps, "steps traced with train.trace: \"A:B\" traces steps A to B - 1"),
      TESSEL_KEY("metrics.tensorboard", observe.tensorboard, "also write the metrics as TensorBoard scalars (event files in tensorboard/ of the run folder)"),
      TESSEL_KEY("runtime.threads", runtime.threads, "BLAS threads of this process", {1, 256}),
      TESSEL_KEY("runtime.workers", runtime.workers, "ranks run as threads of this process (same as --workers)", {1, 1024}),
      TESSEL_KEY("runtime.backend", runtime.backend, "auto, threads or mpi (auto: mpi when started by an MPI launcher)"),
      TESSEL_KEY("runtime.device", parallel.device, "cpu or cuda: where each rank's tensors live and its kernels run; cuda (builds with CUDA only) is checked at start: the device must be usable, and the decision table says what runs on it (docs/gpu.md)"),
      TESSEL_KEY("runtime.memory_limit_mb", parallel.memory_limit_mb, "per-rank memory limit in MiB for tensors (parameters, gradients, optimizer state, activations, communication buffers); a rank that would pass it fails naming the category and the ZeRO stage that shards it (0: none)", {0, 1 << 30}),
      TESSEL_KEY("comm.timeout_s", comm.timeout_s, "deadline in seconds of every blocking communication", {.lo = 0, .hi = kMaxSeconds, .lo_open = true}),
      TESSEL_KEY("comm.algorithm", comm.algorithm, "collective algorithm: auto, ring, halving_doubling, tree, direct, native"),
      TESSEL_KEY("ddp.bucket_mb", parallel.bucket_mb, "gradient bucket size in MiB; buckets are all-reduced while backward runs", {.lo = 0, .hi = 1 << 20, .lo_open = true}),
      TESSEL_KEY("ddp.overlap", parallel.overlap, "auto, on or off: on runs each gradient bucket's collective (and ZeRO-3 prefetches) on a progress thread while the backward pass computes; off runs it on the compute thread as soon as the bucket is complete; auto: on only with a spare core per rank"),
      TESSEL_KEY("ddp.shared_memory", parallel.shared_memory, "among ranks of one host, sum gradients straight from each other's memory instead of sending messages: zero.stage = 0 (without ddp.overlap) writes each shard's sum into every rank's arena, zero.stage = 1 also keeps one parameter copy in shared memory; false: messages, as between hosts"),
      TESSEL_KEY("ddp.check_every", parallel.check_every, "steps between cross-rank parameter checksums (0: off)", {0, kMaxSteps}),
      TESSEL_KEY("ddp.micro_shard", parallel.micro_shard, "deterministic mode: rows per fixed micro-shard", {1, 1 << 24}),
      TESSEL_KEY("ddp.balance", parallel.balance, "off (each rank computes an even share of every batch's micro-shards in deterministic mode, else rows), static (the shares follow the ranks' speeds measured over the first 10 steps) or dynamic (re-dealt whenever the measured speeds change): the same gradient (deterministic: the same bits), a slow rank no longer sets the pace (docs/data_parallel.md)"),
      TESSEL_KEY("compress.kind", parallel.compress.kind, "what data-parallel gradient buckets (zero.stage 0-2, with pipelines, tensor parallelism and 16-bit precision too) and parameter-server pushes travel as: none (f32), fp16, bf16, int8 (per-chunk scales, stochastic rounding), topk (largest |g| as index/value pairs, all-gathered) or powersgd (rank-r factors P and Q, all-reduced); 1-D tensors and tensors it would not shrink stay f32 (docs/compression.md)"),
      TESSEL_KEY("compress.ratio", parallel.compress.ratio, "topk: the share of each bucket's compressed elements sent per step, in (0, 0.5]", {.lo = 0, .hi = 0.5, .lo_open = true}).when("compress.kind", {"topk"}),
      TESSEL_KEY("compress.rank", parallel.compress.rank, "powersgd: the rank r of each matrix's approximation (m x n sends r (m + n) values)", {1, 1 << 16}).when("compress.kind", {"powersgd"}),
      TESSEL_KEY("compress.start_step", parallel.compress.start_step, "steps sent uncompressed (f32) before compression starts", {0, kMaxSteps}),
      TESSEL_KEY("compress.error_feedback", parallel.compress.error_feedback, "topk and powersgd: keep what a step did not send (the residual, per bucket and rank) and add it to the next step's gradient"),
      TESSEL_KEY("zero.stage", parallel.zero_stage, "sharded data parallelism over the dp ranks: 0 replicated, 1 optimizer state sharded (allocated 1/N per rank), 2 gradients too (buckets reduce-scattered during backward), 3 parameters too (gathered per block before forward and backward, released after)", {0, 3}),
      TESSEL_KEY("zero.prefetch", parallel.zero_prefetch, "zero.stage = 3: gather the next block's parameters on a progress thread while this block computes (the order is recorded on the first step)"),
      TESSEL_KEY("zero.shard_size", parallel.zero_shard_size, "zero.stage 1-3: shard within groups of this many consecutive dp ranks (e.g. one host's) and all-reduce the gradient shards across the groups, so that ZeRO-3's gathers stay inside a group (hierarchical sharding: PyTorch HSDP, DeepSpeed MiCS); must divide the dp size; 0: the whole dp group", {0, 1 << 20}),
      TESSEL_KEY("tp.size", parallel.tp_size, "tensor parallelism: ranks each layer of an mlp or gpt is cut across (1: none); the world is dp x pp x tp ranks, tp fastest (a tp group is consecutive ranks)", {1, 1024}),
      TESSEL_KEY("tp.sequence_parallel", parallel.tp_sequence, "tp.size > 1 with a gpt: activations outside the cut layers (layer norms, residuals) are split along the sequence, and the tp all-reduces become all-gathers and reduce-scatters"),
      TESSEL_KEY("pp.stages", parallel.pp_stages, "pipeline stages: the model's blocks cut into this many contiguous stages (1: no pipeline); the world is dp x pp x tp ranks", {1, 1024}),
      TESSEL_KEY("pp.microbatches", parallel.pp_microbatches, "micro-batches each rank's batch is cut into for the pipeline schedule", {1, 1 << 16}),
      TESSEL_KEY("pp.schedule", parallel.pp_schedule, "gpipe (all forwards, then all backwards), 1f1b (one forward, one backward after warm-up), interleaved (Megatron's interleaved 1F1B over pp.virtual_stages chunks per stage: bubble (P-1)/(v m + P-1)) or zb-h1 (zero-bubble ZB-H1: backwards split into input- and weight-gradient halves, the weight halves filling the drain: bubble (P-1)/(3m + P-1), activations of min(m, P) micro-batches per stage)"),
      TESSEL_KEY("pp.virtual_stages", parallel.pp_virtual_stages, "pp.schedule = interleaved: chunks v >= 2 per stage; the model is cut into P x v chunks (pp.partition) and stage s holds chunks s, s + P, ...", {1, 1024}),
      TESSEL_KEY("pp.partition", parallel.pp_partition, "balanced (by estimated compute), uniform (same block count) or round_robin (block l on stage l mod P)"),
      TESSEL_KEY("pp.cuts", parallel.pp_cuts, "explicit first block of stages 1..P-1, e.g. [3, 7] (overrides pp.partition)", {1, 1 << 20}),
      TESSEL_KEY("ps.servers", parallel.ps_servers, "parameter-server ranks (the last ones; 0: no parameter server)", {0, 1024}),
      TESSEL_KEY("ps.mode", parallel.ps_mode, "sync (lockstep slices, one summed update per step: equals data parallel), async (workers claim worker batches of train.batch / workers rows one at a time, each push applied at once) or ssp (async, no claim more than ps.staleness steps ahead of a batch still in progress)"),
      TESSEL_KEY("ps.staleness", parallel.ps_staleness, "ssp: a claim at step c waits until every batch in progress is at step c - staleness or later (W claimed batches make a step)", {0, 1 << 20}).when("ps.mode", {"ssp"}),
      TESSEL_KEY("ps.stale_lr", parallel.ps_stale_lr, "async/ssp: inverse applies an update computed on parameters s versions old at lr / (1 + s); none at lr").when("ps.mode", {"async", "ssp"}),
      TESSEL_KEY("infer.chunk_rows", infer.chunk_rows, "predict: rows per chunk, the unit handed to a worker, written in order and resumed from (the same output for any worker count)", {1, 1 << 30}),
      TESSEL_KEY("infer.batch", infer.batch, "predict: rows (gpt: prompts) per forward pass within a chunk", {1, 1 << 24}),
      TESSEL_KEY("infer.top_k", infer.top_k, "predict and serve: classes listed with their probabilities per row", {1, 1 << 20}),
      TESSEL_KEY("infer.chunk_timeout_s", infer.chunk_timeout_s, "predict with threads: a worker holding a chunk this long is stalled and another worker re-runs the chunk", {.lo = 0, .hi = kMaxSeconds, .lo_open = true}),
      TESSEL_KEY("infer.commit_every_s", infer.commit_every_s, "predict: seconds between commits of the output (fsync + progress file); a killed job resumes from the last one (0: after every chunk)", {0, kMaxSeconds}),
      TESSEL_KEY("infer.max_new_tokens", infer.max_new_tokens, "gpt: tokens generated per prompt (prompt + these must fit the context)", {1, 1 << 24}).when("model.kind", {"gpt", "sequential"}),
      TESSEL_KEY("infer.temperature", infer.temperature, "gpt: 0 greedy (the most likely token), else sample at this temperature, seeded by seed and the row", {0, 1000}).when("model.kind", {"gpt", "sequential"}),
      TESSEL_KEY("infer.sample_top_k", infer.sample_top_k, "gpt: sample among the k most likely tokens (0: all)", {0, 1 << 20}).when("model.kind", {"gpt", "sequential"}),
      TESSEL_KEY("infer.kv_cache", infer.kv_cache, "gpt: keep each block's keys and values while generating (false: recompute the whole context for every token)").when("model.kind", {"gpt", "sequential"}),
      TESSEL_KEY("serve.host", serve.host, "address tessel serve listens on (127.0.0.1: this machine only; 0.0.0.0: every interface)"),
      TESSEL_KEY("serve.max_batch", serve.max_batch, "rows per batch a serve worker runs (requests are batched up to it); also the most rows one request may carry", {1, 1 << 20}),
      TESSEL_KEY("serve.max_wait_ms", serve.max_wait_ms, "longest a request waits for others to fill a batch (0: a free worker takes what waits at once)", {0, kMaxSeconds}),
      TESSEL_KEY("serve.max_queue", serve.max_queue, "classifiers: rows waiting for a worker; gpt models: generations waiting to join the running batch; requests beyond it get 503", {1, 1 << 30}),
      TESSEL_KEY("serve.max_body_kb", serve.max_body_kb, "largest request body in KiB; larger ones get 413", {1, 1 << 22}),
      TESSEL_KEY("serve.connections", serve.connections, "HTTP connections open at once; a connection beyond them gets 503 with Retry-After and is closed", {1, 1 << 20}),
      TESSEL_KEY("serve.io_threads", serve.io_threads, "threads reading and writing HTTP on every connection (event-driven), apart from the model's workers", {1, 256}),
      TESSEL_KEY("serve.timeout_s", serve.timeout_s, "a request not answered in this many seconds gets 504, one not read whole 408; a connection idle this long is closed", {.lo = 0, .hi = kMaxSeconds, .lo_open = true}),
      TESSEL_KEY("serve.max_sequences", serve.max_sequences, "gpt: sequences generating together (continuous batching; 1: one request at a time); more wait to join", {1, 1 << 16}).when("model.kind", {"gpt", "sequential"}),
      TESSEL_KEY("serve.max_step_tokens", serve.max_step_tokens, "gpt: rows in one generation step, new tokens first, then prompt chunks", {1, 1 << 20}).when("model.kind", {"gpt", "sequential"}),
      TESSEL_KEY("debug.slow_rank", parallel.slow_rank, "rank that sleeps debug.delay_ms in every step (a parameter-server worker: before its push; otherwise before the gradient reduction) or before every chunk (predict) or every batch and generation step of its serve worker (serve; generation counts as worker 0), to study stragglers and timeouts (-1: none)", {-1, kMaxRank}),
      TESSEL_KEY("debug.delay_ms", parallel.delay_ms, "milliseconds debug.slow_rank sleeps in every step, chunk or serve batch", {0, kMaxSeconds}),
      TESSEL_KEY("debug.slow_factor", parallel.slow_factor, "training: debug.slow_rank's forward and backward of every piece take this many times as long (it sleeps the difference), a slower processor to study ddp.balance (1: off)", {1, 1000}),
      TESSEL_KEY("debug.slow_from_step", parallel.slow_from_step, "debug.slow_factor applies from this step on (0-based; 0: from the start): a straggler that appears mid-run", {0, kMaxSteps}),
      TESSEL_KEY("debug.fail_rank", fault.fail_rank, "inject a failure on this world rank (-1: none), to test recovery; restarts (train.max_restarts, tessel launch) run without it", {-1, kMaxRank}),
      TESSEL_KEY("debug.fail_step", fault.fail_step, "the injected failure happens right after this step (1-based)", {0, kMaxSteps}),
      TESSEL_KEY("debug.fail_mode", fault.fail_mode, "throw (an error), kill (SIGKILL of the process), hang (the rank stops making progress) or stop (SIGSTOP of the process; MPI only)"),
      TESSEL_KEY("debug.overflow_steps", parallel.overflow_steps, "train.precision = fp16: steps at which debug.overflow_rank's loss gradient is made inf, an injected overflow that every rank must skip", {0, kMaxSteps}),
      TESSEL_KEY("debug.overflow_rank", parallel.overflow_rank, "the worker rank that injects debug.overflow_steps", {0, kMaxRank}),
      TESSEL_KEY("debug.kill_rank", infer.kill_rank, "predict worker that dies after debug.kill_after chunks, to test re-runs and --resume (threads: its thread fails; mpi: its process is killed; -1: none)", {-1, kMaxRank}),
      TESSEL_KEY("debug.kill_after", infer.kill_after, "chunks debug.kill_rank finishes before it dies", {0, 1 << 30}),
  };
  // clang-format on
  return keys;
}

#undef TESSEL_KEY

const Key* find_key(const std::string& path) {
  for (const Key& k : registry())
    if (k.info.path == path) return &k;
  return nullptr;
}

bool known_key(const std::string& path) { return find_key(path) != nullptr; }

void require(bool ok, const std::string& msg) {
  if (!ok) throw InvalidArgument("config: " + msg);
}

// What no single key's range or choices can say: rules between keys. Each key's range or
// choices were checked as it was read (make_key).
void validate(const Config& c) {
  require(!c.parallel.deterministic || c.train.batch % c.parallel.micro_shard == 0,
          str("train.deterministic needs train.batch (", c.train.batch,
              ") to be a multiple of ddp.micro_shard (", c.parallel.micro_shard, ")"));
  require(!c.parallel.deterministic || c.parallel.ps_servers == 0 || c.train.clip_norm == 0,
          str("train.clip_norm = ", c.train.clip_norm,
              " needs the norm of the summed gradient, which with ps.servers and "
              "train.deterministic only the servers hold; set train.clip_norm = 0, or train "
              "deterministically without parameter servers"));
  require(c.parallel.overflow_steps.empty() || c.parallel.precision == parallel::Precision::kFp16,
          str("debug.overflow_steps injects fp16 overflows, got train.precision = ",
              name_of(c.parallel.precision),
              "; set train.precision = fp16 or clear debug.overflow_steps"));
  require(c.serve.max_queue >= c.serve.max_batch,
          str("serve.max_queue must be >= serve.max_batch (", c.serve.max_batch, "), got ",
              c.serve.max_queue));
  parse_step_window(c.observe.trace_steps);  // throws naming trace.steps
  require(c.checkpoint.snapshot_steps == 0 || c.parallel.ps_servers == 0,
          "checkpoint.snapshot_steps needs every rank to train steps, but parameter servers only "
          "serve; use checkpoint.every_steps with ps.servers > 0");
  require(c.fault.fail_rank < 0 || c.fault.fail_step >= 1,
          str("debug.fail_step must be >= 1 with debug.fail_rank set, got ", c.fault.fail_step));
}

// Calls visit(key, value) for every key of root; throws naming an unknown key.
void for_each_key(const toml::table& root,
                  const std::function<void(const Key&, const toml::node&)>& visit) {
  auto one = [&](const std::string& path, const toml::node& v) {
    const Key* k = find_key(path);
    if (k == nullptr) throw InvalidArgument(unknown_key_message(path, ""));
    visit(*k, v);
  };
  for (auto&& [key, node] : root) {
    std::string top(key.str());
    if (const toml::table* section = node.as_table()) {
      for (auto&& [sub, v] : *section) one(top + "." + std::string(sub.str()), v);
    } else {
      one(top, node);
    }
  }
}

// The config root gives (defaults for the keys it lacks), not yet validated as a whole.
Config read_keys(const toml::table& root, const std::string& name) {
  Config c;
  c.name = name;
  for_each_key(root, [&](const Key& k, const toml::node& v) { k.set(c, v); });
  return c;
}

std::string stem(const std::string& path) { return std::filesystem::path(path).stem().string(); }

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& name,
                    const std::vector<std::string>& overrides) {
  Config c = read_keys(parse_table(toml_text, name, overrides, known_key), name);
  validate(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c = read_keys(parse_table(read_config_file(path), path, overrides, known_key), stem(path));
  validate(c);
  return c;
}

Config load_resume_config(const std::string& run_config, const std::string& path,
                          const std::vector<std::string>& overrides,
                          std::vector<std::string>* changed) {
  Config c = load_config(run_config);
  // What the file says differently is noted; the run's own value stays.
  const toml::table in_file = parse_table(read_config_file(path), path, {}, known_key);
  const Config file = read_keys(in_file, stem(path));
  for_each_key(in_file, [&](const Key& k, const toml::node&) {
    const std::string& key = k.info.path;
    const std::string was = k.get(c), now = k.get(file);
    if (key != "name" && was != now)
      changed->push_back(str(path, " says ", key, " = ", now, ", but the run's ", was,
                             " stays (--set ", key, "=", now, " changes it)"));
  });
  // What the command line sets wins.
  const toml::table set = parse_table("", "--set", overrides, known_key);
  const Config want = read_keys(set, c.name);
  bool schedule = false;
  for_each_key(set, [&](const Key& k, const toml::node&) {
    const std::string& key = k.info.path;
    const std::string was = k.get(c), now = k.get(want);
    if (was == now) return;
    k.set(c, *toml::parse("v = " + now).get("v"));
    changed->push_back(str("overridden: ", key, " = ", now, " (the run had ", was, ")"));
    schedule = schedule || key == "train.epochs" || key.rfind("schedule.", 0) == 0;
  });
  if (schedule)
    changed->push_back(
        "the learning-rate schedule is laid out again for the new length: from the resumed step "
        "on the rate follows the new schedule, not the one the run started with");
  validate(c);
  return c;
}

namespace {

// Whether key k applies to c (its `applies`).
bool applies(const Key& k, const Config& c) {
  const Applies& a = k.applies;
  if (a.key.empty()) return true;
  const Key* on = find_key(a.key);
  TESSEL_CHECK(on != nullptr, "config: ", k.info.path, " applies by unknown key ", a.key);
  const std::string now = on->get(c);  // a quoted TOML string
  return std::find(a.values.begin(), a.values.end(), now.substr(1, now.size() - 2)) !=
         a.values.end();
}

}  // namespace

std::string to_toml(const Config& c) {
  std::string out =
      "# resolved tessel config: every key that applies to this model, data, optimizer, schedule "
      "and mode, defaults included\n";
  std::string section;
  for (const Key& k : registry()) {
    if (!applies(k, c)) continue;
    const std::string& path = k.info.path;
    size_t dot = path.find('.');
    std::string sec = dot == std::string::npos ? "" : path.substr(0, dot);
    if (sec != section) {
      out += "\n[" + sec + "]\n";
      section = sec;
    }
    out += path.substr(dot == std::string::npos ? 0 : dot + 1) + " = " + k.get(c) + "\n";
  }
  return out;
}

int resolve_prefetch(int requested, int ranks_on_host, int blas_threads, int cores) {
  if (requested >= 0) return requested;
  return cores > ranks_on_host * std::max(1, blas_threads) ? 2 : 0;
}

comm::Backend resolve_backend(const Config& config, bool under_mpi) {
  const BackendChoice choice = config.runtime.backend;
  const comm::Backend backend =
      choice == BackendChoice::kMpi || (choice == BackendChoice::kAuto && under_mpi)
          ? comm::Backend::kMpi
          : comm::Backend::kThreads;
  if (backend == comm::Backend::kMpi && config.runtime.workers > 1)
    throw InvalidArgument(
        "runtime.workers (--workers) is for ranks as threads; under mpirun use -np instead");
  return backend;
}

std::vector<KeyInfo> config_keys() {
  std::vector<KeyInfo> out;
  for (const Key& k : registry()) out.push_back(k.info);
  return out;
}

}  // namespace tessel::train
