// The ISA levels (tessel/ops/isa.h): names and their errors, and the promise that every level
// the host supports computes the same bits as the portable one: the f32 GEMM over edge and
// model shapes (and a row's result whatever the call's row count), conversions between the
// float types, GELU, attention's causal softmax and its backward, LayerNorm, the 2x2 max pool and
// the direct convolution with its fusions. The suites of each kernel (gemm_test, conv_test, ...)
// check each level against its reference; this one checks the levels against each other.
#include "tessel/ops/isa.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "conv_impl.h"
#include "gemm_shapes.h"
#include "grad_check.h"
#include "kernels.h"
#include "tessel/core/error.h"
#include "tessel/core/rng.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

using testing::Vec;

TEST(Isa, NamesRoundTripAndUnknownNamesAreRefused) {
  for (Isa l : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    EXPECT_EQ(parse_isa(isa_name(l)), l);
  }
  try {
    parse_isa("avx3");
    FAIL() << "avx3 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'avx3'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("portable, avx2, avx512, avx512_bf16"), std::string::npos)
        << e.what();
  }
}

TEST(Isa, HostLevelIsSupportedAndHigherOnesAreRefused) {
  const std::vector<Isa> levels = supported_isas();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), Isa::kPortable);
  EXPECT_EQ(levels.back(), host_isa());
  EXPECT_LE(isa(), host_isa());
  if (host_isa() == Isa::kAvx512Bf16) GTEST_SKIP() << "no level above this host's";
  const Isa above = static_cast<Isa>(static_cast<int>(host_isa()) + 1);
  EXPECT_THROW(set_isa(above), InvalidArgument);
  EXPECT_NE(isa_description().find(isa_name(host_isa())), std::string::npos);
}

// C of one GEMM case at `level`, C starting from `c0` (beta != 0) or NaN (beta = 0). A's rows
// are stored 3 floats apart past their end, the gap NaN: a kernel that reads A in place (AVX2)
// must keep to its rows.
Vec gemm_at(Isa level, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const Vec& A,
            const Vec& B, float beta, const Vec& c0) {
  const int64_t cols = ta ? M : K, rows = ta ? K : M, lda = cols + 3;
  Vec a(rows * lda, std::numeric_limits<float>::quiet_NaN());
  for (int64_t r = 0; r < rows; ++r) std::copy_n(A.data() + r * cols, cols, a.data() + r * lda);
  Vec C = beta == 0.0f ? Vec(M * N, std::numeric_limits<float>::quiet_NaN()) : c0;
  kernels_for(level).sgemm(ta, tb, M, N, K, alpha, a.data(), lda, B.data(), tb ? K : N, beta,
                           C.data(), N);
  return C;
}

// Bitwise equality, naming the first differing element.
void expect_same_bits(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) {
      FAIL() << what << ": element " << i << " is " << got[i] << ", want " << want[i];
    }
  }
}

