#include "cudnn_handle.h"

#include "tessel/ops/cuda/check.h"

namespace tessel::ops::cuda {

void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) [[likely]]
    return;
  throw CudaError(str("cudnn: ", what, " failed: ", cudnnGetErrorString(status), " (", status,
                      "); check that the GPU machine's libcudnn is version 9 (scripts/gpu_check "
                      "prints which it loads) and the shape against include/tessel/ops/cpu.h"));
}

cudnnHandle_t cudnn_handle(cudaStream_t stream) {
  struct Handle {
    cudnnHandle_t h = nullptr;
    Handle() { check_cudnn(cudnnCreate(&h), "cudnnCreate"); }
    ~Handle() { cudnnDestroy(h); }
  };
  thread_local Handle handle;
  check_cudnn(cudnnSetStream(handle.h, stream), "cudnnSetStream");
  return handle.h;
}

}  // namespace tessel::ops::cuda
