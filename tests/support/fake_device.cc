#include "fake_device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "tessel/ops/cpu.h"
#include "tessel/ops/exact.h"
#include "tessel/optim/schedule.h"

namespace tessel::fakes {

// ---- FakeRuntime ----

namespace {
thread_local int t_gpu = 0;

// Each pointer that is device memory lies on the calling thread's GPU.
void expect_on_this_gpu(const FakeRuntime& r, const char* what,
                        std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    const int gpu = p != nullptr ? r.gpu_of(p) : -1;
    if (gpu >= 0) {
      EXPECT_EQ(gpu, t_gpu) << what << " on GPU " << t_gpu << " was given GPU " << gpu
                            << "'s memory";
    }
  }
}
}  // namespace

void* FakeRuntime::allocate(size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  void* p = std::malloc(allocation_size(bytes));
  std::memset(p, 0xFF, allocation_size(bytes));
  blocks[p] = allocation_size(bytes);
  gpus[p] = t_gpu;
  in_use += static_cast<int64_t>(allocation_size(bytes));
  return p;
}

void FakeRuntime::free(void* p, size_t bytes) noexcept {
  std::lock_guard<std::recursive_mutex> lock(mu);
  EXPECT_EQ(blocks[p], allocation_size(bytes));
  EXPECT_FALSE(cancel_pending(p, blocks[p]))
      << "a device block freed while a queued copy still uses it";
  in_use -= static_cast<int64_t>(blocks[p]);
  blocks.erase(p);
  gpus.erase(p);
  std::free(p);
}

void FakeRuntime::zero(void* p, size_t bytes, void* stream) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  EXPECT_TRUE(owns(p, bytes));
  expect_on_this_gpu(*this, "zero", {p});
  streams.push_back(stream);
  std::memset(p, 0, bytes);
}

void FakeRuntime::copy(void* dst, Device dst_device, const void* src, Device src_device,
                       size_t bytes, void* stream) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  EXPECT_EQ(dst_device == Device::kCuda, owns(dst, bytes));
  EXPECT_EQ(src_device == Device::kCuda, owns(src, bytes));
  expect_on_this_gpu(*this, "copy", {dst, src});
  streams.push_back(stream);
  ++copies;
  if (dst_device == Device::kCpu) to_host_bytes += static_cast<int64_t>(bytes);
  std::memmove(dst, src, bytes);
}

void FakeRuntime::convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
                          void* stream) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  EXPECT_TRUE(owns(dst, static_cast<size_t>(n) * dtype_size(dst_type)));
  EXPECT_TRUE(owns(src, static_cast<size_t>(n) * dtype_size(src_type)));
  expect_on_this_gpu(*this, "convert", {dst, src});
  streams.push_back(stream);
  ops::convert(dst, dst_type, src, src_type, n);
}

bool FakeRuntime::owns(const void* p, size_t bytes) const {
  std::lock_guard<std::recursive_mutex> lock(mu);
  for (const auto& [base, size] : blocks)
    if (p >= base && static_cast<const char*>(p) + bytes <= static_cast<char*>(base) + size)
      return true;
  return false;
}

int FakeRuntime::gpu_of(const void* p) const {
  std::lock_guard<std::recursive_mutex> lock(mu);
  auto it = blocks.upper_bound(const_cast<void*>(p));  // the first block after p
  if (it == blocks.begin()) return -1;
  --it;
  if (static_cast<const char*>(p) >= static_cast<char*>(it->first) + it->second) return -1;
  return gpus.at(it->first);
}

// ---- The kernel table: the CPU kernels on the fake device's memory ----

namespace {
FakeDevice* g_device = nullptr;
}  // namespace

