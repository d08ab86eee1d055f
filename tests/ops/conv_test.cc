// Conv2d and MaxPool2d. Each convolution implementation (the public entry points, which
// dispatch; im2col + GEMM; the direct kernels of the ISA level in use where the shape allows) runs
// every shape: finite-difference gradient checks on small shapes, agreement with a direct
// seven-loop convolution in double on larger ones (the CNN's layers, N = 1, C = 1, lane counts
// around 16 and 32, wide and narrow rows, odd sizes, strides, paddings, kernel widths up to 8),
// accumulation into dw and db, and bit-reproducibility across runs and threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "conv_impl.h"
#include "grad_check.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {

// How gtest prints a shape in test listings (instead of its bytes).
void PrintTo(const Conv2dShape& s, std::ostream* os) {
  *os << "N" << s.N << " C" << s.C << " " << s.H << "x" << s.W << " OC" << s.OC << " k" << s.KH
      << "x" << s.KW << " s" << s.stride << " p" << s.pad;
}

namespace {

using testing::expect_grad;
using testing::max_rel_diff;
using testing::poisoned;
using testing::randn;
using testing::Vec;
using testing::weighted_sum;

std::string describe(const Conv2dShape& s) {
  std::ostringstream os;
  PrintTo(s, &os);
  return os.str();
}

int64_t in_numel(const Conv2dShape& s) { return s.N * s.C * s.H * s.W; }
int64_t out_numel(const Conv2dShape& s) { return s.N * s.OC * s.OH() * s.OW(); }
int64_t w_numel(const Conv2dShape& s) { return s.OC * s.C * s.KH * s.KW; }

// One implementation of the conv2d forward/backward pair.
struct Impl {
  const char* name;
  bool (*supports)(const Conv2dShape&);
  int64_t (*scratch)(const Conv2dShape&);
  void (*forward)(float* y, const float* x, const float* w, const float* b, const Conv2dShape& s,
                  float* scratch);
  void (*backward)(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                   const Conv2dShape& s, float* scratch);
};

const Impl kImpls[] = {
    {"public", [](const Conv2dShape&) { return true; }, conv2d_scratch_floats, conv2d_forward,
     conv2d_backward},
    {"im2col", [](const Conv2dShape&) { return true; }, detail::conv2d_im2col_scratch_floats,
     detail::conv2d_im2col_forward,
     [](float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
        const Conv2dShape& s, float* scratch) {
       detail::conv2d_im2col_backward(dx, dw, db, dy, nullptr, x, w, s, scratch);
     }},
    {"direct", detail::conv2d_direct_supported,
     [](const Conv2dShape& s) { return detail::conv2d_direct_scratch_floats(s, {}); },
     [](float* y, const float* x, const float* w, const float* b, const Conv2dShape& s,
        float* scratch) { detail::conv2d_direct_forward(y, nullptr, x, w, b, {}, s, scratch); },
     [](float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
        const Conv2dShape& s, float* scratch) {
       detail::conv2d_direct_backward(dx, dw, db, dy, nullptr, nullptr, {}, x, w, s, scratch);
     }},
};

// Runs check(impl) for every implementation that takes the shape (the direct kernels not
// outside stride 1 / kernel width <= 7 / pad < kernel), each traced
// by name: one test process per shape, not per shape and implementation.
template <typename F>
void for_each_impl(const Conv2dShape& s, F check) {
  for (const Impl& impl : kImpls) {
    if (!impl.supports(s)) continue;
    SCOPED_TRACE(std::string(impl.name) + ", " + describe(s));
    check(impl);
  }
}

std::string case_name(const ::testing::TestParamInfo<Conv2dShape>& info) {
  return "case" + std::to_string(info.index);
}

// Direct convolution and its gradients, accumulated in double. Calls f(x index, w index,
// y index) for every (input, weight, output) triple that meets.
template <typename F>
void for_each_tap(const Conv2dShape& s, F f) {
  const int64_t OH = s.OH(), OW = s.OW();
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t oc = 0; oc < s.OC; ++oc)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow)
          for (int64_t c = 0; c < s.C; ++c)
            for (int64_t kh = 0; kh < s.KH; ++kh)
              for (int64_t kw = 0; kw < s.KW; ++kw) {
                const int64_t ih = oh * s.stride - s.pad + kh, iw = ow * s.stride - s.pad + kw;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                f(((n * s.C + c) * s.H + ih) * s.W + iw, ((oc * s.C + c) * s.KH + kh) * s.KW + kw,
                  ((n * s.OC + oc) * OH + oh) * OW + ow);
              }
}

