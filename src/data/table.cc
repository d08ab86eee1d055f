// Users' own tables (kinds npy and csv): f32 feature rows and integer class targets, f32
// regression targets (data.task = regression: one output, a mean squared error loss) or K 0/1
// labels per row (data.task = multilabel: K outputs, sigmoid + binary cross-entropy).
//
// Sources: a CSV file (csv.cc); a 2-D .npy [N, C] whose column data.target (default the last;
// multilabel: columns "3,4,5") holds the targets; an .npz holding arrays "x" [N, ...] (features,
// flattened per row) and "y" (or data.target) [N] (multilabel: [N, K]). Any numeric dtype is
// converted to f32.
// Test set: the table at data.test_path (same form), else round(test_fraction * N) rows drawn
// by a permutation seeded with data.seed (never all of them).
// Normalisation: each feature's mean and standard deviation over the train rows (double sums;
// a constant feature keeps std 1), applied to train and test rows alike and returned in
// Splits so that a trained model applies the same map to raw inputs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "datasets_internal.h"
#include "tessel/data/csv.h"
#include "tessel/data/loader.h"
#include "tessel/data/npy.h"

namespace tessel::data::detail {
namespace {

constexpr uint64_t kSplitTag = 0x5441'424c;  // "TABL": the test rows' permutation seed

// Feature rows with f32 targets: one regression target, or the K 0/1 labels of a multilabel
// table.
class TargetDataset final : public Dataset {
 public:
  TargetDataset(std::string name, Table t, Task task)
      : name_(std::move(name)), t_(std::move(t)), task_(task) {}
  std::string name() const override { return name_; }
  int64_t size() const override { return t_.rows; }
  Shape input_shape() const override { return {t_.features}; }
  DType input_dtype() const override { return DType::kF32; }
  Shape label_shape() const override {
    return task_ == Task::kMultilabel ? Shape{t_.targets} : Shape{};
  }
  DType label_dtype() const override { return DType::kF32; }
  Task task() const override { return task_; }
  int64_t num_classes() const override { return t_.targets; }
  void get(int64_t index, void* x, int32_t* y) const override {
    TESSEL_CHECK(index >= 0 && index < size(), "dataset ", name_, ": index ", index,
                 " outside [0, ", size(), ")");
    std::memcpy(x, t_.x.data() + index * t_.features,
                static_cast<size_t>(t_.features) * sizeof(float));
    std::memcpy(y, t_.y.data() + index * t_.targets,
                static_cast<size_t>(t_.targets) * sizeof(float));
  }