// Each slot counts its call, checks its pointers (null ones are "not needed") and runs the CPU
// op with this thread's device set to the CPU, so the typed ops take their CPU path.
struct FakeSlots {
  static void enter(const char* op, std::initializer_list<const void*> pointers) {
    ASSERT_NE(g_device, nullptr);
    {
      std::lock_guard<std::recursive_mutex> lock(g_device->runtime_.mu);
      ++g_device->calls_[op];
    }
    g_device->runtime_.count_kernel();
    for (const void* p : pointers) {
      if (p != nullptr) {
        EXPECT_TRUE(g_device->runtime_.owns(p, 1)) << op << " was given host memory";
        EXPECT_FALSE(g_device->runtime_.pending(p, 1))
            << op << " was given memory a queued copy has not written or read yet (a missed wait)";
      }
    }
    expect_on_this_gpu(g_device->runtime_, op, pointers);
  }

  // The logits widened to f32 (the CPU loss's own widening).
  static std::vector<float> widened(const void* logits, int64_t n, DType t) {
    std::vector<float> out(static_cast<size_t>(n));
    ops::convert(out.data(), DType::kF32, logits, t, n);
    return out;
  }

  static void fill_conv_slots(ops::DeviceKernels& k);
  // The CPU attention forward on the fake device's memory (its probabilities in a host
  // buffer), and the device cache: lse[B,NH,T], each query row's log-sum-exp of its scaled
  // scores, computed from qkv.
  static void attention(void* out, float* lse, const void* qkv, int64_t B, int64_t T, int64_t C,
                        int64_t NH, DType t, std::vector<float>& att);

  static ops::DeviceKernels table();
  static void fill_gpt_slots(ops::DeviceKernels& k);
  static void fill_modern_slots(ops::DeviceKernels& k);
  static void fill_exact_slots(ops::DeviceKernels& k);
  static void fill_vocab_parallel_slots(ops::DeviceKernels& k);
};

// ---- Convolution and pooling: the CPU's unfused kernels, scratch on the host ----
void FakeSlots::fill_conv_slots(ops::DeviceKernels& k) {
  k.conv2d_forward = [](float* y, const float* x, const float* w, const float* b,
                        const ops::Conv2dShape& s, void*) {
    enter("conv2d_forward", {y, x, w, b});
    DeviceScope host(Device::kCpu, nullptr);
    std::vector<float> scratch(static_cast<size_t>(ops::conv2d_scratch_floats(s)));
    ops::conv2d_forward(y, x, w, b, s, scratch.data());
  };
  k.conv2d_backward = [](float* dx, float* dw, float* db, const float* dy, const float* x,
                         const float* w, const ops::Conv2dShape& s, void*) {
    enter("conv2d_backward", {dx, dw, db, dy, x, w});
    DeviceScope host(Device::kCpu, nullptr);
    std::vector<float> scratch(static_cast<size_t>(ops::conv2d_scratch_floats(s)));
    ops::conv2d_backward(dx, dw, db, dy, x, w, s, scratch.data());
  };
  k.maxpool2d_forward = [](float* y, int32_t* argmax, const float* x, int64_t N, int64_t C,
                           int64_t H, int64_t W, int64_t kk, int64_t stride, void*) {
    enter("maxpool2d_forward", {y, argmax, x});
    DeviceScope host(Device::kCpu, nullptr);
    ops::maxpool2d_forward(y, argmax, x, N, C, H, W, kk, stride);
  };
  k.maxpool2d_backward = [](float* dx, const float* dy, const int32_t* argmax, int64_t N, int64_t C,
                            int64_t H, int64_t W, int64_t kk, int64_t stride, void*) {
    enter("maxpool2d_backward", {dx, dy, argmax});
    DeviceScope host(Device::kCpu, nullptr);
    ops::maxpool2d_backward(dx, dy, argmax, N, C, H, W, kk, stride);
  };
}

void FakeSlots::attention(void* out, float* lse, const void* qkv, int64_t B, int64_t T, int64_t C,
                          int64_t NH, DType t, std::vector<float>& att) {
  att.assign(static_cast<size_t>(B * NH * T * T), 0.0f);
  {
    DeviceScope host(Device::kCpu, nullptr);
    ops::attention_forward(out, att.data(), qkv, B, T, C, NH, t);
  }
  const std::vector<float> x = widened(qkv, B * T * 3 * C, t);
  const int64_t HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  std::vector<float> s(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const float* q = x.data() + (b * T + i) * 3 * C + h * HS;
        float mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          const float* k = x.data() + (b * T + j) * 3 * C + C + h * HS;
          float dot = 0.0f;
          for (int64_t d = 0; d < HS; ++d) dot += q[d] * k[d];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        lse[(b * NH + h) * T + i] = mx + std::log(sum);
      }
}

