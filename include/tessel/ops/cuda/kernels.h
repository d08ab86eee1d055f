// CUDA kernels as forward/backward free functions over device pointers (llm.c llmc/*.cuh
// style: one layer per source file in src/ops/cuda/, each a kernel pair plus a host launcher).
// They mirror cpu.h: same shapes, row-major and contiguous, same contracts:
//   - forward writes its outputs (=) and the cache its backward needs;
//   - backward OVERWRITES dx and ACCUMULATES (+=) into parameter gradients (dw, db, dtable),
//     which are always f32; a null dx means "not needed" and is skipped;
//   - activations are of type t, f32 or bf16 (InvalidArgument otherwise); arithmetic in f32.
// Every pointer is device memory; every launcher only enqueues work on `stream` (asynchronous,
// nothing is read back) and checks the launch. Results are deterministic: no float atomics, each
// sum in one fixed order whatever the device, so two runs give the same bits.
// Where a GPU cache differs from the CPU's (attention keeps lse[B,NH,T], not att[B,NH,T,T];
// cross-entropy keeps lse[N], probabilities optional) the comment says so.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tessel/ops/optim_step.h"  // AdamWStep, SgdStep, kSumSquaresParts
#include "tessel/tensor/dtype.h"

namespace tessel::ops::cuda {

// ---- Elementwise over n values ----
void relu_forward(void* y, const void* x, int64_t n, DType t, cudaStream_t stream);
void relu_backward(void* dx, const void* dy, const void* y, int64_t n, DType t,
                   cudaStream_t stream);  // y = the forward's output
// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as ops::gelu_forward.
void gelu_forward(void* y, const void* x, int64_t n, DType t, cudaStream_t stream);
void gelu_backward(void* dx, const void* dy, const void* x, int64_t n, DType t,
                   cudaStream_t stream);
// y = a + b over count rows of n, b one row added to each (the residual add, count = 1; the
// position table added to every sequence). Its backward is a copy to both inputs.
void add_forward(void* y, const void* a, const void* b, int64_t n, int64_t count, DType t,
                 cudaStream_t stream);
// dst[i] = src[i] between f32 and bf16 (round to nearest even, as tessel::f32_to_bf16).
void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
             cudaStream_t stream);
// acc[i] (f32) += x[k n + i] for k = 0 .. count - 1 in order (a gradient summed into f32, as
// ops::accumulate: the position table's over the sequences).
void accumulate(float* acc, const void* x, int64_t n, int64_t count, DType t, cudaStream_t stream);
// db[OC] += the column sums of dy[N,OC] (the linear layer's bias gradient).
void bias_backward(float* db, const void* dy, DType t, int64_t N, int64_t OC, cudaStream_t stream);

// ---- LayerNorm over the last dimension: x[N,C], w[C], b[C] of type t; eps = 1e-5 ----
// Caches mean[N] and rstd[N] (f32; 1/sqrt(var + eps), biased variance, two-pass).
void layernorm_forward(void* y, float* mean, float* rstd, const void* x, const void* w,
                       const void* b, int64_t N, int64_t C, DType t, cudaStream_t stream);
void layernorm_backward(void* dx, float* dw, float* db, const void* dy, const void* x,
                        const void* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                        DType t, cudaStream_t stream);

// ---- Fused log-softmax + cross-entropy over logits[N,C] of type t, labels[N] ----
// Writes loss[0] = the mean over the N rows (one fixed-order sum), losses[N] (each row's
// loss) and lse[N] (each row's log-sum-exp, the backward's cache). probs[N,C] (f32, the
// softmax, as ops::cross_entropy_forward writes it) only when not null: the fused path needs
// none. A label outside [0, C) makes its row's loss NaN (the CPU throws; validate labels on the
// host where they are loaded).
void cross_entropy_forward(float* loss, float* losses, float* lse, float* probs, const void* logits,
                           const int32_t* labels, int64_t N, int64_t C, DType t,
                           cudaStream_t stream);
// dlogits = (softmax(logits) - onehot(labels - lo)) * dloss / N, the softmax recomputed from
// logits and lse; dlogits may be logits itself (in place). Labels outside [lo, lo + C) add
// nothing, as in ops::cross_entropy_backward.
void cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                            const int32_t* labels, int64_t N, int64_t C, float dloss, int64_t lo,
                            DType t, cudaStream_t stream);
// correct[0] = the number of rows whose first maximum is the label (ops::count_correct).
void count_correct(int64_t* correct, const void* logits, const int32_t* labels, int64_t N,
                   int64_t C, DType t, cudaStream_t stream);

