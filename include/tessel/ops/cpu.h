// CPU kernels as forward/backward free functions over raw pointers (llm.c style), shapes in the
// signature, all row-major and contiguous. Contracts shared by every pair:
//   - forward writes its outputs (=) and any cache the backward needs;
//   - backward OVERWRITES dx (the gradient w.r.t. the input) and ACCUMULATES (+=) into
//     parameter gradients (dw, db, dtable ...), so several micro-batches can add up;
//   - a null dx means "not needed" (e.g. the first layer) and is skipped.
// GEMMs go through tessel's own AVX-512 kernel when the build targets AVX-512 and one BLAS thread
// is asked for, else OpenBLAS (cblas_sgemm); the rest are plain loops the compiler vectorises.
// Kernels hold no state and are safe to call from several threads on distinct buffers.
#pragma once

#include <cstdint>

#include "tessel/tensor/dtype.h"

namespace tessel::ops {

// ---- BLAS ----
// C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major; op(X) = X or X^T.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// OpenBLAS's thread count is one value for the whole process: set it once per process from
// runtime.threads. Ranks running as threads of one process each call BLAS with 1 thread.
// With 1 (also before any call) gemm runs tessel's own kernels, whose row bits depend on
// neither the row count nor the ISA level; only with more does it call OpenBLAS.
void set_blas_threads(int n);
int blas_threads();  // the count last set, 1 before any call

// ---- Low precision (train.precision = bf16 | fp16) ----
// A row-major matrix of f32, bf16 or f16 elements (16-bit ones as their bit patterns) with
// leading dimension ld, in elements.
struct ConstMatrix {
  const void* p;
  DType type;
  int64_t ld;
};
struct Matrix {
  void* p;
  DType type;
  int64_t ld;
};
// C[M,N] = alpha * op(A) @ op(B) + beta * C, each element of op(A) and op(B) rounded to bf16
// (f32 and f16 operands converted on the fly, to nearest even), products and sums in f32; a
// 16-bit C is rounded once, at the end. beta = 0 never reads C. tessel's own AVX512_BF16 kernel
// where the CPU has the instruction (checked at run time), else a portable path with the same
// products (only the order of the f32 additions differs). Single-threaded.
void gemm_lowp(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               ConstMatrix A, ConstMatrix B, float beta, Matrix C);
// Whether gemm_lowp runs tessel's AVX512_BF16 kernel on this machine.
bool gemm_lowp_native();
// dst[i] = src[i] converted between f32, bf16 and f16 (round to nearest even; NaN stays NaN,
// f16 overflow becomes inf; the AVX512_BF16 path flushes f32 subnormals to zero).
void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n);

// ---- The kernels below over buffers of any float type t (f32, bf16 or f16) ----
// The layers call these in every train.precision: f32 runs the f32 kernels, a 16-bit type the
// GEMMs on gemm_lowp and the rest on f32 copies of small pieces (statistics, softmax, sums in
// f32; 16-bit results rounded once). Parameter gradients (dw, db, dtable) and the statistics
// (mean, rstd, att) are always f32. Same shapes and contracts as the f32 versions.
// acc[i] += x[k n + i] for k = 0, 1, ..., count - 1 in that order: count rows of n summed into
// one, each element in the order count separate calls would give.
void accumulate(float* acc, const void* x, int64_t n, DType t, int64_t count = 1);
// x may be of another float type than y, w, b (the first layer's f32 input); dx has x's type.
void linear_forward(void* y, const void* x, DType x_type, const void* w, const void* b, DType t,
                    int64_t N, int64_t C, int64_t OC);
void linear_backward(void* dx, DType x_type, float* dw, float* db, const void* dy, const void* x,
                     const void* w, DType t, int64_t N, int64_t C, int64_t OC);
