// The core's measured fp32 FMA peak, for benches to print beside the GFLOP/s they report:
// 12 independent chains of vector FMAs (enough to cover the FMA latency on every core we
// run on, so the loop is throughput-bound, not latency-bound), best of 5 runs of ~35 ms
// (the first doubles as warm-up). The vector of the ISA level asked for (default: the one in
// use, ops::isa()): zmm at avx512, ymm at avx2; 0 (no vector FMA) at portable. The asm runs
// only at a level the CPU supports. Single-threaded: call it from the thread being measured.
// bf16_peak_gflops() is the same loop of `vdpbf16ps` (64 flops each), for CPUs with
// AVX512_BF16 only: check ops::gemm_lowp_native() first.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "tessel/ops/isa.h"

namespace tessel::bench {

namespace detail {

// clang-format off
// Instruction `op` into each of registers 2..13 from registers 0 and 1, of vector kind r.
#define TESSEL_OP12(op, r) \
  op " %%" r "0,%%" r "1,%%" r "2\n\t"  op " %%" r "0,%%" r "1,%%" r "3\n\t" \
  op " %%" r "0,%%" r "1,%%" r "4\n\t"  op " %%" r "0,%%" r "1,%%" r "5\n\t" \
  op " %%" r "0,%%" r "1,%%" r "6\n\t"  op " %%" r "0,%%" r "1,%%" r "7\n\t" \
  op " %%" r "0,%%" r "1,%%" r "8\n\t"  op " %%" r "0,%%" r "1,%%" r "9\n\t" \
  op " %%" r "0,%%" r "1,%%" r "10\n\t" op " %%" r "0,%%" r "1,%%" r "11\n\t" \
  op " %%" r "0,%%" r "1,%%" r "12\n\t" op " %%" r "0,%%" r "1,%%" r "13\n\t"

// n iterations of TESSEL_OP12(op, r), all 14 registers zeroed first (a denormal accumulator
// could slow the instructions down).
#define TESSEL_CHAIN_LOOP(n, op, r)                                                         \
  asm volatile(                                                                             \
      "vxorps %%xmm0, %%xmm0, %%xmm0\n\t"   "vxorps %%xmm1, %%xmm1, %%xmm1\n\t"             \
      "vxorps %%xmm2, %%xmm2, %%xmm2\n\t"   "vxorps %%xmm3, %%xmm3, %%xmm3\n\t"             \
      "vxorps %%xmm4, %%xmm4, %%xmm4\n\t"   "vxorps %%xmm5, %%xmm5, %%xmm5\n\t"             \
      "vxorps %%xmm6, %%xmm6, %%xmm6\n\t"   "vxorps %%xmm7, %%xmm7, %%xmm7\n\t"             \
      "vxorps %%xmm8, %%xmm8, %%xmm8\n\t"   "vxorps %%xmm9, %%xmm9, %%xmm9\n\t"             \
      "vxorps %%xmm10, %%xmm10, %%xmm10\n\t" "vxorps %%xmm11, %%xmm11, %%xmm11\n\t"         \
      "vxorps %%xmm12, %%xmm12, %%xmm12\n\t" "vxorps %%xmm13, %%xmm13, %%xmm13\n\t"         \
      "1:\n\t" TESSEL_OP12(op, r) "dec %0\n\t"                                               \
      "jnz 1b\n\t"                                                                          \
      : "+r"(n)                                                                             \
      :                                                                                     \
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",     \
        "xmm10", "xmm11", "xmm12", "xmm13", "cc")
// clang-format on

// n iterations of 12 independent FMAs at `level`; returns the flops of one iteration.
inline double fma_chains(ops::Isa level, int64_t n) {
  if (level >= ops::Isa::kAvx512) {
    TESSEL_CHAIN_LOOP(n, "vfmadd231ps", "zmm");
    return 12 * 2 * 16;
  }
  if (level == ops::Isa::kAvx2) {
    TESSEL_CHAIN_LOOP(n, "vfmadd231ps", "ymm");
    return 12 * 2 * 8;
  }
  return 0.0;
}

// n iterations of 12 independent vdpbf16ps; returns the flops of one iteration.
inline double dpbf16_chains(int64_t n) {
#if defined(__x86_64__)
  TESSEL_CHAIN_LOOP(n, "vdpbf16ps", "zmm");
  return 12 * 2 * 2 * 16;
#else
  (void)n;
  return 0.0;
#endif
}
#undef TESSEL_CHAIN_LOOP
#undef TESSEL_OP12

// Best GFLOP/s of 5 runs of `chains` (about 35 ms each at the fp32 peak).
template <typename F>
double best_gflops(F chains) {
  using Clock = std::chrono::steady_clock;
  constexpr int64_t kIters = 20'000'000;
  double best = 0.0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    const double per_iter = chains(kIters);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (per_iter == 0.0) return 0.0;
    best = std::max(best, per_iter * static_cast<double>(kIters) / s / 1e9);
  }
  return best;
}

}  // namespace detail

// GFLOP/s of the fp32 FMA loop at `level` on the calling thread; 0 at the portable level.
inline double fma_peak_gflops(ops::Isa level = ops::isa()) {
  if (level > ops::host_isa()) return 0.0;
  return detail::best_gflops([level](int64_t n) { return detail::fma_chains(level, n); });
}

// GFLOP/s of the vdpbf16ps loop on the calling thread (AVX512_BF16 CPUs only).
inline double bf16_peak_gflops() { return detail::best_gflops(detail::dpbf16_chains); }

}  // namespace tessel::bench
