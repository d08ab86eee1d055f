// The CS231n spiral: K = classes arms of N = points_per_class 2-D points each. For arm j the
// radius runs r = linspace(0, 1, N) and the angle t = linspace(4j, 4(j+1), N) + noise * N(0,1);
// a point is (r sin t, r cos t), labelled j. Not linearly separable, which is the point.
//
// Train holds exactly those K*N points. Test is a *separate draw* of the same distribution
// (not a copy of the train points, so test accuracy measures generalisation): M =
// max(1, round(test_fraction * K * N)) points, point i on arm i % K with r ~ U[0, 1) and
// t = 4j + 4r + noise * N(0,1), i.e. the train curve sampled at random radii. test_fraction = 0
// gives no test set. All randomness is CounterRng(seed, kData stream per split), so the data is
// a pure function of the spec.
#include <algorithm>
#include <cmath>

#include "datasets_internal.h"
#include "tessel/core/rng.h"

namespace tessel::data::detail {
namespace {

constexpr uint64_t kSpiralTag = 0x5350'4952;  // "SPIR": keeps these streams apart from others
constexpr int64_t kMaxPoints = int64_t{1} << 28;

}  // namespace

Splits make_spiral_splits(const DataSpec& spec) {
  check_range("classes", spec.classes, 1, 1 << 20);
  check_range("points_per_class", spec.points_per_class, 1, kMaxPoints);
  if (spec.points_per_class * spec.classes > kMaxPoints)  // both capped above: no overflow
    throw InvalidArgument(str("data: spiral needs classes * points_per_class <= ", kMaxPoints,
                              ", got ", spec.classes * spec.points_per_class,
                              "; lower data.classes or data.points_per_class"));
  check_test_fraction(spec);
  if (!(spec.noise >= 0 && std::isfinite(spec.noise)))
    throw InvalidArgument(str("data: noise must be finite and >= 0, got ", spec.noise,
                              "; set data.noise to e.g. 0.2"));
  const int64_t k = spec.classes, n = spec.points_per_class;
  const double noise = spec.noise;

  // Train: the grid points of each arm.
  CounterRng train_rng(spec.seed, mix_stream(RngPurpose::kData, kSpiralTag, 0));
  std::vector<float> x(static_cast<size_t>(2 * k * n));
  std::vector<int32_t> y(static_cast<size_t>(k * n));
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t p = j * n + i;
      double frac = n > 1 ? static_cast<double>(i) / static_cast<double>(n - 1) : 0.0;
      double r = frac;
      double t = 4.0 * j + 4.0 * frac + noise * train_rng.normal(static_cast<uint64_t>(p));
      x[2 * p] = static_cast<float>(r * std::sin(t));
      x[2 * p + 1] = static_cast<float>(r * std::cos(t));
      y[p] = static_cast<int32_t>(j);
    }
  }
  Splits s;
  s.train = std::make_shared<DenseDataset>("spiral", 2, k, std::move(x), std::move(y));
  if (spec.test_fraction == 0) return s;

  // Test: a fresh draw at random radii; uniform and normal use disjoint indices of one stream.
  const int64_t m = std::max<int64_t>(1, std::llround(spec.test_fraction * k * n));
  CounterRng test_rng(spec.seed, mix_stream(RngPurpose::kData, kSpiralTag, 1));
  std::vector<float> tx(static_cast<size_t>(2 * m));
  std::vector<int32_t> ty(static_cast<size_t>(m));
  for (int64_t p = 0; p < m; ++p) {
    int64_t j = p % k;
    double r = test_rng.uniform(2 * static_cast<uint64_t>(p));
    double t = 4.0 * j + 4.0 * r + noise * test_rng.normal(2 * static_cast<uint64_t>(p) + 1);
    tx[2 * p] = static_cast<float>(r * std::sin(t));
    tx[2 * p + 1] = static_cast<float>(r * std::cos(t));
    ty[p] = static_cast<int32_t>(j);
  }
  s.test = std::make_shared<DenseDataset>("spiral", 2, k, std::move(tx), std::move(ty));
  return s;
}

}  // namespace tessel::data::detail