TEST(Isa, GemmGivesThePortableBitsAtEveryLevel) {
  constexpr int64_t kSizes[] = {1, 7, 13, 31, 33, 129, 320, 321, 784, 1000};
  testing::for_each_edge_shape(
      kSizes, 3'000'000, CounterRng(7, mix_stream(RngPurpose::kData, 3)),
      [&](bool ta, bool tb, int64_t M, int64_t N, int64_t K, uint64_t seed) {
        const Vec A = testing::randn(M * K, seed * 3), B = testing::randn(K * N, seed * 3 + 1);
        const Vec c0 = testing::randn(M * N, seed * 3 + 2);
        const float alpha = seed % 3 == 0 ? -0.75f : 1.0f;
        const float beta = seed % 2 == 0 ? 0.0f : (seed % 4 == 1 ? 1.0f : 0.5f);
        const Vec want = gemm_at(Isa::kPortable, ta, tb, M, N, K, alpha, A, B, beta, c0);
        for (Isa l : supported_isas()) {
          expect_same_bits(gemm_at(l, ta, tb, M, N, K, alpha, A, B, beta, c0), want,
                           std::string(isa_name(l)) + (ta ? " T" : " N") + (tb ? "T" : "N") +
                               " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                               " K=" + std::to_string(K));
        }
      });
}

// gemm_lowp's f32 path (no native bf16) gives the portable bits at every level, whether the
// level rounds the operands to bf16 while packing them and a 16-bit C in its tile stores
// (sgemm_lowp) or into f32 copies first: each operand and C f32, bf16 or f16, with bf16
// rounding ties and subnormals among the values, over edge shapes in all transpose combinations
// (K up to 784: C's sum over one K block and over several).
TEST(Isa, GemmLowpRoundingWhilePackingGivesThePortableBits) {
  constexpr int64_t kSizes[] = {1, 7, 17, 33, 129, 321, 784};
  const DType types[] = {DType::kF32, DType::kBF16, DType::kF16};
  // n values stored as t (bits in `stored`), and the f32 values they round to in bf16.
  auto operand = [](int64_t n, uint64_t seed, DType t, std::vector<uint32_t>& stored) {
    Vec v = testing::randn(n, seed);
    for (int64_t i = 0; i < n; i += 5)  // a tie halfway between two bf16 values
      v[i] = std::bit_cast<float>((std::bit_cast<uint32_t>(v[i]) & 0xffff0000u) | 0x8000u);
    for (int64_t i = 3; i < n; i += 37) v[i] = i % 2 ? 3e-39f : -1e-40f;  // f32 subnormals
    stored.assign(n, 0);
    if (t == DType::kF32) std::memcpy(stored.data(), v.data(), n * sizeof(float));
    if (t != DType::kF32) portable::convert(stored.data(), t, v.data(), DType::kF32, n);
    std::vector<uint16_t> bf16(n);
    Vec rounded(n);
    portable::convert(bf16.data(), DType::kBF16, stored.data(), t, n);
    portable::convert(rounded.data(), DType::kF32, bf16.data(), DType::kBF16, n);
    return rounded;
  };
  testing::for_each_edge_shape(
      kSizes, 2'000'000, CounterRng(9, mix_stream(RngPurpose::kData, 5)),
      [&](bool ta, bool tb, int64_t M, int64_t N, int64_t K, uint64_t seed) {
        const DType at = types[seed % 3], bt = types[(seed / 3) % 3], ct = types[(seed / 9) % 3];
        std::vector<uint32_t> a_bits, b_bits, c_bits;
        const Vec a = operand(M * K, seed * 3, at, a_bits),
                  b = operand(K * N, seed * 3 + 1, bt, b_bits);
        const float beta = seed % 2 == 0 ? 0.0f : 1.0f;
        // C starts as c0 stored in ct (NaN when beta = 0: it must not be read); the portable
        // level updates it widened to f32, then rounds the result to ct once.
        Vec c0 = testing::randn(M * N, seed * 3 + 2);
        if (beta == 0.0f) c0.assign(M * N, std::numeric_limits<float>::quiet_NaN());
        std::vector<uint32_t> c_start(M * N);
        portable::convert(c_start.data(), ct, c0.data(), DType::kF32, M * N);
        Vec c_wide(M * N);
        portable::convert(c_wide.data(), DType::kF32, c_start.data(), ct, M * N);
        const Vec want_f32 = gemm_at(Isa::kPortable, ta, tb, M, N, K, 1.0f, a, b, beta, c_wide);
        std::vector<uint32_t> want(M * N);
        portable::convert(want.data(), ct, want_f32.data(), DType::kF32, M * N);
        for (Isa l : supported_isas()) {
          if (kernels_for(l).sgemm_lowp == nullptr) continue;  // copies: the sgemm test's
          std::vector<uint32_t> got = c_start;
          kernels_for(l).sgemm_lowp(ta, tb, M, N, K, 1.0f, {a_bits.data(), at, ta ? M : K},
                                    {b_bits.data(), bt, tb ? K : N}, beta, {got.data(), ct, N});
          const std::string what = std::string(isa_name(l)) + (ta ? " T" : " N") +
                                   (tb ? "T" : "N") + " M=" + std::to_string(M) +
                                   " N=" + std::to_string(N) + " K=" + std::to_string(K) + " A " +
                                   dtype_name(at) + " B " + dtype_name(bt) + " C " + dtype_name(ct);
          const size_t bytes = M * N * dtype_size(ct);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), bytes), 0) << what;
        }
      });
}

