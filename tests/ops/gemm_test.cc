// ops::gemm against a double-precision reference over all four transpose combinations, edge
// sizes in every dimension, padded leading dimensions, alpha != 1 and beta in {0, 1, 0.5}.
// With one BLAS thread the kernel table's own GEMM runs; the suite runs at every ISA level the
// host supports (portable, AVX2, AVX-512), so these cases cover each kernel's packing, row
// tiling, masked column edges, K blocking and transposed-product paths; a second suite runs a
// few cases on two BLAS threads (OpenBLAS). isa_test checks that the levels agree bit for bit.
// Padding of A, B and C is poisoned: NaN in A and B must not be read, C's must stay untouched; beta
// = 0 starts from a NaN C.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gemm_shapes.h"
#include "grad_check.h"
#include "tessel/core/error.h"
#include "tessel/core/rng.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/isa.h"

namespace tessel::ops {
namespace {

using testing::Vec;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = -12345.0f;  // C's padding columns must keep it

struct Case {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // leading dimension minus its minimum
  float alpha = 1.0f, beta = 0.0f;
  uint64_t seed = 1;
};

std::string describe(const Case& c) {
  std::ostringstream os;
  os << (c.ta ? "T" : "N") << (c.tb ? "T" : "N") << " M=" << c.M << " N=" << c.N << " K=" << c.K
     << " pads=" << c.pad_a << "," << c.pad_b << "," << c.pad_c << " alpha=" << c.alpha
     << " beta=" << c.beta;
  return os.str();
}

// A stored matrix of rows x (cols + pad) with its padding set to `pad_value`.
Vec stored(int64_t rows, int64_t cols, int64_t pad, uint64_t seed, float pad_value) {
  const int64_t ld = cols + pad;
  Vec v = testing::randn(rows * ld, seed);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = cols; c < ld; ++c) v[r * ld + c] = pad_value;
  }
  return v;
}

// Runs one case through ops::gemm and checks C against the double reference, within 1e-5 of
// sum |alpha a b| + |beta c| per element (a single lost or doubled term of a K = 784 sum is
// ~1e-3 of it), and C's padding against the sentinel. Big cases compare every row_step-th row
// only, so that the reference stays quick in sanitizer builds; every element is still checked
// to be finite.
void check(const Case& c) {
  SCOPED_TRACE(describe(c));
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = std::max<int64_t>(a_cols + c.pad_a, 1);
  const int64_t ldb = std::max<int64_t>(b_cols + c.pad_b, 1), ldc = c.N + c.pad_c;
  const Vec A = stored(a_rows, a_cols, lda - a_cols, c.seed * 3 + 1, kNaN);
  const Vec B = stored(b_rows, b_cols, ldb - b_cols, c.seed * 3 + 2, kNaN);
  Vec C = stored(c.M, c.N, c.pad_c, c.seed * 3 + 3, kSentinel);
  if (c.beta == 0.0f) {
    for (int64_t i = 0; i < c.M; ++i) {
      std::fill(C.begin() + i * ldc, C.begin() + i * ldc + c.N, kNaN);
    }
  }
  const Vec C0 = C;
  gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);

  // op(A) [M, K] and op(B) [K, N] densely in double, then C row by row in i-k-j order.
  std::vector<double> a(c.M * c.K), b(c.K * c.N);
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t k = 0; k < c.K; ++k) a[i * c.K + k] = c.ta ? A[k * lda + i] : A[i * lda + k];
  }
  for (int64_t k = 0; k < c.K; ++k) {
    for (int64_t j = 0; j < c.N; ++j) b[k * c.N + j] = c.tb ? B[j * ldb + k] : B[k * ldb + j];
  }
  std::vector<double> sum(c.N), mag(c.N);
  const int64_t row_step = 1 + c.M * c.N * c.K / 3'000'000;
  int failures = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      if (!std::isfinite(C[i * ldc + j]) && failures++ < 5) {
        ADD_FAILURE() << "C(" << i << "," << j << ") = " << C[i * ldc + j];
      }
    }
    for (int64_t j = c.N; j < ldc; ++j) {
      if (C[i * ldc + j] != kSentinel && failures++ < 5) {
        ADD_FAILURE() << "padding C(" << i << "," << j << ") changed to " << C[i * ldc + j];
      }
    }
    if (i % row_step != static_cast<int64_t>(c.seed % row_step) && i != c.M - 1) continue;
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(mag.begin(), mag.end(), 0.0);
    for (int64_t k = 0; k < c.K; ++k) {
      const double aik = a[i * c.K + k];
      const double* brow = b.data() + k * c.N;
      for (int64_t j = 0; j < c.N; ++j) {
        sum[j] += aik * brow[j];
        mag[j] += std::abs(aik * brow[j]);
      }
    }
    for (int64_t j = 0; j < c.N; ++j) {
      const double c0 = c.beta == 0.0f ? 0.0 : C0[i * ldc + j];
      const double want = c.alpha * sum[j] + c.beta * c0;
      const double bound = 1e-5 * (std::abs(c.alpha) * mag[j] + std::abs(c.beta * c0)) + 1e-30;
      const double got = C[i * ldc + j];
      if (!(std::abs(got - want) <= bound) && failures++ < 5) {  // NaN fails too
        ADD_FAILURE() << "C(" << i << "," << j << ") = " << got << ", want " << want << " (bound "
                      << bound << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

// Runs each test at one ISA level with one BLAS thread, and restores both after.
class GemmTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    saved_threads_ = blas_threads();
    saved_isa_ = isa();
    set_blas_threads(1);
    set_isa(GetParam());
  }
  void TearDown() override {
    set_blas_threads(saved_threads_);
    set_isa(saved_isa_);
  }

 private:
  int saved_threads_ = 1;
  Isa saved_isa_ = Isa::kPortable;
};

