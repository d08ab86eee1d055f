// make_datasets: dispatch on DataSpec::kind, plus the helpers the dataset builders share.
#include <cstring>
#include <utility>

#include "datasets_internal.h"

namespace tessel::data {
namespace {

constexpr int64_t kGeneratedClasses = 3;  // spiral / synthetic when data.classes = 0

}  // namespace

namespace detail {

void check_test_fraction(const DataSpec& spec) {
  if (!(spec.test_fraction >= 0.0 && spec.test_fraction < 1.0))
    throw InvalidArgument(str("data: test_fraction must be in [0, 1), got ", spec.test_fraction,
                              "; set data.test_fraction to e.g. 0.1 (0 means no test split)"));
}

void check_range(const char* key, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi)
    throw InvalidArgument(str("data: ", key, " must be in [", lo, ", ", hi, "], got ", value,
                              "; set data.", key, " to a value in that range"));
}

int64_t resolve_classes(int64_t largest, int64_t classes, const std::string& where) {
  if (classes == 0) return largest + 1;
  if (classes <= largest)
    throw InvalidArgument(str("data: data.classes = ", classes, " is too few for ", where,
                              ", got labels up to ", largest, "; set data.classes to at least ",
                              largest + 1, " or to 0 (the data's own count)"));
  return classes;
}

DenseDataset::DenseDataset(std::string name, int64_t features, int64_t classes,
                           std::vector<float> x, std::vector<int32_t> y)
    : name_(std::move(name)),
      features_(features),
      classes_(classes),
      x_(std::move(x)),
      y_(std::move(y)) {
  TESSEL_CHECK(static_cast<int64_t>(x_.size()) == size() * features_, "dense dataset ", name_, ": ",
               x_.size(), " values for ", size(), " rows of ", features_);
}

void DenseDataset::get(int64_t index, void* x, int32_t* y) const {
  TESSEL_CHECK(index >= 0 && index < size(), "dataset ", name_, ": index ", index, " outside [0, ",
               size(), ")");
  std::memcpy(x, x_.data() + index * features_, static_cast<size_t>(features_) * sizeof(float));
  *y = y_[static_cast<size_t>(index)];
}

}  // namespace detail

Splits make_datasets(const DataSpec& spec) {
  DataSpec generated = spec;
  if (generated.classes == 0) generated.classes = kGeneratedClasses;
  switch (spec.kind) {
    case DataKind::kFashionMnist:
    case DataKind::kMnistIdx:
      return detail::make_idx_splits(spec);
    case DataKind::kText:
      return detail::make_text_splits(spec);
    case DataKind::kNpy:
    case DataKind::kCsv:
      return detail::make_table_splits(spec);
    case DataKind::kSpiral:
      return detail::make_spiral_splits(generated);
    case DataKind::kSynthetic:
      return detail::make_synthetic_splits(generated);
    case DataKind::kTokens:
      return detail::make_tokens_splits(spec);
  }
  throw InvalidArgument(
      str("data: data.kind out of range, got ", static_cast<int>(spec.kind), "; this is a bug"));
}

}  // namespace tessel::data