// ---- Vocab-parallel cross-entropy over this rank's classes [lo, lo + C) of V ----
// device_kernels.h's sliced_* slots: columns from `valid` on are padding; the caller reduces
// row_max (max), sums and target (sum) over the tp group between the calls.
void sliced_row_max(float* row_max, const void* logits, int64_t N, int64_t C, int64_t valid,
                    DType t, cudaStream_t stream);
void sliced_exp_sum(float* sums, float* target, const void* logits, const int32_t* labels,
                    const float* row_max, int64_t N, int64_t C, int64_t valid, int64_t lo,
                    int64_t V, DType t, cudaStream_t stream);
void sliced_cross_entropy_backward(void* dlogits, const void* logits, const float* row_max,
                                   const float* sums, const int32_t* labels, int64_t N, int64_t C,
                                   int64_t valid, int64_t lo, float dloss, DType t,
                                   cudaStream_t stream);

// ---- Embedding: y[N,C] = table[ids[n] - lo, :], table[rows,C] holding ids [lo, lo + rows) --
// Ids in [0, V) outside the slice give zero rows; ids outside [0, V) give NaN rows (the CPU
// throws). The backward adds rows in the order of n, without atomics: the same sums in the
// same order as the CPU's loop, so f32 results are the CPU's bits.
void embedding_forward(void* y, const int32_t* ids, const void* table, int64_t N, int64_t V,
                       int64_t C, int64_t lo, int64_t rows, DType t, cudaStream_t stream);
void embedding_backward(float* dtable, const void* dy, const int32_t* ids, int64_t N, int64_t C,
                        int64_t lo, int64_t rows, DType t, cudaStream_t stream);

// ---- Causal multi-head self-attention, flash style ----
// qkv[B,T,3C] (q, k, v side by side, C = NH * HS), out[B,T,C]. Online softmax over key tiles:
// no T x T matrix is ever stored. The cache is lse[B,NH,T] (f32, each query row's
// log-sum-exp of its scaled scores), not the CPU's att; the backward recomputes the
// probabilities from it and needs the forward's out. It OVERWRITES all of dqkv[B,T,3C].
// Head sizes 16, 32, 64 and 128 (attention_head_size_supported); InvalidArgument otherwise.
bool attention_head_size_supported(int64_t HS);
void attention_forward(void* out, float* lse, const void* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, DType t, cudaStream_t stream);
void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH, DType t,
                        cudaStream_t stream);
// The same through tensor-core GEMMs (attention_gemm.cu; cuBLASLt, bf16 in, f32 accumulate),
// for bf16, T >= 256 a multiple of 8, the head sizes above (attention_gemm_supported):
// batched over the heads of a sequence or, when B > NH, over the sequences of a head, by chunks
// of that batch: S = scale Q K^T (f32), a causal softmax kernel writes P (bf16) and lse,
// O = P V; the backward recomputes S and P. Same cache (lse) and contract, so either backward
// takes either forward's out and lse. `scratch` (device, 256-byte aligned) holds 12 T^2 bytes
// per matrix of a chunk (S, dP f32; P, dS bf16): a chunk = scratch_bytes / (12 T^2) matrices,
// at least one; attention_gemm_scratch_bytes(B, T, NH) is the size the kernel table uses: the
// whole batch (max(B, NH) matrices) up to 256 MiB, else as many as fit (one at least).
class Blas;
bool attention_gemm_supported(DType t, int64_t T, int64_t HS);
size_t attention_gemm_scratch_bytes(int64_t B, int64_t T, int64_t NH);
void attention_gemm_forward(Blas& blas, void* scratch, size_t scratch_bytes, void* out, float* lse,
                            const void* qkv, int64_t B, int64_t T, int64_t C, int64_t NH, DType t,
                            cudaStream_t stream);
void attention_gemm_backward(Blas& blas, void* scratch, size_t scratch_bytes, void* dqkv,
                             const void* dout, const void* qkv, const void* out, const float* lse,
                             int64_t B, int64_t T, int64_t C, int64_t NH, DType t,
                             cudaStream_t stream);

// The same through cuDNN's fused flash attention (attention_cudnn.cc: cuDNN 9's SDPA through
// cudnn-frontend graphs, bf16 in, f32 softmax, tensor cores, the deterministic backward). Same
// cache (lse) and contract, so its forward and another path's backward mix. Each direction:
// attention_cudnn_refusal says "" where this cuDNN runs it and why not elsewhere (f32; a head
// size, length or library it lacks): the first ask builds the direction's graph on this thread
// (a device is needed) and keeps it. The others throw InvalidArgument for a refused direction.
// `workspace` (device) holds attention_cudnn_workspace_bytes of that direction (the
// deterministic backward's grows with B NH T^2: about 384 MiB for GPT-2 at 16 x 1024 with
// cuDNN 9.19, by the frontend's formula).
std::string attention_cudnn_refusal(DType t, int64_t B, int64_t T, int64_t C, int64_t NH,
                                    bool backward);