Vec to_float(const std::vector<double>& v) { return Vec(v.begin(), v.end()); }

class ConvGrad : public ::testing::TestWithParam<Conv2dShape> {};

TEST_P(ConvGrad, FiniteDifferences) {
  const Conv2dShape s = GetParam();
  for_each_impl(s, [&](const Impl& impl) {
    Vec x = randn(in_numel(s), 31), w = randn(w_numel(s), 32, 0.5f), b = randn(s.OC, 33);
    Vec r = randn(out_numel(s), 34), scratch(impl.scratch(s));
    auto objective = [&] {
      Vec y(out_numel(s));
      impl.forward(y.data(), x.data(), w.data(), b.data(), s, scratch.data());
      return weighted_sum(r, y);
    };
    Vec dx = poisoned(in_numel(s)), dw(w_numel(s), 0.0f), db(s.OC, 0.0f);
    std::fill(scratch.begin(), scratch.end(), 1e30f);  // the kernel must not read stale scratch
    impl.backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), s, scratch.data());
    expect_grad("conv2d dx", x, dx, objective);
    expect_grad("conv2d dw", w, dw, objective);
    expect_grad("conv2d db", b, db, objective);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvGrad,
    ::testing::Values(Conv2dShape{2, 2, 6, 5, 3, 3, 3, 1, 0},   // stride 1, pad 0
                      Conv2dShape{2, 2, 7, 6, 3, 3, 3, 2, 1},   // stride 2, pad 1
                      Conv2dShape{1, 3, 5, 5, 2, 5, 5, 1, 2},   // stride 1, pad 2, "same"
                      Conv2dShape{2, 2, 7, 7, 4, 3, 2, 2, 0},   // non-square kernel
                      Conv2dShape{1, 2, 6, 6, 3, 3, 3, 2, 2},   // stride 2, pad 2
                      Conv2dShape{2, 1, 5, 5, 2, 1, 1, 1, 0},   // 1x1 kernel
                      Conv2dShape{1, 1, 9, 9, 17, 3, 3, 1, 1},  // C = 1; 17 lanes: 2 zmm, 3 ymm
                      Conv2dShape{2, 18, 5, 4, 2, 3, 3, 1, 1},  // 18 input lanes, short rows
                      Conv2dShape{1, 2, 4, 30, 3, 2, 7, 1, 1},  // widest kernel, rows tiled
                      Conv2dShape{1, 3, 3, 3, 33, 3, 3, 1,
                                  1}),  // 33 lanes: 32 + 1 (16 + 16 + 1 in ymm)
    case_name);

class ConvReference : public ::testing::TestWithParam<Conv2dShape> {};

