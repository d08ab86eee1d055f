// GEMMs on the GPU through cuBLASLt, and the linear layer built on them. Row-major like
// tessel::ops::gemm (cpu.h): C[M,N] = alpha * op(A) @ op(B) + beta * C, same argument order.
// Types: f32 inputs compute in f32 (CUBLAS_COMPUTE_32F: TF32 off, so results match the CPU's
// f32 GEMM to rounding); bf16 or f16 inputs compute with f32 accumulation, into a C of the
// inputs' type or f32. Blas owns the handle, the workspace and the plans (descriptors and
// algorithm) of the GEMMs it has run; it is used from one thread at a time, and work queued on
// several streams through one Blas must not overlap (one workspace).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tessel/ops/cpu.h"  // ConstMatrix, Matrix
#include "tessel/tensor/dtype.h"

struct cublasLtContext;  // cublasLtHandle_t is cublasLtContext*

namespace tessel::ops::cuda {

class Blas {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // Hopper's cuBLAS asks 32 MiB

  Blas();  // throws CudaError without a device
  ~Blas() noexcept;
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  cublasLtContext* handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  struct Plans;  // blas.cc's cache of GEMM plans
  Plans& plans() { return *plans_; }

 private:
  std::unique_ptr<Plans> plans_;
  cublasLtContext* handle_ = nullptr;
  void* workspace_ = nullptr;
};

// The cuBLASLt library's version, e.g. 130100 for 13.1.0 (what the process loaded).
size_t cublaslt_version();

// C = alpha * op(A) @ op(B) + beta * C (+ bias[N] on every row when bias is not null; bias has
// C's type). A and B of one type (f32, bf16, f16); C f32 or A's type (f32 A needs f32 C).
// beta = 0 never reads C. Throws InvalidArgument on a type mix cuBLASLt lacks, CudaError when
// cuBLASLt finds no algorithm.
void gemm(Blas& blas, cudaStream_t stream, bool trans_a, bool trans_b, int64_t M, int64_t N,
          int64_t K, float alpha, ConstMatrix A, ConstMatrix B, float beta, Matrix C,
          const void* bias = nullptr);

// A batch of `count` GEMMs of one shape, matrix b of each operand at p + b * stride (elements).
// Strides may be smaller than a matrix (the heads of an attention layer, interleaved in one
// row-major [T, NH * HS] tensor); the C matrices must not overlap.
struct GemmBatch {
  int64_t count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};
// gemm over every matrix of the batch (no bias).
void gemm_batched(Blas& blas, cudaStream_t stream, bool trans_a, bool trans_b, int64_t M, int64_t N,
                  int64_t K, float alpha, ConstMatrix A, ConstMatrix B, float beta, Matrix C,
                  const GemmBatch& batch);

// ---- Linear: y[N,OC] = x[N,C] @ w[OC,C]^T + b[OC], everything of type t (f32 or bf16) ----
// Same contract as ops::linear_forward/backward: b may be null; the backward OVERWRITES dx
// (of type t; null: skipped) and ACCUMULATES into dw[OC,C] and db[OC] (f32; db null: skipped).
void linear_forward(Blas& blas, cudaStream_t stream, void* y, const void* x, const void* w,
                    const void* b, DType t, int64_t N, int64_t C, int64_t OC);
void linear_backward(Blas& blas, cudaStream_t stream, void* dx, float* dw, float* db,
                     const void* dy, const void* x, const void* w, DType t, int64_t N, int64_t C,
                     int64_t OC);

}  // namespace tessel::ops::cuda
