// The kernels of cpu.h over buffers of any float type (f32, bf16, f16; dtype t), as the layers
// call them in every train.precision. f32 goes straight to the f32 kernels. A 16-bit type runs
// the GEMMs on gemm_lowp (bf16 products, f32 sums) and everything else through the f32 kernels
// on f32 copies of small pieces (a chunk of an elementwise op, a row of a LayerNorm, one
// sequence of an attention), so statistics, softmax and sums stay f32 and the 16-bit values
// are rounded once, when stored; ReLU, which only keeps or zeroes values, selects the stored
// bits directly (the same bits, without the conversions). Parameter gradients are always f32
// (accumulated, never rounded). On a device (inside a DeviceScope) each op calls that device's
// kernel table (device_kernels.h) instead, with the same arguments and the current stream; an op
// without a device kernel throws naming itself.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"

namespace tessel::ops {
namespace {

constexpr int64_t kChunk = 1024;  // elementwise ops: f32 copies of this many values (12 KiB)

bool is_f32(DType t) { return t == DType::kF32; }

// The current device's kernel `slot` over args, on the current stream.
template <typename Fn, typename... Args>
void run_on_device(Fn DeviceKernels::*slot, const char* op, Args... args) {
  device_kernel(slot, op)(args..., current_stream());
}

void check_float(DType t, const char* who) {
  TESSEL_CHECK(t == DType::kF32 || t == DType::kBF16 || t == DType::kF16, who,
               ": buffers must be f32, bf16 or f16, got ", dtype_name(t));
}

// Element i of a buffer of type t.
const void* at(const void* p, int64_t i, DType t) {
  return static_cast<const char*>(p) + i * static_cast<int64_t>(dtype_size(t));
}
void* at(void* p, int64_t i, DType t) {
  return static_cast<char*>(p) + i * static_cast<int64_t>(dtype_size(t));
}

// Grow-only f32 buffers of this thread, k = 0..3 for the several operands of one kernel.
float* f32_buffer(int k, int64_t n) {
  thread_local std::vector<float> buffers[4];
  std::vector<float>& b = buffers[k];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

// An f32 copy of n values of type t in thread buffer k (p itself when t is f32).
const float* widened(int k, const void* p, int64_t n, DType t) {
  if (is_f32(t)) return static_cast<const float*>(p);
  float* out = f32_buffer(k, n);
  convert(out, DType::kF32, p, t, n);
  return out;
}

// Runs f(offset, count, x_f32..., y_f32) over chunks of n elementwise values: inputs widened,
// the output rounded back into y.
template <typename F>
void elementwise(void* y, std::initializer_list<const void*> inputs, int64_t n, DType t, F f) {
  float* out = f32_buffer(3, kChunk);
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    const float* in[3] = {};
    int k = 0;
    for (const void* p : inputs) {
      in[k] = widened(k, at(p, i, t), m, t);
      ++k;
    }
    f(out, in, m);
    convert(at(y, i, t), t, out, DType::kF32, m);
  }
}

// Whether a 16-bit float of type t with bits h is > 0: sign clear, neither zero nor NaN (at most
// the bits of +inf).
bool positive(uint16_t h, DType t) { return h != 0 && h <= (t == DType::kBF16 ? 0x7f80 : 0x7c00); }

}  // namespace

void accumulate(float* acc, const void* x, int64_t n, DType t, int64_t count) {
  check_float(t, "accumulate");
  if (on_device())
    return run_on_device(&DeviceKernels::accumulate, "accumulate", acc, x, n, count, t);
  for (int64_t k = 0; k < count; ++k)
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      const float* v = widened(0, at(x, k * n + i, t), m, t);
      float* __restrict a = acc + i;
      for (int64_t j = 0; j < m; ++j) a[j] += v[j];
    }
}

void linear_forward(void* y, const void* x, DType x_type, const void* w, const void* b, DType t,
                    int64_t N, int64_t C, int64_t OC) {
  check_float(t, "linear_forward");
  if (on_device())
    return run_on_device(&DeviceKernels::linear_forward, "linear_forward", y, x, x_type, w, b, t, N,
                         C, OC);
  if (is_f32(t) && is_f32(x_type)) {
    linear_forward(static_cast<float*>(y), static_cast<const float*>(x),
                   static_cast<const float*>(w), static_cast<const float*>(b), N, C, OC);
    return;
  }
  if (b != nullptr) {  // seeded with the bias, which the GEMM adds onto (beta = 1)
    const size_t row = static_cast<size_t>(OC) * dtype_size(t);
    for (int64_t n = 0; n < N; ++n) std::memcpy(at(y, n * OC, t), b, row);
  }
  gemm_lowp(false, true, N, OC, C, 1.0f, {x, x_type, C}, {w, t, C}, b != nullptr ? 1.0f : 0.0f,
            {y, t, OC});
}

