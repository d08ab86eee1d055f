// The ISA level: what the CPU runs (CPUID through the compiler's __builtin_cpu_supports, which
// also checks that the OS saves the wider registers), what TESSEL_ISA asks for, and the kernel
// table of each level. Compiled for the baseline x86-64, like everything outside the ISA
// translation units.
#include "tessel/ops/isa.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

#include "kernels.h"
#include "tessel/core/error.h"

namespace tessel::ops {
namespace {

constexpr Isa kLevels[] = {Isa::kPortable, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16};

#ifdef TESSEL_BF16_KERNEL
constexpr bool kBf16Built = true;
constexpr auto kGemmBf16 = &avx512_bf16::gemm_bf16;
#else
constexpr bool kBf16Built = false;
constexpr decltype(CpuKernels::gemm_bf16) kGemmBf16 = nullptr;
#endif

// A level's table of the kernels every level defines (kernels.h's TESSEL_LEVEL_KERNELS);
// designated initializers, so a slot left out is null (its portable default, kernels.h).
#define TESSEL_LEVEL_TABLE(level, ns)                                                            \
  .isa = level, .sgemm = &ns::sgemm, .convert = &ns::convert, .gelu_forward = &ns::gelu_forward, \
  .gelu_backward = &ns::gelu_backward, .causal_softmax = &ns::causal_softmax,                    \
  .causal_softmax_backward = &ns::causal_softmax_backward,                                       \
  .layernorm_forward = &ns::layernorm_forward, .layernorm_backward = &ns::layernorm_backward,    \
  .maxpool_2x2 = &ns::maxpool_2x2, .conv_direct_scratch = &ns::conv_direct_scratch,              \
  .conv_direct_forward = &ns::conv_direct_forward,                                               \
  .conv_direct_backward = &ns::conv_direct_backward

constexpr CpuKernels kAvx512Table = {TESSEL_LEVEL_TABLE(Isa::kAvx512, avx512),
                                     // AVX2's: no AVX-512 kernel of their own yet
                                     .int8_quantize = &avx2::int8_quantize,
                                     .int8_dequantize_add = &avx2::int8_dequantize_add};

// avx512_bf16: the avx512 table and the native bf16 GEMM.
constexpr CpuKernels with_bf16(CpuKernels t) {
  t.isa = Isa::kAvx512Bf16;
  t.gemm_bf16 = kGemmBf16;
  return t;
}

const CpuKernels kTables[] = {
    {TESSEL_LEVEL_TABLE(Isa::kPortable, portable), .int8_quantize = &portable::int8_quantize,
     .int8_dequantize_add = &portable::int8_dequantize_add},
    {TESSEL_LEVEL_TABLE(Isa::kAvx2, avx2), .int8_quantize = &avx2::int8_quantize,
     .int8_dequantize_add = &avx2::int8_dequantize_add, .sgemm_lowp = &avx2::sgemm_lowp},
    kAvx512Table,
    with_bf16(kAvx512Table),
};

Isa detect() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (!avx2) return Isa::kPortable;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!avx512) return Isa::kAvx2;
  return kBf16Built && __builtin_cpu_supports("avx512bf16") ? Isa::kAvx512Bf16 : Isa::kAvx512;
}

std::string supported_list() {
  std::string s;
  for (Isa l : supported_isas()) s += std::string(s.empty() ? "" : ", ") + isa_name(l);
  return s;
}

void check_supported(Isa level, const char* what) {
  if (level > host_isa()) {
    throw InvalidArgument(str(what, ": this CPU runs at most ", isa_name(host_isa()), ", got ",
                              isa_name(level), "; choose one of ", supported_list()));
  }
}

Isa from_environment() {
  const char* env = std::getenv("TESSEL_ISA");
  if (env == nullptr || *env == '\0') return host_isa();
  const Isa level = parse_isa(env);
  check_supported(level, "TESSEL_ISA");
  return level;
}

std::atomic<const CpuKernels*>& current() {
  static std::atomic<const CpuKernels*> table{&kernels_for(from_environment())};
  return table;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line
                                        : line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown CPU";
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Bf16:
      return "avx512_bf16";
  }
  return "?";
}

Isa parse_isa(std::string_view name) {
  for (Isa l : kLevels) {
    if (name == isa_name(l)) return l;
  }
  throw InvalidArgument(
      str("isa: unknown level, got '", name, "'; use one of portable, avx2, avx512, avx512_bf16"));
}

Isa host_isa() {
  static const Isa level = detect();
  return level;
}

Isa isa() { return current().load(std::memory_order_relaxed)->isa; }

void set_isa(Isa level) {
  check_supported(level, "set_isa");
  current().store(&kernels_for(level), std::memory_order_relaxed);
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa l : kLevels) {
    if (l <= host_isa()) out.push_back(l);
  }
  return out;
}

std::string isa_description() {
  return str(isa_name(isa()), " (host ", isa_name(host_isa()), "; ", cpu_model(), ")");
}

const CpuKernels& kernels() { return *current().load(std::memory_order_relaxed); }

const CpuKernels& kernels_for(Isa level) {
  check_supported(level, "kernels_for");
  return kTables[static_cast<int>(level)];
}

}  // namespace tessel::ops
