// The CUDA kernel table: each slot adapts the typed public op's arguments to a launcher of
// kernels.h or blas.h (the stream as a cudaStream_t; the linear layer's input type). Each
// thread (a rank) has its own cuBLASLt handle and workspace, as Blas asks.
#include "kernel_table.h"

#include <algorithm>

#include "tessel/ops/cuda/blas.h"
#include "tessel/ops/cuda/conv.h"
#include "tessel/ops/cuda/kernels.h"
#include "tessel/tensor/tensor.h"

namespace tessel::ops::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

Blas& blas() {
  thread_local Blas b;
  return b;
}

// cuBLASLt multiplies operands of one type: an input of another type (the first layer's f32
// input of a bf16 model) is converted into a pooled device tensor first, as the CPU rounds it
// while packing.
Tensor as_type(const void* x, DType x_type, DType t, int64_t n, cudaStream_t s) {
  Tensor out = Tensor::empty({n}, t, Device::kCuda);
  convert(out.raw(), t, x, x_type, n, s);
  return out;
}

void linear_fwd(void* y, const void* x, DType x_type, const void* w, const void* b, DType t,
                int64_t N, int64_t C, int64_t OC, void* stream) {
  const cudaStream_t s = as_stream(stream);
  if (x_type == t) return linear_forward(blas(), s, y, x, w, b, t, N, C, OC);
  const Tensor xt = as_type(x, x_type, t, N * C, s);
  linear_forward(blas(), s, y, xt.raw(), w, b, t, N, C, OC);
}

// dx comes in t and is converted to x_type when they differ.
void linear_bwd(void* dx, DType x_type, float* dw, float* db, const void* dy, const void* x,
                const void* w, DType t, int64_t N, int64_t C, int64_t OC, void* stream) {
  const cudaStream_t s = as_stream(stream);
  if (x_type == t) return linear_backward(blas(), s, dx, dw, db, dy, x, w, t, N, C, OC);
  const Tensor xt = x != nullptr ? as_type(x, x_type, t, N * C, s) : Tensor();
  const Tensor dxt = dx != nullptr ? Tensor::empty({N * C}, t, Device::kCuda) : Tensor();
  linear_backward(blas(), s, dx ? dxt.raw() : nullptr, dw, db, dy, x ? xt.raw() : nullptr, w, t, N,
                  C, OC);
  if (dx != nullptr) convert(dx, x_type, dxt.raw(), t, N * C, s);
}

// ---- Convolution and pooling ----
// cuDNN's workspace for one call, from the caching pool (given back at once: work queued after
// this call's reuses it).
Tensor conv_workspace(const Conv2dShape& s) {
  const int64_t floats = static_cast<int64_t>((conv2d_workspace_bytes(s) + 3) / 4);
  return Tensor::empty({std::max<int64_t>(floats, 1)}, DType::kF32, Device::kCuda);
}

void fill_conv_slots(DeviceKernels& k) {
  k.conv2d_forward = [](float* y, const float* x, const float* w, const float* b,
                        const Conv2dShape& s, void* stream) {
    const Tensor ws = conv_workspace(s);
    conv2d_forward(y, x, w, b, s, ws.raw(), as_stream(stream));
  };
  k.conv2d_backward = [](float* dx, float* dw, float* db, const float* dy, const float* x,
                         const float* w, const Conv2dShape& s, void* stream) {
    const Tensor ws = conv_workspace(s);
    conv2d_backward(dx, dw, db, dy, x, w, s, ws.raw(), as_stream(stream));
  };
  k.maxpool2d_forward = [](float* y, int32_t* argmax, const float* x, int64_t N, int64_t C,
                           int64_t H, int64_t W, int64_t kk, int64_t stride, void* stream) {
    maxpool2d_forward(y, argmax, x, N, C, H, W, kk, stride, as_stream(stream));
  };
  k.maxpool2d_backward = [](float* dx, const float* dy, const int32_t* argmax, int64_t N, int64_t C,
                            int64_t H, int64_t W, int64_t kk, int64_t stride, void* stream) {
    maxpool2d_backward(dx, dy, argmax, N, C, H, W, kk, stride, as_stream(stream));
  };
}

// ---- Attention: tensor-core GEMMs where attention_gemm_supported (bf16, long sequences), the
// flash kernels otherwise; the GEMM path's T x T scratch comes from the caching pool.
Tensor attention_scratch(int64_t T, int64_t NH) {
  const int64_t floats = static_cast<int64_t>(attention_gemm_scratch_bytes(T, NH) / 4);
  return Tensor::empty({floats}, DType::kF32, Device::kCuda);
}

