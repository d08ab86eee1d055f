// Attention through tensor-core GEMMs (attention_gemm.cu) against the CPU's bf16
// attention_forward/backward, its lse against the flash kernel's, chunks of heads against whole
// sequences, and the same bits on a second run (IsDeterministic: gpu_check leaves it out of
// memcheck, as every *Deterministic* test). The support rule and the scratch bound are host
// functions and run without a device.
#include <memory>

#include "attention_testing.h"
#include "tessel/core/error.h"
#include "tessel/ops/cuda/blas.h"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda::testing {
namespace {

constexpr DType kBf16 = DType::kBF16;

TEST(AttentionGemmPlan, SupportsBf16LongSequencesOnly) {
  EXPECT_TRUE(attention_gemm_supported(kBf16, 256, 64));
  EXPECT_TRUE(attention_gemm_supported(kBf16, 1024, 128));
  EXPECT_FALSE(attention_gemm_supported(DType::kF32, 1024, 64));  // f32 stays exact (flash)
  EXPECT_FALSE(attention_gemm_supported(kBf16, 248, 64));         // short: flash
  EXPECT_FALSE(attention_gemm_supported(kBf16, 260, 64));         // not a multiple of 8
  EXPECT_FALSE(attention_gemm_supported(kBf16, 1024, 48));        // head size
}

TEST(AttentionGemmPlan, ScratchHoldsTheWholeBatchUpTo256MiBElseWhatFits) {
  const size_t MiB = size_t{1} << 20;
  EXPECT_EQ(attention_gemm_scratch_bytes(1, 1024, 12), 144 * MiB);   // 12 heads x 12 MiB
  EXPECT_EQ(attention_gemm_scratch_bytes(16, 1024, 12), 192 * MiB);  // GPT-2: 16 sequences
  EXPECT_EQ(attention_gemm_scratch_bytes(1, 2048, 12), 5 * 48 * MiB);
  EXPECT_EQ(attention_gemm_scratch_bytes(1, 4096, 32), 192 * MiB);  // one even past the budget
  EXPECT_EQ(attention_gemm_scratch_bytes(64, 256, 6), 48 * MiB);    // char GPT: 64 sequences
}

class CudaAttentionGemm : public Gpu {
 protected:
  struct Result {
    Vec out, lse, dqkv;
  };
  // Forward and backward through the GEMM path with `scratch_bytes` of scratch (0: the
  // kernel table's size).
  Result run(const Case& c, const DeviceBuffer& qkv, const DeviceBuffer& dout,
             size_t scratch_bytes = 0) {
    const int64_t n_qkv = c.B * c.T * 3 * c.C, n_out = c.B * c.T * c.C, n_lse = c.B * c.NH * c.T;
    if (scratch_bytes == 0) scratch_bytes = attention_gemm_scratch_bytes(c.B, c.T, c.NH);
    DeviceBuffer scratch(scratch_bytes), out = poisoned(n_out, kBf16), lse = poisoned(n_lse),
                                         dqkv = poisoned(n_qkv, kBf16);
    attention_gemm_forward(blas(), scratch.get(), scratch_bytes, out.get(), lse.as<float>(),
                           qkv.get(), c.B, c.T, c.C, c.NH, kBf16, nullptr);
    attention_gemm_backward(blas(), scratch.get(), scratch_bytes, dqkv.get(), dout.get(), qkv.get(),
                            out.get(), lse.as<float>(), c.B, c.T, c.C, c.NH, kBf16, nullptr);
    return {download(out, n_out, kBf16), download(lse, n_lse), download(dqkv, n_qkv, kBf16)};
  }
  Blas& blas() {  // made after SetUp: Blas throws without a device
    if (!blas_) blas_ = std::make_unique<Blas>();
    return *blas_;
  }
  std::unique_ptr<Blas> blas_;
};

TEST_F(CudaAttentionGemm, ForwardAndBackwardMatchCpuBf16) {
  // GPT-2's head size 64 at T = 256 and 1024; 256/4 has four heads of 64 too; 6 sequences of
  // 2 heads batch over the sequences.
  for (const Case& c : {Case{2, 256, 256, 4}, Case{1, 256, 768, 12}, Case{1, 1024, 768, 12},
                        Case{6, 256, 128, 2}}) {
    const int64_t n_qkv = c.B * c.T * 3 * c.C, n_out = c.B * c.T * c.C;
    const auto qkv = to_bf16(randn(n_qkv, 11)), dout = to_bf16(randn(n_out, 12));
    const CpuAttention want = cpu_attention_bf16(c, qkv, dout);
    const DeviceBuffer gqkv = upload_ints(qkv), gdout = upload_ints(dout);
    const Result got = run(c, gqkv, gdout);
    // The flash kernel's lse (f32 scores from the same bf16 inputs): only the sums' order differs.
    DeviceBuffer fout = poisoned(n_out, kBf16), flse = poisoned(c.B * c.NH * c.T);
    attention_forward(fout.get(), flse.as<float>(), gqkv.get(), c.B, c.T, c.C, c.NH, kBf16,
                      nullptr);
    const std::string tag = str(" gemm B=", c.B, " T=", c.T, " C=", c.C, " NH=", c.NH);
    // Both round P and dS to bf16 for their GEMMs, and an f32 score summed in another order can
    // round to the neighbouring bf16 step: one step of a large P (a query with few keys) moves
    // an output by up to a few % of |want| + rms, while the norm error stays near 2.5e-3 (H200,
    // 2026-11-29, two seeds: worst out 1.9% and 1.8%, worst dqkv 6.5% and 7.6%, at T = 1024).
    expect_close(got.out, want.out, 5e-2, "attention out" + tag, 1e-2);
    expect_close(got.lse, download(flse, c.B * c.NH * c.T), 1e-5, "attention lse" + tag);
    expect_close(got.dqkv, want.dqkv, 2e-1, "attention dqkv" + tag, 1e-2);
  }
}

TEST_F(CudaAttentionGemm, ChunksGiveTheWholeResult) {
  const Case c{2, 256, 768, 12};
  const DeviceBuffer qkv = upload(randn(c.B * c.T * 3 * c.C, 13), kBf16);
  const DeviceBuffer dout = upload(randn(c.B * c.T * c.C, 14), kBf16);
  const Result whole = run(c, qkv, dout);
  // Room for 5 heads: chunks of 5, 5 and 2 per sequence.
  const Result chunked = run(c, qkv, dout, 5 * 12 * c.T * c.T + 1000);
  // Another batch count may pick another GEMM algorithm: equal to a bf16 step or two.
  expect_close(chunked.out, whole.out, 1e-2, "chunked attention out", 1e-3);
  expect_close(chunked.lse, whole.lse, 1e-5, "chunked attention lse");
  expect_close(chunked.dqkv, whole.dqkv, 1e-2, "chunked attention dqkv", 1e-3);
  // Batched over 6 sequences of 2 heads: room for 4 gives chunks of 4 and 2 per head.
  const Case s{6, 256, 128, 2};
  const DeviceBuffer sqkv = upload(randn(s.B * s.T * 3 * s.C, 20), kBf16);
  const DeviceBuffer sdout = upload(randn(s.B * s.T * s.C, 21), kBf16);
  const Result swhole = run(s, sqkv, sdout), schunked = run(s, sqkv, sdout, 4 * 12 * s.T * s.T);
  expect_close(schunked.out, swhole.out, 1e-2, "chunked sequences out", 1e-3);
  expect_close(schunked.lse, swhole.lse, 1e-5, "chunked sequences lse");
  expect_close(schunked.dqkv, swhole.dqkv, 1e-2, "chunked sequences dqkv", 1e-3);
}

TEST_F(CudaAttentionGemm, IsDeterministic) {
  const Case c{2, 1024, 768, 12};
  const DeviceBuffer qkv = upload(randn(c.B * c.T * 3 * c.C, 15), kBf16);
  const DeviceBuffer dout = upload(randn(c.B * c.T * c.C, 16), kBf16);
  const Result a = run(c, qkv, dout), b = run(c, qkv, dout);
  expect_same_bits(a.out, b.out, "gemm attention out");
  expect_same_bits(a.lse, b.lse, "gemm attention lse");
  expect_same_bits(a.dqkv, b.dqkv, "gemm attention dqkv");
}

TEST_F(CudaAttentionGemm, RefusesScratchWithoutRoomForOneHead) {
  const Case c{1, 256, 256, 4};
  const DeviceBuffer qkv = upload(randn(c.B * c.T * 3 * c.C, 17), kBf16);
  DeviceBuffer scratch(1024), out(c.B * c.T * c.C * 2), lse(c.B * c.NH * c.T * 4);
  EXPECT_THROW(attention_gemm_forward(blas(), scratch.get(), 1024, out.get(), lse.as<float>(),
                                      qkv.get(), c.B, c.T, c.C, c.NH, kBf16, nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace tessel::ops::cuda::testing