// A row's result does not depend on how many rows the call has (the promise behind "the same
// bytes on any worker count" and the KV cache's bits): rows [3, 3 + m) of a 200-row product
// equal a product of those m rows alone, for the linear layer's forward (B transposed) and
// backward (B plain) orientations.
TEST(Isa, ARowsBitsDoNotDependOnTheRowCount) {
  constexpr int64_t M = 200, N = 96, K = 700;
  for (bool tb : {true, false}) {
    const Vec A = testing::randn(M * K, 11), B = testing::randn(K * N, 12);
    for (Isa l : supported_isas()) {
      const Vec all = gemm_at(l, false, tb, M, N, K, 1.0f, A, B, 0.0f, {});
      for (int64_t m : {1, 2, 5, 17, 64}) {
        const Vec part(A.begin() + 3 * K, A.begin() + (3 + m) * K);
        const Vec got = gemm_at(l, false, tb, m, N, K, 1.0f, part, B, 0.0f, {});
        expect_same_bits(got, Vec(all.begin() + 3 * N, all.begin() + (3 + m) * N),
                         std::string(isa_name(l)) + " rows=" + std::to_string(m));
      }
    }
  }
}

// Random floats with the special values mixed in: NaN, infinities, signed zeros, f32 and f16
// subnormals, values that round to even in bf16 and f16, f16 overflow.
std::vector<float> awkward_floats(int64_t n) {
  std::vector<float> v = testing::randn(n, 21);
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            0.0f,
                            -0.0f,
                            1e-40f,
                            -3e-39f,
                            6e-8f,
                            3e-5f,
                            65504.0f,
                            70000.0f,
                            std::bit_cast<float>(0x3f808000u),
                            std::bit_cast<float>(0x3f818000u),
                            std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < std::size(specials); ++i) v[i * 7 % n] = specials[i];
  for (int64_t i = 0; i < n; i += 5) v[i] *= 1e4f;
  return v;
}

// Bits of n elements of type t, NaNs all alike (f16 NaN payloads are not promised).
std::vector<uint32_t> canonical(const void* p, DType t, int64_t n) {
  std::vector<uint32_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    float f;
    if (t == DType::kF32) {
      f = static_cast<const float*>(p)[i];
    } else {
      const uint16_t h = static_cast<const uint16_t*>(p)[i];
      f = t == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
    out[i] = std::isnan(f) ? 0x7fc00000u : std::bit_cast<uint32_t>(f);
  }
  return out;
}