void linear_backward(void* dx, DType x_type, float* dw, float* db, const void* dy, const void* x,
                     const void* w, DType t, int64_t N, int64_t C, int64_t OC) {
  check_float(t, "linear_backward");
  if (on_device())
    return run_on_device(&DeviceKernels::linear_backward, "linear_backward", dx, x_type, dw, db, dy,
                         x, w, t, N, C, OC);
  if (is_f32(t) && is_f32(x_type)) {
    linear_backward(static_cast<float*>(dx), dw, db, static_cast<const float*>(dy),
                    static_cast<const float*>(x), static_cast<const float*>(w), N, C, OC);
    return;
  }
  if (dw != nullptr)
    gemm_lowp(true, false, OC, C, N, 1.0f, {dy, t, OC}, {x, x_type, C}, 1.0f, {dw, DType::kF32, C});
  if (db != nullptr)
    for (int64_t n = 0; n < N; ++n) accumulate(db, at(dy, n * OC, t), OC, t);
  if (dx != nullptr)
    gemm_lowp(false, false, N, C, OC, 1.0f, {dy, t, OC}, {w, t, C}, 0.0f, {dx, x_type, C});
}

void relu_forward(void* y, const void* x, int64_t n, DType t) {
  check_float(t, "relu_forward");
  if (on_device()) return run_on_device(&DeviceKernels::relu_forward, "relu_forward", y, x, n, t);
  if (is_f32(t)) return relu_forward(static_cast<float*>(y), static_cast<const float*>(x), n);
  // On the stored bits: the f32 kernel keeps a widened x > 0 exactly or gives +0, and rounding
  // gives x's bits back.
  const auto* in = static_cast<const uint16_t*>(x);
  auto* out = static_cast<uint16_t*>(y);
  for (int64_t i = 0; i < n; ++i) out[i] = positive(in[i], t) ? in[i] : uint16_t{0};
}

void relu_backward(void* dx, const void* dy, const void* y, int64_t n, DType t) {
  check_float(t, "relu_backward");
  if (on_device())
    return run_on_device(&DeviceKernels::relu_backward, "relu_backward", dx, dy, y, n, t);
  if (dx == nullptr) return;
  if (is_f32(t))
    return relu_backward(static_cast<float*>(dx), static_cast<const float*>(dy),
                         static_cast<const float*>(y), n);
  // On the stored bits, as relu_forward (a NaN gradient stays a NaN); dy read unconditionally,
  // as in the f32 kernel, so the loop vectorises.
  const auto* g = static_cast<const uint16_t*>(dy);
  const auto* out = static_cast<const uint16_t*>(y);
  auto* d = static_cast<uint16_t*>(dx);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = g[i];
    d[i] = positive(out[i], t) ? v : uint16_t{0};
  }
}

void gelu_forward(void* y, const void* x, int64_t n, DType t) {
  check_float(t, "gelu_forward");
  if (on_device()) return run_on_device(&DeviceKernels::gelu_forward, "gelu_forward", y, x, n, t);
  if (is_f32(t)) return gelu_forward(static_cast<float*>(y), static_cast<const float*>(x), n);
  elementwise(y, {x}, n, t,
              [](float* o, const float* const* in, int64_t m) { gelu_forward(o, in[0], m); });
}

void gelu_backward(void* dx, const void* dy, const void* x, int64_t n, DType t) {
  check_float(t, "gelu_backward");
  if (on_device())
    return run_on_device(&DeviceKernels::gelu_backward, "gelu_backward", dx, dy, x, n, t);
  if (dx == nullptr) return;
  if (is_f32(t))
    return gelu_backward(static_cast<float*>(dx), static_cast<const float*>(dy),
                         static_cast<const float*>(x), n);
  elementwise(dx, {dy, x}, n, t, [](float* o, const float* const* in, int64_t m) {
    gelu_backward(o, in[0], in[1], m);
  });
}

void add_forward(void* y, const void* a, const void* b, int64_t n, DType t, int64_t count) {
  check_float(t, "add_forward");
  if (on_device())
    return run_on_device(&DeviceKernels::add_forward, "add_forward", y, a, b, n, count, t);
  for (int64_t k = 0; k < count; ++k) {
    void* yk = static_cast<char*>(y) + k * n * static_cast<int64_t>(dtype_size(t));
    const void* ak = at(a, k * n, t);
    if (is_f32(t)) {
      add_forward(static_cast<float*>(yk), static_cast<const float*>(ak),
                  static_cast<const float*>(b), n);
      continue;
    }
    elementwise(yk, {ak, b}, n, t, [](float* o, const float* const* in, int64_t m) {
      add_forward(o, in[0], in[1], m);
    });
  }
}

