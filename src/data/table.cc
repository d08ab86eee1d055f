// Users' own tables (kinds npy and csv): f32 feature rows and integer class targets, or f32
// regression targets (data.task = regression: one output, a mean squared error loss).
//
// Sources: a CSV file (csv.cc); a 2-D .npy [N, C] whose column data.target (default the last)
// holds the targets; an .npz holding arrays "x" [N, ...] (features, flattened per row) and "y"
// (or data.target) [N]. Any numeric dtype is converted to f32.
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
#include "tessel/data/loader.h"
#include "tessel/data/npy.h"

namespace tessel::data::detail {
namespace {

constexpr uint64_t kSplitTag = 0x5441'424c;  // "TABL": the test rows' permutation seed

// Feature rows with one f32 regression target each.
class TargetDataset final : public Dataset {
 public:
  TargetDataset(std::string name, Table t) : name_(std::move(name)), t_(std::move(t)) {}
  std::string name() const override { return name_; }
  int64_t size() const override { return t_.rows; }
  Shape input_shape() const override { return {t_.features}; }
  DType input_dtype() const override { return DType::kF32; }
  Shape label_shape() const override { return {}; }
  DType label_dtype() const override { return DType::kF32; }
  int64_t num_classes() const override { return 1; }
  void get(int64_t index, void* x, int32_t* y) const override {
    TESSEL_CHECK(index >= 0 && index < size(), "dataset ", name_, ": index ", index,
                 " outside [0, ", size(), ")");
    std::memcpy(x, t_.x.data() + index * t_.features,
                static_cast<size_t>(t_.features) * sizeof(float));
    std::memcpy(y, &t_.y[static_cast<size_t>(index)], sizeof(float));
  }

 private:
  std::string name_;
  Table t_;
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Table from_npz(const std::string& path, const std::string& target) {
  const NpyArray x = read_npz_member(path, "x");
  const NpyArray y = read_npz_member(path, target.empty() ? "y" : target);
  Table t;
  t.rows = x.shape.empty() ? 0 : x.shape[0];
  const int64_t y_row =
      y.shape.empty() || y.shape[0] == 0 ? 0 : static_cast<int64_t>(y.values.size()) / y.shape[0];
  if (x.shape.size() < 2 || t.rows < 1 || y.shape.empty() || y.shape[0] != t.rows || y_row != 1)
    throw InvalidArgument(str("data: ", path, " holds x ", shape_str(x.shape), " and ",
                              target.empty() ? "y" : target, " ", shape_str(y.shape),
                              "; save features [N, F] and one target per row [N]"));
  t.features = static_cast<int64_t>(x.values.size()) / t.rows;
  t.x = x.values;
  t.y = y.values;
  return t;
}

Table from_npy(const std::string& path, const std::string& target) {
  const NpyArray a = read_npy(path);
  if (a.shape.size() != 2 || a.shape[0] < 1 || a.shape[1] < 2)
    throw InvalidArgument(str("data: ", path, " has shape ", shape_str(a.shape),
                              "; a .npy table is 2-D [rows, features + 1] with the targets in "
                              "one column (data.target), or use an .npz with arrays x and y"));
  const int64_t cols = a.shape[1];
  int64_t t = cols - 1;
  if (!target.empty()) {
    size_t used = 0;
    try {
      t = std::stoll(target, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != target.size() || t < 0 || t >= cols)
      throw InvalidArgument(str("data: data.target for ", path, " must be a column number in [0, ",
                                cols, "), got '", target, "'; leave it empty for the last column"));
  }
  Table out;
  out.rows = a.shape[0];
  out.features = cols - 1;
  for (int64_t r = 0; r < out.rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      (c == t ? out.y : out.x).push_back(a.values[static_cast<size_t>(r * cols + c)]);
  return out;
}

Table read_table(const DataSpec& spec, const std::string& path) {
  if (!std::filesystem::is_regular_file(path))
    throw IoError(str("data: ", path,
                      " is not a readable file; set data.path (and "
                      "data.test_path) to a ",
                      spec.kind == "csv" ? ".csv" : ".npy or .npz", " file"));
  if (spec.kind == "csv") return read_csv_table(path, spec.target);
  if (ends_with(path, ".npz")) return from_npz(path, spec.target);
  return from_npy(path, spec.target);
}

// Rows `rows` of t, in that order.
Table take(const Table& t, const std::vector<int64_t>& rows) {
  Table out;
  out.rows = static_cast<int64_t>(rows.size());
  out.features = t.features;
  for (int64_t r : rows) {
    out.x.insert(out.x.end(), t.x.begin() + r * t.features, t.x.begin() + (r + 1) * t.features);
    out.y.push_back(t.y[static_cast<size_t>(r)]);
  }
  return out;
}

// Checks what a table read from `path` holds, before any split, so that a row number is the
// file's data row: finite features, and targets that are class labels (classification) or
// finite (regression).
void check_table(const Table& t, const std::string& path, bool regression) {
  for (size_t i = 0; i < t.x.size(); ++i)
    if (!std::isfinite(t.x[i]))
      throw InvalidArgument(str("data: ", path, " row ", i / t.features, " feature ",
                                i % t.features, " is ", t.x[i],
                                "; fill or drop missing values before training"));
  for (size_t r = 0; r < t.y.size(); ++r) {
    const float v = t.y[r];
    if (regression && !std::isfinite(v))
      throw InvalidArgument(str("data: ", path, " row ", r, " has target ", v,
                                "; fill or drop rows with missing targets before training"));
    if (!regression && !(v >= 0 && v < (1 << 24) && v == std::floor(v)))
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
  if (spec.task != "classification" && spec.task != "regression")
    throw InvalidArgument(
        str("data: unknown task '", spec.task, "'; set data.task to classification or regression"));
  const bool regression = spec.task == "regression";
  Table train = read_table(spec, spec.path), test;
  check_table(train, spec.path, regression);
  if (!spec.test_path.empty()) {
    test = read_table(spec, spec.test_path);
    check_table(test, spec.test_path, regression);
    if (test.features != train.features)
      throw InvalidArgument(str("data: ", spec.test_path, " has ", test.features,
                                " features per row, got ", train.features, " in ", spec.path,
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
  const int64_t f = train.features;
  feature_stats(train, s.input_mean, s.input_std);
  normalise(train, s.input_mean, s.input_std);
  normalise(test, s.input_mean, s.input_std);
  if (regression) {
    s.train = std::make_shared<TargetDataset>(spec.kind, std::move(train));
    if (test.rows > 0) s.test = std::make_shared<TargetDataset>(spec.kind, std::move(test));
    return s;
  }

  int64_t largest = 0;
  std::vector<int32_t> y_train = class_ids(train, largest), y_test = class_ids(test, largest);
  const int64_t classes = resolve_classes(largest, spec.classes, spec.path);
  s.train =
      std::make_shared<DenseDataset>(spec.kind, f, classes, std::move(train.x), std::move(y_train));
  if (test.rows > 0)
    s.test =
        std::make_shared<DenseDataset>(spec.kind, f, classes, std::move(test.x), std::move(y_test));
  return s;
}

}  // namespace tessel::data::detail
