// Error conversion for the CUDA backend: every CUDA runtime and cuBLASLt call of
// tessel_ops_cuda goes through check_cuda / check_cublas, which throw CudaError naming the call,
// the library's own error name and what to do next. check_launch follows every kernel launch
// (it reads cudaGetLastError, so a bad launch configuration is reported at its launch site).
// Errors of asynchronous work surface at the next synchronising call, like CUDA's own.
#pragma once

#include <cuda_runtime_api.h>

#include "tessel/core/error.h"

namespace tessel::ops::cuda {

// A CUDA runtime or library call failed (no device, out of memory, a bad launch, a failed
// kernel). After a kernel fault (illegal address) the CUDA context is unusable: the process
// must end; the message says so.
class CudaError : public Error {
 public:
  using Error::Error;
};

// Throws CudaError "cuda: <what> failed: <cudaErrorName> (<description>)" unless e is
// cudaSuccess.
void check_cuda(cudaError_t e, const char* what);
// check_cuda(cudaGetLastError(), kernel) after a launch.
void check_launch(const char* kernel);
// cuBLAS / cuBLASLt status codes (cublasStatus_t, an int-sized enum) likewise.
void check_cublas(int status, const char* what);

}  // namespace tessel::ops::cuda
