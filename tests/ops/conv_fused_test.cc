// The fused kernels conv2d_relu_* and conv2d_relu_maxpool_* against the unfused sequence they
// replace (conv2d, relu, maxpool2d and their backwards, each gradient-checked in conv_test and
// ops_test). On the direct path (at every ISA level) they must give the same bits; on the
// im2col path (strides, wide kernels) the same values up to summation order, which the
// one-image-at-a-time pooling path changes for dw and db.
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "conv_impl.h"
#include "grad_check.h"
#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

using testing::max_rel_diff;
using testing::poisoned;
using testing::randn;
using testing::Vec;

struct Case {
  Conv2dShape s;
  int64_t k, stride;  // the pool
};

std::string describe(const Case& c) {
  const Conv2dShape& s = c.s;
  std::ostringstream os;
  os << "N" << s.N << " C" << s.C << " " << s.H << "x" << s.W << " OC" << s.OC << " k" << s.KH
     << "x" << s.KW << " s" << s.stride << " p" << s.pad << " pool " << c.k << "/" << c.stride
     << (detail::conv2d_direct_supported(s) ? " (direct)" : " (im2col)");
  return os.str();
}

void PrintTo(const Case& c, std::ostream* os) { *os << describe(c); }

// What the layers compute unfused: conv2d, relu, maxpool2d; and back.
struct Unfused {
  Vec conv, relu, pooled, dpool_in, drelu, dconv, dx, dw, db;
  std::vector<int32_t> argmax;
};

class ConvFused : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    const Conv2dShape& s = c.s;
    x = randn(s.N * s.C * s.H * s.W, 71);
    w = randn(s.OC * s.C * s.KH * s.KW, 72, 0.3f);
    b = randn(s.OC, 73, 0.5f);  // a bias spread around 0, so that the ReLU cuts about half
    conv_size = s.N * s.OC * s.OH() * s.OW();
    PH = (s.OH() - c.k) / c.stride + 1;
    PW = (s.OW() - c.k) / c.stride + 1;
    pooled_size = s.N * s.OC * PH * PW;
    dy_conv = randn(conv_size, 74);
    dy_pool = randn(pooled_size, 75);
    // The unfused reference.
    Vec scratch(conv2d_scratch_floats(s));
    u.conv.resize(conv_size);
    u.relu.resize(conv_size);
    u.pooled.resize(pooled_size);
    u.argmax.resize(pooled_size);
    conv2d_forward(u.conv.data(), x.data(), w.data(), b.data(), s, scratch.data());
    relu_forward(u.relu.data(), u.conv.data(), conv_size);
    maxpool2d_forward(u.pooled.data(), u.argmax.data(), u.relu.data(), s.N, s.OC, s.OH(), s.OW(),
                      c.k, c.stride);
  }

  // conv2d_backward of dconv, with fresh gradients starting from 1 (they must accumulate).
  void conv_backward(const Vec& dconv, Vec& dx, Vec& dw, Vec& db) {
    const Conv2dShape& s = GetParam().s;
    Vec scratch(conv2d_scratch_floats(s));
    dx = poisoned(x.size());
    dw.assign(w.size(), 1.0f);
    db.assign(b.size(), 1.0f);
    conv2d_backward(dx.data(), dw.data(), db.data(), dconv.data(), x.data(), w.data(), s,
                    scratch.data());
  }

  // Bit-equal on the direct path, close on the portable one.
  void expect_same(const Vec& got, const Vec& want, const char* what, bool exact) {
    if (exact) {
      EXPECT_EQ(got, want) << what << ": " << describe(GetParam());
    } else {
      EXPECT_LT(max_rel_diff(got, want), 1e-5) << what << ": " << describe(GetParam());
    }
  }

  Vec x, w, b, dy_conv, dy_pool;
  int64_t conv_size = 0, pooled_size = 0, PH = 0, PW = 0;
  Unfused u;
};