TEST_P(ConvReference, MatchesDirectConvolution) {
  const Conv2dShape s = GetParam();
  for_each_impl(s, [&](const Impl& impl) {
    Vec x = randn(in_numel(s), 41), w = randn(w_numel(s), 42, 0.2f), b = randn(s.OC, 43);
    Vec dy = randn(out_numel(s), 44);
    std::vector<double> y_ref(out_numel(s)), dx_ref(in_numel(s), 0.0), dw_ref(w_numel(s), 0.0);
    std::vector<double> db_ref(s.OC, 0.0);
    const int64_t OHW = s.OH() * s.OW();
    for (int64_t i = 0; i < out_numel(s); ++i) {
      y_ref[i] = b[(i / OHW) % s.OC];
      db_ref[(i / OHW) % s.OC] += dy[i];
    }
    for_each_tap(s, [&](int64_t xi, int64_t wi, int64_t yi) {
      y_ref[yi] += static_cast<double>(x[xi]) * w[wi];
      dx_ref[xi] += static_cast<double>(w[wi]) * dy[yi];
      dw_ref[wi] += static_cast<double>(x[xi]) * dy[yi];
    });

    Vec scratch(impl.scratch(s), 1e30f), y = poisoned(out_numel(s));
    impl.forward(y.data(), x.data(), w.data(), b.data(), s, scratch.data());
    EXPECT_LT(max_rel_diff(y, to_float(y_ref)), 1e-5) << describe(s);

    // Parameter gradients start from a non-zero value: the kernel must add to it.
    Vec dx = poisoned(in_numel(s)), dw(w_numel(s), 1.0f), db(s.OC, 1.0f);
    impl.backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), s,
                  scratch.data());
    for (auto& v : dw_ref) v += 1.0;
    for (auto& v : db_ref) v += 1.0;
    EXPECT_LT(max_rel_diff(dx, to_float(dx_ref)), 1e-5) << describe(s);
    EXPECT_LT(max_rel_diff(dw, to_float(dw_ref)), 1e-5) << describe(s);
    EXPECT_LT(max_rel_diff(db, to_float(db_ref)), 1e-5) << describe(s);

    // Null dx: the same parameter gradients, dx untouched.
    Vec dw2(w_numel(s), 1.0f), db2(s.OC, 1.0f);
    impl.backward(nullptr, dw2.data(), db2.data(), dy.data(), x.data(), w.data(), s,
                  scratch.data());
    EXPECT_EQ(dw2, dw) << describe(s);
    EXPECT_EQ(db2, db) << describe(s);
  });
}

// The CNN's layers at small and odd batches, and shapes around every tiling edge of the
// direct kernels (lane blocks of 32 + 16, rows of 1..7 positions taken two at a time, rows cut
// into tiles, odd row counts) and of the im2col path (image groups, a short last group).
const Conv2dShape kReferenceShapes[] = {
    {6, 1, 28, 28, 16, 5, 5, 1, 2},   // CNN conv1
    {7, 16, 14, 14, 32, 5, 5, 1, 2},  // CNN conv2
    {1, 16, 14, 14, 32, 5, 5, 1, 2},  // CNN conv2, N = 1
    {1, 1, 28, 28, 16, 5, 5, 1, 2},   // CNN conv1, N = 1
    {9, 8, 15, 13, 6, 3, 3, 2, 1},    // stride 2, odd sizes
    {3, 4, 9, 9, 5, 4, 4, 3, 0},      // stride 3, even kernel
    {3, 40, 9, 11, 48, 3, 3, 1, 1},   // 40 input lanes (32 + 8), 48 output lanes (32 + 16)
    {2, 5, 12, 33, 20, 3, 7, 1, 2},   // kernel width 7, 31 columns in 3 tiles, 20 lanes
    {2, 3, 8, 8, 4, 1, 1, 1, 0},      // 1x1
    {2, 3, 7, 5, 16, 3, 3, 1, 0},     // no padding, 5 rows x 3 columns out
    {2, 2, 5, 5, 3, 3, 3, 1, 2},      // pad = kernel - 1: the input gradient's pad is 0
    {2, 4, 10, 10, 8, 8, 8, 1, 3},    // kernel width 8: im2col only
    {1, 2, 6, 6, 3, 3, 3, 1, 3},      // pad >= kernel: im2col only
    {2, 6, 1, 9, 32, 1, 3, 1, 0},     // one row
    {2, 33, 6, 2, 1, 2, 2, 1, 1},     // one output channel, 33 input lanes, 3 columns out
};

INSTANTIATE_TEST_SUITE_P(Shapes, ConvReference, ::testing::ValuesIn(kReferenceShapes), case_name);

class ConvRepeat : public ::testing::TestWithParam<Conv2dShape> {};

TEST_P(ConvRepeat, BackwardAccumulatesTwice) {
  const Conv2dShape s = GetParam();
  for_each_impl(s, [&](const Impl& impl) {
    Vec x = randn(in_numel(s), 51), w = randn(w_numel(s), 52), dy = randn(out_numel(s), 53);
    Vec scratch(impl.scratch(s)), dx(in_numel(s)), dw1(w_numel(s), 0.0f);
    Vec dw2(w_numel(s), 0.0f), db1(s.OC, 0.0f), db2(s.OC, 0.0f);
    impl.backward(dx.data(), dw1.data(), db1.data(), dy.data(), x.data(), w.data(), s,
                  scratch.data());
    for (int rep = 0; rep < 2; ++rep) {
      impl.backward(dx.data(), dw2.data(), db2.data(), dy.data(), x.data(), w.data(), s,
                    scratch.data());
    }
    for (auto& v : dw1) v *= 2.0f;
    for (auto& v : db1) v *= 2.0f;
    EXPECT_LT(max_rel_diff(dw2, dw1), 1e-6);
    EXPECT_LT(max_rel_diff(db2, db1), 1e-6);
  });
}