void relu_forward(void* y, const void* x, int64_t n, DType t);
void relu_backward(void* dx, const void* dy, const void* y, int64_t n, DType t);
void gelu_forward(void* y, const void* x, int64_t n, DType t);
void gelu_backward(void* dx, const void* dy, const void* x, int64_t n, DType t);
// y = a + b over count rows of n: b is one row of n, added to every row of a (y may alias a).
void add_forward(void* y, const void* a, const void* b, int64_t n, DType t, int64_t count = 1);
void dropout_forward(void* y, const void* x, int64_t rows, int64_t cols, float p, uint64_t seed,
                     int64_t step, int64_t first_sample, int64_t first_col, DType t);
void dropout_backward(void* dx, const void* dy, int64_t rows, int64_t cols, float p, uint64_t seed,
                      int64_t step, int64_t first_sample, int64_t first_col, DType t);
void layernorm_forward(void* y, float* mean, float* rstd, const void* x, const void* w,
                       const void* b, int64_t N, int64_t C, DType t);
void layernorm_backward(void* dx, float* dw, float* db, const void* dy, const void* x,
                        const void* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                        DType t);
void rmsnorm_forward(void* y, float* rstd, const void* x, const void* w, int64_t N, int64_t C,
                     DType t);
void rmsnorm_backward(void* dx, float* dw, const void* dy, const void* x, const void* w,
                      const float* rstd, int64_t N, int64_t C, DType t);
void rotary_forward(void* qkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t);
void rotary_backward(void* dqkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t);
void swiglu_forward(void* y, const void* x, int64_t N, int64_t H, DType t);
void swiglu_backward(void* dx, const void* dy, const void* x, int64_t N, int64_t H, DType t);
void embedding_forward(void* y, const int32_t* ids, const void* table, int64_t N, int64_t V,
                       int64_t C, int64_t lo, int64_t rows, DType t);
void embedding_backward(float* dtable, const void* dy, const int32_t* ids, int64_t N, int64_t C,
                        int64_t lo, int64_t rows, DType t);
void attention_forward(void* out, float* att, const void* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, DType t);
void attention_backward(void* dqkv, const void* dout, const void* qkv, const float* att, int64_t B,
                        int64_t T, int64_t C, int64_t NH, DType t);

// ---- Linear: y[N,OC] = x[N,C] @ w[OC,C]^T + b[OC]  (PyTorch weight layout) ----
// b may be null; w_t: w is given transposed, [C,OC] (read in place: no per-call packing), with
// the same bits.
void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t C,
                    int64_t OC, bool w_t = false);
void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, int64_t N, int64_t C, int64_t OC);  // dx, dw, db may be null
// db[OC] += the column sums of dy[N,OC] (linear_backward's bias part).
void bias_backward(float* db, const float* dy, int64_t N, int64_t OC);

// ---- Elementwise activations over n values ----
void relu_forward(float* y, const float* x, int64_t n);
void relu_backward(float* dx, const float* dy, const float* y, int64_t n);  // y = forward output
// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(float* y, const float* x, int64_t n);
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n);
// y = a + b (residual connections); the backward of an add is a copy to both inputs.
void add_forward(float* y, const float* a, const float* b, int64_t n);

// ---- Fused log-softmax + cross-entropy, mean over the N rows ----
// logits[N,C], labels[N] in [0, C). Returns the mean loss; writes probs[N,C] (softmax) for the
// backward. Stable: subtracts each row's max. Throws InvalidArgument on a label outside [0, C).
float cross_entropy_forward(float* probs, const float* logits, const int32_t* labels, int64_t N,
                            int64_t C);
// dlogits = (probs - onehot(labels - lo)) * dloss / N   (dloss = 1 for a plain mean loss);
// when the columns are classes [lo, lo + C) of a tensor-parallel slice, labels outside it add
// nothing (on every rank, the one whose slice starts at lo = 0 too).
void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t N,
                            int64_t C, float dloss, int64_t lo = 0);
// Number of rows whose argmax equals the label.
int64_t count_correct(const float* logits, const int32_t* labels, int64_t N, int64_t C);