// Two BLAS threads: OpenBLAS.
class GemmTwoThreadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = blas_threads();
    set_blas_threads(2);
  }
  void TearDown() override { set_blas_threads(saved_); }

 private:
  int saved_ = 1;
};

constexpr int64_t kSizes[] = {0, 1, 7, 13, 31, 33, 127, 129, 300, 784};
constexpr float kAlphas[] = {1.0f, -0.75f, 2.5f};
constexpr float kBetas[] = {0.0f, 1.0f, 0.5f};

// Every size in every dimension, for each transpose combination, with the other two
// dimensions drawn at random (redrawn while the case is too big for the reference to be quick)
// and the padding, alpha and beta cycled.
TEST_P(GemmTest, EdgeSizesAllTransposes) {
  testing::for_each_edge_shape(
      kSizes, 2'000'000, CounterRng(42, mix_stream(RngPurpose::kData, 7)),
      [&](bool ta, bool tb, int64_t M, int64_t N, int64_t K, uint64_t seed) {
        Case c;
        c.ta = ta, c.tb = tb, c.M = M, c.N = N, c.K = K;
        c.pad_a = seed % 2 == 0 ? 0 : static_cast<int64_t>(seed % 5);
        c.pad_b = seed % 3 == 0 ? 0 : static_cast<int64_t>(seed % 7);
        c.pad_c = seed % 4 == 0 ? 0 : static_cast<int64_t>(seed % 3 + 1);
        c.alpha = kAlphas[seed % 3];
        c.beta = kBetas[(seed / 3) % 3];
        c.seed = seed;
        check(c);
      });
}