TEST(Isa, ConversionsGiveThePortableBitsAtEveryLevel) {
  constexpr int64_t n = 1003;  // whole vectors and a tail
  const std::vector<float> f32 = awkward_floats(n);
  const DType types[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (DType from : types) {
    // The source in its own type, made by the portable conversion.
    std::vector<uint32_t> src(n);
    if (from != DType::kF32) portable::convert(src.data(), from, f32.data(), DType::kF32, n);
    const void* in = from == DType::kF32 ? static_cast<const void*>(f32.data()) : src.data();
    for (DType to : types) {
      if (to == from) continue;
      std::vector<uint32_t> want(n), got(n);
      portable::convert(want.data(), to, in, from, n);
      for (Isa l : supported_isas()) {
        kernels_for(l).convert(got.data(), to, in, from, n);
        EXPECT_EQ(canonical(got.data(), to, n), canonical(want.data(), to, n))
            << isa_name(l) << ": " << dtype_name(from) << " -> " << dtype_name(to);
      }
    }
  }
}

TEST(Isa, GeluGivesThePortableBitsAtEveryLevel) {
  constexpr int64_t n = 1003;
  std::vector<float> x = awkward_floats(n);
  for (int64_t i = 0; i < n; i += 3) x[i] *= 1e-4f;  // the range where tanh's polynomial works
  const Vec dy = testing::randn(n, 22);
  Vec want_y(n), want_dx(n), y(n), dx(n);
  portable::gelu_forward(want_y.data(), x.data(), n);
  portable::gelu_backward(want_dx.data(), dy.data(), x.data(), n);
  for (Isa l : supported_isas()) {
    kernels_for(l).gelu_forward(y.data(), x.data(), n);
    kernels_for(l).gelu_backward(dx.data(), dy.data(), x.data(), n);
    EXPECT_EQ(canonical(y.data(), DType::kF32, n), canonical(want_y.data(), DType::kF32, n))
        << isa_name(l);
    EXPECT_EQ(canonical(dx.data(), DType::kF32, n), canonical(want_dx.data(), DType::kF32, n))
        << isa_name(l);
  }
}

TEST(Isa, CausalSoftmaxGivesThePortableBitsAtEveryLevel) {
  // A query block of 37 rows from position 40, 77 keys, rows 101 apart: rows of 41 to 77 keys
  // (lane tails of every length), zeros after each row's keys, the rest of a row untouched.
  constexpr int64_t rows = 37, ld = 101, first = 40, keys = 77;
  constexpr float scale = 0.25f;
  Vec scores = testing::randn(rows * ld, 23);
  for (float& s : scores) s *= 8.0f;  // a wide range of exponents
  const Vec dp = testing::randn(rows * ld, 28);
  Vec want = scores, want_ds = dp;
  portable::causal_softmax(want.data(), rows, ld, first, keys);
  portable::causal_softmax_backward(want_ds.data(), want.data(), rows, ld, first, keys, scale);
  EXPECT_EQ(want[keys - 1], 0.0f);  // row 0 has 41 keys
  EXPECT_EQ(want[keys], scores[keys]);
  EXPECT_EQ(want_ds[keys - 1], 0.0f);
  EXPECT_EQ(want_ds[keys], dp[keys]);
  const auto bits = [](const Vec& v) { return canonical(v.data(), DType::kF32, rows * ld); };
  for (Isa l : supported_isas()) {
    Vec got = scores, ds = dp;
    kernels_for(l).causal_softmax(got.data(), rows, ld, first, keys);
    kernels_for(l).causal_softmax_backward(ds.data(), want.data(), rows, ld, first, keys, scale);
    EXPECT_EQ(bits(got), bits(want)) << isa_name(l);
    EXPECT_EQ(bits(ds), bits(want_ds)) << isa_name(l);
  }
}

TEST(Isa, LayerNormGivesThePortableBitsAtEveryLevel) {
  // Rows of 77 values: two vectors of 16 lanes and a tail, an offset that the mean removes.
  constexpr int64_t N = 9, C = 77;
  Vec x = testing::randn(N * C, 24), w = testing::randn(C, 25), b = testing::randn(C, 26);
  const Vec dy = testing::randn(N * C, 27);
  for (float& v : x) v = 3.0f + 0.5f * v;
  Vec want_y(N * C), want_mean(N), want_rstd(N), want_dx(N * C), want_dw(C, 0.25f), want_db(C);
  portable::layernorm_forward(want_y.data(), want_mean.data(), want_rstd.data(), x.data(), w.data(),
                              b.data(), N, C);
  portable::layernorm_backward(want_dx.data(), want_dw.data(), want_db.data(), dy.data(), x.data(),
                               w.data(), want_mean.data(), want_rstd.data(), N, C);
  const auto bits = [](const Vec& v) {
    return canonical(v.data(), DType::kF32, static_cast<int64_t>(v.size()));
  };
  for (Isa l : supported_isas()) {
    Vec y(N * C), mean(N), rstd(N), dx(N * C), dw(C, 0.25f), db(C);
    kernels_for(l).layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                     b.data(), N, C);
    kernels_for(l).layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(),
                                      w.data(), mean.data(), rstd.data(), N, C);
    EXPECT_EQ(bits(y), bits(want_y)) << isa_name(l);
    EXPECT_EQ(bits(mean), bits(want_mean)) << isa_name(l);
    EXPECT_EQ(bits(rstd), bits(want_rstd)) << isa_name(l);
    EXPECT_EQ(bits(dx), bits(want_dx)) << isa_name(l);
    EXPECT_EQ(bits(dw), bits(want_dw)) << isa_name(l);
    EXPECT_EQ(bits(db), bits(want_db)) << isa_name(l);
  }
}

