// A synthetic classification problem (kind synthetic): `classes` Gaussian blobs in `features`
// dimensions. Class centres are drawn once from N(0, 1) per coordinate; sample i has label
// i % classes (balanced) and features centre + N(0, 1) noise. Centres sit about sqrt(2 *
// features) apart against unit noise, so the problem is nearly linearly separable for the
// default 32 features and visibly overlapping for 2. The last max(1, round(test_fraction *
// samples)) samples form the test split (none when test_fraction = 0). Everything is drawn
// from CounterRng(seed, kData streams), so the data is a pure function of the spec.
#include <algorithm>
#include <cmath>

#include "datasets_internal.h"
#include "tessel/core/rng.h"

namespace tessel::data::detail {
namespace {

constexpr uint64_t kSyntheticTag = 0x5359'4e54;  // "SYNT": keeps these streams apart
constexpr int64_t kMaxValues = int64_t{1} << 30;

std::shared_ptr<const Dataset> make_rows(const DataSpec& spec, const std::vector<float>& centres,
                                         int64_t first, int64_t count) {
  const int64_t f = spec.features;
  CounterRng rng(spec.seed, mix_stream(RngPurpose::kData, kSyntheticTag, 1));
  std::vector<float> x(static_cast<size_t>(count * f));
  std::vector<int32_t> y(static_cast<size_t>(count));
  for (int64_t r = 0; r < count; ++r) {
    const int64_t i = first + r;  // global sample index keys the noise
    const int64_t c = i % spec.classes;
    for (int64_t k = 0; k < f; ++k)
      x[r * f + k] = centres[c * f + k] + rng.normal(static_cast<uint64_t>(i * f + k));
    y[r] = static_cast<int32_t>(c);
  }
  return std::make_shared<DenseDataset>("synthetic", f, spec.classes, std::move(x), std::move(y));
}

}  // namespace

Splits make_synthetic_splits(const DataSpec& spec) {
  check_range("samples", spec.samples, 1, kMaxValues);
  check_range("features", spec.features, 1, kMaxValues);
  check_range("classes", spec.classes, 1, 1 << 20);
  check_test_fraction(spec);
  // Each factor is capped at 2^30 above, so the products cannot overflow.
  if (std::max(spec.samples, spec.classes) * spec.features > kMaxValues)
    throw InvalidArgument(
        str("data: synthetic needs samples * features and classes * features <= ", kMaxValues,
            ", got ", spec.samples, ", ", spec.classes, " and ", spec.features,
            "; lower data.samples, data.classes or data.features"));
  const int64_t test = spec.test_fraction > 0
                           ? std::max<int64_t>(1, std::llround(spec.test_fraction * spec.samples))
                           : 0;
  if (spec.samples - test < 1)
    throw InvalidArgument(str("data: synthetic train split is empty, got samples = ", spec.samples,
                              " with test_fraction = ", spec.test_fraction,
                              "; raise data.samples"));

  CounterRng centre_rng(spec.seed, mix_stream(RngPurpose::kData, kSyntheticTag, 0));
  std::vector<float> centres(static_cast<size_t>(spec.classes * spec.features));
  for (size_t i = 0; i < centres.size(); ++i) centres[i] = centre_rng.normal(i);

  Splits s;
  s.train = make_rows(spec, centres, 0, spec.samples - test);
  if (test > 0) s.test = make_rows(spec, centres, spec.samples - test, test);
  return s;
}

}  // namespace tessel::data::detail
