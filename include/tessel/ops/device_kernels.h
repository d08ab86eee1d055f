// The kernel table of a device (ggml's backend interface, narrowed to the ops tessel's models
// use): plain function pointers that a device backend fills with its launchers
// (ops::cuda::install() for Device::kCuda). The typed public ops of cpu.h and the device
// losses below call the table of current_device() when a thread works on a device (inside a
// DeviceScope), and the CPU kernels otherwise; an op whose slot is null (or that has none)
// throws naming the op. Every pointer a slot takes is that device's memory; every slot only
// queues work on `stream` (the caller's current_stream()) and reads nothing back. Contracts are
// cpu.h's: forward writes (=), backward overwrites dx (null: skipped) and accumulates (+=) into
// the f32 parameter gradients; activations are of type t (f32 or bf16 on CUDA).
#pragma once

#include <cstdint>

#include "tessel/ops/optim_step.h"  // AdamWStep, SgdStep, kSumSquaresParts
#include "tessel/tensor/dtype.h"

namespace tessel::ops {

struct Conv2dShape;  // cpu.h

struct DeviceKernels {
  // ---- Linear: y[N,OC] = x[N,C] @ w[OC,C]^T + b[OC] (b may be null); x of x_type, the rest t
  void (*linear_forward)(void* y, const void* x, DType x_type, const void* w, const void* b,
                         DType t, int64_t N, int64_t C, int64_t OC, void* stream);
  // dx of x_type (null: skipped); dw[OC,C], db[OC] f32, accumulated (each may be null).
  void (*linear_backward)(void* dx, DType x_type, float* dw, float* db, const void* dy,
                          const void* x, const void* w, DType t, int64_t N, int64_t C, int64_t OC,
                          void* stream);
  // ---- Convolution and pooling: f32, NCHW, s as cpu.h's Conv2dShape ----
  // y[N,OC,OH,OW] = conv2d(x[N,C,H,W], w[OC,C,KH,KW]) + b[OC].
  void (*conv2d_forward)(float* y, const float* x, const float* w, const float* b,
                         const Conv2dShape& s, void* stream);
  // dx[N,C,H,W] overwritten (null: skipped); dw, db accumulated.
  void (*conv2d_backward)(float* dx, float* dw, float* db, const float* dy, const float* x,
                          const float* w, const Conv2dShape& s, void* stream);
  // Max pooling without padding, y[N,C,OH,OW], argmax[N,C,OH,OW] each winner's index h * W + w
  // in its plane; the first maximum in scan order wins, a NaN wins (cpu.h's maxpool2d_forward).
  void (*maxpool2d_forward)(float* y, int32_t* argmax, const float* x, int64_t N, int64_t C,
                            int64_t H, int64_t W, int64_t k, int64_t stride, void* stream);
  // dx[N,C,H,W] overwritten: zero, plus dy at each argmax (summed where windows overlap).
  void (*maxpool2d_backward)(float* dx, const float* dy, const int32_t* argmax, int64_t N,
                             int64_t C, int64_t H, int64_t W, int64_t k, int64_t stride,
                             void* stream);
  // ---- Elementwise over n values ----
  void (*relu_forward)(void* y, const void* x, int64_t n, DType t, void* stream);
  void (*relu_backward)(void* dx, const void* dy, const void* y, int64_t n, DType t,
                        void* stream);  // y = the forward's output
  void (*gelu_forward)(void* y, const void* x, int64_t n, DType t, void* stream);
  void (*gelu_backward)(void* dx, const void* dy, const void* x, int64_t n, DType t, void* stream);
  void (*add_forward)(void* y, const void* a, const void* b, int64_t n, int64_t count, DType t,
                      void* stream);
  // ---- LayerNorm over x[N,C], w[C], b[C]; mean[N], rstd[N] f32 (eps 1e-5) ----
  void (*layernorm_forward)(void* y, float* mean, float* rstd, const void* x, const void* w,
                            const void* b, int64_t N, int64_t C, DType t, void* stream);
  void (*layernorm_backward)(void* dx, float* dw, float* db, const void* dy, const void* x,
                             const void* w, const float* mean, const float* rstd, int64_t N,
                             int64_t C, DType t, void* stream);
  // ---- Embedding: y[N,C] = table[ids[n] - lo], a table of rows [lo, lo + rows) of V ----
  // An id outside [0, V) gives a NaN row (a kernel cannot throw: ids are checked on the host).
  void (*embedding_forward)(void* y, const int32_t* ids, const void* table, int64_t N, int64_t V,
                            int64_t C, int64_t lo, int64_t rows, DType t, void* stream);
  void (*embedding_backward)(float* dtable, const void* dy, const int32_t* ids, int64_t N,
                             int64_t C, int64_t lo, int64_t rows, DType t, void* stream);
  // ---- Fused softmax + cross-entropy over logits[N,C] of type t, labels[N] ----
  // loss[0] = the mean over the rows, losses[N] each row's, lse[N] each row's log-sum-exp (the
  // backward's cache; no probabilities). A label outside [0, C) gives a NaN loss.
  void (*cross_entropy_forward)(float* loss, float* losses, float* lse, const void* logits,
                                const int32_t* labels, int64_t N, int64_t C, DType t, void* stream);
  // dlogits (type t) = (softmax(logits) - onehot(labels - lo)) * dloss / N, the softmax
  // recomputed from logits and lse; labels outside [lo, lo + C) add nothing.
  void (*cross_entropy_backward)(void* dlogits, const void* logits, const float* lse,
                                 const int32_t* labels, int64_t N, int64_t C, float dloss,
                                 int64_t lo, DType t, void* stream);
  // correct[0] = the number of rows whose first maximum is the label (torch.argmax's tie).
  void (*count_correct)(int64_t* correct, const void* logits, const int32_t* labels, int64_t N,
                        int64_t C, DType t, void* stream);
  // ---- Vocab-parallel cross-entropy (tensor parallel; cpu.h's sliced_* steps) ----
  // logits[N,C] of type t hold this rank's classes [lo, lo + C) of V; columns from `valid` on
  // pad the vocabulary, left out. The caller reduces each row's values over the tp group
  // between the calls (the max of row_max, the sums of sums and target).
  // row_max[N] = each row's maximum over its valid columns.
  void (*sliced_row_max)(float* row_max, const void* logits, int64_t N, int64_t C, int64_t valid,
                         DType t, void* stream);
  // sums[N] = each row's sum of exp(logit - row_max) over its valid columns (row_max: the
  // group's); target[N] = the label's logit where this rank holds the label, else 0. A label
  // outside [0, V) gives a NaN target (ids are checked where they are loaded).
  void (*sliced_exp_sum)(float* sums, float* target, const void* logits, const int32_t* labels,
                         const float* row_max, int64_t N, int64_t C, int64_t valid, int64_t lo,
                         int64_t V, DType t, void* stream);
  // dlogits (type t) = (exp(logit - row_max) / sums - onehot(labels - lo)) * dloss / N over
  // the valid columns (row_max, sums: the group's), 0 over the padding.
  void (*sliced_cross_entropy_backward)(void* dlogits, const void* logits, const float* row_max,
                                        const float* sums, const int32_t* labels, int64_t N,
                                        int64_t C, int64_t valid, int64_t lo, float dloss, DType t,
                                        void* stream);
  // ---- GPT ----
  // acc[n] (f32) += x[n] of type t (a gradient summed into f32, e.g. the position table's).
  void (*accumulate)(float* acc, const void* x, int64_t n, int64_t count, DType t, void* stream);
  // Causal multi-head attention over qkv[B,T,3C] (q, k, v side by side, C = NH * head size),
  // out[B,T,C]. The cache is lse[B,NH,T] (f32, each query row's log-sum-exp of its scaled
  // scores), not the CPU's att[B,NH,T,T]; the backward recomputes the probabilities from qkv,
  // the forward's out and lse, and overwrites all of dqkv.
  void (*attention_forward)(void* out, float* lse, const void* qkv, int64_t B, int64_t T, int64_t C,
                            int64_t NH, DType t, void* stream);
  void (*attention_backward)(void* dqkv, const void* dout, const void* qkv, const void* out,
                             const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH, DType t,
                             void* stream);
  // The modern GPT's parts (cpu.h's contracts). RMSNorm over x[N,C], w[C]; rstd[N] f32
  // (eps 1e-5); dw[C] f32, accumulated.
  void (*rmsnorm_forward)(void* y, float* rstd, const void* x, const void* w, int64_t N, int64_t C,
                          DType t, void* stream);
  void (*rmsnorm_backward)(void* dx, float* dw, const void* dy, const void* x, const void* w,
                           const float* rstd, int64_t N, int64_t C, DType t, void* stream);
  // Rotary positions, in place over the q and k of N rows of qkv[N,3C] (NH heads), each row at
  // position pos[n] (device memory); the backward turns the gradient back.
  void (*rotary_forward)(void* qkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t,
                         void* stream);
  void (*rotary_backward)(void* dqkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t,
                          void* stream);
  // SwiGLU: y[N,H] = silu(x[:, :H]) * x[:, H:] over x[N,2H]; the backward overwrites dx[N,2H].
  void (*swiglu_forward)(void* y, const void* x, int64_t N, int64_t H, DType t, void* stream);
  void (*swiglu_backward)(void* dx, const void* dy, const void* x, int64_t N, int64_t H, DType t,
                          void* stream);
  // Dropout (any model's) over x[rows, cols] with the CPU's mask: element (r, c) kept, scaled
  // by 1 / (1 - p), when the counter RNG's uniform for (seed, step, first_sample + r,
  // first_col + c) is >= p (src/ops/dropout.cc); the backward applies the same mask to dy.
  void (*dropout_forward)(void* y, const void* x, int64_t rows, int64_t cols, float p,
                          uint64_t seed, int64_t step, int64_t first_sample, int64_t first_col,
                          DType t, void* stream);
  void (*dropout_backward)(void* dx, const void* dy, int64_t rows, int64_t cols, float p,
                           uint64_t seed, int64_t step, int64_t first_sample, int64_t first_col,
                           DType t, void* stream);
  // ---- Optimizers over a flat f32 arena of n parameters ----
  // m, v, momentum: the optimizer's state; working (null: none) receives the new parameters as
  // working_type (bf16), the 16-bit copy the next forward reads.
  void (*adamw_step)(float* params, const float* grads, float* m, float* v, void* working,
                     DType working_type, int64_t n, const AdamWStep& k, void* stream);
  void (*sgd_step)(float* params, const float* grads, float* momentum, void* working,
                   DType working_type, int64_t n, const SgdStep& k, void* stream);
  // out[0] = the sum of x[i]^2 in f64 (kSumSquaresParts partial sums in `partials`, then one).
  void (*sum_squares)(double* out, double* partials, const float* x, int64_t n, void* stream);
  // ---- Deterministic mode's exact sum (tessel/ops/exact.h's contracts, the CPU's bits) ----
  void (*exact_collect)(float* kept, float* max, const float* g, int64_t n, void* stream);
  void (*exact_quantise)(int64_t* acc, const float* g, int64_t n, double scale, void* stream);
  void (*exact_dequantise)(float* out, const int64_t* sums, int64_t n, double scale, void* stream);
};

// Makes `kernels` the table of `device` (process wide, before any thread uses it; it must live
// until exit; nullptr uninstalls it, as tests do). Device::kCpu has none.
void install_device_kernels(Device device, const DeviceKernels* kernels);
// The table of `device`, or null when none is installed.
const DeviceKernels* device_kernels(Device device);

// Whether this thread's work goes to a device (current_device() is not the CPU).
bool on_device();
// Throws Error naming `op` and the current device: it has no kernel for the op.
[[noreturn]] void throw_no_device_kernel(const char* op);
// The current device's slot `slot`; throws as throw_no_device_kernel when the device has no
// table or the table no such kernel.
const DeviceKernels& current_device_kernels(const char* op);
template <typename Fn>
Fn device_kernel(Fn DeviceKernels::*slot, const char* op) {
  const Fn fn = current_device_kernels(op).*slot;
  if (fn == nullptr) throw_no_device_kernel(op);
  return fn;
}

// ---- Losses on the current device (a DeviceScope's), over device tensors ----
// The fused cross-entropy forward: lse[N] (f32, device) the backward's cache; returns the mean
// loss and *correct, read back from the device (the one read back of a loss).
float cross_entropy_forward_device(float* lse, int64_t* correct, const void* logits,
                                   const int32_t* labels, int64_t N, int64_t C, DType t);
void cross_entropy_backward_device(void* dlogits, const void* logits, const float* lse,
                                   const int32_t* labels, int64_t N, int64_t C, float dloss,
                                   int64_t lo, DType t);

// ---- Attention on the current device, over device tensors (the device's cache: lse) ----
void attention_forward_device(void* out, float* lse, const void* qkv, int64_t B, int64_t T,
                              int64_t C, int64_t NH, DType t);
void attention_backward_device(void* dqkv, const void* dout, const void* qkv, const void* out,
                               const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                               DType t);

}  // namespace tessel::ops
