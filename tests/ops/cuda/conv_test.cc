// cuDNN's convolution and the max-pool kernels against the CPU ops: the convolution in f32 to
// 1e-5 (FMA math, no TF32; other sum orders than the CPU's), and the same bits on two runs;
// the pool bit for bit, ties and NaNs included, with overlapping windows.
#include "tessel/ops/cuda/conv.h"

#include <algorithm>
#include <cmath>

#include "cuda_test_util.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops::cuda::testing {
namespace {

// fashion_cnn's two layers, a strided one with a wide kernel (the CPU's im2col path), and 1x1.
const Conv2dShape kShapes[] = {{4, 1, 28, 28, 16, 5, 5, 1, 2},
                               {3, 16, 14, 14, 32, 5, 5, 1, 2},
                               {2, 3, 11, 9, 5, 3, 9, 2, 1},
                               {2, 8, 7, 7, 4, 1, 1, 1, 0}};

std::string tag(const Conv2dShape& s) {
  return str(" N=", s.N, " C=", s.C, " ", s.H, "x", s.W, " OC=", s.OC, " k=", s.KH, "x", s.KW,
             " stride=", s.stride, " pad=", s.pad);
}

class CudaConv : public Gpu {};

TEST_F(CudaConv, F32ForwardAndBackwardMatchCpu) {
  for (const Conv2dShape& s : kShapes) {
    const int64_t nx = s.N * s.C * s.H * s.W, nw = s.OC * s.C * s.KH * s.KW;
    const int64_t ny = s.N * s.OC * s.OH() * s.OW();
    const Vec x = randn(nx, 1), w = randn(nw, 2, 0.2f), b = randn(s.OC, 3), dy = randn(ny, 4);
    // The parameter gradients start from values, so that accumulating (+=) is checked.
    Vec dw = randn(nw, 5), db = randn(s.OC, 6), y(ny), dx(nx);
    const DeviceBuffer gdw = upload(dw), gdb = upload(db);
    Vec scratch(static_cast<size_t>(conv2d_scratch_floats(s)));
    ops::conv2d_forward(y.data(), x.data(), w.data(), b.data(), s, scratch.data());
    ops::conv2d_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), s,
                         scratch.data());
    const DeviceBuffer gx = upload(x), gw = upload(w), gb = upload(b), gdy = upload(dy);
    const DeviceBuffer gy = poisoned(ny), gdx = poisoned(nx);
    const DeviceBuffer ws(std::max<size_t>(conv2d_workspace_bytes(s), 1));
    conv2d_forward(gy.as<float>(), gx.as<float>(), gw.as<float>(), gb.as<float>(), s, ws.get(),
                   nullptr);
    conv2d_backward(gdx.as<float>(), gdw.as<float>(), gdb.as<float>(), gdy.as<float>(),
                    gx.as<float>(), gw.as<float>(), s, ws.get(), nullptr);
    expect_close(download(gy, ny), y, 1e-5, "conv2d y" + tag(s));
    expect_close(download(gdx, nx), dx, 1e-5, "conv2d dx" + tag(s));
    expect_close(download(gdw, nw), dw, 1e-5, "conv2d dw" + tag(s));
    expect_close(download(gdb, s.OC), db, 1e-5, "conv2d db" + tag(s));
  }
}

TEST_F(CudaConv, BackwardIsDeterministic) {
  const Conv2dShape s = kShapes[1];
  const int64_t nx = s.N * s.C * s.H * s.W, nw = s.OC * s.C * s.KH * s.KW;
  const int64_t ny = s.N * s.OC * s.OH() * s.OW();
  const DeviceBuffer gx = upload(randn(nx, 7)), gw = upload(randn(nw, 8)),
                     gdy = upload(randn(ny, 9));
  DeviceBuffer gdx(nx * 4), gdw(nw * 4), gdb(s.OC * 4);
  const DeviceBuffer ws(std::max<size_t>(conv2d_workspace_bytes(s), 1));
  Vec runs[2][3];
  for (Vec* r : {runs[0], runs[1]}) {
    gdw.fill(0);
    gdb.fill(0);
    conv2d_backward(gdx.as<float>(), gdw.as<float>(), gdb.as<float>(), gdy.as<float>(),
                    gx.as<float>(), gw.as<float>(), s, ws.get(), nullptr);
    r[0] = download(gdx, nx);
    r[1] = download(gdw, nw);
    r[2] = download(gdb, s.OC);
  }
  expect_same_bits(runs[0][0], runs[1][0], "conv2d dx");
  expect_same_bits(runs[0][1], runs[1][1], "conv2d dw");
  expect_same_bits(runs[0][2], runs[1][2], "conv2d db");
}

struct Pool {
  int64_t N, C, H, W, k, stride;
};
// fashion_cnn's 2x2 pools, overlapping 3x3 windows at stride 2 and 1, an uneven edge.
const Pool kPools[] = {
    {4, 16, 28, 28, 2, 2}, {3, 32, 14, 14, 2, 2}, {2, 3, 9, 11, 3, 2}, {1, 2, 6, 5, 3, 1}};

class CudaMaxPool : public Gpu {};

TEST_F(CudaMaxPool, ForwardAndBackwardGiveTheCpuBits) {
  for (const Pool& p : kPools) {
    const int64_t OH = (p.H - p.k) / p.stride + 1, OW = (p.W - p.k) / p.stride + 1;
    const int64_t nx = p.N * p.C * p.H * p.W, ny = p.N * p.C * OH * OW;
    // Few distinct values, so windows tie; a few NaNs, which win once.
    Vec x = randn(nx, 10);
    for (size_t i = 0; i < x.size(); ++i) x[i] = i % 97 == 5 ? NAN : std::round(x[i]);
    const Vec dy = randn(ny, 11);
    Vec y(ny), dx(nx);
    std::vector<int32_t> argmax(ny);
    ops::maxpool2d_forward(y.data(), argmax.data(), x.data(), p.N, p.C, p.H, p.W, p.k, p.stride);
    ops::maxpool2d_backward(dx.data(), dy.data(), argmax.data(), p.N, p.C, p.H, p.W, p.k, p.stride);
    const DeviceBuffer gx = upload(x), gdy = upload(dy);
    const DeviceBuffer gy = poisoned(ny), ga = poisoned(ny), gdx = poisoned(nx);
    maxpool2d_forward(gy.as<float>(), ga.as<int32_t>(), gx.as<float>(), p.N, p.C, p.H, p.W, p.k,
                      p.stride, nullptr);
    maxpool2d_backward(gdx.as<float>(), gdy.as<float>(), ga.as<int32_t>(), p.N, p.C, p.H, p.W, p.k,
                       p.stride, nullptr);
    const std::string t = str(" ", p.H, "x", p.W, " k=", p.k, " stride=", p.stride);
    std::vector<int32_t> got_argmax(ny);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    ga.download(got_argmax.data(), got_argmax.size() * sizeof(int32_t));
    EXPECT_EQ(got_argmax, argmax) << "maxpool2d argmax" << t;
    expect_same_bits(download(gy, ny), y, "maxpool2d y" + t);
    expect_same_bits(download(gdx, nx), dx, "maxpool2d dx" + t);
  }
}

}  // namespace
}  // namespace tessel::ops::cuda::testing