// Dropout row by row: each row keeps its global sample index, so the masks are the f32 ones.
void dropout_forward(void* y, const void* x, int64_t rows, int64_t cols, float p, uint64_t seed,
                     int64_t step, int64_t first_sample, int64_t first_col, DType t) {
  check_float(t, "dropout_forward");
  if (on_device())
    return run_on_device(&DeviceKernels::dropout_forward, "dropout_forward", y, x, rows, cols, p,
                         seed, step, first_sample, first_col, t);
  if (is_f32(t))
    return dropout_forward(static_cast<float*>(y), static_cast<const float*>(x), rows, cols, p,
                           seed, step, first_sample, first_col);
  float* out = f32_buffer(3, cols);
  for (int64_t r = 0; r < rows; ++r) {
    dropout_forward(out, widened(0, at(x, r * cols, t), cols, t), 1, cols, p, seed, step,
                    first_sample + r, first_col);
    convert(at(y, r * cols, t), t, out, DType::kF32, cols);
  }
}

void dropout_backward(void* dx, const void* dy, int64_t rows, int64_t cols, float p, uint64_t seed,
                      int64_t step, int64_t first_sample, int64_t first_col, DType t) {
  check_float(t, "dropout_backward");
  if (on_device())
    return run_on_device(&DeviceKernels::dropout_backward, "dropout_backward", dx, dy, rows, cols,
                         p, seed, step, first_sample, first_col, t);
  if (is_f32(t))
    return dropout_backward(static_cast<float*>(dx), static_cast<const float*>(dy), rows, cols, p,
                            seed, step, first_sample, first_col);
  float* out = f32_buffer(3, cols);
  for (int64_t r = 0; r < rows; ++r) {
    dropout_backward(out, widened(0, at(dy, r * cols, t), cols, t), 1, cols, p, seed, step,
                     first_sample + r, first_col);
    convert(at(dx, r * cols, t), t, out, DType::kF32, cols);
  }
}

void layernorm_forward(void* y, float* mean, float* rstd, const void* x, const void* w,
                       const void* b, int64_t N, int64_t C, DType t) {
  check_float(t, "layernorm_forward");
  if (on_device())
    return run_on_device(&DeviceKernels::layernorm_forward, "layernorm_forward", y, mean, rstd, x,
                         w, b, N, C, t);
  if (is_f32(t))
    return layernorm_forward(static_cast<float*>(y), mean, rstd, static_cast<const float*>(x),
                             static_cast<const float*>(w), static_cast<const float*>(b), N, C);
  const float* wf = widened(1, w, C, t);
  const float* bf = widened(2, b, C, t);
  float* out = f32_buffer(3, C);
  for (int64_t r = 0; r < N; ++r) {
    layernorm_forward(out, mean + r, rstd + r, widened(0, at(x, r * C, t), C, t), wf, bf, 1, C);
    convert(at(y, r * C, t), t, out, DType::kF32, C);
  }
}

void layernorm_backward(void* dx, float* dw, float* db, const void* dy, const void* x,
                        const void* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                        DType t) {
  check_float(t, "layernorm_backward");
  if (on_device())
    return run_on_device(&DeviceKernels::layernorm_backward, "layernorm_backward", dx, dw, db, dy,
                         x, w, mean, rstd, N, C, t);
  if (is_f32(t))
    return layernorm_backward(static_cast<float*>(dx), dw, db, static_cast<const float*>(dy),
                              static_cast<const float*>(x), static_cast<const float*>(w), mean,
                              rstd, N, C);
  const float* wf = widened(2, w, C, t);
  float* out = f32_buffer(3, C);
  for (int64_t r = 0; r < N; ++r) {
    layernorm_backward(dx ? out : nullptr, dw, db, widened(0, at(dy, r * C, t), C, t),
                       widened(1, at(x, r * C, t), C, t), wf, mean + r, rstd + r, 1, C);
    if (dx) convert(at(dx, r * C, t), t, out, DType::kF32, C);
  }
}

