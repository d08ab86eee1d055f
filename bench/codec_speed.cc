// ns per element of the int8 gradient codec's kernels (tessel/ops/quantize.h; issue 28):
// encode (absmax, Philox4x32-10, stochastic rounding) and decode-add, at every ISA level the
// host runs, side by side in one run. The portable level is the scalar loop the codec had
// before its per-level kernels; each level is checked to write the portable bytes. Each
// figure: the best of R passes over n elements (n: a small and a large gradient unit).
//
//   codec_speed [--repeats R]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "best_of.h"
#include "tessel/core/rng.h"
#include "tessel/ops/isa.h"
#include "tessel/ops/quantize.h"

using namespace tessel;

namespace {

constexpr int64_t kChunk = 256;  // the codec's kInt8Chunk

// ns per element of the best of `repeats` calls of f over n elements, after one warm-up call.
template <typename F>
double best_ns(int repeats, int64_t n, F f) {
  return bench::best_seconds(repeats, f) * 1e9 / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 15;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::stoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: codec_speed [--repeats R]\n");
      return 2;
    }
  }
  double load = 0;
  getloadavg(&load, 1);
  std::printf("isa: %s; load average %.1f\n", ops::isa_description().c_str(), load);
  std::printf("%-10s %9s %14s %14s\n", "level", "n", "encode ns/el", "add ns/el");
  for (const int64_t n : {int64_t{100'000}, int64_t{4'000'000}}) {
    const CounterRng rng(7, 8);
    std::vector<float> x(static_cast<size_t>(n)), acc(static_cast<size_t>(n), 0.0f);
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = rng.uniform(i) - 0.5f;
    const auto chunks = static_cast<size_t>((n + kChunk - 1) / kChunk);
    std::vector<int8_t> q(static_cast<size_t>(n)), want;
    std::vector<float> scales(chunks);
    for (const ops::Isa level : ops::supported_isas()) {
      ops::set_isa(level);
      const double enc = best_ns(repeats, n, [&] {
        ops::int8_quantize(q.data(), scales.data(), x.data(), n, kChunk, 42, 43);
      });
      const double add = best_ns(repeats, n, [&] {
        ops::int8_dequantize_add(acc.data(), q.data(), scales.data(), n, kChunk);
      });
      if (want.empty()) want = q;
      std::printf("%-10s %9lld %14.2f %14.2f%s\n", ops::isa_name(level), static_cast<long long>(n),
                  enc, add, q == want ? "" : "  BYTES DIFFER FROM PORTABLE");
    }
  }
  return 0;
}