ops::DeviceKernels FakeSlots::table() {
  ops::DeviceKernels k{};
  k.linear_forward = [](void* y, const void* x, DType xt, const void* w, const void* b, DType t,
                        int64_t N, int64_t C, int64_t OC, void*) {
    enter("linear_forward", {y, x, w, b});
    DeviceScope host(Device::kCpu, nullptr);
    ops::linear_forward(y, x, xt, w, b, t, N, C, OC);
  };
  k.linear_backward = [](void* dx, DType xt, float* dw, float* db, const void* dy, const void* x,
                         const void* w, DType t, int64_t N, int64_t C, int64_t OC, void*) {
    enter("linear_backward", {dx, dw, db, dy, x, w});
    DeviceScope host(Device::kCpu, nullptr);
    ops::linear_backward(dx, xt, dw, db, dy, x, w, t, N, C, OC);
  };
  fill_conv_slots(k);
  k.relu_forward = [](void* y, const void* x, int64_t n, DType t, void*) {
    enter("relu_forward", {y, x});
    DeviceScope host(Device::kCpu, nullptr);
    ops::relu_forward(y, x, n, t);
  };
  k.relu_backward = [](void* dx, const void* dy, const void* y, int64_t n, DType t, void*) {
    enter("relu_backward", {dx, dy, y});
    DeviceScope host(Device::kCpu, nullptr);
    ops::relu_backward(dx, dy, y, n, t);
  };
  k.gelu_forward = [](void* y, const void* x, int64_t n, DType t, void*) {
    enter("gelu_forward", {y, x});
    DeviceScope host(Device::kCpu, nullptr);
    ops::gelu_forward(y, x, n, t);
  };
  k.gelu_backward = [](void* dx, const void* dy, const void* x, int64_t n, DType t, void*) {
    enter("gelu_backward", {dx, dy, x});
    DeviceScope host(Device::kCpu, nullptr);
    ops::gelu_backward(dx, dy, x, n, t);
  };
  k.add_forward = [](void* y, const void* a, const void* b, int64_t n, int64_t count, DType t,
                     void*) {
    enter("add_forward", {y, a, b});
    DeviceScope host(Device::kCpu, nullptr);
    ops::add_forward(y, a, b, n, t, count);
  };
  k.layernorm_forward = [](void* y, float* mean, float* rstd, const void* x, const void* w,
                           const void* b, int64_t N, int64_t C, DType t, void*) {
    enter("layernorm_forward", {y, mean, rstd, x, w, b});
    DeviceScope host(Device::kCpu, nullptr);
    ops::layernorm_forward(y, mean, rstd, x, w, b, N, C, t);
  };
  k.layernorm_backward = [](void* dx, float* dw, float* db, const void* dy, const void* x,
                            const void* w, const float* mean, const float* rstd, int64_t N,
                            int64_t C, DType t, void*) {
    enter("layernorm_backward", {dx, dw, db, dy, x, w, mean, rstd});
    DeviceScope host(Device::kCpu, nullptr);
    ops::layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C, t);
  };
  k.embedding_forward = [](void* y, const int32_t* ids, const void* table, int64_t N, int64_t V,
                           int64_t C, int64_t lo, int64_t rows, DType t, void*) {
    enter("embedding_forward", {y, ids, table});
    DeviceScope host(Device::kCpu, nullptr);
    ops::embedding_forward(y, ids, table, N, V, C, lo, rows, t);
  };
  k.embedding_backward = [](float* dtable, const void* dy, const int32_t* ids, int64_t N, int64_t C,
                            int64_t lo, int64_t rows, DType t, void*) {
    enter("embedding_backward", {dtable, dy, ids});
    DeviceScope host(Device::kCpu, nullptr);
    ops::embedding_backward(dtable, dy, ids, N, C, lo, rows, t);
  };
  // The CPU loss (probabilities, then the mean), each row's loss and lse = loss + its logit.
  k.cross_entropy_forward = [](float* loss, float* losses, float* lse, const void* logits,
                               const int32_t* labels, int64_t N, int64_t C, DType t, void*) {
    enter("cross_entropy_forward", {loss, losses, lse, logits, labels});
    const std::vector<float> x = widened(logits, N * C, t);
    std::vector<float> probs(x.size());
    loss[0] = ops::cross_entropy_forward(probs.data(), x.data(), labels, N, C);
    for (int64_t r = 0; r < N; ++r) {
      losses[r] = ops::cross_entropy_forward(probs.data(), x.data() + r * C, labels + r, 1, C);
      lse[r] = losses[r] + x[static_cast<size_t>(r * C + labels[r])];
    }
  };
  // The probabilities recomputed as the CPU's forward made them, then the CPU's backward.
  k.cross_entropy_backward = [](void* dlogits, const void* logits, const float* lse,
                                const int32_t* labels, int64_t N, int64_t C, float dloss,
                                int64_t lo, DType t, void*) {
    enter("cross_entropy_backward", {dlogits, logits, lse, labels});
    const std::vector<float> x = widened(logits, N * C, t);
    std::vector<float> probs(x.size()), d(x.size());
    ops::cross_entropy_forward(probs.data(), x.data(), labels, N, C);
    ops::cross_entropy_backward(d.data(), probs.data(), labels, N, C, dloss, lo);
    ops::convert(dlogits, t, d.data(), DType::kF32, N * C);
  };
  k.count_correct = [](int64_t* correct, const void* logits, const int32_t* labels, int64_t N,
                       int64_t C, DType t, void*) {
    enter("count_correct", {correct, logits, labels});
    correct[0] = ops::count_correct(widened(logits, N * C, t).data(), labels, N, C);
  };
  k.adamw_step = [](float* p, const float* g, float* m, float* v, void* working, DType wt,
                    int64_t n, const ops::AdamWStep& a, void*) {
    enter("adamw_step", {p, g, m, v, working});
    ops::adamw_step(p, g, m, v, working, wt, n, a);
  };
  k.sgd_step = [](float* p, const float* g, float* momentum, void* working, DType wt, int64_t n,
                  const ops::SgdStep& a, void*) {
    enter("sgd_step", {p, g, momentum, working});
    ops::sgd_step(p, g, momentum, working, wt, n, a);
  };
  k.sum_squares = [](double* out, double* partials, const float* x, int64_t n, void*) {
    enter("sum_squares", {out, partials, x});
    DeviceScope host(Device::kCpu, nullptr);
    out[0] = optim::sum_squares(x, n);
  };
  fill_gpt_slots(k);
  fill_modern_slots(k);
  fill_exact_slots(k);
  fill_vocab_parallel_slots(k);
  return k;
}

