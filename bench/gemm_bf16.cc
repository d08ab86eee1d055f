// bf16 and fp16 GEMM against tessel's fp32 GEMM on the shapes the example models' training
// steps issue (fashion_mlp at batch 128; char_gpt at batch 32, context 64, embed 256: 2048 rows),
// 1 thread, in one run: each round times every implementation on a shape back to back, and the
// figures are medians over the rounds (min and max beside them). Operand types are the layers'
// in train.precision = bf16: activations and working weights bf16, weight gradients f32 with
// beta = 1, the first layer's f32 input. fp16 is measured two ways, through the bf16 kernel (F16C
// conversion while packing: what gemm_lowp does) and converted to f32 for the fp32 GEMM, so the
// choice between them is a measured one. Also prints the core's measured peaks: fp32 vfmadd
// and bf16 vdpbf16ps (12 independent chains each, bench/fma_peak.h).
//
//   gemm_bf16 [--rounds R] [--calls C] [--models fashion_mlp,char_gpt] [--json FILE]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
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

struct Shape {
  std::string model, name;
  bool ta, tb;
  int64_t M, N, K;
  DType a, b, c;  // in bf16 training
  float beta;
};

std::vector<Shape> shapes() {
  const DType f = DType::kF32, h = DType::kBF16;
  const int64_t V = 91;  // char_gpt's vocabulary on the fortunes text
  return {
      {"fashion_mlp", "fc1 forward", false, true, 128, 512, 784, f, h, h, 1},
      {"fashion_mlp", "fc2 forward", false, true, 128, 256, 512, h, h, h, 1},
      {"fashion_mlp", "fc3 forward", false, true, 128, 10, 256, h, h, h, 1},
      {"fashion_mlp", "fc3 dW", true, false, 10, 256, 128, h, h, f, 1},
      {"fashion_mlp", "fc3 dx", false, false, 128, 256, 10, h, h, h, 0},
      {"fashion_mlp", "fc2 dW", true, false, 256, 512, 128, h, h, f, 1},
      {"fashion_mlp", "fc2 dx", false, false, 128, 512, 256, h, h, h, 0},
      {"fashion_mlp", "fc1 dW", true, false, 512, 784, 128, h, f, f, 1},
      {"char_gpt", "qkv forward", false, true, 2048, 768, 256, h, h, h, 1},
      {"char_gpt", "attn.proj forward", false, true, 2048, 256, 256, h, h, h, 1},
      {"char_gpt", "mlp.fc forward", false, true, 2048, 1024, 256, h, h, h, 1},
      {"char_gpt", "mlp.proj forward", false, true, 2048, 256, 1024, h, h, h, 1},
      {"char_gpt", "head forward", false, true, 2048, V, 256, h, h, h, 0},
      {"char_gpt", "head dW", true, false, V, 256, 2048, h, h, f, 1},
      {"char_gpt", "head dx", false, false, 2048, 256, V, h, h, h, 0},
      {"char_gpt", "mlp.fc dW", true, false, 1024, 256, 2048, h, h, f, 1},
      {"char_gpt", "mlp.fc dx", false, false, 2048, 256, 1024, h, h, h, 0},
      {"char_gpt", "qkv dW", true, false, 768, 256, 2048, h, h, f, 1},
      {"char_gpt", "qkv dx", false, false, 2048, 256, 768, h, h, h, 0},
  };
}

// A buffer of n random values stored as `type`.
std::vector<uint16_t> buffer(int64_t n, DType type, uint64_t seed) {
  CounterRng rng(seed, mix_stream(RngPurpose::kData, 3));
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = rng.normal(static_cast<uint64_t>(i));
  std::vector<uint16_t> out(static_cast<size_t>(n) * dtype_size(type) / 2);
  ops::convert(out.data(), type, v.data(), DType::kF32, n);
  return out;
}

