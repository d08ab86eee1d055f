// The fashion_cnn training step (examples/fashion_cnn.toml at batch 128) as a sequence of
// ops kernel calls, timed kernel by kernel, 1 thread: where a step's time goes, and what the
// fused convolution kernels of cpu.h save before a layer uses them. Modes, alternated round by
// round in one run (the machine is shared and noisy):
//   unfused    conv2d, relu, maxpool2d as separate kernels (what nn's layers call today);
//   relu       conv2d_relu_forward / conv2d_relu_backward, maxpool2d separate;
//   pool       conv2d_relu_maxpool_forward / conv2d_relu_maxpool_backward.
// The step: forward, cross-entropy, backward (no input gradient for the first conv), a plain
// SGD-with-momentum update over all parameters and the zeroing of their gradients. GFLOP/s
// counts as bench/train_throughput does: forward F, backward 2F, less conv1's input gradient.
// Inputs are random (the kernels' time does not depend on the values).
//
//   cnn_layers [--steps S] [--rounds R] [--modes unfused,relu,pool] [--batch N]
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fma_peak.h"
#include "tessel/core/clock.h"
#include "tessel/core/rng.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/isa.h"

using namespace tessel;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

std::vector<float> random_vec(int64_t n, uint64_t seed, float scale) {
  CounterRng rng(seed, mix_stream(RngPurpose::kData, 7));
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * rng.normal(static_cast<uint64_t>(i));
  return v;
}

// A parameter and its gradient and momentum.
struct Param {
  std::vector<float> w, g, m;
  Param(int64_t n, uint64_t seed, float scale)
      : w(random_vec(n, seed, scale)), g(static_cast<size_t>(n)), m(static_cast<size_t>(n)) {}
};

// The network's buffers; names as in the layer sequence.
struct Net {
  int64_t N;
  ops::Conv2dShape s1, s2;
  Param w1, b1, w2, b2, wf1, bf1, wf2, bf2;
  std::vector<float> x, c1, r1, p1, c2, r2, p2, f1, r3, f2, probs;
  std::vector<int32_t> labels, a1, a2;
  std::vector<float> dlogits, dr3, df1, dp2, dr2, dc2, dp1, dr1, dc1, scratch;

  explicit Net(int64_t n)
      : N(n),
        s1{n, 1, 28, 28, 16, 5, 5, 1, 2},
        s2{n, 16, 14, 14, 32, 5, 5, 1, 2},
        w1(16 * 25, 1, 0.2f),
        b1(16, 2, 0.1f),
        w2(32 * 16 * 25, 3, 0.05f),
        b2(32, 4, 0.1f),
        wf1(128 * 1568, 5, 0.025f),
        bf1(128, 6, 0.1f),
        wf2(10 * 128, 7, 0.09f),
        bf2(10, 8, 0.1f),
        x(random_vec(n * 784, 9, 1.0f)),
        c1(n * 16 * 784),
        r1(c1.size()),
        p1(n * 16 * 196),
        c2(n * 32 * 196),
        r2(c2.size()),
        p2(n * 32 * 49),
        f1(n * 128),
        r3(f1.size()),
        f2(n * 10),
        probs(f2.size()),
        labels(n),
        a1(p1.size()),
        a2(p2.size()),
        dlogits(f2.size()),
        dr3(r3.size()),
        df1(f1.size()),
        dp2(p2.size()),
        dr2(r2.size()),
        dc2(c2.size()),
        dp1(p1.size()),
        dr1(r1.size()),
        dc1(c1.size()) {
    for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((i * 7) % 10);
    int64_t floats = 0;
    for (const ops::Conv2dShape& s : {s1, s2}) {
      floats = std::max({floats, ops::conv2d_scratch_floats(s),
                         ops::conv2d_relu_maxpool_scratch_floats(s, 2, 2)});
    }
    scratch.resize(floats);
  }
  std::vector<Param*> params() { return {&w1, &b1, &w2, &b2, &wf1, &bf1, &wf2, &bf2}; }
  double flops() const {  // per step: 3F less conv1's input gradient
    const double conv1 = 2.0 * N * 16 * 784 * 25, conv2 = 2.0 * N * 32 * 196 * 400;
    const double fc = 2.0 * N * (1568 * 128 + 128 * 10);
    return 3.0 * (conv1 + conv2 + fc) - conv1;
  }
};