// The same bits on every run, and when other threads run the same kernels at the same time
// (each with its own scratch): no state, no order that depends on timing.
TEST_P(ConvRepeat, SameBitsAcrossRunsAndThreads) {
  const Conv2dShape s = GetParam();
  for_each_impl(s, [&](const Impl& impl) {
    const Vec x = randn(in_numel(s), 61), w = randn(w_numel(s), 62), b = randn(s.OC, 63);
    const Vec dy = randn(out_numel(s), 64);
    struct Result {
      Vec y, dx, dw, db;
    };
    auto run = [&] {
      Result r{Vec(out_numel(s)), Vec(in_numel(s)), Vec(w_numel(s), 0.0f), Vec(s.OC, 0.0f)};
      Vec scratch(impl.scratch(s));
      impl.forward(r.y.data(), x.data(), w.data(), b.data(), s, scratch.data());
      impl.backward(r.dx.data(), r.dw.data(), r.db.data(), dy.data(), x.data(), w.data(), s,
                    scratch.data());
      return r;
    };
    const Result first = run();
    Result threaded[2];
    std::thread t0([&] { threaded[0] = run(); }), t1([&] { threaded[1] = run(); });
    t0.join();
    t1.join();
    for (const Result& r : {run(), threaded[0], threaded[1]}) {
      EXPECT_EQ(r.y, first.y) << describe(s);
      EXPECT_EQ(r.dx, first.dx) << describe(s);
      EXPECT_EQ(r.dw, first.dw) << describe(s);
      EXPECT_EQ(r.db, first.db) << describe(s);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvRepeat,
                         ::testing::Values(Conv2dShape{3, 2, 6, 6, 3, 3, 3, 1, 1},
                                           Conv2dShape{5, 16, 14, 14, 32, 5, 5, 1, 2},
                                           Conv2dShape{4, 3, 9, 8, 20, 3, 3, 2, 1}),
                         case_name);

TEST(Conv2d, Im2colScratchGrowsWithBatchButStaysBounded) {
  Conv2dShape s{1, 16, 14, 14, 32, 5, 5, 1, 2};
  const int64_t one = detail::conv2d_im2col_scratch_floats(s);
  EXPECT_GE(one, (16 * 25) * (14 * 14)) << "at least one image's column matrix";
  s.N = 128;
  const int64_t many = detail::conv2d_im2col_scratch_floats(s);
  EXPECT_GE(many, one);
  EXPECT_LT(many, 16 * one) << "the kernel should work on small groups, not the whole batch";
}

TEST(Conv2d, DirectScratchDoesNotGrowWithBatch) {
  Conv2dShape s{1, 16, 14, 14, 32, 5, 5, 1, 2};
  if (!detail::conv2d_direct_supported(s)) GTEST_SKIP() << "no direct kernels in this build";
  const int64_t one = detail::conv2d_direct_scratch_floats(s, {});
  s.N = 128;
  EXPECT_EQ(detail::conv2d_direct_scratch_floats(s, {}), one);
  EXPECT_LT(one, (16 * 25) * (14 * 14)) << "no column matrix";
  EXPECT_EQ(conv2d_scratch_floats(s), one) << "the public entry takes the direct kernels";
}

// ---- MaxPool2d ----

struct PoolShape {
  int64_t N, C, H, W, k, stride;
};

class PoolGrad : public ::testing::TestWithParam<PoolShape> {};

TEST_P(PoolGrad, FiniteDifferencesAndReference) {
  const PoolShape p = GetParam();
  const int64_t n_in = p.N * p.C * p.H * p.W;
  const int64_t OH = (p.H - p.k) / p.stride + 1, OW = (p.W - p.k) / p.stride + 1;
  const int64_t n_out = p.N * p.C * OH * OW;
  // Distinct values 0.05 apart, shuffled: the FD step (0.01) never changes a window's winner.
  Vec x(n_in), key = randn(n_in, 61);
  std::vector<int64_t> order(n_in);
  for (int64_t i = 0; i < n_in; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key[a] < key[b]; });
  for (int64_t i = 0; i < n_in; ++i) x[order[i]] = 0.05f * static_cast<float>(i) - 1.0f;

  Vec y(n_out), r = randn(n_out, 62), dx = poisoned(n_in);
  std::vector<int32_t> argmax(n_out);
  maxpool2d_forward(y.data(), argmax.data(), x.data(), p.N, p.C, p.H, p.W, p.k, p.stride);
  for (int64_t plane = 0; plane < p.N * p.C; ++plane) {
    for (int64_t oh = 0; oh < OH; ++oh) {
      for (int64_t ow = 0; ow < OW; ++ow) {
        float best = -1e30f;
        for (int64_t i = 0; i < p.k; ++i)
          for (int64_t j = 0; j < p.k; ++j)
            best = std::max(best, x[(plane * p.H + oh * p.stride + i) * p.W + ow * p.stride + j]);
        const int64_t o = (plane * OH + oh) * OW + ow;
        EXPECT_EQ(y[o], best);
        EXPECT_EQ(x[plane * p.H * p.W + argmax[o]], best);
      }
    }
  }
  maxpool2d_backward(dx.data(), r.data(), argmax.data(), p.N, p.C, p.H, p.W, p.k, p.stride);
  auto objective = [&] {
    Vec yy(n_out);
    std::vector<int32_t> am(n_out);
    maxpool2d_forward(yy.data(), am.data(), x.data(), p.N, p.C, p.H, p.W, p.k, p.stride);
    return weighted_sum(r, yy);
  };
  expect_grad("maxpool2d dx", x, dx, objective);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PoolGrad,
                         ::testing::Values(PoolShape{2, 2, 6, 6, 2, 2},    // the CNN's pool
                                           PoolShape{1, 2, 7, 7, 3, 2},    // overlapping windows
                                           PoolShape{1, 1, 5, 7, 2, 2},    // leftover row/col
                                           PoolShape{1, 1, 4, 4, 2, 1},    // stride 1
                                           PoolShape{2, 2, 5, 41, 2, 2}),  // two chunks a row
                         [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(MaxPool2d, NanPropagatesOnBothPaths) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // 2x2 stride 2 (the specialised path) and 3x3 stride 1 (the general one): a NaN anywhere
  // in a window makes that output NaN and points argmax at it, even if larger values follow.
  for (int64_t k : {2, 3}) {
    const int64_t stride = k == 2 ? 2 : 1;
    Vec x(9 * 9 * 1);
    for (int64_t i = 0; i < 81; ++i) x[i] = static_cast<float>(i);
    x[1] = nan;  // second in scan order: it must beat x[0] and then hold against 9, 10, ...
    const int64_t OH = (9 - k) / stride + 1;
    Vec y(OH * OH);
    std::vector<int32_t> argmax(OH * OH);
    maxpool2d_forward(y.data(), argmax.data(), x.data(), 1, 1, 9, 9, k, stride);
    EXPECT_TRUE(std::isnan(y[0])) << "k=" << k;
    EXPECT_EQ(argmax[0], 1) << "k=" << k;
    EXPECT_EQ(y[2], k == 2 ? 14.0f : 22.0f) << "k=" << k;  // a window without the NaN
  }
}

TEST(MaxPool2d, TiesPickTheFirstInScanOrder) {
  Vec x = {1, 2,   //
           2, 0};  // one 2x2 window, two equal maxima: (0,1) comes first
  Vec y(1), dx(4);
  std::vector<int32_t> argmax(1);
  maxpool2d_forward(y.data(), argmax.data(), x.data(), 1, 1, 2, 2, 2, 2);
  EXPECT_EQ(argmax[0], 1);
  Vec dy = {3.0f};
  maxpool2d_backward(dx.data(), dy.data(), argmax.data(), 1, 1, 2, 2, 2, 2);
  EXPECT_EQ(dx, (Vec{0, 3, 0, 0}));
}

}  // namespace
}  // namespace tessel::ops