// The vocab-parallel loss's steps: the CPU's sliced_* on the widened logits; the backward
// recomputes the probabilities as the CPU's forward made them (exp, then times 1 / sum).
void FakeSlots::fill_vocab_parallel_slots(ops::DeviceKernels& k) {
  k.sliced_row_max = [](float* row_max, const void* logits, int64_t N, int64_t C, int64_t valid,
                        DType t, void*) {
    enter("sliced_row_max", {row_max, logits});
    ops::sliced_row_max(row_max, widened(logits, N * C, t).data(), N, C, valid);
  };
  k.sliced_exp_sum = [](float* sums, float* target, const void* logits, const int32_t* labels,
                        const float* row_max, int64_t N, int64_t C, int64_t valid, int64_t lo,
                        int64_t V, DType t, void*) {
    enter("sliced_exp_sum", {sums, target, logits, labels, row_max});
    std::vector<float> probs(static_cast<size_t>(N * C));
    ops::sliced_exp(probs.data(), sums, target, widened(logits, N * C, t).data(), labels, row_max,
                    N, C, valid, lo);
    for (int64_t r = 0; r < N; ++r)
      if (labels[r] < 0 || labels[r] >= V) target[r] = NAN;
  };
  k.sliced_cross_entropy_backward = [](void* dlogits, const void* logits, const float* row_max,
                                       const float* sums, const int32_t* labels, int64_t N,
                                       int64_t C, int64_t valid, int64_t lo, float dloss, DType t,
                                       void*) {
    enter("sliced_cross_entropy_backward", {dlogits, logits, row_max, sums, labels});
    const size_t n = static_cast<size_t>(N * C);
    std::vector<float> probs(n), d(n), local_sums(static_cast<size_t>(N)), target(local_sums);
    ops::sliced_exp(probs.data(), local_sums.data(), target.data(),
                    widened(logits, N * C, t).data(), labels, row_max, N, C, valid, lo);
    ops::sliced_normalize(probs.data(), sums, N, C, valid);
    ops::cross_entropy_backward(d.data(), probs.data(), labels, N, C, dloss, lo);
    ops::convert(dlogits, t, d.data(), DType::kF32, N * C);
  };
}

