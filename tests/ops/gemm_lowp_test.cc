// ops::gemm_lowp's two implementations (tessel's AVX512_BF16 kernel where the CPU has it, and
// the portable path) against a double-precision reference over the bf16-rounded operands: all
// four transpose combinations, edge sizes in every dimension (odd K included: the last k-pair
// is half padding), padded leading dimensions, alpha and beta, every operand type (f32, bf16,
// f16) and every C type. Products of bf16 values are exact in f32, so an f32 C is held to the
// f32 GEMM's bound; a 16-bit C may differ by its own rounding. Padding is poisoned: NaN in A
// and B must not be read, C's must stay untouched; beta = 0 starts from a NaN C.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gemm_bf16.h"
#include "gemm_shapes.h"
#include "grad_check.h"
#include "kernels.h"
#include "tessel/core/error.h"
#include "tessel/core/rng.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = -12345.0f;

enum class Impl { kNative, kPortable };

// A matrix stored as `type` elements: raw bytes plus the f32 values they hold.
struct Stored {
  DType type;
  std::vector<uint16_t> half;
  std::vector<float> full;
  const void* data() const {
    return type == DType::kF32 ? static_cast<const void*>(full.data()) : half.data();
  }
  void* data() { return type == DType::kF32 ? static_cast<void*>(full.data()) : half.data(); }
  float at(size_t i) const {
    if (type == DType::kF32) return full[i];
    return type == DType::kBF16 ? bf16_to_f32(half[i]) : f16_to_f32(half[i]);
  }
};

// rows x ld values (padding columns set to pad_value) of `type`.
Stored stored(DType type, int64_t rows, int64_t cols, int64_t ld, uint64_t seed, float pad_value) {
  std::vector<float> v = testing::randn(rows * ld, seed);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = cols; c < ld; ++c) v[r * ld + c] = pad_value;
  Stored s{type, {}, {}};
  if (type == DType::kF32) {
    s.full = v;
  } else {
    s.half.resize(v.size());
    convert(s.half.data(), type, v.data(), DType::kF32, static_cast<int64_t>(v.size()));
  }
  return s;
}

double round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

struct Case {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  int64_t pad = 0;  // added to every leading dimension
  float alpha = 1.0f, beta = 0.0f;
  DType a = DType::kBF16, b = DType::kBF16, c = DType::kF32;
  uint64_t seed = 1;
};

std::string describe(const Case& c) {
  std::ostringstream os;
  os << (c.ta ? "T" : "N") << (c.tb ? "T" : "N") << " M=" << c.M << " N=" << c.N << " K=" << c.K
     << " pad=" << c.pad << " alpha=" << c.alpha << " beta=" << c.beta << " A " << dtype_name(c.a)
     << " B " << dtype_name(c.b) << " C " << dtype_name(c.c);
  return os.str();
}

void run(Impl impl, const Case& c, Stored& A, int64_t lda, Stored& B, int64_t ldb, Stored& C,
         int64_t ldc) {
  const ConstMatrix a{A.data(), A.type, lda}, b{B.data(), B.type, ldb};
  const Matrix m{C.data(), C.type, ldc};
  if (impl == Impl::kNative)
    kernels_for(Isa::kAvx512Bf16).gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, a, b, c.beta, m);
  else
    detail::gemm_lowp_portable(c.ta, c.tb, c.M, c.N, c.K, c.alpha, a, b, c.beta, m);
}