TEST(Isa, MaxPoolGivesThePortableResultAtEveryLevel) {
  // Rows of 14 outputs (a full and a partial chunk at 8 and 16 lanes), 16, and 3 (one short).
  constexpr int64_t kShapes[][3] = {{5, 13, 29}, {3, 4, 32}, {2, 7, 6}};
  for (const auto& [planes, H, W] : kShapes) {
    const int64_t OH = H / 2, OW = W / 2;
    Vec x = testing::randn(planes * H * W, 31);
    x[40] = std::numeric_limits<float>::quiet_NaN();
    x[41] = x[42] = 2.0f;  // ties keep the first in scan order
    x[W + 3] = x[W + 2] = std::numeric_limits<float>::quiet_NaN();  // a NaN after a NaN
    x[2 * W + 4] = -std::numeric_limits<float>::infinity();
    x[3 * W + 4] = std::numeric_limits<float>::infinity();
    Vec want(planes * OH * OW), got(want.size());
    std::vector<int32_t> want_at(want.size()), got_at(want.size());
    portable::maxpool_2x2(want.data(), want_at.data(), x.data(), planes, H, W, OH, OW);
    for (Isa l : supported_isas()) {
      kernels_for(l).maxpool_2x2(got.data(), got_at.data(), x.data(), planes, H, W, OH, OW);
      const std::string what = std::string(isa_name(l)) + " W=" + std::to_string(W);
      EXPECT_EQ(canonical(got.data(), DType::kF32, got.size()),
                canonical(want.data(), DType::kF32, want.size()))
          << what;
      EXPECT_EQ(got_at, want_at) << what;
    }
  }
}

// One level's direct convolution: the forward, then the backward from the portable forward's
// y and argmax (so that every level gets the same inputs), dw and db accumulating onto dw0, db0;
// then the backward again without dx, from dw0 and db0 (dw_only, db_only).
struct DirectConv {
  Vec y, dx, dw, db;
  std::vector<int32_t> argmax;
  Vec dw_only, db_only;  // from a backward without dx (a first layer's)
};

DirectConv direct_conv_at(Isa level, const Conv2dShape& s, const detail::ConvFusion& f,
                          const Vec& x, const Vec& w, const Vec& b, const Vec& dy,
                          const DirectConv* forward, const Vec& dw0, const Vec& db0) {
  const CpuKernels& k = kernels_for(level);
  const int64_t out =
      f.pooled() ? s.N * detail::conv_pooled_size(s, f) : s.N * s.OC * s.OH() * s.OW();
  Vec scratch(k.conv_direct_scratch(s, f), std::numeric_limits<float>::quiet_NaN());
  DirectConv r{testing::poisoned(out), testing::poisoned(x.size()), dw0, db0, {}, dw0, db0};
  r.argmax.assign(f.pooled() ? out : 0, -1);
  k.conv_direct_forward(r.y.data(), r.argmax.data(), x.data(), w.data(), b.data(), f, s,
                        scratch.data());
  const DirectConv& fw = forward != nullptr ? *forward : r;
  k.conv_direct_backward(r.dx.data(), r.dw.data(), r.db.data(), dy.data(), fw.y.data(),
                         fw.argmax.data(), f, x.data(), w.data(), s, scratch.data());
  k.conv_direct_backward(nullptr, r.dw_only.data(), r.db_only.data(), dy.data(), fw.y.data(),
                         fw.argmax.data(), f, x.data(), w.data(), s, scratch.data());
  return r;
}

