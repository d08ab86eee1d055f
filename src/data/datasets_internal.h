// Private to src/data: one builder per dataset kind (dispatched by make_datasets) and the
// small pieces they share. Not installed, not part of the public API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/data/dataset.h"

namespace tessel::data::detail {

Splits make_idx_splits(const DataSpec& spec);        // idx.cc: fashion_mnist, mnist_idx
Splits make_spiral_splits(const DataSpec& spec);     // spiral.cc
Splits make_text_splits(const DataSpec& spec);       // text.cc
Splits make_synthetic_splits(const DataSpec& spec);  // synthetic.cc
Splits make_table_splits(const DataSpec& spec);      // table.cc: npy, csv
Splits make_tokens_splits(const DataSpec& spec);     // tokens.cc

// A table of `rows` rows: `features` f32 values each (row-major) and `targets` targets each
// (one, or a multilabel table's K labels), row-major.
struct Table {
  int64_t rows = 0;
  int64_t features = 0;
  int64_t targets = 1;
  std::vector<float> x;
  std::vector<float> y;
  std::vector<std::string> feature_names, target_names;  // csv: the header's columns
};
// csv.cc: the CSV file at `path`, its column `target` (empty: the last) the targets; multilabel:
// the columns data.target names (DataSpec::target).
Table read_csv_table(const std::string& path, const std::string& target, bool multilabel);

// The class count of labels whose largest is `largest`: largest + 1, or `classes` (data.classes)
// when > 0, which must be larger; throws InvalidArgument naming `where` otherwise.
int64_t resolve_classes(int64_t largest, int64_t classes, const std::string& where);

// text.cc: next-token windows of spec.context over ids (the test split: test_ids when
// spec.test_path is set, else the last spec.test_fraction of ids), num_classes = vocab.
Splits token_windows(std::vector<int32_t> ids, std::vector<int32_t> test_ids, const DataSpec& spec,
                     int64_t vocab);

// Throws InvalidArgument unless spec.test_fraction is in [0, 1).
void check_test_fraction(const DataSpec& spec);

// Throws InvalidArgument naming `key` unless lo <= value <= hi.
void check_range(const char* key, int64_t value, int64_t lo, int64_t hi);

// An in-memory table of f32 feature rows and i32 class labels (spiral, synthetic).
class DenseDataset final : public Dataset {
 public:
  DenseDataset(std::string name, int64_t features, int64_t classes, std::vector<float> x,
               std::vector<int32_t> y);
  std::string name() const override { return name_; }
  int64_t size() const override { return static_cast<int64_t>(y_.size()); }
  Shape input_shape() const override { return {features_}; }
  DType input_dtype() const override { return DType::kF32; }
  Shape label_shape() const override { return {}; }
  int64_t num_classes() const override { return classes_; }
  void get(int64_t index, void* x, int32_t* y) const override;

 private:
  std::string name_;
  int64_t features_;
  int64_t classes_;
  std::vector<float> x_;  // size() rows of features_ values
  std::vector<int32_t> y_;
};

}  // namespace tessel::data::detail
