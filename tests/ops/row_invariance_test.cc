// A row's bits do not depend on the call's row count or the row's position in it (the promise
// behind "the same bytes on any worker count", serve's batching and the KV cache's bits): each
// row-wise op of the models' forward paths, fed 33 distinct rows, gives row r of a call of n
// rows (n = 1..33, r at every position) the bits of that row alone, at every ISA level the host
// supports. The inputs include rows through the old IDX pixel map (p / 255 - mean) / std.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "grad_check.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/isa.h"

namespace tessel::ops {
namespace {

using testing::Vec;

constexpr int64_t kRows = 33;

// An op over `rows` rows of `in` values each, writing `out` values per row.
struct RowOp {
  std::string name;
  int64_t in, out;
  std::function<void(float* y, const float* x, int64_t rows)> run;
};

// Runs `op` on rows [first, first + n) of x, returns their outputs.
Vec run_rows(const RowOp& op, const Vec& x, int64_t first, int64_t n) {
  Vec y(static_cast<size_t>(n * op.out), -1.0f);
  op.run(y.data(), x.data() + first * op.in, n);
  return y;
}

// Every row of a call of n rows (n = 2..kRows, starting at a row that moves with n) equals its
// output alone, bit for bit, at every level. Nothing here sets the BLAS thread count: a process
// that never does gets the exact kernels (OpenBLAS's default of one thread per core did not).
void expect_row_invariant(const RowOp& op, const Vec& x) {
  const Isa saved = isa();
  for (Isa level : supported_isas()) {
    set_isa(level);
    std::vector<Vec> alone;
    for (int64_t r = 0; r < kRows; ++r) alone.push_back(run_rows(op, x, r, 1));
    for (int64_t n = 2; n <= kRows; ++n) {
      // The portable GEMM runs row by row (and its fma is a libm call): a few counts suffice.
      if (level == Isa::kPortable && n != 2 && n != 7 && n != 16 && n != kRows) continue;
      const int64_t first = (n * 7) % (kRows - n + 1);  // spread over the rows
      const Vec y = run_rows(op, x, first, n);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < op.out; ++j) {
          const float got = y[r * op.out + j], want = alone[first + r][j];
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
              << op.name << " at " << isa_name(level) << ": row " << r << " of " << n
              << " (input row " << first + r << "), element " << j << " is " << got << ", alone "
              << want;
        }
      }
    }
  }
  set_isa(saved);
}

// kRows rows of 784 pixels through the old IDX map (p / 255 - mean) / std, Fashion-MNIST's.
Vec old_pixel_rows() {
  const Vec u = testing::uniform(kRows * 784, 5, 0.0f, 256.0f);
  Vec x(u.size());
  for (size_t i = 0; i < u.size(); ++i) {
    const float p = static_cast<float>(static_cast<int>(u[i]) % 256);
    x[i] = (p / 255.0f - 0.2860f) / 0.3530f;
  }
  return x;
}

RowOp linear(int64_t in, int64_t out, uint64_t seed, bool bias = true) {
  auto w = std::make_shared<Vec>(testing::randn(out * in, seed, 0.05f));
  auto b = std::make_shared<Vec>(testing::randn(out, seed + 1, 0.1f));
  return {"linear " + std::to_string(in) + "->" + std::to_string(out) + (bias ? "" : " no bias"),
          in, out, [=](float* y, const float* x, int64_t rows) {
            linear_forward(y, x, w->data(), bias ? b->data() : nullptr, rows, in, out);
          }};
}

TEST(RowInvariance, LinearLayersOfTheMlp) {
  const Vec pixels = old_pixel_rows();
  for (bool bias : {true, false}) expect_row_invariant(linear(784, 512, 1, bias), pixels);
  const Vec h = testing::randn(kRows * 512, 2);
  for (int64_t out : {512, 10}) expect_row_invariant(linear(512, out, 3), h);
  expect_row_invariant(linear(96, 288, 4), testing::randn(kRows * 96, 5));
}

TEST(RowInvariance, WholeMlpForward) {
  const RowOp l1 = linear(784, 512, 1), l2 = linear(512, 512, 3), l3 = linear(512, 10, 6);
  const RowOp mlp{"mlp 784-512-512-10", 784, 10, [&](float* y, const float* x, int64_t rows) {
                    Vec a(rows * 512), b(rows * 512);
                    l1.run(a.data(), x, rows);
                    relu_forward(a.data(), a.data(), rows * 512);
                    l2.run(b.data(), a.data(), rows);
                    relu_forward(b.data(), b.data(), rows * 512);
                    Vec logits(rows * 10);
                    l3.run(logits.data(), b.data(), rows);
                    testing::softmax_rows(y, logits.data(), rows, 10);
                  }};
  expect_row_invariant(mlp, old_pixel_rows());
}

TEST(RowInvariance, ElementwiseAndRowReductions) {
  const Vec x = testing::randn(kRows * 200, 7, 3.0f);
  expect_row_invariant(
      {"relu", 200, 200,
       [](float* y, const float* x, int64_t rows) { relu_forward(y, x, rows * 200); }},
      x);
  expect_row_invariant(
      {"gelu", 200, 200,
       [](float* y, const float* x, int64_t rows) { gelu_forward(y, x, rows * 200); }},
      x);
  expect_row_invariant(
      {"softmax", 200, 200,
       [](float* y, const float* x, int64_t rows) { testing::softmax_rows(y, x, rows, 200); }},
      x);
  const Vec w = testing::randn(200, 8), b = testing::randn(200, 9);
  expect_row_invariant({"layernorm", 200, 200,
                        [&](float* y, const float* x, int64_t rows) {
                          Vec mean(rows), rstd(rows);
                          layernorm_forward(y, mean.data(), rstd.data(), x, w.data(), b.data(),
                                            rows, 200);
                        }},
                       x);
}

}  // namespace
}  // namespace tessel::ops
