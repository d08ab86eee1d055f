#include "fake_device.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "tessel/ops/cpu.h"
#include "tessel/optim/schedule.h"

namespace tessel::fakes {

// ---- FakeRuntime ----

void* FakeRuntime::allocate(size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  void* p = std::malloc(allocation_size(bytes));
  std::memset(p, 0xFF, allocation_size(bytes));
  blocks[p] = allocation_size(bytes);
  in_use += static_cast<int64_t>(allocation_size(bytes));
  return p;
}

void FakeRuntime::free(void* p, size_t bytes) noexcept {
  std::lock_guard<std::recursive_mutex> lock(mu);
  EXPECT_EQ(blocks[p], allocation_size(bytes));
  in_use -= static_cast<int64_t>(blocks[p]);
  blocks.erase(p);
  std::free(p);
}

void FakeRuntime::zero(void* p, size_t bytes, void* stream) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  EXPECT_TRUE(owns(p, bytes));
  streams.push_back(stream);
  std::memset(p, 0, bytes);
}

void FakeRuntime::copy(void* dst, Device dst_device, const void* src, Device src_device,
                       size_t bytes, void* stream) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  EXPECT_EQ(dst_device == Device::kCuda, owns(dst, bytes));
  EXPECT_EQ(src_device == Device::kCuda, owns(src, bytes));
  streams.push_back(stream);
  ++copies;
  std::memmove(dst, src, bytes);
}

void FakeRuntime::convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
                          void* stream) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  EXPECT_TRUE(owns(dst, static_cast<size_t>(n) * dtype_size(dst_type)));
  EXPECT_TRUE(owns(src, static_cast<size_t>(n) * dtype_size(src_type)));
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
    for (const void* p : pointers) {
      if (p != nullptr) {
        EXPECT_TRUE(g_device->runtime_.owns(p, 1)) << op << " was given host memory";
      }
    }
  }

  // The logits widened to f32 (the CPU loss's own widening).
  static std::vector<float> widened(const void* logits, int64_t n, DType t) {
    std::vector<float> out(static_cast<size_t>(n));
    ops::convert(out.data(), DType::kF32, logits, t, n);
    return out;
  }

  static ops::DeviceKernels table();
};

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
  k.add_forward = [](void* y, const void* a, const void* b, int64_t n, DType t, void*) {
    enter("add_forward", {y, a, b});
    DeviceScope host(Device::kCpu, nullptr);
    ops::add_forward(y, a, b, n, t);
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
  return k;
}

// ---- FakeDevice ----

FakeDevice::FakeDevice() : kernels_(FakeSlots::table()) {
  g_device = this;
  install_device_runtime(Device::kCuda, &runtime_);
  ops::install_device_kernels(Device::kCuda, &kernels_);
}

FakeDevice::~FakeDevice() {
  ops::install_device_kernels(Device::kCuda, nullptr);
  install_device_runtime(Device::kCuda, nullptr);
  g_device = nullptr;
  EXPECT_TRUE(runtime_.blocks.empty()) << "a device block was not given back";
}

int FakeDevice::calls(const std::string& op) const {
  std::lock_guard<std::recursive_mutex> lock(runtime_.mu);
  auto it = calls_.find(op);
  return it == calls_.end() ? 0 : it->second;
}

}  // namespace tessel::fakes