// Accumulates seconds per kernel name over the timed steps of one round.
class Timer {
 public:
  explicit Timer(std::map<std::string, double>& into) : into_(into) {}
  template <typename F>
  void operator()(const std::string& name, F f) {
    const double t0 = now_seconds();
    f();
    into_[name] += now_seconds() - t0;
  }

 private:
  std::map<std::string, double>& into_;
};

void step(Net& n, const std::string& mode, Timer& t) {
  const int64_t N = n.N;
  float* scr = n.scratch.data();
  // Forward.
  if (mode == "pool") {
    t("conv1+relu+pool", [&] {
      ops::conv2d_relu_maxpool_forward(n.p1.data(), n.a1.data(), n.x.data(), n.w1.w.data(),
                                       n.b1.w.data(), n.s1, 2, 2, scr);
    });
    t("conv2+relu+pool", [&] {
      ops::conv2d_relu_maxpool_forward(n.p2.data(), n.a2.data(), n.p1.data(), n.w2.w.data(),
                                       n.b2.w.data(), n.s2, 2, 2, scr);
    });
  } else {
    for (int layer = 1; layer <= 2; ++layer) {
      const ops::Conv2dShape& s = layer == 1 ? n.s1 : n.s2;
      const float* in = layer == 1 ? n.x.data() : n.p1.data();
      Param& w = layer == 1 ? n.w1 : n.w2;
      Param& b = layer == 1 ? n.b1 : n.b2;
      std::vector<float>& c = layer == 1 ? n.c1 : n.c2;
      std::vector<float>& r = layer == 1 ? n.r1 : n.r2;
      const std::string id = std::to_string(layer);
      if (mode == "relu") {
        t("conv" + id + "+relu",
          [&] { ops::conv2d_relu_forward(r.data(), in, w.w.data(), b.w.data(), s, scr); });
      } else {
        t("conv" + id, [&] { ops::conv2d_forward(c.data(), in, w.w.data(), b.w.data(), s, scr); });
        t("relu" + id, [&] { ops::relu_forward(r.data(), c.data(), c.size()); });
      }
      float* p = layer == 1 ? n.p1.data() : n.p2.data();
      int32_t* a = layer == 1 ? n.a1.data() : n.a2.data();
      t("pool" + id,
        [&] { ops::maxpool2d_forward(p, a, r.data(), N, s.OC, s.OH(), s.OW(), 2, 2); });
    }
  }
  t("fc1", [&] {
    ops::linear_forward(n.f1.data(), n.p2.data(), n.wf1.w.data(), n.bf1.w.data(), N, 1568, 128);
  });
  t("relu3", [&] { ops::relu_forward(n.r3.data(), n.f1.data(), n.f1.size()); });
  t("fc2", [&] {
    ops::linear_forward(n.f2.data(), n.r3.data(), n.wf2.w.data(), n.bf2.w.data(), N, 128, 10);
  });
  t("loss", [&] {
    ops::cross_entropy_forward(n.probs.data(), n.f2.data(), n.labels.data(), N, 10);
    ops::cross_entropy_backward(n.dlogits.data(), n.probs.data(), n.labels.data(), N, 10, 1.0f);
  });
  // Backward.
  t("fc2 bwd", [&] {
    ops::linear_backward(n.dr3.data(), n.wf2.g.data(), n.bf2.g.data(), n.dlogits.data(),
                         n.r3.data(), n.wf2.w.data(), N, 128, 10);
  });
  t("relu3 bwd", [&] { ops::relu_backward(n.df1.data(), n.dr3.data(), n.r3.data(), n.f1.size()); });
  t("fc1 bwd", [&] {
    ops::linear_backward(n.dp2.data(), n.wf1.g.data(), n.bf1.g.data(), n.df1.data(), n.p2.data(),
                         n.wf1.w.data(), N, 1568, 128);
  });
  for (int layer = 2; layer >= 1; --layer) {
    const ops::Conv2dShape& s = layer == 1 ? n.s1 : n.s2;
    const float* in = layer == 1 ? n.x.data() : n.p1.data();
    Param& w = layer == 1 ? n.w1 : n.w2;
    Param& b = layer == 1 ? n.b1 : n.b2;
    float* dx = layer == 1 ? nullptr : n.dp1.data();
    const float* dp = layer == 1 ? n.dp1.data() : n.dp2.data();
    const float* p = layer == 1 ? n.p1.data() : n.p2.data();
    const int32_t* a = layer == 1 ? n.a1.data() : n.a2.data();
    std::vector<float>& r = layer == 1 ? n.r1 : n.r2;
    std::vector<float>& dr = layer == 1 ? n.dr1 : n.dr2;
    std::vector<float>& dc = layer == 1 ? n.dc1 : n.dc2;
    const std::string id = std::to_string(layer);
    if (mode == "pool") {
      t("conv" + id + "+relu+pool bwd", [&] {
        ops::conv2d_relu_maxpool_backward(dx, w.g.data(), b.g.data(), dp, a, p, in, w.w.data(), s,
                                          2, 2, scr);
      });
      continue;
    }
    t("pool" + id + " bwd",
      [&] { ops::maxpool2d_backward(dr.data(), dp, a, N, s.OC, s.OH(), s.OW(), 2, 2); });
    if (mode == "relu") {
      t("conv" + id + "+relu bwd", [&] {
        ops::conv2d_relu_backward(dx, w.g.data(), b.g.data(), dr.data(), r.data(), in, w.w.data(),
                                  s, scr);
      });
      continue;
    }
    t("relu" + id + " bwd", [&] { ops::relu_backward(dc.data(), dr.data(), r.data(), dr.size()); });
    t("conv" + id + " bwd",
      [&] { ops::conv2d_backward(dx, w.g.data(), b.g.data(), dc.data(), in, w.w.data(), s, scr); });
  }
  t("sgd+zero", [&] {
    for (Param* p : n.params()) {
      for (size_t i = 0; i < p->w.size(); ++i) {
        p->m[i] = 0.9f * p->m[i] + p->g[i];
        p->w[i] -= 1e-6f * p->m[i];  // tiny: the weights stay where they are
        p->g[i] = 0.0f;
      }
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("isa: %s\n", tessel::ops::isa_description().c_str());  // CPU and ISA level
  int steps = 50, rounds = 5;
  int64_t batch = 128;
  std::vector<std::string> modes = {"unfused", "relu", "pool"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--steps" && has) {
      steps = std::stoi(argv[++i]);
    } else if (a == "--rounds" && has) {
      rounds = std::stoi(argv[++i]);
    } else if (a == "--modes" && has) {
      modes = split(argv[++i]);
    } else if (a == "--batch" && has) {
      batch = std::stoll(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: cnn_layers [--steps S] [--rounds R] [--modes unfused,relu,pool] "
                   "[--batch N]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  ops::set_blas_threads(1);
  Net net(batch);
  const double peak = bench::fma_peak_gflops();
  // Per mode: the step times of each round, and each kernel's seconds summed over all rounds.
  std::map<std::string, std::vector<double>> step_times;
  std::map<std::string, std::map<std::string, double>> kernel_secs;
  for (int r = 0; r < rounds; ++r) {
    for (const std::string& mode : modes) {
      std::map<std::string, double> warm;
      Timer wt(warm);
      for (int i = 0; i < 3; ++i) step(net, mode, wt);
      std::map<std::string, double>& secs = kernel_secs[mode];
      Timer t(secs);
      const double t0 = now_seconds();
      for (int i = 0; i < steps; ++i) step(net, mode, t);
      step_times[mode].push_back((now_seconds() - t0) / steps);
    }
  }
  std::printf(
      "fp32 FMA peak (12 chains, this run): %.1f GFLOP/s; batch %lld, %d rounds x %d "
      "steps, modes alternating\n",
      peak, static_cast<long long>(batch), rounds, steps);
  for (const std::string& mode : modes) {
    std::vector<double> t = step_times[mode];
    std::sort(t.begin(), t.end());
    const double med = t[t.size() / 2];
    std::printf(
        "\n%-8s step %.2f ms (min %.2f, max %.2f): %.0f samples/s, %.1f GFLOP/s, %.0f%% "
        "of peak\n",
        mode.c_str(), med * 1e3, t.front() * 1e3, t.back() * 1e3, batch / med,
        net.flops() / med / 1e9, peak > 0 ? 100.0 * net.flops() / med / 1e9 / peak : 0.0);
    double total = 0.0;
    for (const auto& [name, s] : kernel_secs[mode]) total += s;
    for (const auto& [name, s] : kernel_secs[mode]) {
      std::printf("  %-26s %7.3f ms  %5.1f%%\n", name.c_str(), s / (rounds * steps) * 1e3,
                  100.0 * s / total);
    }
  }
  return 0;
}