size_t attention_cudnn_workspace_bytes(int64_t B, int64_t T, int64_t C, int64_t NH, bool backward);
void attention_cudnn_forward(void* workspace, void* out, float* lse, const void* qkv, int64_t B,
                             int64_t T, int64_t C, int64_t NH, cudaStream_t stream);
void attention_cudnn_backward(void* workspace, void* dqkv, const void* dout, const void* qkv,
                              const void* out, const float* lse, int64_t B, int64_t T, int64_t C,
                              int64_t NH, cudaStream_t stream);

// ---- The modern GPT's parts (src/ops/cuda/modern_gpt.cu), as cpu.h's ----
// RMSNorm over x[N,C], w[C]; eps = 1e-5; caches rstd[N] (f32); dw[C] accumulated (+=).
void rmsnorm_forward(void* y, float* rstd, const void* x, const void* w, int64_t N, int64_t C,
                     DType t, cudaStream_t stream);
void rmsnorm_backward(void* dx, float* dw, const void* dy, const void* x, const void* w,
                      const float* rstd, int64_t N, int64_t C, DType t, cudaStream_t stream);
// Rotary positions in place over q and k (the first 2C values) of N rows of qkv[N,3C]: in each
// head of size hs = C/NH the pairs (i, i + hs/2) turn by pos[n] * 10000^(-2i/hs) (the angle in
// f64, as the CPU); the backward turns the other way.
void rotary_forward(void* qkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t,
                    cudaStream_t stream);
void rotary_backward(void* dqkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t,
                     cudaStream_t stream);
// SwiGLU over x[N,2H] (gate, then up): y[N,H] = silu(gate) * up; the backward overwrites dx.
void swiglu_forward(void* y, const void* x, int64_t N, int64_t H, DType t, cudaStream_t stream);
void swiglu_backward(void* dx, const void* dy, const void* x, int64_t N, int64_t H, DType t,
                     cudaStream_t stream);

// ---- Dropout with the CPU's counter-RNG mask (src/ops/cuda/dropout.cu): the CPU's bits ----
// y[rows, cols] = x * mask / (1 - p); element (r, c) kept when the uniform of CounterRng(seed,
// mix_stream(kDropout, step, first_sample + r)) at first_col + c is >= p. The backward applies
// the same mask to dy (a null dx is skipped).
void dropout_forward(void* y, const void* x, int64_t rows, int64_t cols, float p, uint64_t seed,
                     int64_t step, int64_t first_sample, int64_t first_col, DType t,
                     cudaStream_t stream);
void dropout_backward(void* dx, const void* dy, int64_t rows, int64_t cols, float p, uint64_t seed,
                      int64_t step, int64_t first_sample, int64_t first_col, DType t,
                      cudaStream_t stream);

// ---- Optimizers over a flat f32 arena (AdamWStep, SgdStep: optim_step.h) ----
// One AdamW step over n parameters, reading grads * grad_scale; m and v are the state. When
// `working` is not null, the new parameters are also written there as working_type (bf16 for
// now; round to nearest even), the 16-bit copy the next forward reads.
void adamw_step(float* params, const float* grads, float* m, float* v, void* working,
                DType working_type, int64_t n, const AdamWStep& k, cudaStream_t stream);
// One SGD step over n parameters; the momentum buffer is seeded on k.first, as PyTorch does.
// `working` as in adamw_step. The CPU optimizer's roundings: the same f32 operations in the
// same order, no contraction.
void sgd_step(float* params, const float* grads, float* momentum, void* working, DType working_type,
              int64_t n, const SgdStep& k, cudaStream_t stream);
// out[0] = sum of x[i]^2 over n floats, in f64 (as optim::sum_squares), in a fixed order:
// kSumSquaresParts partial sums (in `partials`, caller-owned, that many doubles) then one.
// The global norm is sqrt of that (summed over shards first).
void sum_squares(double* out, double* partials, const float* x, int64_t n, cudaStream_t stream);

// ---- Deterministic mode's exact sum (src/ops/cuda/exact.cu): tessel/ops/exact.h's contracts,
// the CPU loops' bits ----
void exact_collect(float* kept, float* max, const float* g, int64_t n, cudaStream_t stream);
void exact_quantise(int64_t* acc, const float* g, int64_t n, double scale, cudaStream_t stream);
void exact_dequantise(float* out, const int64_t* sums, int64_t n, double scale,
                      cudaStream_t stream);

}  // namespace tessel::ops::cuda
