// The CUDA kernel table: each slot adapts the typed public op's arguments to a launcher of
// kernels.h or blas.h (the stream as a cudaStream_t; the linear layer's input type). Each
// thread (a rank) has its own cuBLASLt handle and workspace, as Blas asks.
#include "kernel_table.h"

#include <algorithm>
#include <type_traits>

#include "tessel/ops/cuda/blas.h"
#include "tessel/ops/cuda/conv.h"
#include "tessel/ops/cuda/kernels.h"
#include "tessel/tensor/tensor.h"

namespace tessel::ops::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// The slot of launcher F, which takes the table's arguments with the stream as a cudaStream_t
// (a slot's type-erased void*): Launch<&F>::call. An argument whose type differs from the
// slot's fails to compile.
template <typename T>
using SlotArg = std::conditional_t<std::is_same_v<T, cudaStream_t>, void*, T>;
template <auto F>
struct Launch;
template <typename... A, void (*F)(A...)>
struct Launch<F> {
  static void call(SlotArg<A>... a) { F(static_cast<A>(a)...); }
};

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

// A library call's workspace or scratch from the caching pool (given back at once: work queued
// after this call's reuses it).
Tensor pooled_bytes(size_t bytes) {
  return Tensor::empty({std::max<int64_t>(static_cast<int64_t>((bytes + 3) / 4), 1)}, DType::kF32,
                       Device::kCuda);
}

// ---- Convolution and pooling ----
Tensor conv_workspace(const Conv2dShape& s) { return pooled_bytes(conv2d_workspace_bytes(s)); }

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
  k.maxpool2d_forward = Launch<&maxpool2d_forward>::call;
  k.maxpool2d_backward = Launch<&maxpool2d_backward>::call;
}

// ---- Attention: cuDNN's fused attention where this cuDNN runs the shape (bf16), else
// tensor-core GEMMs where attention_gemm_supported (bf16, long sequences), the flash kernels
// otherwise.
bool use_cudnn(DType t, int64_t B, int64_t T, int64_t C, int64_t NH, bool backward) {
  return attention_cudnn_refusal(t, B, T, C, NH, backward).empty();
}

bool use_gemm(DType t, int64_t T, int64_t C, int64_t NH) {
  return NH > 0 && C % NH == 0 && attention_gemm_supported(t, T, C / NH);
}

void attention_fwd(void* out, float* lse, const void* qkv, int64_t B, int64_t T, int64_t C,
                   int64_t NH, DType t, void* stream) {
  const cudaStream_t s = as_stream(stream);
  if (use_cudnn(t, B, T, C, NH, false)) {
    const Tensor ws = pooled_bytes(attention_cudnn_workspace_bytes(B, T, C, NH, false));
    return attention_cudnn_forward(ws.raw(), out, lse, qkv, B, T, C, NH, s);
  }
  if (!use_gemm(t, T, C, NH)) return attention_forward(out, lse, qkv, B, T, C, NH, t, s);
  const Tensor scratch = pooled_bytes(attention_gemm_scratch_bytes(B, T, NH));
  attention_gemm_forward(blas(), scratch.raw(), scratch.nbytes(), out, lse, qkv, B, T, C, NH, t, s);
}

void attention_bwd(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                   int64_t B, int64_t T, int64_t C, int64_t NH, DType t, void* stream) {
  const cudaStream_t s = as_stream(stream);
  if (use_cudnn(t, B, T, C, NH, true)) {
    const Tensor ws = pooled_bytes(attention_cudnn_workspace_bytes(B, T, C, NH, true));
    return attention_cudnn_backward(ws.raw(), dqkv, dout, qkv, out, lse, B, T, C, NH, s);
  }
  if (!use_gemm(t, T, C, NH))
    return attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, t, s);
  const Tensor scratch = pooled_bytes(attention_gemm_scratch_bytes(B, T, NH));
  attention_gemm_backward(blas(), scratch.raw(), scratch.nbytes(), dqkv, dout, qkv, out, lse, B, T,
                          C, NH, t, s);
}

DeviceKernels make_table() {
  DeviceKernels k{};
  k.linear_forward = linear_fwd;
  k.linear_backward = linear_bwd;
  fill_conv_slots(k);
  k.relu_forward = Launch<&relu_forward>::call;
  k.relu_backward = Launch<&relu_backward>::call;
  k.gelu_forward = Launch<&gelu_forward>::call;
  k.gelu_backward = Launch<&gelu_backward>::call;
  k.add_forward = Launch<&add_forward>::call;
  k.layernorm_forward = Launch<&layernorm_forward>::call;
  k.layernorm_backward = Launch<&layernorm_backward>::call;
  k.embedding_forward = Launch<&embedding_forward>::call;
  k.embedding_backward = Launch<&embedding_backward>::call;
  k.cross_entropy_forward = [](float* loss, float* losses, float* lse, const void* logits,
                               const int32_t* labels, int64_t N, int64_t C, DType t, void* s) {
    cross_entropy_forward(loss, losses, lse, nullptr, logits, labels, N, C, t, as_stream(s));
  };
  k.cross_entropy_backward = Launch<&cross_entropy_backward>::call;
  k.sliced_row_max = Launch<&sliced_row_max>::call;
  k.sliced_exp_sum = Launch<&sliced_exp_sum>::call;
  k.sliced_cross_entropy_backward = Launch<&sliced_cross_entropy_backward>::call;
  k.count_correct = Launch<&count_correct>::call;
  k.adamw_step = Launch<&adamw_step>::call;
  k.sgd_step = Launch<&sgd_step>::call;
  k.sum_squares = Launch<&sum_squares>::call;
  // The GPT's slots (and dropout's).
  k.accumulate = Launch<&accumulate>::call;
  k.attention_forward = attention_fwd;
  k.attention_backward = attention_bwd;
  k.rmsnorm_forward = Launch<&rmsnorm_forward>::call;
  k.rmsnorm_backward = Launch<&rmsnorm_backward>::call;
  k.rotary_forward = Launch<&rotary_forward>::call;
  k.rotary_backward = Launch<&rotary_backward>::call;
  k.swiglu_forward = Launch<&swiglu_forward>::call;
  k.swiglu_backward = Launch<&swiglu_backward>::call;
  k.dropout_forward = Launch<&dropout_forward>::call;
  k.dropout_backward = Launch<&dropout_backward>::call;
  // Deterministic mode's exact sum.
  k.exact_collect = Launch<&exact_collect>::call;
  k.exact_quantise = Launch<&exact_quantise>::call;
  k.exact_dequantise = Launch<&exact_dequantise>::call;
  return k;
}

}  // namespace

const DeviceKernels& kernel_table() {
  static const DeviceKernels table = make_table();
  return table;
}

}  // namespace tessel::ops::cuda