// The GPT's slots: accumulate and attention.
void FakeSlots::fill_gpt_slots(ops::DeviceKernels& k) {
  k.accumulate = [](float* acc, const void* x, int64_t n, int64_t count, DType t, void*) {
    enter("accumulate", {acc, x});
    DeviceScope host(Device::kCpu, nullptr);
    ops::accumulate(acc, x, n, t, count);
  };
  k.attention_forward = [](void* out, float* lse, const void* qkv, int64_t B, int64_t T, int64_t C,
                           int64_t NH, DType t, void*) {
    enter("attention_forward", {out, lse, qkv});
    std::vector<float> att;
    attention(out, lse, qkv, B, T, C, NH, t, att);
  };
  // The CPU backward over the probabilities the CPU forward recomputes, after checking that the
  // caller passed the forward's out and lse (what a flash backward reads).
  k.attention_backward = [](void* dqkv, const void* dout, const void* qkv, const void* out,
                            const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH, DType t,
                            void*) {
    enter("attention_backward", {dqkv, dout, qkv, out, lse});
    const size_t out_bytes = static_cast<size_t>(B * T * C) * dtype_size(t);
    std::vector<char> out2(out_bytes);
    std::vector<float> lse2(static_cast<size_t>(B * NH * T)), att;
    attention(out2.data(), lse2.data(), qkv, B, T, C, NH, t, att);
    EXPECT_EQ(std::memcmp(out2.data(), out, out_bytes), 0) << "attention_backward: out is not "
                                                              "the forward's";
    EXPECT_EQ(std::memcmp(lse2.data(), lse, lse2.size() * sizeof(float)), 0)
        << "attention_backward: lse is not the forward's";
    DeviceScope host(Device::kCpu, nullptr);
    ops::attention_backward(dqkv, dout, qkv, att.data(), B, T, C, NH, t);
  };
}