// ---- The same over logits cut by class across a tensor-parallel group ----
// logits[N, C] hold classes [lo, lo + C); columns from `valid` on are padding (a vocabulary
// padded to a multiple of the group), left out. Three steps, each followed by a reduction of
// one value per row over the group:
// (1) row_max = the max over this rank's classes (then: the max over the group);
void sliced_row_max(float* row_max, const float* logits, int64_t N, int64_t C, int64_t valid);
// (2) probs = exp(logits - row_max), sums = their row sums, target = the label's logit where
//     this rank holds the label, else 0 (then: both summed over the group);
void sliced_exp(float* probs, float* sums, float* target, const float* logits,
                const int32_t* labels, const float* row_max, int64_t N, int64_t C, int64_t valid,
                int64_t lo);
// (3) probs /= sums (padding 0);
void sliced_normalize(float* probs, const float* sums, int64_t N, int64_t C, int64_t valid);
// (4) returns the mean loss, log(sum) + max - target (the group's), and *correct, the rows
//     whose label's logit is their maximum. (A device computes (3) in its backward and reads
//     (4)'s N x 3 values back.)
float sliced_loss(const float* sums, const float* target, const float* row_max, int64_t N,
                  int64_t* correct);

// ---- LayerNorm over the last dimension: x[N,C], w[C], b[C]; eps = 1e-5 ----
// Caches mean[N] and rstd[N] (1/sqrt(var + eps), biased variance) for the backward.
void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C);
void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C);

// ---- The modern GPT variant's kernels (modern_gpt.cc) ----
// RMSNorm over the last dimension: y = x / sqrt(mean(x^2) + eps) * w, x[N,C], w[C], eps 1e-5;
// caches rstd[N] for the backward.
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t N, int64_t C);
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t N, int64_t C);
// Rotary position embedding (RoPE, GPT-NeoX's pairing), in place on qkv[N,3C] rows (q, k, v of
// NH heads of even size hs = C/NH): each head's pairs (i, i + hs/2) of q and k are rotated by
// pos[n] * 10000^(-2i/hs); v is untouched. The backward rotates the gradient back.
void rotary_forward(float* qkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH);
void rotary_backward(float* dqkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH);
// SwiGLU: y[N,H] = silu(a) * b for x[N,2H] = [a | b] row by row (silu(a) = a sigmoid(a)).
void swiglu_forward(float* y, const float* x, int64_t N, int64_t H);
void swiglu_backward(float* dx, const float* dy, const float* x, int64_t N, int64_t H);

// ---- Embedding: y[N,C] = table[ids[n], :], table[V,C] ----
// Throws InvalidArgument on an id outside [0, V). A tensor-parallel rank holds only the rows
// of ids [lo, lo + rows): other ids give zero rows in the forward and nothing in the backward.
void embedding_forward(float* y, const int32_t* ids, const float* table, int64_t N, int64_t V,
                       int64_t C, int64_t lo = 0, int64_t rows = -1);  // rows < 0: V

// ---- Dropout with a counter-based mask ----
// x holds `rows` samples of `cols` values each; row r is global sample (first_sample + r),
// column c is feature first_col + c (nonzero for a tensor-parallel slice of the features).
// The keep decision for element (r, c) is a pure function of (seed, step, sample, feature),
// so it is the same whatever rank, thread or batch split computes it, and the backward
// recomputes it instead of storing a mask. Kept values are scaled by 1/(1-p).
void dropout_forward(float* y, const float* x, int64_t rows, int64_t cols, float p, uint64_t seed,
                     int64_t step, int64_t first_sample, int64_t first_col = 0);
void dropout_backward(float* dx, const float* dy, int64_t rows, int64_t cols, float p,
                      uint64_t seed, int64_t step, int64_t first_sample, int64_t first_col = 0);

// ---- Conv2d: x[N,C,H,W], w[OC,C,KH,KW], b[OC] -> y[N,OC,OH,OW] ----
// OH = (H + 2*pad - KH) / stride + 1, likewise OW. `scratch` holds at least
// conv2d_scratch_floats(...) floats; the caller owns it. An AVX-512 build runs tessel's own
// direct kernels for stride 1 (kernel width <= 7, pad < kernel size), im2col + GEMM otherwise.
// Single-threaded; results are the same bits on every run and for any thread count. On a device
// (inside a DeviceScope) the conv and pool ops run its kernel table (device_kernels.h), and the
// scratch is device memory of the size the scratch queries then give.
struct Conv2dShape {
  int64_t N, C, H, W, OC, KH, KW, stride, pad;
  int64_t OH() const { return (H + 2 * pad - KH) / stride + 1; }
  int64_t OW() const { return (W + 2 * pad - KW) / stride + 1; }
};
int64_t conv2d_scratch_floats(const Conv2dShape& s);
void conv2d_forward(float* y, const float* x, const float* w, const float* b, const Conv2dShape& s,
                    float* scratch);