void check(Impl impl, const Case& c) {
  SCOPED_TRACE(describe(c));
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = std::max<int64_t>(a_cols + c.pad, 1),
                ldb = std::max<int64_t>(b_cols + c.pad, 1);
  const int64_t ldc = c.N + c.pad;
  Stored A = stored(c.a, a_rows, a_cols, lda, c.seed * 3 + 1, kNaN);
  Stored B = stored(c.b, b_rows, b_cols, ldb, c.seed * 3 + 2, kNaN);
  Stored C = stored(c.c, c.M, c.N, ldc, c.seed * 3 + 3, kSentinel);
  if (c.beta == 0.0f) {
    std::vector<float> nan(static_cast<size_t>(c.N), kNaN);
    for (int64_t i = 0; i < c.M; ++i) {
      if (C.type == DType::kF32)
        std::fill(C.full.begin() + i * ldc, C.full.begin() + i * ldc + c.N, kNaN);
      else
        convert(C.half.data() + i * ldc, C.type, nan.data(), DType::kF32, c.N);
    }
  }
  const Stored C0 = C;
  run(impl, c, A, lda, B, ldb, C, ldc);

  // op(A) and op(B) rounded to bf16, in double; C row by row.
  std::vector<double> a(c.M * c.K), b(c.K * c.N);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t k = 0; k < c.K; ++k)
      a[i * c.K + k] = round_bf16(A.at(c.ta ? k * lda + i : i * lda + k));
  for (int64_t k = 0; k < c.K; ++k)
    for (int64_t j = 0; j < c.N; ++j)
      b[k * c.N + j] = round_bf16(B.at(c.tb ? j * ldb + k : k * ldb + j));
  const double c_ulp = c.c == DType::kF32 ? 0.0 : c.c == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;
  const float sentinel = C0.at(c.N < ldc ? static_cast<size_t>(c.N) : 0);
  // Big cases compare every row_step-th row only, so that the reference stays quick.
  const int64_t row_step = 1 + c.M * c.N * c.K / 3'000'000;
  int failures = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = c.N; j < ldc; ++j)
      if (C.at(i * ldc + j) != sentinel && failures++ < 5)
        ADD_FAILURE() << "padding C(" << i << "," << j << ") changed to " << C.at(i * ldc + j);
    if (i % row_step != static_cast<int64_t>(c.seed % row_step) && i != c.M - 1) continue;
    for (int64_t j = 0; j < c.N; ++j) {
      double sum = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        sum += a[i * c.K + k] * b[k * c.N + j];
        mag += std::abs(a[i * c.K + k] * b[k * c.N + j]);
      }
      const double c0 = c.beta == 0.0f ? 0.0 : C0.at(i * ldc + j);
      const double want = c.alpha * sum + c.beta * c0;
      const double bound = 1e-5 * (std::abs(c.alpha) * mag + std::abs(c.beta * c0)) +
                           c_ulp * std::abs(want) + (c.c == DType::kF16 ? 6e-8 : 1e-30);
      const double got = C.at(i * ldc + j);
      if (!(std::abs(got - want) <= bound) && failures++ < 5)
        ADD_FAILURE() << "C(" << i << "," << j << ") = " << got << ", want " << want << " (bound "
                      << bound << ")";
    }
  }
  EXPECT_EQ(failures, 0);
}

class GemmLowpTest : public ::testing::TestWithParam<Impl> {
 protected:
  void SetUp() override {
    if (GetParam() == Impl::kNative && host_isa() < Isa::kAvx512Bf16)
      GTEST_SKIP() << "this CPU or build has no AVX512_BF16 (host level " << isa_name(host_isa())
                   << ")";
  }
};

constexpr int64_t kSizes[] = {1, 2, 7, 13, 31, 33, 127, 300, 785};

// Every size in every dimension and transpose combination, the other two drawn at random,
// operand types, C type, padding, alpha and beta cycled.
TEST_P(GemmLowpTest, EdgeSizesAllTransposesAndTypes) {
  const DType types[] = {DType::kBF16, DType::kF32, DType::kF16};
  testing::for_each_edge_shape(
      kSizes, 1'000'000, CounterRng(7, mix_stream(RngPurpose::kData, 11)),
      [&](bool ta, bool tb, int64_t M, int64_t N, int64_t K, uint64_t seed) {
        Case c;
        c.ta = ta, c.tb = tb, c.M = M, c.N = N, c.K = K;
        c.pad = static_cast<int64_t>(seed % 3);
        c.alpha = seed % 3 == 0 ? -0.75f : 1.0f;
        c.beta = seed % 4 == 0 ? 0.5f : seed % 4 == 1 ? 1.0f : 0.0f;
        c.a = types[seed % 3];
        c.b = types[(seed / 3) % 3];
        c.c = types[(seed / 9) % 3];
        c.seed = seed;
        check(GetParam(), c);
      });
}