void attention_fwd(void* out, float* lse, const void* qkv, int64_t B, int64_t T, int64_t C,
                   int64_t NH, DType t, void* stream) {
  const cudaStream_t s = as_stream(stream);
  if (NH <= 0 || C % NH != 0 || !attention_gemm_supported(t, T, C / NH))
    return attention_forward(out, lse, qkv, B, T, C, NH, t, s);
  const Tensor scratch = attention_scratch(T, NH);
  attention_gemm_forward(blas(), scratch.raw(), scratch.nbytes(), out, lse, qkv, B, T, C, NH, t, s);
}

void attention_bwd(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                   int64_t B, int64_t T, int64_t C, int64_t NH, DType t, void* stream) {
  const cudaStream_t s = as_stream(stream);
  if (NH <= 0 || C % NH != 0 || !attention_gemm_supported(t, T, C / NH))
    return attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, t, s);
  const Tensor scratch = attention_scratch(T, NH);
  attention_gemm_backward(blas(), scratch.raw(), scratch.nbytes(), dqkv, dout, qkv, out, lse, B, T,
                          C, NH, t, s);
}

// The GPT's slots (and dropout's).
void fill_gpt_slots(DeviceKernels& k) {
  k.accumulate = [](float* acc, const void* x, int64_t n, DType t, void* s) {
    accumulate(acc, x, n, t, as_stream(s));
  };
  k.attention_forward = attention_fwd;
  k.attention_backward = attention_bwd;
  k.rmsnorm_forward = [](void* y, float* rstd, const void* x, const void* w, int64_t N, int64_t C,
                         DType t,
                         void* s) { rmsnorm_forward(y, rstd, x, w, N, C, t, as_stream(s)); };
  k.rmsnorm_backward = [](void* dx, float* dw, const void* dy, const void* x, const void* w,
                          const float* rstd, int64_t N, int64_t C, DType t, void* s) {
    rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C, t, as_stream(s));
  };
  k.rotary_forward = [](void* qkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t,
                        void* s) { rotary_forward(qkv, pos, N, C, NH, t, as_stream(s)); };
  k.rotary_backward = [](void* dqkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t,
                         void* s) { rotary_backward(dqkv, pos, N, C, NH, t, as_stream(s)); };
  k.swiglu_forward = [](void* y, const void* x, int64_t N, int64_t H, DType t, void* s) {
    swiglu_forward(y, x, N, H, t, as_stream(s));
  };
  k.swiglu_backward = [](void* dx, const void* dy, const void* x, int64_t N, int64_t H, DType t,
                         void* s) { swiglu_backward(dx, dy, x, N, H, t, as_stream(s)); };
  k.dropout_forward = [](void* y, const void* x, int64_t rows, int64_t cols, float p, uint64_t seed,
                         int64_t step, int64_t first_sample, int64_t first_col, DType t, void* s) {
    dropout_forward(y, x, rows, cols, p, seed, step, first_sample, first_col, t, as_stream(s));
  };
  k.dropout_backward = [](void* dx, const void* dy, int64_t rows, int64_t cols, float p,
                          uint64_t seed, int64_t step, int64_t first_sample, int64_t first_col,
                          DType t, void* s) {
    dropout_backward(dx, dy, rows, cols, p, seed, step, first_sample, first_col, t, as_stream(s));
  };
}

// Deterministic mode's exact sum.
void fill_exact_slots(DeviceKernels& k) {
  k.exact_collect = [](float* kept, float* max, const float* g, int64_t n, void* s) {
    exact_collect(kept, max, g, n, as_stream(s));
  };
  k.exact_quantise = [](int64_t* acc, const float* g, int64_t n, double scale, void* s) {
    exact_quantise(acc, g, n, scale, as_stream(s));
  };
  k.exact_dequantise = [](float* out, const int64_t* sums, int64_t n, double scale, void* s) {
    exact_dequantise(out, sums, n, scale, as_stream(s));
  };
}