// Every level's direct convolution gives the portable kernel's bits: forward (with the bias, the
// ReLU, the max pool), input, weight and bias gradients, on shapes with odd channel counts
// (lane tails at 8 and 16 lanes), 1x1 to 7x7 kernels, non-square ones, every padding from 0 to
// k - 1, rows wider than one tile, overlapping pool windows, and signed zeros in the inputs and dy.
TEST(Isa, DirectConvGivesThePortableBitsAtEveryLevel) {
  const Conv2dShape shapes[] = {
      {3, 1, 28, 28, 16, 5, 5, 1, 2},  // the CNN's stages
      {2, 16, 14, 14, 32, 5, 5, 1, 2}, {2, 3, 9, 7, 20, 3, 3, 1, 1},  {1, 5, 11, 13, 7, 1, 1, 1, 0},
      {2, 7, 10, 9, 33, 3, 3, 1, 2},   {2, 4, 12, 17, 9, 5, 5, 1, 4}, {1, 2, 8, 30, 40, 5, 5, 1, 0},
      {2, 3, 7, 6, 3, 7, 7, 1, 3},     {1, 17, 6, 6, 5, 3, 7, 1, 2},  {1, 10, 9, 9, 12, 7, 7, 1, 3},
      {2, 9, 5, 4, 24, 2, 3, 1, 0},
  };
  uint64_t seed = 100;
  for (const Conv2dShape& s : shapes) {
    for (const detail::ConvFusion& f :
         {detail::ConvFusion{}, detail::ConvFusion{true}, detail::ConvFusion{true, 2, 2},
          detail::ConvFusion{true, 3, 2}}) {
      if (f.pooled() && (s.OH() < f.pool_k || s.OW() < f.pool_k)) continue;
      ASSERT_TRUE(detail::conv2d_direct_supported(s));
      Vec x = testing::randn(s.N * s.C * s.H * s.W, ++seed);
      Vec w = testing::randn(s.OC * s.C * s.KH * s.KW, ++seed, 0.3f);
      Vec b = testing::randn(s.OC, ++seed, 0.5f);
      x[0] = -0.0f;
      x[x.size() / 2] = 0.0f;
      b[0] = -0.0f;
      const int64_t out =
          f.pooled() ? s.N * detail::conv_pooled_size(s, f) : s.N * s.OC * s.OH() * s.OW();
      Vec dy = testing::randn(out, ++seed);
      dy[0] = -0.0f;  // a signed zero through the ReLU and the pool's scatter
      dy[dy.size() / 3] = -0.0f;
      const Vec dw0 = testing::randn(w.size(), ++seed), db0 = testing::randn(b.size(), ++seed);
      const DirectConv want = direct_conv_at(Isa::kPortable, s, f, x, w, b, dy, nullptr, dw0, db0);
      for (Isa l : supported_isas()) {
        const DirectConv got = direct_conv_at(l, s, f, x, w, b, dy, &want, dw0, db0);
        std::ostringstream what;
        what << isa_name(l) << " N" << s.N << " C" << s.C << " " << s.H << "x" << s.W << " OC"
             << s.OC << " k" << s.KH << "x" << s.KW << " p" << s.pad << " relu " << f.relu
             << " pool " << f.pool_k;
        expect_same_bits(got.y, want.y, what.str() + " y");
        EXPECT_EQ(got.argmax, want.argmax) << what.str();
        expect_same_bits(got.dx, want.dx, what.str() + " dx");
        expect_same_bits(got.dw, want.dw, what.str() + " dw");
        expect_same_bits(got.db, want.db, what.str() + " db");
        expect_same_bits(got.dw_only, want.dw, what.str() + " dw without dx");
        expect_same_bits(got.db_only, want.db, what.str() + " db without dx");
      }
    }
  }
}

}  // namespace
}  // namespace tessel::ops