// The modern GPT's slots and dropout's.
void FakeSlots::fill_modern_slots(ops::DeviceKernels& k) {
  k.rmsnorm_forward = [](void* y, float* rstd, const void* x, const void* w, int64_t N, int64_t C,
                         DType t, void*) {
    enter("rmsnorm_forward", {y, rstd, x, w});
    DeviceScope host(Device::kCpu, nullptr);
    ops::rmsnorm_forward(y, rstd, x, w, N, C, t);
  };
  k.rmsnorm_backward = [](void* dx, float* dw, const void* dy, const void* x, const void* w,
                          const float* rstd, int64_t N, int64_t C, DType t, void*) {
    enter("rmsnorm_backward", {dx, dw, dy, x, w, rstd});
    DeviceScope host(Device::kCpu, nullptr);
    ops::rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C, t);
  };
  k.rotary_forward = [](void* qkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t,
                        void*) {
    enter("rotary_forward", {qkv, pos});
    DeviceScope host(Device::kCpu, nullptr);
    ops::rotary_forward(qkv, pos, N, C, NH, t);
  };
  k.rotary_backward = [](void* dqkv, const int64_t* pos, int64_t N, int64_t C, int64_t NH, DType t,
                         void*) {
    enter("rotary_backward", {dqkv, pos});
    DeviceScope host(Device::kCpu, nullptr);
    ops::rotary_backward(dqkv, pos, N, C, NH, t);
  };
  k.swiglu_forward = [](void* y, const void* x, int64_t N, int64_t H, DType t, void*) {
    enter("swiglu_forward", {y, x});
    DeviceScope host(Device::kCpu, nullptr);
    ops::swiglu_forward(y, x, N, H, t);
  };
  k.swiglu_backward = [](void* dx, const void* dy, const void* x, int64_t N, int64_t H, DType t,
                         void*) {
    enter("swiglu_backward", {dx, dy, x});
    DeviceScope host(Device::kCpu, nullptr);
    ops::swiglu_backward(dx, dy, x, N, H, t);
  };
  k.dropout_forward = [](void* y, const void* x, int64_t rows, int64_t cols, float p, uint64_t seed,
                         int64_t step, int64_t first_sample, int64_t first_col, DType t, void*) {
    enter("dropout_forward", {y, x});
    DeviceScope host(Device::kCpu, nullptr);
    ops::dropout_forward(y, x, rows, cols, p, seed, step, first_sample, first_col, t);
  };
  k.dropout_backward = [](void* dx, const void* dy, int64_t rows, int64_t cols, float p,
                          uint64_t seed, int64_t step, int64_t first_sample, int64_t first_col,
                          DType t, void*) {
    enter("dropout_backward", {dx, dy});
    DeviceScope host(Device::kCpu, nullptr);
    ops::dropout_backward(dx, dy, rows, cols, p, seed, step, first_sample, first_col, t);
  };
}

// Deterministic mode's exact sum: the CPU's loops (tessel/ops/exact.h).
void FakeSlots::fill_exact_slots(ops::DeviceKernels& k) {
  k.exact_collect = [](float* kept, float* max, const float* g, int64_t n, void*) {
    enter("exact_collect", {kept, max, g});
    DeviceScope host(Device::kCpu, nullptr);
    ops::exact_collect(kept, max, g, n);
  };
  k.exact_quantise = [](int64_t* acc, const float* g, int64_t n, double scale, void*) {
    enter("exact_quantise", {acc, g});
    DeviceScope host(Device::kCpu, nullptr);
    ops::exact_quantise(acc, g, n, scale);
  };
  k.exact_dequantise = [](float* out, const int64_t* sums, int64_t n, double scale, void*) {
    enter("exact_dequantise", {out, sums});
    DeviceScope host(Device::kCpu, nullptr);
    ops::exact_dequantise(out, sums, n, scale);
  };
}

// ---- FakeDevice ----

FakeDevice::FakeDevice(int gpus) : gpus_(gpus), kernels_(FakeSlots::table()) {
  g_device = this;
  install_device_runtime(Device::kCuda, &runtime_);
  ops::install_device_kernels(Device::kCuda, &kernels_);
}

FakeDevice::~FakeDevice() {
  ops::install_device_kernels(Device::kCuda, nullptr);
  install_device_runtime(Device::kCuda, nullptr);
  g_device = nullptr;
  EXPECT_TRUE(runtime_.blocks.empty()) << "a device block was not given back";
  EXPECT_TRUE(runtime_.pinned.empty()) << "pinned host memory was not given back";
}

int FakeDevice::calls(const std::string& op) const {
  std::lock_guard<std::recursive_mutex> lock(runtime_.mu);
  auto it = calls_.find(op);
  return it == calls_.end() ? 0 : it->second;
}

// ---- Several GPUs ----

void set_fake_gpu(int gpu) {
  EXPECT_GE(gpu, 0);
  EXPECT_LT(gpu, fake_gpu_count()) << "set_fake_gpu of a GPU the fake device does not have";
  t_gpu = gpu;
}

int fake_gpu() { return t_gpu; }

int fake_gpu_count() { return g_device != nullptr ? g_device->gpu_count() : 1; }

int fake_gpu_of(const void* p) { return g_device != nullptr ? g_device->runtime().gpu_of(p) : -1; }

}  // namespace tessel::fakes