TEST_P(ConvFused, ReluForwardAndBackwardEqualTheSequence) {
  const Conv2dShape& s = GetParam().s;
  Vec scratch(conv2d_scratch_floats(s), 1e30f), y = poisoned(conv_size);
  conv2d_relu_forward(y.data(), x.data(), w.data(), b.data(), s, scratch.data());
  EXPECT_EQ(y, u.relu) << describe(GetParam());

  Vec dconv(conv_size), dx, dw, db;
  relu_backward(dconv.data(), dy_conv.data(), u.relu.data(), conv_size);
  conv_backward(dconv, dx, dw, db);
  Vec fdx = poisoned(x.size()), fdw(w.size(), 1.0f), fdb(b.size(), 1.0f);
  conv2d_relu_backward(fdx.data(), fdw.data(), fdb.data(), dy_conv.data(), u.relu.data(), x.data(),
                       w.data(), s, scratch.data());
  EXPECT_EQ(fdx, dx) << describe(GetParam());
  EXPECT_EQ(fdw, dw) << describe(GetParam());
  EXPECT_EQ(fdb, db) << describe(GetParam());
}

TEST_P(ConvFused, ReluMaxpoolForwardAndBackwardEqualTheSequence) {
  const Case& c = GetParam();
  const Conv2dShape& s = c.s;
  const bool exact = detail::conv2d_direct_supported(s);
  Vec scratch(conv2d_relu_maxpool_scratch_floats(s, c.k, c.stride), 1e30f);
  Vec y = poisoned(pooled_size);
  std::vector<int32_t> argmax(pooled_size, -1);
  conv2d_relu_maxpool_forward(y.data(), argmax.data(), x.data(), w.data(), b.data(), s, c.k,
                              c.stride, scratch.data());
  expect_same(y, u.pooled, "pooled y", exact);
  if (exact) {
    EXPECT_EQ(argmax, u.argmax) << describe(c);
  }

  Vec drelu(conv_size), dconv(conv_size), dx, dw, db;
  maxpool2d_backward(drelu.data(), dy_pool.data(), u.argmax.data(), s.N, s.OC, s.OH(), s.OW(), c.k,
                     c.stride);
  relu_backward(dconv.data(), drelu.data(), u.relu.data(), conv_size);
  conv_backward(dconv, dx, dw, db);
  Vec fdx = poisoned(x.size()), fdw(w.size(), 1.0f), fdb(b.size(), 1.0f);
  conv2d_relu_maxpool_backward(fdx.data(), fdw.data(), fdb.data(), dy_pool.data(), u.argmax.data(),
                               u.pooled.data(), x.data(), w.data(), s, c.k, c.stride,
                               scratch.data());
  expect_same(fdx, dx, "dx", exact);
  expect_same(fdw, dw, "dw", exact);
  expect_same(fdb, db, "db", exact);

  // The first layer's call: no input gradient, the same parameter gradients.
  Vec gdw(w.size(), 1.0f), gdb(b.size(), 1.0f);
  conv2d_relu_maxpool_backward(nullptr, gdw.data(), gdb.data(), dy_pool.data(), u.argmax.data(),
                               u.pooled.data(), x.data(), w.data(), s, c.k, c.stride,
                               scratch.data());
  EXPECT_EQ(gdw, fdw) << describe(c);
  EXPECT_EQ(gdb, fdb) << describe(c);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvFused,
    ::testing::Values(Case{{5, 1, 28, 28, 16, 5, 5, 1, 2}, 2, 2},   // CNN stage 1
                      Case{{3, 16, 14, 14, 32, 5, 5, 1, 2}, 2, 2},  // CNN stage 2
                      Case{{1, 3, 9, 7, 20, 3, 3, 1, 1}, 2, 2},     // N = 1, odd sizes: a
                                                                    // leftover row and column
                      Case{{2, 2, 8, 8, 6, 3, 3, 1, 1}, 3, 2},      // overlapping windows
                      Case{{2, 2, 9, 9, 5, 3, 3, 2, 1}, 2, 2},      // stride 2: im2col path
                      Case{{2, 3, 6, 6, 4, 8, 8, 1, 3}, 2, 1}),     // kernel 8: im2col path
    [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(ConvFused, BadPoolThrows) {
  const Conv2dShape s{1, 1, 4, 4, 2, 3, 3, 1, 0};  // 2 x 2 output
  Vec x(16), w(18), b(2), y(4), scratch(1024);
  std::vector<int32_t> argmax(4);
  EXPECT_THROW(conv2d_relu_maxpool_scratch_floats(s, 3, 1), InvalidArgument);
  EXPECT_THROW(conv2d_relu_maxpool_forward(y.data(), argmax.data(), x.data(), w.data(), b.data(), s,
                                           2, 0, scratch.data()),
               InvalidArgument);
}

}  // namespace
}  // namespace tessel::ops
