// Private to ops: the CPU kernel table. Each ISA level (tessel/ops/isa.h) fills one table of
// plain function pointers with kernels compiled for that level in their own translation units
// (*_avx2.cc, *_avx512.cc, gemm_bf16.cc: only those carry the level's compiler flags, and only
// the table reaches their code, so no wider instruction runs on a CPU without it). The public
// ops (cpu.h) check their arguments and call kernels(). Optional slots are null where a level
// has no kernel of its own; the caller then takes the portable path named beside the slot.
// A device backend adds its own table beside this one.
#pragma once

#include <cstdint>

#include "conv_impl.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/isa.h"

namespace tessel::ops {

// The kernels every level defines in its own translation units, declared in each level's
// namespace below.
#define TESSEL_LEVEL_KERNELS                                                                      \
  void gelu_forward(float* y, const float* x, int64_t n);                                         \
  void gelu_backward(float* dx, const float* dy, const float* x, int64_t n);                      \
  void causal_softmax(float* p, int64_t rows, int64_t ld, int64_t first, int64_t keys);           \
  void causal_softmax_backward(float* d, const float* p, int64_t rows, int64_t ld, int64_t first, \
                               int64_t keys, float scale);                                        \
  void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,      \
                         const float* b, int64_t N, int64_t C);                                   \
  void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,       \
                          const float* w, const float* mean, const float* rstd, int64_t N,        \
                          int64_t C);                                                             \
  void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,            \
             const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,      \
             int64_t ldc);                                                                        \
  void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n);            \
  void maxpool_2x2(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H,          \
                   int64_t W, int64_t OH, int64_t OW);                                            \
  int64_t conv_direct_scratch(const Conv2dShape& s, const detail::ConvFusion& f);                 \
  void conv_direct_forward(float* y, int32_t* argmax, const float* x, const float* w,             \
                           const float* b, const detail::ConvFusion& f, const Conv2dShape& s,     \
                           float* scratch);                                                       \
  void conv_direct_backward(float* dx, float* dw, float* db, const float* dy, const float* y,     \
                            const int32_t* argmax, const detail::ConvFusion& f, const float* x,   \
                            const float* w, const Conv2dShape& s, float* scratch);

// The int8 codec's kernels: portable and AVX2 only (the AVX-512 tables take AVX2's, isa.cc).
#define TESSEL_INT8_KERNELS                                                              \
  void int8_quantize(int8_t* q, float* scales, const float* x, int64_t n, int64_t chunk, \
                     uint64_t seed, uint64_t stream);                                    \
  void int8_dequantize_add(float* acc, const int8_t* q, const float* scales, int64_t n,  \
                           int64_t chunk);

namespace portable {
TESSEL_LEVEL_KERNELS
TESSEL_INT8_KERNELS
}  // namespace portable

namespace avx2 {
TESSEL_LEVEL_KERNELS
void sgemm_lowp(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                ConstMatrix A, ConstMatrix B, float beta, Matrix C);
TESSEL_INT8_KERNELS
}  // namespace avx2

namespace avx512 {
TESSEL_LEVEL_KERNELS
}  // namespace avx512

// Built only where the compiler targets AVX512_BF16 (TESSEL_BF16_KERNEL).
namespace avx512_bf16 {
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               ConstMatrix A, ConstMatrix B, float beta, Matrix C);
}  // namespace avx512_bf16

struct CpuKernels {
  Isa isa;
  // ops::gemm for K > 0 and alpha != 0, in the sum order of gemm_blocking.h (every level gives
  // the same bits). Single-threaded.
  decltype(&portable::sgemm) sgemm;
  // ops::convert between two different float types.
  decltype(&portable::convert) convert;
  // ops::gelu_forward and gelu_backward over f32 (dx not null).
  decltype(&portable::gelu_forward) gelu_forward;
  decltype(&portable::gelu_backward) gelu_backward;
  // Attention's softmax of a query block's scores and its backward (activation_loops.h).
  decltype(&portable::causal_softmax) causal_softmax;
  decltype(&portable::causal_softmax_backward) causal_softmax_backward;
  // ops::layernorm_forward and layernorm_backward over f32 (layernorm_loops.h).
  decltype(&portable::layernorm_forward) layernorm_forward;
  decltype(&portable::layernorm_backward) layernorm_backward;
  // The 2x2, stride 2 max pool over `planes` planes of H x W (pool.cc).
  decltype(&portable::maxpool_2x2) maxpool_2x2;
  // The direct convolution of conv_impl.h, for the shapes conv2d_direct_supported takes, in
  // one sum order at every level (conv_direct_portable.cc).
  decltype(&portable::conv_direct_scratch) conv_direct_scratch;
  decltype(&portable::conv_direct_forward) conv_direct_forward;
  decltype(&portable::conv_direct_backward) conv_direct_backward;
  // ops::int8_quantize and int8_dequantize_add (quantize.cc; chunk checked).
  decltype(&portable::int8_quantize) int8_quantize;
  decltype(&portable::int8_dequantize_add) int8_dequantize_add;
  // (optional, default null: bf16-rounded operands through sgemm) gemm_lowp on native bf16
  // dot products; the caller has checked sizes, K > 0 and alpha != 0.
  decltype(&avx512_bf16::gemm_bf16) gemm_bf16 = nullptr;
  // (optional, default null: operands rounded into f32 copies, then sgemm) gemm_lowp's f32 path:
  // sgemm's kernel and sum order on operands of any float type, each rounded to bf16 while it
  // is packed (gemm_driver.h's Elem), and a C of any float type, a 16-bit one widened when read
  // and rounded once when its sum is complete (gemm_driver.h's CElem); the caller has checked
  // sizes, K > 0 and alpha != 0.
  decltype(&avx2::sgemm_lowp) sgemm_lowp = nullptr;
};

// The table of the level in use (isa()).
const CpuKernels& kernels();
// The table of a level this build and CPU support.
const CpuKernels& kernels_for(Isa level);

}  // namespace tessel::ops