// Median seconds of `calls` calls of f, after one warm-up call.
double time_calls(const std::function<void()>& f, int calls) {
  f();
  std::vector<double> t;
  for (int i = 0; i < calls; ++i) {
    const double t0 = now_seconds();
    f();
    t.push_back(now_seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Stats {
  double med, lo, hi;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("isa: %s\n", tessel::ops::isa_description().c_str());  // CPU and ISA level
  int rounds = 5, calls = 15;
  std::vector<std::string> models = {"fashion_mlp", "char_gpt"};
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--rounds")
      rounds = std::stoi(argv[++i]);
    else if (i + 1 < argc && a == "--calls")
      calls = std::stoi(argv[++i]);
    else if (i + 1 < argc && a == "--models")
      models = split(argv[++i]);
    else if (i + 1 < argc && a == "--json")
      json_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: gemm_bf16 [--rounds R] [--calls C] [--models a,b] [--json F]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  ops::set_blas_threads(1);
  const bool native = ops::gemm_lowp_native();
  const double fma_peak = bench::fma_peak_gflops();
  const double bf16_peak = native ? bench::bf16_peak_gflops() : 0.0;
  std::printf("1 thread; bf16 kernel: %s\n", native ? "AVX512_BF16 (vdpbf16ps)" : "portable");
  std::printf("measured peaks, 1 core: fp32 vfmadd %.1f GFLOP/s, bf16 vdpbf16ps %.1f GFLOP/s\n",
              fma_peak, bf16_peak);
  std::printf("%-12s %-18s %5s %5s %5s | %7s %7s %6s | %7s %7s | GFLOP/s, medians of %d rounds\n",
              "model", "gemm", "M", "N", "K", "fp32", "bf16", "ratio", "fp16", "fp16/32", rounds);
  nlohmann::json out = nlohmann::json::array();
  for (const Shape& s : shapes()) {
    if (std::find(models.begin(), models.end(), s.model) == models.end()) continue;
    const int64_t a_n = s.M * s.K, b_n = s.K * s.N, c_n = s.M * s.N;
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    // fp32: every operand f32. bf16: the layers' types. fp16: f16 where bf16 has bf16.
    auto f16 = [](DType t) { return t == DType::kBF16 ? DType::kF16 : t; };
    const std::vector<uint16_t> a32 = buffer(a_n, DType::kF32, 1),
                                b32 = buffer(b_n, DType::kF32, 2);
    const std::vector<uint16_t> a_h = buffer(a_n, s.a, 1), b_h = buffer(b_n, s.b, 2);
    const std::vector<uint16_t> a_f = buffer(a_n, f16(s.a), 1), b_f = buffer(b_n, f16(s.b), 2);
    std::vector<uint16_t> c32 = buffer(c_n, DType::kF32, 3), c_h = buffer(c_n, s.c, 3);
    std::vector<uint16_t> c_f = buffer(c_n, f16(s.c), 3);
    std::vector<float> wa(static_cast<size_t>(a_n)), wb(static_cast<size_t>(b_n));
    std::vector<float> wc(static_cast<size_t>(c_n));
    const float* A32 = reinterpret_cast<const float*>(a32.data());
    const float* B32 = reinterpret_cast<const float*>(b32.data());
    float* C32 = reinterpret_cast<float*>(c32.data());
    auto fp32 = [&] {
      ops::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A32, lda, B32, ldb, s.beta, C32, s.N);
    };
    auto bf16 = [&] {
      ops::gemm_lowp(s.ta, s.tb, s.M, s.N, s.K, 1.0f, {a_h.data(), s.a, lda},
                     {b_h.data(), s.b, ldb}, s.beta, {c_h.data(), s.c, s.N});
    };
    auto fp16 = [&] {
      ops::gemm_lowp(s.ta, s.tb, s.M, s.N, s.K, 1.0f, {a_f.data(), f16(s.a), lda},
                     {b_f.data(), f16(s.b), ldb}, s.beta, {c_f.data(), f16(s.c), s.N});
    };
    auto fp16_via_fp32 = [&] {  // widen, fp32 GEMM, round C
      ops::convert(wa.data(), DType::kF32, a_f.data(), f16(s.a), a_n);
      ops::convert(wb.data(), DType::kF32, b_f.data(), f16(s.b), b_n);
      if (s.beta != 0) ops::convert(wc.data(), DType::kF32, c_f.data(), f16(s.c), c_n);
      ops::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, wa.data(), lda, wb.data(), ldb, s.beta, wc.data(),
                s.N);
      ops::convert(c_f.data(), f16(s.c), wc.data(), DType::kF32, c_n);
    };
    const double flop = 2.0 * static_cast<double>(s.M * s.N * s.K);
    std::vector<double> g32, g16, gh, ghf, ratio;
    for (int r = 0; r < rounds; ++r) {
      g32.push_back(flop / time_calls(fp32, calls) / 1e9);
      g16.push_back(flop / time_calls(bf16, calls) / 1e9);
      gh.push_back(flop / time_calls(fp16, calls) / 1e9);
      ghf.push_back(flop / time_calls(fp16_via_fp32, calls) / 1e9);
      ratio.push_back(g16.back() / g32.back());
    }
    const Stats a = stats(g32), b = stats(g16), q = stats(ratio), h = stats(gh), hf = stats(ghf);
    std::printf("%-12s %-18s %5lld %5lld %5lld | %7.1f %7.1f %5.2fx | %7.1f %7.1f\n",
                s.model.c_str(), s.name.c_str(), static_cast<long long>(s.M),
                static_cast<long long>(s.N), static_cast<long long>(s.K), a.med, b.med, q.med,
                h.med, hf.med);
    std::fflush(stdout);
    out.push_back({{"model", s.model},
                   {"gemm", s.name},
                   {"M", s.M},
                   {"N", s.N},
                   {"K", s.K},
                   {"fp32_gflops", {a.med, a.lo, a.hi}},
                   {"bf16_gflops", {b.med, b.lo, b.hi}},
                   {"ratio", {q.med, q.lo, q.hi}},
                   {"fp16_gflops", {h.med, h.lo, h.hi}},
                   {"fp16_via_fp32_gflops", {hf.med, hf.lo, hf.hi}},
                   {"fma_peak", fma_peak},
                   {"bf16_peak", bf16_peak}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
