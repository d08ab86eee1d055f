// The seam between the typed public ops and a device's kernel table (device_kernels.h), on the
// CPU: with the fake device (tests/support/fake_device.h: "device" memory in host blocks, a
// table whose slots run the CPU kernels), every op called inside a DeviceScope goes through its
// slot, with device pointers only, and gives the CPU path's bits (attention, whose device cache
// differs, through its device entry points); outside one the CPU path runs and no slot is
// called; an op without a device kernel throws naming itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "fake_device.h"
#include "grad_check.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/device_kernels.h"
#include "tessel/optim/optimizer.h"
#include "tessel/tensor/tensor.h"

namespace tessel::ops {
namespace {

using testing::randn;
using testing::Vec;

// A host tensor of type t holding v (rounded to t).
Tensor host(const Vec& v, DType t = DType::kF32) {
  Tensor f = Tensor::empty({static_cast<int64_t>(v.size())});
  std::memcpy(f.raw(), v.data(), v.size() * sizeof(float));
  return t == DType::kF32 ? f : f.to(t);
}

Tensor ids(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor h = b.to_device(Device::kCpu);
  return a.nbytes() == h.nbytes() && std::memcmp(a.raw(), h.raw(), a.nbytes()) == 0;
}

class DeviceSeam : public ::testing::Test {
 protected:
  // Runs op over host copies of args (the CPU path), then over device copies inside a
  // DeviceScope, and expects every argument (outputs, caches, gradients) to end with the same
  // bits, and slot `op_name` to have run `calls` times, only in the scope.
  void expect_same(const std::string& op_name, const std::vector<Tensor>& args,
                   const std::function<void(std::vector<Tensor>&)>& op, int calls = 1) {
    const int before = fake_.calls(op_name);
    std::vector<Tensor> cpu, dev;
    for (const Tensor& a : args) {
      cpu.push_back(a.clone());
      dev.push_back(a.to_device(Device::kCuda));
    }
    op(cpu);
    EXPECT_EQ(fake_.calls(op_name), before) << op_name << ": the CPU path called the device";
    {
      DeviceScope scope(Device::kCuda, &stream_);
      op(dev);
    }
    EXPECT_EQ(fake_.calls(op_name), before + calls) << op_name;
    for (size_t i = 0; i < args.size(); ++i)
      EXPECT_TRUE(same_bytes(cpu[i], dev[i])) << op_name << ": argument " << i << " differs";
  }

