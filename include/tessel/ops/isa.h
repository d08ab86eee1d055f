// The CPU instruction-set level the kernels run at. One binary serves every x86-64 CPU: the
// kernels are compiled once per level and the level in use is chosen at start from CPUID (the
// highest the CPU and OS support), or lowered by the environment variable TESSEL_ISA
// (portable | avx2 | avx512 | avx512_bf16). Every f32 kernel gives the same bits at every level
// (docs/performance.md says how); only the avx512_bf16 level's native bf16 GEMM rounds otherwise.
// Thread safety: the level is read by every kernel call; set_isa is for tests and benches and
// must not race with running kernels.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessel::ops {

enum class Isa { kPortable, kAvx2, kAvx512, kAvx512Bf16 };

// "portable", "avx2", "avx512", "avx512_bf16".
const char* isa_name(Isa isa);
// The inverse of isa_name; throws InvalidArgument naming the choices on anything else.
Isa parse_isa(std::string_view name);
// The highest level this CPU and OS run (AVX2 needs FMA and F16C too; AVX-512 is F, BW, VL,
// DQ; avx512_bf16 also needs a build whose compiler targets AVX512_BF16).
Isa host_isa();
// The level in use: host_isa(), or TESSEL_ISA where set (read once, at the first call). Throws
// InvalidArgument when TESSEL_ISA names an unknown level or one above host_isa().
Isa isa();
// Runs the kernels at `level` from now on; throws InvalidArgument above host_isa().
void set_isa(Isa level);
// Every level host_isa() covers, lowest first.
std::vector<Isa> supported_isas();
// One line for logs and reports, e.g. "avx2 (host avx2; AMD EPYC 7B13)".
std::string isa_description();

}  // namespace tessel::ops