// The GEMMs of the MLP (784-512-256-10) and CNN training steps, as linear and conv issue them,
// beta alternating between 0 and 1: several K blocks (K = 784, 1568), narrow N computed as the
// transposed product (N = 10, 16), short K (10, 16, 25, 32).
TEST_P(GemmTest, ModelShapes) {
  struct Shape {
    bool ta, tb;
    int64_t M, N, K;
  };
  const Shape shapes[] = {
      {false, true, 128, 512, 784},  {true, false, 512, 784, 128},  {false, true, 128, 256, 512},
      {true, false, 256, 512, 128},  {false, false, 128, 512, 256}, {false, true, 128, 10, 256},
      {true, false, 10, 256, 128},   {false, false, 128, 256, 10},  {false, false, 16, 784, 25},
      {false, true, 25, 16, 784},    {true, false, 25, 784, 16},    {false, false, 32, 392, 400},
      {false, true, 400, 32, 392},   {true, false, 400, 392, 32},   {false, true, 128, 128, 1568},
      {true, false, 128, 1568, 128}, {false, false, 128, 1568, 128}};
  uint64_t seed = 100;
  for (const Shape& s : shapes) {
    ++seed;
    check({s.ta, s.tb, s.M, s.N, s.K, 0, 0, 0, 1.0f, seed % 2 == 0 ? 0.0f : 1.0f, seed});
  }
}

// More rows than one packed A block and more columns than one packed B block hold.
TEST_P(GemmTest, SeveralCacheBlocks) {
  check({false, false, 700, 2100, 40, 3, 0, 5, 1.0f, 0.5f, 201});
  check({true, true, 350, 2080, 33, 0, 2, 0, -1.0f, 1.0f, 202});
}

TEST_P(GemmTest, EmptyInnerDimensionScalesC) {
  for (float beta : {0.0f, 1.0f, 0.5f, -2.0f}) {
    check({false, true, 13, 33, 0, 0, 0, 2, 1.5f, beta, 300});
  }
}

TEST_P(GemmTest, EmptyOutputLeavesCUntouched) {
  Vec a(64, kNaN), b(64, kNaN), c(64, kSentinel);
  gemm(false, false, 0, 5, 7, 1.0f, a.data(), 7, b.data(), 5, 0.0f, c.data(), 5);
  gemm(true, true, 5, 0, 7, 1.0f, a.data(), 5, b.data(), 7, 0.0f, c.data(), 1);
  for (float v : c) EXPECT_EQ(v, kSentinel);
}

// alpha = 0 reads neither A nor B (as in OpenBLAS): a NaN there does not reach C.
TEST_P(GemmTest, ZeroAlphaOnlyScalesC) {
  Vec a(12 * 20, kNaN), b(20 * 9, kNaN), c(12 * 9, 3.0f);
  gemm(false, false, 12, 9, 20, 0.0f, a.data(), 20, b.data(), 9, 0.5f, c.data(), 9);
  for (float v : c) EXPECT_EQ(v, 1.5f);
  gemm(false, false, 12, 9, 20, 0.0f, a.data(), 20, b.data(), 9, 0.0f, c.data(), 9);
  for (float v : c) EXPECT_EQ(v, 0.0f);
}

// Each thread packs into its own scratch: concurrent calls of different shapes stay correct.
TEST_P(GemmTest, ConcurrentCallsAreIndependent) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int rep = 0; rep < 3; ++rep) {
        check({t % 2 == 1, t >= 2, 100 + 17 * t, 300 - 31 * t, 350 + 9 * t, 1, 2, 3, 1.0f,
               kBetas[rep], static_cast<uint64_t>(400 + 10 * t + rep)});
      }
    });
  }
  for (auto& th : threads) th.join();
}

TEST_F(GemmTwoThreadsTest, OpenBlasPathAgrees) {
  check({false, true, 128, 512, 784, 0, 0, 0, 1.0f, 1.0f, 500});
  check({true, false, 129, 33, 300, 2, 1, 3, -0.75f, 0.0f, 501});
  check({true, true, 31, 13, 7, 0, 4, 0, 2.5f, 0.5f, 502});
}

TEST_P(GemmTest, RejectsBadArguments) {
  Vec a(16), b(16), c(16);
  EXPECT_THROW(gemm(false, false, -1, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2),
               Error);
  EXPECT_THROW(gemm(false, false, 2, 2, 3, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2),
               Error);
}

INSTANTIATE_TEST_SUITE_P(EveryLevel, GemmTest, ::testing::ValuesIn(supported_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(isa_name(info.param));
                         });

}  // namespace
}  // namespace tessel::ops
