// GFLOP/s of each convolution kernel on the fashion_cnn layer shapes (batch 128, 1 thread),
// beside the core's FMA peak measured in the same run: forward, weight gradient (backward
// with dx = null, which computes dw and db only) and input gradient (full backward minus the
// weight-gradient time), then the fused conv2d_relu_maxpool_forward/backward (2x2 pool; conv1's
// backward without the input gradient, as in training). Each figure is the median of R timed
// calls after a warm-up, with the min and max; a kernel of F flops (2 * N * OC * OH * OW * C *
// KH * KW) runs at F / time.
//
//   conv_kernels [--repeats R] [--batch N] [--layer conv1|conv2]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fma_peak.h"
#include "tessel/core/clock.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/isa.h"

using namespace tessel;

namespace {

struct Stats {
  double median, min, max;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

// Seconds per call of f, one entry per repeat.
template <typename F>
std::vector<double> time_calls(int repeats, F f) {
  f();  // warm-up: first touch of the buffers, packing scratch
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = now_seconds();
    f();
    t.push_back(now_seconds() - t0);
  }
  return t;
}

void print(const char* layer, const char* kernel, double flops, const std::vector<double>& secs,
           double peak) {
  std::vector<double> gf;
  for (double s : secs) gf.push_back(flops / s / 1e9);
  const Stats g = stats(gf);
  std::printf("%-6s %-28s %8.3f ms %8.1f GFLOP/s  [%6.1f, %6.1f]  %4.0f%% of peak\n", layer, kernel,
              stats(secs).median * 1e3, g.median, g.min, g.max,
              peak > 0 ? 100.0 * g.median / peak : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("isa: %s\n", tessel::ops::isa_description().c_str());  // CPU and ISA level
  int repeats = 21;
  int64_t batch = 128;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc) {
      repeats = std::stoi(argv[++i]);
    } else if (a == "--batch" && i + 1 < argc) {
      batch = std::stoll(argv[++i]);
    } else if (a == "--layer" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: conv_kernels [--repeats R] [--batch N] [--layer conv1|conv2]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  ops::set_blas_threads(1);
  const double peak = bench::fma_peak_gflops();
  std::printf("fp32 FMA peak (12 chains, this run): %.1f GFLOP/s\n", peak);
  struct Layer {
    const char* name;
    ops::Conv2dShape s;
  };
  const Layer layers[] = {{"conv1", {batch, 1, 28, 28, 16, 5, 5, 1, 2}},
                          {"conv2", {batch, 16, 14, 14, 32, 5, 5, 1, 2}}};
  for (const Layer& l : layers) {
    if (!only.empty() && only != l.name) continue;
    const ops::Conv2dShape& s = l.s;
    const int64_t nx = s.N * s.C * s.H * s.W, ny = s.N * s.OC * s.OH() * s.OW();
    const int64_t nw = s.OC * s.C * s.KH * s.KW;
    std::vector<float> x(nx), w(nw), b(s.OC), y(ny), dy(ny), dx(nx), dw(nw), db(s.OC);
    for (int64_t i = 0; i < nx; ++i) x[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (int64_t i = 0; i < nw; ++i) w[i] = static_cast<float>((i * 104729) % 997) * 1e-4f;
    for (int64_t i = 0; i < ny; ++i) dy[i] = static_cast<float>((i * 31) % 101) * 1e-3f - 0.05f;
    std::vector<float> scratch(ops::conv2d_scratch_floats(s));
    const double flops = 2.0 * s.N * s.OC * s.OH() * s.OW() * s.C * s.KH * s.KW;
    const auto fwd = time_calls(repeats, [&] {
      ops::conv2d_forward(y.data(), x.data(), w.data(), b.data(), s, scratch.data());
    });
    const auto wgrad = time_calls(repeats, [&] {
      ops::conv2d_backward(nullptr, dw.data(), db.data(), dy.data(), x.data(), w.data(), s,
                           scratch.data());
    });
    const auto full = time_calls(repeats, [&] {
      ops::conv2d_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), s,
                           scratch.data());
    });
    std::vector<double> igrad;  // full backward minus the weight-gradient median
    const double wmed = stats(wgrad).median;
    for (double t : full) igrad.push_back(std::max(t - wmed, 1e-9));
    print(l.name, "forward", flops, fwd, peak);
    print(l.name, "dw+db", flops, wgrad, peak);
    print(l.name, "dx", flops, igrad, peak);
    print(l.name, "backward", 2 * flops, full, peak);
    // The fused convolution + ReLU + 2x2 max pool (what the CNN's stages can call instead).
    const int64_t np = s.N * s.OC * (s.OH() / 2) * (s.OW() / 2);
    std::vector<float> yp(np), dyp(np);
    std::vector<int32_t> argmax(np);
    for (int64_t i = 0; i < np; ++i) dyp[i] = static_cast<float>((i * 17) % 89) * 1e-3f - 0.04f;
    std::vector<float> pscratch(ops::conv2d_relu_maxpool_scratch_floats(s, 2, 2));
    const auto pfwd = time_calls(repeats, [&] {
      ops::conv2d_relu_maxpool_forward(yp.data(), argmax.data(), x.data(), w.data(), b.data(), s, 2,
                                       2, pscratch.data());
    });
    float* pdx = std::string(l.name) == "conv1" ? nullptr : dx.data();  // as in training
    const auto pbwd = time_calls(repeats, [&] {
      ops::conv2d_relu_maxpool_backward(pdx, dw.data(), db.data(), dyp.data(), argmax.data(),
                                        yp.data(), x.data(), w.data(), s, 2, 2, pscratch.data());
    });
    print(l.name, "fwd+relu+pool", flops, pfwd, peak);
    print(l.name, pdx != nullptr ? "bwd of fwd+relu+pool" : "bwd of fwd+relu+pool (dw, db)",
          (pdx != nullptr ? 2 : 1) * flops, pbwd, peak);
  }
  return 0;
}
