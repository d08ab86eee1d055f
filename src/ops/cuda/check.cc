// The one place CUDA runtime and cuBLAS status codes become tessel errors.
#include "tessel/ops/cuda/check.h"

#include <cublas_api.h>

namespace tessel::ops::cuda {
namespace {

// What the user can do about the usual failures.
const char* advice(cudaError_t e) {
  switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return "run on a machine with an NVIDIA GPU and a driver for CUDA 13, or set "
             "runtime.device = cpu";
    case cudaErrorMemoryAllocation:
      return "lower the micro-batch or sequence length, or free other processes' GPU memory";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return "this build targets sm_90 (Hopper); rebuild with CMAKE_CUDA_ARCHITECTURES naming "
             "this GPU";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
      return "a kernel faulted and the CUDA context is lost: the process must end; run it "
             "under compute-sanitizer to find the access";
    default:
      return "see the CUDA error above";
  }
}

const char* cublas_name(int s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
      return "unknown cuBLAS status";
  }
}

}  // namespace

void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) [[likely]]
    return;
  throw CudaError(str("cuda: ", what, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
                      "); ", advice(e)));
}

void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

void check_cublas(int status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) [[likely]]
    return;
  throw CudaError(str("cublas: ", what, " failed: ", cublas_name(status), " (", status,
                      "); check the shapes, types and leading dimensions against "
                      "include/tessel/ops/cuda/blas.h"));
}

}  // namespace tessel::ops::cuda