// The GEMMs of the MLP and GPT steps as the layers issue them in bf16: activations and working
// weights bf16, weight gradients f32 (beta = 1), the first layer's f32 input.
TEST_P(GemmLowpTest, ModelShapes) {
  struct S {
    bool ta, tb;
    int64_t M, N, K;
    DType a, b, c;
    float beta;
  };
  const DType f = DType::kF32, h = DType::kBF16;
  const S shapes[] = {
      {false, true, 128, 512, 784, f, h, h, 1.0f},   {true, false, 512, 784, 128, h, f, f, 1.0f},
      {false, true, 128, 10, 256, h, h, h, 1.0f},    {false, false, 128, 256, 10, h, h, h, 0.0f},
      {false, true, 512, 768, 256, h, h, h, 1.0f},   {true, false, 1024, 256, 512, h, h, f, 1.0f},
      {false, false, 512, 256, 1024, h, h, h, 0.0f}, {false, true, 256, 91, 256, h, h, h, 0.0f}};
  uint64_t seed = 50;
  for (const S& s : shapes) {
    Case c{s.ta, s.tb, s.M, s.N, s.K, 0, 1.0f, s.beta, s.a, s.b, s.c, ++seed};
    check(GetParam(), c);
  }
}

// More rows than one packed A block and more columns than one packed B block hold; K over
// several blocks into a 16-bit C.
TEST_P(GemmLowpTest, SeveralCacheBlocks) {
  check(GetParam(),
        {false, false, 700, 2100, 40, 3, 1.0f, 0.5f, DType::kBF16, DType::kBF16, DType::kF32, 201});
  check(GetParam(),
        {true, true, 350, 130, 1601, 1, -1.0f, 1.0f, DType::kBF16, DType::kF16, DType::kBF16, 202});
}

INSTANTIATE_TEST_SUITE_P(Impls, GemmLowpTest, ::testing::Values(Impl::kNative, Impl::kPortable),
                         [](const auto& info) {
                           return info.param == Impl::kNative ? "avx512_bf16" : "portable";
                         });

// The public entry: K = 0 and alpha = 0 only scale C (reading neither A nor B), bad arguments
// are errors, and the same call gives the same bits.
TEST(GemmLowp, ScalesCWithoutReadingOperands) {
  std::vector<float> a(12 * 20, kNaN), b(20 * 9, kNaN), c(12 * 9, 3.0f);
  gemm_lowp(false, false, 12, 9, 20, 0.0f, {a.data(), DType::kF32, 20}, {b.data(), DType::kF32, 9},
            0.5f, {c.data(), DType::kF32, 9});
  for (float v : c) EXPECT_EQ(v, 1.5f);
  gemm_lowp(false, false, 12, 9, 0, 1.0f, {a.data(), DType::kF32, 20}, {b.data(), DType::kF32, 9},
            0.0f, {c.data(), DType::kF32, 9});
  for (float v : c) EXPECT_EQ(v, 0.0f);
}

TEST(GemmLowp, RejectsBadArguments) {
  std::vector<float> x(64);
  EXPECT_THROW(gemm_lowp(false, false, 4, 4, 4, 1.0f, {x.data(), DType::kI32, 4},
                         {x.data(), DType::kF32, 4}, 0.0f, {x.data(), DType::kF32, 4}),
               Error);
  EXPECT_THROW(gemm_lowp(false, false, 4, 4, 4, 1.0f, {x.data(), DType::kF32, 3},
                         {x.data(), DType::kF32, 4}, 0.0f, {x.data(), DType::kF32, 4}),
               Error);
}

TEST(GemmLowp, Deterministic) {
  const Stored A = stored(DType::kBF16, 200, 300, 300, 1, 0),
               B = stored(DType::kBF16, 300, 170, 170, 2, 0);
  std::vector<float> c1(200 * 170), c2(200 * 170);
  for (std::vector<float>* c : {&c1, &c2})
    gemm_lowp(false, false, 200, 170, 300, 1.0f, {A.data(), A.type, 300}, {B.data(), B.type, 170},
              0.0f, {c->data(), DType::kF32, 170});
  EXPECT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)));
}

}  // namespace
}  // namespace tessel::ops
