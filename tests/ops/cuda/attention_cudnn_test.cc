// cuDNN's fused attention (attention_cudnn.cc) against the CPU's bf16 attention, its lse against
// the flash kernel's, either path's backward from the other's forward, the same bits on a second
// run (IsDeterministic: gpu_check leaves it out of memcheck, as every *Deterministic* test), and
// the kernel table's choice of it. The f32 refusal is a host rule and runs without a device.
#include <cstdio>

#include "attention_testing.h"
#include "tessel/ops/cuda/kernels.h"
#include "tessel/ops/cuda/runtime.h"
#include "tessel/ops/device_kernels.h"

namespace tessel::ops::cuda::testing {
namespace {

constexpr DType kBf16 = DType::kBF16;

TEST(AttentionCudnnPlan, RefusesF32AndShapesThatAreNotAttention) {
  for (bool backward : {false, true}) {
    EXPECT_NE(attention_cudnn_refusal(DType::kF32, 2, 256, 768, 12, backward).find("16-bit"),
              std::string::npos);
    EXPECT_NE(attention_cudnn_refusal(kBf16, 2, 256, 760, 12, backward), "");  // 12 in 760: no
    EXPECT_NE(attention_cudnn_refusal(kBf16, 0, 256, 768, 12, backward), "");
  }
}

class CudaAttentionCudnn : public Gpu {
 protected:
  struct Result {
    Vec out, lse, dqkv;
  };
  // Forward and backward through cuDNN; empty where cuDNN refuses the shape, which fails the
  // test where `must_run` (GPT-2's and the char GPT's head sizes, lengths of whole tiles).
  static Result run(const Case& c, const DeviceBuffer& qkv, const DeviceBuffer& dout,
                    bool must_run = true) {
    const std::string why = attention_cudnn_refusal(kBf16, c.B, c.T, c.C, c.NH, false) +
                            attention_cudnn_refusal(kBf16, c.B, c.T, c.C, c.NH, true);
    if (!why.empty()) {
      if (must_run) ADD_FAILURE() << "cuDNN refuses" << c.tag() << ": " << why;
      std::printf("[ cuda tests ] cuDNN refuses%s: %s\n", c.tag().c_str(), why.c_str());
      return {};
    }
    DeviceBuffer fws(attention_cudnn_workspace_bytes(c.B, c.T, c.C, c.NH, false) + 1),
        bws(attention_cudnn_workspace_bytes(c.B, c.T, c.C, c.NH, true) + 1);
    DeviceBuffer out = poisoned(c.out_size(), kBf16), lse = poisoned(c.lse_size()),
                 dqkv = poisoned(c.qkv_size(), kBf16);
    attention_cudnn_forward(fws.get(), out.get(), lse.as<float>(), qkv.get(), c.B, c.T, c.C, c.NH,
                            nullptr);
    attention_cudnn_backward(bws.get(), dqkv.get(), dout.get(), qkv.get(), out.get(),
                             lse.as<float>(), c.B, c.T, c.C, c.NH, nullptr);
    return {download(out, c.out_size(), kBf16), download(lse, c.lse_size()),
            download(dqkv, c.qkv_size(), kBf16)};
  }
};

// GPT-2's head size and length (T = 1024, heads of 64) and the 10.8M char GPT's (T = 256, heads
// of 64) must run; the example char GPT's heads of 16 and lengths that are no multiple of a tile
// may be refused (the table then falls back), and where they run they hold the same bounds.
TEST_F(CudaAttentionCudnn, ForwardAndBackwardMatchCpuBf16) {
  struct Try {
    Case c;
    bool must_run;
  };
  for (const auto& [c, must_run] :
       {Try{{2, 256, 256, 4}, true}, Try{{1, 1024, 768, 12}, true}, Try{{2, 256, 384, 6}, true},
        Try{{32, 64, 64, 4}, false}, Try{{2, 97, 256, 2}, false}, Try{{3, 1, 64, 1}, false}}) {
    const auto qkv = to_bf16(randn(c.qkv_size(), 31)), dout = to_bf16(randn(c.out_size(), 32));
    const CpuAttention want = cpu_attention_bf16(c, qkv, dout);
    const DeviceBuffer gqkv = upload_ints(qkv), gdout = upload_ints(dout);
    const Result got = run(c, gqkv, gdout, must_run);
    if (got.out.empty()) continue;
    DeviceBuffer fout = poisoned(c.out_size(), kBf16), flse = poisoned(c.lse_size());
    attention_forward(fout.get(), flse.as<float>(), gqkv.get(), c.B, c.T, c.C, c.NH, kBf16,
                      nullptr);
    // cuDNN rounds P (and dS) to bf16 for its tensor-core products, as the CPU and the GEMM path
    // do: the GEMM path's bounds.
    expect_close(got.out, want.out, 5e-2, "cudnn attention out" + c.tag(), 1e-2);
    expect_close(got.lse, download(flse, c.lse_size()), 1e-4, "cudnn attention lse" + c.tag());
    expect_close(got.dqkv, want.dqkv, 2e-1, "cudnn attention dqkv" + c.tag(), 1e-2);
  }
}

// The same cache and contract as the flash kernels: the flash backward from cuDNN's forward
// (its out and lse) gives cuDNN's gradients to bf16 rounding.
TEST_F(CudaAttentionCudnn, FlashBackwardTakesItsCache) {
  const Case c{2, 256, 256, 4};
  const DeviceBuffer qkv = upload(randn(c.qkv_size(), 33), kBf16);
  const DeviceBuffer dout = upload(randn(c.out_size(), 34), kBf16);
  const Result got = run(c, qkv, dout);
  if (got.out.empty()) return;
  DeviceBuffer out = upload(got.out, kBf16), lse = upload(got.lse),
               dqkv = poisoned(c.qkv_size(), kBf16);
  attention_backward(dqkv.get(), dout.get(), qkv.get(), out.get(), lse.as<float>(), c.B, c.T, c.C,
                     c.NH, kBf16, nullptr);
  expect_close(download(dqkv, c.qkv_size(), kBf16), got.dqkv, 2e-1,
               "flash backward of cudnn's forward", 1e-2);
}

TEST_F(CudaAttentionCudnn, IsDeterministic) {
  const Case c{2, 1024, 768, 12};
  const DeviceBuffer qkv = upload(randn(c.qkv_size(), 35), kBf16);
  const DeviceBuffer dout = upload(randn(c.out_size(), 36), kBf16);
  const Result a = run(c, qkv, dout), b = run(c, qkv, dout);
  expect_same_bits(a.out, b.out, "cudnn attention out");
  expect_same_bits(a.lse, b.lse, "cudnn attention lse");
  expect_same_bits(a.dqkv, b.dqkv, "cudnn attention dqkv");
}

// The kernel table's attention slots (what a bf16 GPT calls) are cuDNN's where it runs the
// shape: the same bits.
TEST_F(CudaAttentionCudnn, TheKernelTableTakesItForBf16) {
  const Case c{2, 256, 256, 4};
  const DeviceBuffer qkv = upload(randn(c.qkv_size(), 37), kBf16);
  const DeviceBuffer dout = upload(randn(c.out_size(), 38), kBf16);
  const Result direct = run(c, qkv, dout);
  if (direct.out.empty()) return;
  install();
  const DeviceKernels* table = device_kernels(Device::kCuda);
  ASSERT_NE(table, nullptr);
  DeviceBuffer out = poisoned(c.out_size(), kBf16), lse = poisoned(c.lse_size()),
               dqkv = poisoned(c.qkv_size(), kBf16);
  table->attention_forward(out.get(), lse.as<float>(), qkv.get(), c.B, c.T, c.C, c.NH, kBf16,
                           nullptr);
  table->attention_backward(dqkv.get(), dout.get(), qkv.get(), out.get(), lse.as<float>(), c.B, c.T,
                            c.C, c.NH, kBf16, nullptr);
  expect_same_bits(download(out, c.out_size(), kBf16), direct.out, "table attention out");
  expect_same_bits(download(lse, c.lse_size()), direct.lse, "table attention lse");
  expect_same_bits(download(dqkv, c.qkv_size(), kBf16), direct.dqkv, "table attention dqkv");
}

}  // namespace
}  // namespace tessel::ops::cuda::testing