void rmsnorm_forward(void* y, float* rstd, const void* x, const void* w, int64_t N, int64_t C,
                     DType t) {
  check_float(t, "rmsnorm_forward");
  if (on_device())
    return run_on_device(&DeviceKernels::rmsnorm_forward, "rmsnorm_forward", y, rstd, x, w, N, C,
                         t);
  if (is_f32(t))
    return rmsnorm_forward(static_cast<float*>(y), rstd, static_cast<const float*>(x),
                           static_cast<const float*>(w), N, C);
  const float* wf = widened(1, w, C, t);
  float* out = f32_buffer(3, C);
  for (int64_t r = 0; r < N; ++r) {
    rmsnorm_forward(out, rstd + r, widened(0, at(x, r * C, t), C, t), wf, 1, C);
    convert(at(y, r * C, t), t, out, DType::kF32, C);
  }
}

void rmsnorm_backward(void* dx, float* dw, const void* dy, const void* x, const void* w,
                      const float* rstd, int64_t N, int64_t C, DType t) {
  check_float(t, "rmsnorm_backward");
  if (on_device())
    return run_on_device(&DeviceKernels::rmsnorm_backward, "rmsnorm_backward", dx, dw, dy, x, w,
                         rstd, N, C, t);
  if (is_f32(t))
    return rmsnorm_backward(static_cast<float*>(dx), dw, static_cast<const float*>(dy),
                            static_cast<const float*>(x), static_cast<const float*>(w), rstd, N, C);
  const float* wf = widened(2, w, C, t);
  float* out = f32_buffer(3, C);
  for (int64_t r = 0; r < N; ++r) {
    rmsnorm_backward(dx ? out : nullptr, dw, widened(0, at(dy, r * C, t), C, t),
                     widened(1, at(x, r * C, t), C, t), wf, rstd + r, 1, C);
    if (dx) convert(at(dx, r * C, t), t, out, DType::kF32, C);
  }
}

// Rotary in place, row by row: each row's q and k widened, turned by `turn` (the f32 forward or
// backward) and rounded back.
template <typename Turn>
void rotary_rows(void* qkv, const int64_t* pos, int64_t N, int64_t C, DType t, Turn turn) {
  float* row = f32_buffer(3, 3 * C);
  for (int64_t r = 0; r < N; ++r) {
    convert(row, DType::kF32, at(qkv, r * 3 * C, t), t, 2 * C);
    turn(row, pos + r);
    convert(at(qkv, r * 3 * C, t), t, row, DType::kF32, 2 * C);
  }
}

void rotary_forward(void* qkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t) {
  check_float(t, "rotary_forward");
  if (on_device())
    return run_on_device(&DeviceKernels::rotary_forward, "rotary_forward", qkv, pos, N, C, NH, t);
  if (is_f32(t)) return rotary_forward(static_cast<float*>(qkv), pos, N, C, NH);
  rotary_rows(qkv, pos, N, C, t,
              [&](float* row, const int64_t* p) { rotary_forward(row, p, 1, C, NH); });
}

void rotary_backward(void* dqkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t) {
  check_float(t, "rotary_backward");
  if (on_device())
    return run_on_device(&DeviceKernels::rotary_backward, "rotary_backward", dqkv, pos, N, C, NH,
                         t);
  if (is_f32(t)) return rotary_backward(static_cast<float*>(dqkv), pos, N, C, NH);
  rotary_rows(dqkv, pos, N, C, t,
              [&](float* row, const int64_t* p) { rotary_backward(row, p, 1, C, NH); });
}

void swiglu_forward(void* y, const void* x, int64_t N, int64_t H, DType t) {
  check_float(t, "swiglu_forward");
  if (on_device())
    return run_on_device(&DeviceKernels::swiglu_forward, "swiglu_forward", y, x, N, H, t);
  if (is_f32(t)) return swiglu_forward(static_cast<float*>(y), static_cast<const float*>(x), N, H);
  float* out = f32_buffer(3, H);
  for (int64_t r = 0; r < N; ++r) {
    swiglu_forward(out, widened(0, at(x, r * 2 * H, t), 2 * H, t), 1, H);
    convert(at(y, r * H, t), t, out, DType::kF32, H);
  }
}

void swiglu_backward(void* dx, const void* dy, const void* x, int64_t N, int64_t H, DType t) {
  check_float(t, "swiglu_backward");
  if (on_device())
    return run_on_device(&DeviceKernels::swiglu_backward, "swiglu_backward", dx, dy, x, N, H, t);
  if (is_f32(t))
    return swiglu_backward(static_cast<float*>(dx), static_cast<const float*>(dy),
                           static_cast<const float*>(x), N, H);
  float* out = f32_buffer(3, 2 * H);
  for (int64_t r = 0; r < N; ++r) {
    swiglu_backward(out, widened(0, at(dy, r * H, t), H, t),
                    widened(1, at(x, r * 2 * H, t), 2 * H, t), 1, H);
    convert(at(dx, r * 2 * H, t), t, out, DType::kF32, 2 * H);
  }
}