 private:
  std::string name_;
  Table t_;
  Task task_;
};

Table from_npz(const std::string& path, const std::string& target, bool multilabel) {
  const NpyArray x = read_npz_member(path, "x");
  const NpyArray y = read_npz_member(path, target.empty() ? "y" : target);
  Table t;
  t.rows = x.shape.empty() ? 0 : x.shape[0];
  const int64_t y_row =
      y.shape.empty() || y.shape[0] == 0 ? 0 : static_cast<int64_t>(y.values.size()) / y.shape[0];
  const bool y_fits = multilabel ? y.shape.size() == 2 && y_row >= 1 : y_row == 1;
  if (x.shape.size() < 2 || t.rows < 1 || y.shape.empty() || y.shape[0] != t.rows || !y_fits)
    throw InvalidArgument(
        str("data: ", path, " holds x ", shape_str(x.shape), " and ", target.empty() ? "y" : target,
            " ", shape_str(y.shape), "; save features [N, F] and ",
            multilabel ? "the labels [N, K] (0 or 1 each)" : "one target per row [N]"));
  t.features = static_cast<int64_t>(x.values.size()) / t.rows;
  t.targets = y_row;
  t.x = x.values;
  t.y = y.values;
  return t;
}

// Which of a 2-D .npy's `cols` columns hold the targets: data.target's column numbers (one;
// multilabel: several, separated by commas), or the last column.
std::vector<bool> npy_target_columns(const std::string& target, int64_t cols, bool multilabel,
                                     const std::string& path) {
  std::vector<bool> chosen(static_cast<size_t>(cols), false);
  if (target.empty() && !multilabel) {
    chosen.back() = true;
    return chosen;
  }
  const std::vector<std::string> wanted =
      multilabel ? csv_fields(target) : std::vector<std::string>{target};
  for (const std::string& w : wanted) {
    int64_t c = -1;
    size_t used = 0;
    try {
      c = std::stoll(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (w.empty() || used != w.size() || c < 0 || c >= cols)
      throw InvalidArgument(
          str("data: data.target for ", path, " must be ",
              multilabel ? "column numbers separated by commas" : "a column number", " in [0, ",
              cols, "), got '", target, "'",
              multilabel ? "; e.g. \"8,9,10\" for the label columns"
                         : "; leave it empty for the last column"));
    chosen[static_cast<size_t>(c)] = true;
  }
  if (std::count(chosen.begin(), chosen.end(), true) == cols)
    throw InvalidArgument(str("data: data.target = '", target, "' takes every column of ", path,
                              ", leaving no features; name only the target columns"));
  return chosen;
}

Table from_npy(const std::string& path, const std::string& target, bool multilabel) {
  const NpyArray a = read_npy(path);
  if (a.shape.size() != 2 || a.shape[0] < 1 || a.shape[1] < 2)
    throw InvalidArgument(str("data: ", path, " has shape ", shape_str(a.shape),
                              "; a .npy table is 2-D [rows, features + targets] with the targets "
                              "in data.target's columns, or use an .npz with arrays x and y"));
  const int64_t cols = a.shape[1];
  const std::vector<bool> is_target = npy_target_columns(target, cols, multilabel, path);
  Table out;
  out.rows = a.shape[0];
  out.targets = std::count(is_target.begin(), is_target.end(), true);
  out.features = cols - out.targets;
  for (int64_t r = 0; r < out.rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      (is_target[static_cast<size_t>(c)] ? out.y : out.x)
          .push_back(a.values[static_cast<size_t>(r * cols + c)]);
  return out;
}

Table read_table(const DataSpec& spec, const std::string& path) {
  if (!std::filesystem::is_regular_file(path))
    throw IoError(str("data: ", path,
                      " is not a readable file; set data.path (and "
                      "data.test_path) to a ",
                      spec.kind == DataKind::kCsv ? ".csv" : ".npy or .npz", " file"));
  const bool multilabel = spec.task == Task::kMultilabel;
  if (spec.kind == DataKind::kCsv) return read_csv_table(path, spec.target, multilabel);
  if (path.ends_with(".npz")) return from_npz(path, spec.target, multilabel);
  return from_npy(path, spec.target, multilabel);
}

// "[a, b, c]" for CSV columns; empty for a table without names.
std::string names_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "[" : ", ") + n;
  return out.empty() ? out : out + "]";
}

// Rows `rows` of t, in that order.
Table take(const Table& t, const std::vector<int64_t>& rows) {
  Table out;
  out.rows = static_cast<int64_t>(rows.size());
  out.features = t.features;
  out.feature_names = t.feature_names;
  out.target_names = t.target_names;
  out.targets = t.targets;
  for (int64_t r : rows) {
    out.x.insert(out.x.end(), t.x.begin() + r * t.features, t.x.begin() + (r + 1) * t.features);
    out.y.insert(out.y.end(), t.y.begin() + r * t.targets, t.y.begin() + (r + 1) * t.targets);
  }
  return out;
}

// Checks what a table read from `path` holds, before any split, so that a row number is the
// file's data row: finite features, and targets that are class labels (classification), finite
// (regression) or 0 and 1 (multilabel).
void check_table(const Table& t, const std::string& path, Task task) {
  for (size_t i = 0; i < t.x.size(); ++i)
    if (!std::isfinite(t.x[i]))
      throw InvalidArgument(str("data: ", path, " row ", i / t.features, " feature ",
                                i % t.features, " is ", t.x[i],
                                "; fill or drop missing values before training"));
  for (size_t i = 0; i < t.y.size(); ++i) {
    const float v = t.y[i];
    const size_t r = i / static_cast<size_t>(t.targets);
    if (task == Task::kRegression && !std::isfinite(v))
      throw InvalidArgument(str("data: ", path, " row ", r, " has target ", v,
                                "; fill or drop rows with missing targets before training"));
    if (task == Task::kMultilabel && v != 0 && v != 1)
      throw InvalidArgument(str("data: ", path, " row ", r, " has label ", v, " in target column ",
                                i % static_cast<size_t>(t.targets),
                                "; multilabel targets are 0 or 1 (check data.target)"));
    if (task == Task::kClassification && !(v >= 0 && v < (1 << 24) && v == std::floor(v)))
      throw InvalidArgument(str("data: ", path, " row ", r, " has target ", v,
                                ", which is not a class label; classification targets are "
                                "integers 0, 1, ... (check data.target, or set data.task = "
                                "\"regression\")"));
  }
}

// The class ids of a checked table, and the largest of them so far in `largest`.
std::vector<int32_t> class_ids(const Table& t, int64_t& largest) {
  std::vector<int32_t> y(t.y.begin(), t.y.end());
  for (int32_t v : y) largest = std::max<int64_t>(largest, v);
  return y;
}

// Each feature's mean and standard deviation over t's rows (double sums; std 1 for a constant
// feature, so that it passes through centred).
void feature_stats(const Table& t, std::vector<float>& mean, std::vector<float>& sd) {
  const int64_t f = t.features;
  mean.assign(static_cast<size_t>(f), 0.0f);
  sd.assign(static_cast<size_t>(f), 1.0f);
  for (int64_t c = 0; c < f; ++c) {
    double sum = 0, sq = 0;
    for (int64_t r = 0; r < t.rows; ++r) sum += t.x[static_cast<size_t>(r * f + c)];
    const double m = sum / static_cast<double>(t.rows);
    for (int64_t r = 0; r < t.rows; ++r) {
      const double d = t.x[static_cast<size_t>(r * f + c)] - m;
      sq += d * d;
    }
    const double v = std::sqrt(sq / static_cast<double>(t.rows));
    mean[static_cast<size_t>(c)] = static_cast<float>(m);
    if (v > 1e-12 * std::max(1.0, std::abs(m))) sd[static_cast<size_t>(c)] = static_cast<float>(v);
  }
}

void normalise(Table& t, const std::vector<float>& mean, const std::vector<float>& std) {
  for (size_t i = 0; i < t.x.size(); ++i) {
    const size_t f = i % mean.size();
    t.x[i] = (t.x[i] - mean[f]) / std[f];
  }
}

}  // namespace

Splits make_table_splits(const DataSpec& spec) {
  check_test_fraction(spec);
  Table train = read_table(spec, spec.path), test;
  check_table(train, spec.path, spec.task);
  if (!spec.test_path.empty()) {
    test = read_table(spec, spec.test_path);
    check_table(test, spec.test_path, spec.task);
    if (test.features != train.features || test.feature_names != train.feature_names ||
        test.targets != train.targets)
      throw InvalidArgument(
          str("data: ", spec.test_path, " has ", test.features, " features per row, got ",
              train.features, " in ", spec.path,
              test.feature_names.empty() ? ""
                                         : str(" (columns ", names_list(test.feature_names),
                                               " and ", names_list(train.feature_names), ")"),
              test.targets == train.targets
                  ? ""
                  : str(", and ", test.targets, " targets per row for ", train.targets),
              "; the test table needs the train table's columns"));
  } else if (spec.test_fraction > 0) {
    const int64_t n = std::max<int64_t>(1, std::llround(spec.test_fraction * train.rows));
    if (n >= train.rows)
      throw InvalidArgument(str("data: ", spec.path, " has ", train.rows,
                                " rows, too few to hold out test_fraction = ", spec.test_fraction,
                                "; add rows, lower data.test_fraction or set data.test_path"));
    const std::vector<int64_t> order = epoch_order(train.rows, spec.seed ^ kSplitTag, 0, true);
    test = take(train, {order.begin(), order.begin() + n});
    train = take(train, {order.begin() + n, order.end()});
  }
  Splits s;
  s.input_names = train.feature_names;
  s.target_names = train.target_names;
  const int64_t f = train.features;
  feature_stats(train, s.input_mean, s.input_std);
  normalise(train, s.input_mean, s.input_std);
  normalise(test, s.input_mean, s.input_std);
  if (spec.task != Task::kClassification) {
    s.train = std::make_shared<TargetDataset>(name_of(spec.kind), std::move(train), spec.task);
    if (test.rows > 0)
      s.test = std::make_shared<TargetDataset>(name_of(spec.kind), std::move(test), spec.task);
    return s;
  }

  int64_t largest = 0;
  std::vector<int32_t> y_train = class_ids(train, largest), y_test = class_ids(test, largest);
  const int64_t classes = resolve_classes(largest, spec.classes, spec.path);
  s.train = std::make_shared<DenseDataset>(name_of(spec.kind), f, classes, std::move(train.x),
                                           std::move(y_train));
  if (test.rows > 0)
    s.test = std::make_shared<DenseDataset>(name_of(spec.kind), f, classes, std::move(test.x),
                                            std::move(y_test));
  return s;
}

}  // namespace tessel::data::detail
