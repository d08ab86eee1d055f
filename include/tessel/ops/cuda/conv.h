// Convolution and max pooling on the GPU, f32, NCHW, with the contracts of cpu.h's conv2d and
// maxpool2d: forward writes (=), backward overwrites dx (null: skipped) and accumulates (+=)
// into dw and db. The convolution runs through cuDNN's convolution API with FMA math (no TF32)
// and fixed deterministic algorithms: forward IMPLICIT_PRECOMP_GEMM, backward data ALGO_1,
// backward filter ALGO_1 (two runs give the same bits; not the CPU's bits, whose sums run in
// another order). The pool is tessel's own kernel pair with the CPU's tie rule, and gives the
// CPU's bits. Each thread keeps its own cuDNN handle; the caller provides the workspace. Every
// pointer is device memory; every call only queues work on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tessel/ops/cpu.h"  // Conv2dShape

namespace tessel::ops::cuda {

// The workspace bytes conv2d_forward and conv2d_backward need for shape s (the largest of the
// three algorithms'); may be 0.
size_t conv2d_workspace_bytes(const Conv2dShape& s);
// y[N,OC,OH,OW] = conv2d(x[N,C,H,W], w[OC,C,KH,KW]) + b[OC] (b may be null).
void conv2d_forward(float* y, const float* x, const float* w, const float* b, const Conv2dShape& s,
                    void* workspace, cudaStream_t stream);
// dx (null: skipped) overwritten; dw and db (null: skipped) accumulated.
void conv2d_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const Conv2dShape& s, void* workspace, cudaStream_t stream);
// The cuDNN library's version, e.g. 91900 for 9.19.0 (what the process loaded).
size_t cudnn_version();

// Max pooling without padding: y, argmax [N,C,OH,OW], OH = (H - k) / stride + 1; argmax the
// winner's index h * W + w in its plane, the first maximum in scan order, a NaN winning.
void maxpool2d_forward(float* y, int32_t* argmax, const float* x, int64_t N, int64_t C, int64_t H,
                       int64_t W, int64_t k, int64_t stride, cudaStream_t stream);
// dx[N,C,H,W] overwritten: each input sums dy over the outputs it won, in output order (a
// gather, no atomics).
void maxpool2d_backward(float* dx, const float* dy, const int32_t* argmax, int64_t N, int64_t C,
                        int64_t H, int64_t W, int64_t k, int64_t stride, cudaStream_t stream);

}  // namespace tessel::ops::cuda