// rows: the table's rows, ids [lo, lo + rows) (a tensor-parallel slice); other ids give zero
// rows forward and nothing backward.
void embedding_forward(void* y, const int32_t* ids, const void* table, int64_t N, int64_t V,
                       int64_t C, int64_t lo, int64_t rows, DType t) {
  check_float(t, "embedding_forward");
  if (on_device())
    return run_on_device(&DeviceKernels::embedding_forward, "embedding_forward", y, ids, table, N,
                         V, C, lo, rows, t);
  if (is_f32(t))
    return embedding_forward(static_cast<float*>(y), ids, static_cast<const float*>(table), N, V, C,
                             lo, rows);
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(t);
  for (int64_t n = 0; n < N; ++n) {
    if (ids[n] < 0 || ids[n] >= V)
      throw InvalidArgument(
          str("embedding_forward: id at position ", n, " must be in [0, ", V, "), got ", ids[n],
              "; check the tokenizer's vocabulary against the model's vocab_size"));
    const int64_t id = ids[n] - lo;
    if (id >= 0 && id < rows)
      std::memcpy(at(y, n * C, t), at(table, id * C, t), row_bytes);
    else
      std::memset(at(y, n * C, t), 0, row_bytes);
  }
}

void embedding_backward(float* dtable, const void* dy, const int32_t* ids, int64_t N, int64_t C,
                        int64_t lo, int64_t rows, DType t) {
  check_float(t, "embedding_backward");
  if (on_device())
    return run_on_device(&DeviceKernels::embedding_backward, "embedding_backward", dtable, dy, ids,
                         N, C, lo, rows, t);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t id = ids[n] - lo;
    if (id >= 0 && id < rows) accumulate(dtable + id * C, at(dy, n * C, t), C, t);
  }
}

// Attention one sequence at a time: its qkv (and dout) widened, the f32 kernel, the output
// rounded. The probabilities stay f32.
void attention_forward(void* out, float* att, const void* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, DType t) {
  check_float(t, "attention_forward");
  if (on_device()) throw_no_device_kernel("attention_forward (with the CPU's cache att)");
  if (is_f32(t))
    return attention_forward(static_cast<float*>(out), att, static_cast<const float*>(qkv), B, T, C,
                             NH);
  float* o = f32_buffer(3, T * C);
  for (int64_t b = 0; b < B; ++b) {
    attention_forward(o, att + b * NH * T * T, widened(0, at(qkv, b * T * 3 * C, t), T * 3 * C, t),
                      1, T, C, NH);
    convert(at(out, b * T * C, t), t, o, DType::kF32, T * C);
  }
}

void attention_backward(void* dqkv, const void* dout, const void* qkv, const float* att, int64_t B,
                        int64_t T, int64_t C, int64_t NH, DType t) {
  check_float(t, "attention_backward");
  if (on_device()) throw_no_device_kernel("attention_backward (with the CPU's cache att)");
  if (is_f32(t))
    return attention_backward(static_cast<float*>(dqkv), static_cast<const float*>(dout),
                              static_cast<const float*>(qkv), att, B, T, C, NH);
  if (dqkv == nullptr) return;
  float* d = f32_buffer(3, T * 3 * C);
  for (int64_t b = 0; b < B; ++b) {
    attention_backward(d, widened(0, at(dout, b * T * C, t), T * C, t),
                       widened(1, at(qkv, b * T * 3 * C, t), T * 3 * C, t), att + b * NH * T * T, 1,
                       T, C, NH);
    convert(at(dqkv, b * T * 3 * C, t), t, d, DType::kF32, T * 3 * C);
  }
}

// A device's attention keeps lse[B,NH,T] instead of att (device_kernels.h); the layer chooses.
void attention_forward_device(void* out, float* lse, const void* qkv, int64_t B, int64_t T,
                              int64_t C, int64_t NH, DType t) {
  check_float(t, "attention_forward");
  run_on_device(&DeviceKernels::attention_forward, "attention_forward", out, lse, qkv, B, T, C, NH,
                t);
}

void attention_backward_device(void* dqkv, const void* dout, const void* qkv, const void* out,
                               const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                               DType t) {
  check_float(t, "attention_backward");
  run_on_device(&DeviceKernels::attention_backward, "attention_backward", dqkv, dout, qkv, out, lse,
                B, T, C, NH, t);
}

}  // namespace tessel::ops