void conv2d_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const Conv2dShape& s, float* scratch);

// ---- Conv2d + ReLU (+ MaxPool2d), fused ----
// What conv2d_forward, relu_forward (and maxpool2d_forward) give in sequence, and their
// backwards likewise, in one pass over the batch: the convolution's output does not travel
// through memory between the steps (with pooling it is never stored at all: each image's
// output is pooled while in cache). Bit for bit on the direct kernels; on the im2col path the
// pooled variants go image by image, which changes dw's and db's summation order.
// y = relu(conv2d(x) + b), [N,OC,OH,OW]; scratch of conv2d_scratch_floats(s).
void conv2d_relu_forward(float* y, const float* x, const float* w, const float* b,
                         const Conv2dShape& s, float* scratch);
// dy: the gradient w.r.t. y; y: conv2d_relu_forward's output.
void conv2d_relu_backward(float* dx, float* dw, float* db, const float* dy, const float* y,
                          const float* x, const float* w, const Conv2dShape& s, float* scratch);
// y = maxpool2d(relu(conv2d(x) + b), k, stride), [N,OC,PH,PW] with PH = (OH - k) / stride + 1,
// likewise PW; argmax[N*OC*PH*PW] as maxpool2d_forward's (an index into the OH x OW plane).
int64_t conv2d_relu_maxpool_scratch_floats(const Conv2dShape& s, int64_t k, int64_t stride);
void conv2d_relu_maxpool_forward(float* y, int32_t* argmax, const float* x, const float* w,
                                 const float* b, const Conv2dShape& s, int64_t k, int64_t stride,
                                 float* scratch);
// dy: the gradient w.r.t. y [N,OC,PH,PW]; argmax, y: the forward's outputs.
void conv2d_relu_maxpool_backward(float* dx, float* dw, float* db, const float* dy,
                                  const int32_t* argmax, const float* y, const float* x,
                                  const float* w, const Conv2dShape& s, int64_t k, int64_t stride,
                                  float* scratch);

// ---- MaxPool2d, square kernel k and stride: x[N,C,H,W] -> y[N,C,OH,OW] ----
// OH = (H - k) / stride + 1. argmax[N*C*OH*OW] caches the winning input index for backward.
void maxpool2d_forward(float* y, int32_t* argmax, const float* x, int64_t N, int64_t C, int64_t H,
                       int64_t W, int64_t k, int64_t stride);
void maxpool2d_backward(float* dx, const float* dy, const int32_t* argmax, int64_t N, int64_t C,
                        int64_t H, int64_t W, int64_t k, int64_t stride);

// ---- Causal multi-head self-attention ----
// qkv[B,T,3C] holds q, k, v side by side (each C = NH * HS); out[B,T,C].
// att[B,NH,T,T] caches the softmax probabilities (zero above the diagonal) for the backward.
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        int64_t B, int64_t T, int64_t C, int64_t NH);
// Inference with a KV cache: the T new positions [pos, pos + T) of B sequences. Their keys and
// values (from qkv[B,T,3C]) are appended to k_cache and v_cache [B,Tmax,C] at positions
// [pos, pos + T); each query attends to the cached positions up to its own. The same arithmetic,
// in the same order, as attention_forward's rows for those positions (bit for bit where the
// GEMMs run on tessel's own kernel: AVX-512 builds at one BLAS thread, as predict and serve run).
void attention_forward_kv(float* out, const float* qkv, float* k_cache, float* v_cache, int64_t B,
                          int64_t T, int64_t pos, int64_t C, int64_t NH, int64_t Tmax);

}  // namespace tessel::ops
