// What the attention tests share (attention_test.cc: the flash kernels; attention_gemm_test.cc:
// the tensor-core GEMM path; attention_cudnn_test.cc: cuDNN's fused attention): the shape of a
// case and the CPU's bf16 attention of its inputs, the reference every path is held to.
#pragma once

#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops::cuda::testing {

struct Case {
  int64_t B, T, C, NH;
  int64_t qkv_size() const { return B * T * 3 * C; }
  int64_t out_size() const { return B * T * C; }
  int64_t lse_size() const { return B * NH * T; }
  std::string tag() const { return str(" B=", B, " T=", T, " C=", C, " NH=", NH); }
};

inline Vec to_f32(const std::vector<uint16_t>& h) {
  Vec v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = bf16_to_f32(h[i]);
  return v;
}

// The CPU's bf16 forward and backward of (qkv, dout), as f32.
struct CpuAttention {
  Vec out, dqkv;
};
inline CpuAttention cpu_attention_bf16(const Case& c, const std::vector<uint16_t>& qkv,
                                       const std::vector<uint16_t>& dout) {
  std::vector<uint16_t> out(c.out_size()), dqkv(c.qkv_size());
  Vec att(c.B * c.NH * c.T * c.T);
  const DType t = DType::kBF16;
  ops::attention_forward(out.data(), att.data(), qkv.data(), c.B, c.T, c.C, c.NH, t);
  ops::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), c.B, c.T, c.C, c.NH, t);
  return {to_f32(out), to_f32(dqkv)};
}

}  // namespace tessel::ops::cuda::testing
