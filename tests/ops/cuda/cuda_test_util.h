// Helpers for the CUDA kernels' tests: the Gpu fixture (skips without a device, saying why, or
// fails when TESSEL_GPU_REQUIRED=1), random host data from one seed per process (printed; set
// TESSEL_TEST_SEED to replay), uploads/downloads in f32 or bf16, and a closeness check that
// reports the worst element. Comparisons are |got - want| <= tol * (|want| + rms(want)): a
// relative error, floored by the tensor's scale so that values near zero do not demand more
// digits than the arithmetic has.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tessel/ops/cuda/check.h"
#include "tessel/ops/cuda/device.h"
#include "tessel/tensor/dtype.h"

namespace tessel::ops::cuda::testing {

using Vec = std::vector<float>;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = device_unavailable_reason();
    if (why.empty()) return;
    const char* required = std::getenv("TESSEL_GPU_REQUIRED");
    if (required != nullptr && std::string(required) == "1")
      FAIL() << why << " (TESSEL_GPU_REQUIRED=1 turns the skip into a failure)";
    GTEST_SKIP() << why;
  }
};

inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("TESSEL_TEST_SEED");
    const uint64_t s = env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("[ cuda tests ] TESSEL_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// n normal values times `scale`; `stream` separates the buffers of one test.
inline Vec randn(int64_t n, uint64_t stream, float scale = 1.0f) {
  std::mt19937_64 gen(test_seed() * 0x9E3779B97F4A7C15ull + stream);
  std::normal_distribution<float> dist(0.0f, scale);
  Vec v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::vector<int32_t> rand_ids(int64_t n, int32_t lo, int32_t hi, uint64_t stream) {
  std::mt19937_64 gen(test_seed() * 0x9E3779B97F4A7C15ull + stream);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// v rounded to bf16 and back (what a bf16 tensor of these values holds).
inline Vec round_bf16(Vec v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

inline std::vector<uint16_t> to_bf16(const Vec& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

// A device copy of v as type t (f32 or bf16).
inline DeviceBuffer upload(const Vec& v, DType t = DType::kF32) {
  DeviceBuffer b(v.size() * dtype_size(t));
  if (t == DType::kF32) {
    b.upload(v.data(), v.size() * sizeof(float));
  } else {
    const std::vector<uint16_t> h = to_bf16(v);
    b.upload(h.data(), h.size() * sizeof(uint16_t));
  }
  return b;
}

template <typename I>
DeviceBuffer upload_ints(const std::vector<I>& v) {
  DeviceBuffer b(v.size() * sizeof(I));
  b.upload(v.data(), v.size() * sizeof(I));
  return b;
}

// A buffer of n elements of type t full of NaN (0xFF bytes): an output that a kernel must
// overwrite entirely.
inline DeviceBuffer poisoned(int64_t n, DType t = DType::kF32) {
  DeviceBuffer b(static_cast<size_t>(n) * dtype_size(t));
  b.fill(0xFF);
  return b;
}

// The first n elements of b (of type t) as f32; synchronises the device first.
inline Vec download(const DeviceBuffer& b, int64_t n, DType t = DType::kF32) {
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  Vec out(static_cast<size_t>(n));
  if (t == DType::kF32) {
    b.download(out.data(), out.size() * sizeof(float));
  } else {
    std::vector<uint16_t> h(static_cast<size_t>(n));
    b.download(h.data(), h.size() * sizeof(uint16_t));
    for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_f32(h[i]);
  }
  return out;
}

// Checks every element (error over |want| + rms(want) within tol) and the whole (||got - want|| /
// ||want|| within norm_tol, default tol); on failure names the worst element. Prints both
// errors on success too, so the device check's log shows each kernel's margin.
inline void expect_close(const Vec& got, const Vec& want, double tol, const std::string& what,
                         double norm_tol = -1.0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double sq = 0.0;
  for (float w : want) sq += static_cast<double>(w) * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(sq / static_cast<double>(want.size()));
  double worst = 0.0, diff_sq = 0.0;
  size_t at = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff_sq += d * d;
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]) /
                       (std::fabs(static_cast<double>(want[i])) + rms + 1e-30);
    if (!(err <= tol)) ++bad;  // NaN counts as bad
    if (!(err <= worst)) {
      worst = err;
      at = i;
    }
  }
  const double norm_err = std::sqrt(diff_sq / (sq + 1e-300));
  std::printf("[ cuda tests ] %-42s worst rel err %.3g (tol %.1g), norm %.3g, %zu values\n",
              what.c_str(), worst, tol, norm_err, got.size());
  EXPECT_LE(norm_err, norm_tol < 0 ? tol : norm_tol) << what << ": ||got - want|| / ||want||";
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " values off; worst at "
                     << at << ": got " << got[at] << ", want " << want[at] << " (rms of want "
                     << rms << ", TESSEL_TEST_SEED=" << test_seed() << ")";
}

inline void expect_same_bits(const Vec& a, const Vec& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << what << ": two runs differ";
}

}  // namespace tessel::ops::cuda::testing