DeviceKernels make_table() {
  DeviceKernels k{};
  k.linear_forward = linear_fwd;
  k.linear_backward = linear_bwd;
  fill_conv_slots(k);
  k.relu_forward = [](void* y, const void* x, int64_t n, DType t, void* s) {
    relu_forward(y, x, n, t, as_stream(s));
  };
  k.relu_backward = [](void* dx, const void* dy, const void* y, int64_t n, DType t, void* s) {
    relu_backward(dx, dy, y, n, t, as_stream(s));
  };
  k.gelu_forward = [](void* y, const void* x, int64_t n, DType t, void* s) {
    gelu_forward(y, x, n, t, as_stream(s));
  };
  k.gelu_backward = [](void* dx, const void* dy, const void* x, int64_t n, DType t, void* s) {
    gelu_backward(dx, dy, x, n, t, as_stream(s));
  };
  k.add_forward = [](void* y, const void* a, const void* b, int64_t n, DType t, void* s) {
    add_forward(y, a, b, n, t, as_stream(s));
  };
  k.layernorm_forward = [](void* y, float* mean, float* rstd, const void* x, const void* w,
                           const void* b, int64_t N, int64_t C, DType t, void* s) {
    layernorm_forward(y, mean, rstd, x, w, b, N, C, t, as_stream(s));
  };
  k.layernorm_backward = [](void* dx, float* dw, float* db, const void* dy, const void* x,
                            const void* w, const float* mean, const float* rstd, int64_t N,
                            int64_t C, DType t, void* s) {
    layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C, t, as_stream(s));
  };
  k.embedding_forward = [](void* y, const int32_t* ids, const void* table, int64_t N, int64_t V,
                           int64_t C, int64_t lo, int64_t rows, DType t, void* s) {
    embedding_forward(y, ids, table, N, V, C, lo, rows, t, as_stream(s));
  };
  k.embedding_backward = [](float* dtable, const void* dy, const int32_t* ids, int64_t N, int64_t C,
                            int64_t lo, int64_t rows, DType t, void* s) {
    embedding_backward(dtable, dy, ids, N, C, lo, rows, t, as_stream(s));
  };
  k.cross_entropy_forward = [](float* loss, float* losses, float* lse, const void* logits,
                               const int32_t* labels, int64_t N, int64_t C, DType t, void* s) {
    cross_entropy_forward(loss, losses, lse, nullptr, logits, labels, N, C, t, as_stream(s));
  };
  k.cross_entropy_backward = [](void* dlogits, const void* logits, const float* lse,
                                const int32_t* labels, int64_t N, int64_t C, float dloss,
                                int64_t lo, DType t, void* s) {
    cross_entropy_backward(dlogits, logits, lse, labels, N, C, dloss, lo, t, as_stream(s));
  };
  k.sliced_row_max = [](float* row_max, const void* logits, int64_t N, int64_t C, int64_t valid,
                        DType t,
                        void* s) { sliced_row_max(row_max, logits, N, C, valid, t, as_stream(s)); };
  k.sliced_exp_sum = [](float* sums, float* target, const void* logits, const int32_t* labels,
                        const float* row_max, int64_t N, int64_t C, int64_t valid, int64_t lo,
                        int64_t V, DType t, void* s) {
    sliced_exp_sum(sums, target, logits, labels, row_max, N, C, valid, lo, V, t, as_stream(s));
  };
  k.sliced_cross_entropy_backward = [](void* dlogits, const void* logits, const float* row_max,
                                       const float* sums, const int32_t* labels, int64_t N,
                                       int64_t C, int64_t valid, int64_t lo, float dloss, DType t,
                                       void* s) {
    sliced_cross_entropy_backward(dlogits, logits, row_max, sums, labels, N, C, valid, lo, dloss, t,
                                  as_stream(s));
  };
  k.count_correct = [](int64_t* correct, const void* logits, const int32_t* labels, int64_t N,
                       int64_t C, DType t,
                       void* s) { count_correct(correct, logits, labels, N, C, t, as_stream(s)); };
  k.adamw_step = [](float* p, const float* g, float* m, float* v, void* working, DType wt,
                    int64_t n, const AdamWStep& a,
                    void* s) { adamw_step(p, g, m, v, working, wt, n, a, as_stream(s)); };
  k.sgd_step = [](float* p, const float* g, float* momentum, void* working, DType wt, int64_t n,
                  const SgdStep& a,
                  void* s) { sgd_step(p, g, momentum, working, wt, n, a, as_stream(s)); };
  k.sum_squares = [](double* out, double* partials, const float* x, int64_t n, void* s) {
    sum_squares(out, partials, x, n, as_stream(s));
  };
  fill_gpt_slots(k);
  fill_exact_slots(k);
  return k;
}

}  // namespace

const DeviceKernels& kernel_table() {
  static const DeviceKernels table = make_table();
  return table;
}

}  // namespace tessel::ops::cuda