  fakes::FakeDevice fake_;
  int stream_ = 0;
};

class DeviceSeamTyped : public DeviceSeam, public ::testing::WithParamInterface<DType> {};

TEST_P(DeviceSeamTyped, LinearForwardAndBackward) {
  const DType t = GetParam();
  const int64_t N = 5, C = 7, OC = 3;
  for (DType x_type : {t, DType::kF32}) {  // the first layer's f32 input of a 16-bit model
    const std::vector<Tensor> args = {
        host(Vec(N * OC, 0.0f), t), host(randn(N * C, 1), x_type),  host(randn(OC * C, 2), t),
        host(randn(OC, 3), t),      host(Vec(N * C, 0.0f), x_type), host(randn(OC * C, 4)),
        host(randn(OC, 5)),         host(randn(N * OC, 6), t)};
    expect_same("linear_forward", args, [&](std::vector<Tensor>& a) {
      linear_forward(a[0].raw(), a[1].raw(), x_type, a[2].raw(), a[3].raw(), t, N, C, OC);
    });
    expect_same("linear_backward", args, [&](std::vector<Tensor>& a) {
      linear_backward(a[4].raw(), x_type, static_cast<float*>(a[5].raw()),
                      static_cast<float*>(a[6].raw()), a[7].raw(), a[1].raw(), a[2].raw(), t, N, C,
                      OC);
    });
  }
}

TEST_P(DeviceSeamTyped, ElementwiseOps) {
  const DType t = GetParam();
  const int64_t n = 2051;  // more than one of the CPU path's chunks
  const std::vector<Tensor> args = {host(randn(n, 1), t), host(randn(n, 2), t),
                                    host(Vec(n, 0.0f), t)};
  expect_same("relu_forward", args,
              [&](std::vector<Tensor>& a) { relu_forward(a[2].raw(), a[0].raw(), n, t); });
  expect_same("relu_backward", args, [&](std::vector<Tensor>& a) {
    relu_backward(a[2].raw(), a[1].raw(), a[0].raw(), n, t);
  });
  expect_same("gelu_forward", args,
              [&](std::vector<Tensor>& a) { gelu_forward(a[2].raw(), a[0].raw(), n, t); });
  expect_same("gelu_backward", args, [&](std::vector<Tensor>& a) {
    gelu_backward(a[2].raw(), a[1].raw(), a[0].raw(), n, t);
  });
  expect_same("add_forward", args, [&](std::vector<Tensor>& a) {
    add_forward(a[2].raw(), a[0].raw(), a[1].raw(), n, t);
  });
}

TEST_P(DeviceSeamTyped, LayerNormAndEmbedding) {
  const DType t = GetParam();
  const int64_t N = 6, C = 9, V = 11;
  const std::vector<Tensor> ln = {
      host(Vec(N * C, 0.0f), t), host(Vec(N, 0.0f)),   host(Vec(N, 0.0f)),
      host(randn(N * C, 1), t),  host(randn(C, 2), t), host(randn(C, 3), t),
      host(randn(N * C, 4), t),  host(randn(C, 5)),    host(randn(C, 6))};
  auto f = [](Tensor& x) { return static_cast<float*>(x.raw()); };
  expect_same("layernorm_forward", ln, [&](std::vector<Tensor>& a) {
    layernorm_forward(a[0].raw(), f(a[1]), f(a[2]), a[3].raw(), a[4].raw(), a[5].raw(), N, C, t);
    layernorm_backward(a[0].raw(), f(a[7]), f(a[8]), a[6].raw(), a[3].raw(), a[4].raw(), f(a[1]),
                       f(a[2]), N, C, t);
  });
  EXPECT_EQ(fake_.calls("layernorm_backward"), 1);
  const std::vector<Tensor> emb = {host(Vec(N * C, 0.0f), t), ids({3, 0, 10, 3, 7, 1}),
                                   host(randn(V * C, 7), t), host(randn(N * C, 8), t),
                                   host(randn(V * C, 9))};
  expect_same("embedding_forward", emb, [&](std::vector<Tensor>& a) {
    const auto* id = static_cast<const int32_t*>(a[1].raw());
    embedding_forward(a[0].raw(), id, a[2].raw(), N, V, C, 0, V, t);
    embedding_backward(f(a[4]), a[3].raw(), id, N, C, 0, V, t);
  });
  EXPECT_EQ(fake_.calls("embedding_backward"), 1);
}

TEST_P(DeviceSeamTyped, AccumulateAndAttention) {
  const DType t = GetParam();
  const int64_t n = 2051, B = 2, T = 5, C = 8, NH = 2;
  expect_same("accumulate", {host(randn(n, 1)), host(randn(n, 2), t)}, [&](std::vector<Tensor>& a) {
    accumulate(static_cast<float*>(a[0].raw()), a[1].raw(), n, t);
  });
  // The CPU's attention keeps att[B,NH,T,T]; the device's lse[B,NH,T] (and its backward reads
  // the forward's output): the same outputs and gradients.
  const Tensor qkv = host(randn(B * T * 3 * C, 3), t), dout = host(randn(B * T * C, 4), t);
  Tensor out = host(Vec(B * T * C, 0.0f), t), dqkv = host(Vec(B * T * 3 * C, 0.0f), t);
  Vec att(B * NH * T * T);
  attention_forward(out.raw(), att.data(), qkv.raw(), B, T, C, NH, t);
  attention_backward(dqkv.raw(), dout.raw(), qkv.raw(), att.data(), B, T, C, NH, t);
  const Tensor dev_qkv = qkv.to_device(Device::kCuda), dev_dout = dout.to_device(Device::kCuda);
  Tensor dev_out = Tensor::zeros({B * T * C}, t, Device::kCuda),
         dev_dqkv = Tensor::zeros({B * T * 3 * C}, t, Device::kCuda),
         lse = Tensor::zeros({B * NH * T}, DType::kF32, Device::kCuda);
  {
    DeviceScope scope(Device::kCuda, &stream_);
    auto* l = static_cast<float*>(lse.raw());
    attention_forward_device(dev_out.raw(), l, dev_qkv.raw(), B, T, C, NH, t);
    attention_backward_device(dev_dqkv.raw(), dev_dout.raw(), dev_qkv.raw(), dev_out.raw(), l, B, T,
                              C, NH, t);
  }
  EXPECT_TRUE(same_bytes(out, dev_out));
  EXPECT_TRUE(same_bytes(dqkv, dev_dqkv));
  EXPECT_EQ(fake_.calls("attention_forward"), 1);
  EXPECT_EQ(fake_.calls("attention_backward"), 1);
}

TEST_P(DeviceSeamTyped, ModernGptOps) {
  const DType t = GetParam();
  const int64_t N = 6, C = 8, NH = 2, H = 5;
  auto f = [](Tensor& x) { return static_cast<float*>(x.raw()); };
  const std::vector<Tensor> rms = {host(Vec(N * C, 0.0f), t), host(Vec(N, 0.0f)),
                                   host(randn(N * C, 1), t),  host(randn(C, 2), t),
                                   host(randn(N * C, 3), t),  host(randn(C, 4))};
  expect_same("rmsnorm_forward", rms, [&](std::vector<Tensor>& a) {
    rmsnorm_forward(a[0].raw(), f(a[1]), a[2].raw(), a[3].raw(), N, C, t);
    rmsnorm_backward(a[0].raw(), f(a[5]), a[4].raw(), a[2].raw(), a[3].raw(), f(a[1]), N, C, t);
  });
  EXPECT_EQ(fake_.calls("rmsnorm_backward"), 1);
  Tensor pos = Tensor::empty({N}, DType::kI64);
  for (int64_t i = 0; i < N; ++i) static_cast<int64_t*>(pos.raw())[i] = 3 * i + 1;
  expect_same("rotary_forward", {host(randn(N * 3 * C, 5), t), pos}, [&](std::vector<Tensor>& a) {
    const auto* p = static_cast<const int64_t*>(a[1].raw());
    rotary_forward(a[0].raw(), p, N, C, NH, t);
    rotary_backward(a[0].raw(), p, N, C, NH, t);
  });
  EXPECT_EQ(fake_.calls("rotary_backward"), 1);
  const std::vector<Tensor> glu = {host(Vec(N * H, 0.0f), t), host(randn(N * 2 * H, 6), t),
                                   host(randn(N * H, 7), t), host(Vec(N * 2 * H, 0.0f), t)};
  expect_same("swiglu_forward", glu, [&](std::vector<Tensor>& a) {
    swiglu_forward(a[0].raw(), a[1].raw(), N, H, t);
    swiglu_backward(a[3].raw(), a[2].raw(), a[1].raw(), N, H, t);
  });
  EXPECT_EQ(fake_.calls("swiglu_backward"), 1);
}

// The CPU's counter-RNG mask on the device: rows of other samples and columns past the first.
TEST_P(DeviceSeamTyped, Dropout) {
  const DType t = GetParam();
  const int64_t rows = 5, cols = 77;
  expect_same("dropout_forward",
              {host(Vec(rows * cols, 0.0f), t), host(randn(rows * cols, 1), t),
               host(randn(rows * cols, 2), t), host(Vec(rows * cols, 0.0f), t)},
              [&](std::vector<Tensor>& a) {
                dropout_forward(a[0].raw(), a[1].raw(), rows, cols, 0.3f, 7, 4, 130, 9, t);
                dropout_backward(a[3].raw(), a[2].raw(), rows, cols, 0.3f, 7, 4, 130, 9, t);
              });
  EXPECT_EQ(fake_.calls("dropout_backward"), 1);
}

TEST_P(DeviceSeamTyped, CrossEntropyOnTheDeviceIsTheCpuLoss) {
  const DType t = GetParam();
  const int64_t N = 9, C = 6;
  const Vec logits = randn(N * C, 1, 3.0f);
  const std::vector<int32_t> labels = {0, 5, 2, 2, 1, 4, 3, 0, 5};
  // The CPU loss as nn::CrossEntropyLoss computes it: the logits widened, then f32.
  const Tensor x = host(logits, t).to(DType::kF32);
  Vec probs(N * C), dlogits(N * C);
  const float loss =
      cross_entropy_forward(probs.data(), static_cast<const float*>(x.raw()), labels.data(), N, C);
  const int64_t correct = count_correct(static_cast<const float*>(x.raw()), labels.data(), N, C);
  cross_entropy_backward(dlogits.data(), probs.data(), labels.data(), N, C, 0.5f);

  const Tensor dx = host(logits, t).to_device(Device::kCuda),
               dy = ids(labels).to_device(Device::kCuda);
  Tensor lse = Tensor::zeros({N}, DType::kF32, Device::kCuda);
  Tensor dl = Tensor::zeros({N, C}, t, Device::kCuda);
  DeviceScope scope(Device::kCuda, &stream_);
  int64_t dev_correct = -1;
  const auto* y = static_cast<const int32_t*>(dy.raw());
  EXPECT_EQ(cross_entropy_forward_device(static_cast<float*>(lse.raw()), &dev_correct, dx.raw(), y,
                                         N, C, t),
            loss);
  EXPECT_EQ(dev_correct, correct);
  cross_entropy_backward_device(dl.raw(), dx.raw(), static_cast<float*>(lse.raw()), y, N, C, 0.5f,
                                0, t);
  EXPECT_TRUE(same_bytes(host(dlogits, t), dl));
  EXPECT_EQ(fake_.calls("cross_entropy_forward"), 1);
  EXPECT_EQ(fake_.calls("count_correct"), 1);
  EXPECT_EQ(fake_.calls("cross_entropy_backward"), 1);
}

INSTANTIATE_TEST_SUITE_P(Types, DeviceSeamTyped, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The optimizer's state on the device and its step through the table, with the working copy.
TEST_F(DeviceSeam, OptimizerStepsOnTheDeviceAsOnTheCpu) {
  for (optim::OptimKind kind : {optim::OptimKind::kSgd, optim::OptimKind::kAdamw}) {
    optim::OptimSpec spec;
    spec.kind = kind;
    spec.weight_decay = 0.01f;
    const int64_t n = 5000;
    const std::vector<Tensor> args = {host(randn(n, 1)), host(randn(n, 2)),
                                      host(Vec(n, 0.0f), DType::kBF16)};
    const char* slot = kind == optim::OptimKind::kSgd ? "sgd_step" : "adamw_step";
    expect_same(
        slot, args,
        [&](std::vector<Tensor>& a) {
          auto opt = optim::make_optimizer(spec, n);  // its state where the scope puts it
          const optim::Segment seg{static_cast<float*>(a[0].raw()),
                                   static_cast<float*>(a[1].raw()),
                                   n,
                                   0,
                                   a[2].raw(),
                                   DType::kBF16};
          opt->step({&seg, 1}, 0.1f, 0.5f);
          opt->step({&seg, 1}, 0.1f, 1.0f);  // the second step reads the state the first left
          EXPECT_EQ(opt->state()[0].values.device(), current_device());
        },
        2);  // both steps
  }
}

// The CPU's fused conv2d + ReLU + max pool on the device, as the convolution, ReLU and pooling
// slots in sequence: fashion_cnn's second layer, the CPU fused kernels' bits. Then the plain
// convolution (a strided one) and an overlapping pool.
TEST_F(DeviceSeam, ConvolutionAndPoolingOnTheDeviceAsOnTheCpu) {
  const Conv2dShape s{3, 4, 14, 14, 6, 5, 5, 1, 2};
  const int64_t nx = s.N * s.C * s.H * s.W, nw = s.OC * s.C * s.KH * s.KW, ny = s.N * s.OC * 7 * 7;
  const std::vector<Tensor> args = {host(Vec(ny, 0.0f)),  ids(std::vector<int32_t>(ny, 0)),
                                    host(randn(nx, 1)),   host(randn(nw, 2)),
                                    host(randn(s.OC, 3)), host(Vec(nx, 0.0f)),
                                    host(randn(nw, 4)),   host(randn(s.OC, 5)),
                                    host(randn(ny, 6))};
  auto f = [](const Tensor& x) { return static_cast<float*>(x.raw()); };
  auto scratch = [](int64_t floats) {
    return Tensor::empty({floats}, DType::kF32, current_device());
  };
  expect_same("conv2d_forward", args, [&](std::vector<Tensor>& a) {
    const Tensor t = scratch(conv2d_relu_maxpool_scratch_floats(s, 2, 2));
    auto* argmax = static_cast<int32_t*>(a[1].raw());
    conv2d_relu_maxpool_forward(f(a[0]), argmax, f(a[2]), f(a[3]), f(a[4]), s, 2, 2, f(t));
    conv2d_relu_maxpool_backward(f(a[5]), f(a[6]), f(a[7]), f(a[8]), argmax, f(a[0]), f(a[2]),
                                 f(a[3]), s, 2, 2, f(t));
  });
  for (const char* slot : {"conv2d_backward", "maxpool2d_forward", "maxpool2d_backward",
                           "relu_forward", "relu_backward"})
    EXPECT_EQ(fake_.calls(slot), 1) << slot;
  const Conv2dShape st{2, 3, 11, 9, 5, 3, 3, 2, 1};
  const int64_t sx = st.N * st.C * st.H * st.W, sw = st.OC * st.C * 9, sy = st.N * st.OC * 6 * 5;
  const std::vector<Tensor> conv = {
      host(Vec(sy, 0.0f)), host(randn(sx, 7)),  host(randn(sw, 8)),     host(randn(st.OC, 9)),
      host(Vec(sx, 0.0f)), host(randn(sw, 10)), host(randn(st.OC, 11)), host(randn(sy, 12))};
  expect_same("conv2d_backward", conv, [&](std::vector<Tensor>& a) {
    const Tensor t = scratch(std::max<int64_t>(conv2d_scratch_floats(st), 1));
    conv2d_forward(f(a[0]), f(a[1]), f(a[2]), f(a[3]), st, f(t));
    conv2d_backward(f(a[4]), f(a[5]), f(a[6]), f(a[7]), f(a[1]), f(a[2]), st, f(t));
  });
  const std::vector<Tensor> pool = {host(Vec(2 * 3 * 4 * 5, 0.0f)), ids(std::vector<int32_t>(120)),
                                    host(randn(2 * 3 * 9 * 11, 13)), host(randn(120, 14)),
                                    host(Vec(2 * 3 * 9 * 11, 0.0f))};
  expect_same("maxpool2d_backward", pool, [&](std::vector<Tensor>& a) {
    auto* argmax = static_cast<int32_t*>(a[1].raw());
    maxpool2d_forward(f(a[0]), argmax, f(a[2]), 2, 3, 9, 11, 3, 2);
    maxpool2d_backward(f(a[4]), f(a[3]), argmax, 2, 3, 9, 11, 3, 2);
  });
}

TEST_F(DeviceSeam, OpsWithoutADeviceKernelThrowNamingThemselves) {
  Tensor a = Tensor::zeros({16}, DType::kF32, Device::kCuda);
  DeviceScope scope(Device::kCuda, nullptr);
  try {  // the CPU's cache (att) has no device kernel: the device's attention keeps lse
    attention_forward(a.raw(), nullptr, a.raw(), 1, 1, 1, 1, DType::kF32);
    FAIL() << "attention_forward (att) on the device did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention_forward (with the CPU's cache att) has no"),
              std::string::npos)
        << e.what();
  }
  install_device_kernels(Device::kCuda, nullptr);  // a device runtime without a table
  EXPECT_THROW(relu_forward(a.raw(), a.raw(), 16, DType::kF32), Error);
}

}  // namespace
}  // namespace tessel::ops
