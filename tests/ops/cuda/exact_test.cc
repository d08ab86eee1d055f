// Deterministic mode's exact sum on the GPU gives the CPU loops' bits (tessel/ops/exact.h):
// the kept shard and its largest |g| (a NaN makes it +inf), the quantise-and-add into int64 sums at
// a power-of-two scale (truncation of values far below the scale's unit included), and the
// dequantisation (a NaN scale writes NaN). Without a device it skips, saying why.
#include "tessel/ops/exact.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_test_util.h"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda::testing {
namespace {

class CudaExact : public Gpu {};

constexpr int64_t kN = 100003;  // not a multiple of any block

// Gradients over 30 binary orders of magnitude, so that some lie below the scale's unit.
Vec gradients(uint64_t stream) {
  Vec g = randn(kN, stream);
  for (int64_t i = 0; i < kN; ++i) g[i] = std::ldexp(g[i], -static_cast<int>(i % 30));
  return g;
}

template <typename T>
std::vector<T> download_as(const DeviceBuffer& b, int64_t n) {
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<T> out(static_cast<size_t>(n));
  b.download(out.data(), out.size() * sizeof(T));
  return out;
}

TEST_F(CudaExact, CollectKeepsTheShardAndTakesTheCpusMaximum) {
  Vec g = gradients(1);
  for (bool nan : {false, true}) {
    if (nan) g[kN / 2] = std::numeric_limits<float>::quiet_NaN();
    float want = 0.25f;  // an earlier range's maximum
    Vec kept(kN);
    ops::exact_collect(kept.data(), &want, g.data(), kN);
    DeviceBuffer gg = upload(g), gm = upload(Vec{0.25f}), gkept = poisoned(kN);
    exact_collect(static_cast<float*>(gkept.get()), static_cast<float*>(gm.get()),
                  static_cast<const float*>(gg.get()), kN, nullptr);
    const float got = download(gm, 1)[0];
    EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << got << " vs " << want;
    EXPECT_EQ(std::isinf(got), nan);
    expect_same_bits(download(gkept, kN), kept, "the kept shard");
  }
}

TEST_F(CudaExact, QuantiseAndDequantiseAreTheCpusBits) {
  const double scale = std::ldexp(1.0, 58);  // 2^62 / (4 shards * max |g| < 4)
  std::vector<int64_t> want(kN, 0);
  DeviceBuffer acc = upload_ints(want);
  for (uint64_t shard = 0; shard < 4; ++shard) {
    const Vec g = gradients(10 + shard);
    ops::exact_quantise(want.data(), g.data(), kN, scale);
    DeviceBuffer gg = upload(g);
    exact_quantise(static_cast<int64_t*>(acc.get()), static_cast<const float*>(gg.get()), kN, scale,
                   nullptr);
  }
  const std::vector<int64_t> got = download_as<int64_t>(acc, kN);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), kN * sizeof(int64_t)), 0) << "int64 sums";
  for (double s : {scale, std::numeric_limits<double>::quiet_NaN()}) {
    Vec out(kN);
    ops::exact_dequantise(out.data(), want.data(), kN, s);
    DeviceBuffer gout = poisoned(kN);
    exact_dequantise(static_cast<float*>(gout.get()), static_cast<const int64_t*>(acc.get()), kN, s,
                     nullptr);
    expect_same_bits(download(gout, kN), out,
                     std::isnan(s) ? "dequantise, NaN scale" : "dequantise");
  }
}

}  // namespace
}  // namespace tessel::ops::cuda::testing
