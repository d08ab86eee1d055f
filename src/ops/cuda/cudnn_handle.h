// Private to ops_cuda: cuDNN's status codes as tessel errors, and each thread's cuDNN handle
// (the convolutions of conv.cc and the fused attention of attention_cudnn.cc share it).
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

namespace tessel::ops::cuda {

// Throws CudaError "cudnn: <what> failed: <cuDNN's name> (<code>); ..." unless status is success.
void check_cudnn(cudnnStatus_t status, const char* what);
// This thread's handle (made at its first use), bound to `stream` for the call.
cudnnHandle_t cudnn_handle(cudaStream_t stream);

}  // namespace tessel::ops::cuda
