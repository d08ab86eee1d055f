// Convolution through cuDNN's convolution API. Descriptors are made per call (microseconds,
// like blas.cc's); the algorithms are fixed, not searched, so that the choice (and the bits)
// never depends on timing: IMPLICIT_PRECOMP_GEMM forward, ALGO_1 for both backwards, all three
// deterministic, with CUDNN_FMA_MATH (f32 FMAs, no TF32 tensor-core math).
#include "tessel/ops/cuda/conv.h"

#include <algorithm>

#include "cudnn_handle.h"

namespace tessel::ops::cuda {
namespace {

constexpr cudnnConvolutionFwdAlgo_t kForward = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
constexpr cudnnConvolutionBwdDataAlgo_t kBackwardData = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
constexpr cudnnConvolutionBwdFilterAlgo_t kBackwardFilter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;

int as_int(int64_t v) { return static_cast<int>(v); }

// The descriptors of one shape: x, y and the bias as NCHW f32 tensors, w as a KCRS filter.
struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

  explicit Descriptors(const Conv2dShape& s) {
    const cudnnTensorFormat_t nchw = CUDNN_TENSOR_NCHW;
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    check_cudnn(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateTensorDescriptor(&bias), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
    check_cudnn(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
    check_cudnn(cudnnSetTensor4dDescriptor(x, nchw, f32, as_int(s.N), as_int(s.C), as_int(s.H),
                                           as_int(s.W)),
                "cudnnSetTensor4dDescriptor(x)");
    check_cudnn(cudnnSetTensor4dDescriptor(y, nchw, f32, as_int(s.N), as_int(s.OC), as_int(s.OH()),
                                           as_int(s.OW())),
                "cudnnSetTensor4dDescriptor(y)");
    check_cudnn(cudnnSetTensor4dDescriptor(bias, nchw, f32, 1, as_int(s.OC), 1, 1),
                "cudnnSetTensor4dDescriptor(bias)");
    check_cudnn(cudnnSetFilter4dDescriptor(w, f32, nchw, as_int(s.OC), as_int(s.C), as_int(s.KH),
                                           as_int(s.KW)),
                "cudnnSetFilter4dDescriptor");
    check_cudnn(
        cudnnSetConvolution2dDescriptor(conv, as_int(s.pad), as_int(s.pad), as_int(s.stride),
                                        as_int(s.stride), 1, 1, CUDNN_CROSS_CORRELATION, f32),
        "cudnnSetConvolution2dDescriptor");
    check_cudnn(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH), "cudnnSetConvolutionMathType");
  }
  ~Descriptors() {
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyTensorDescriptor(bias);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyTensorDescriptor(x);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
};

size_t workspace_bytes(cudnnHandle_t h, const Descriptors& d) {
  size_t fwd = 0, data = 0, filter = 0;
  check_cudnn(cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, kForward, &fwd),
              "cudnnGetConvolutionForwardWorkspaceSize");
  check_cudnn(
      cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, kBackwardData, &data),
      "cudnnGetConvolutionBackwardDataWorkspaceSize");
  check_cudnn(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w,
                                                             kBackwardFilter, &filter),
              "cudnnGetConvolutionBackwardFilterWorkspaceSize");
  return std::max({fwd, data, filter});
}

}  // namespace

size_t conv2d_workspace_bytes(const Conv2dShape& s) {
  const Descriptors d(s);
  return workspace_bytes(cudnn_handle(nullptr), d);
}

void conv2d_forward(float* y, const float* x, const float* w, const float* b, const Conv2dShape& s,
                    void* workspace, cudaStream_t stream) {
  const cudnnHandle_t h = cudnn_handle(stream);
  const Descriptors d(s);
  const float one = 1.0f, zero = 0.0f;
  check_cudnn(cudnnConvolutionForward(h, &one, d.x, x, d.w, w, d.conv, kForward, workspace,
                                      workspace_bytes(h, d), &zero, d.y, y),
              "cudnnConvolutionForward");
  if (b != nullptr)
    check_cudnn(cudnnAddTensor(h, &one, d.bias, b, &one, d.y, y), "cudnnAddTensor(bias)");
}

void conv2d_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const Conv2dShape& s, void* workspace, cudaStream_t stream) {
  const cudnnHandle_t h = cudnn_handle(stream);
  const Descriptors d(s);
  const size_t bytes = workspace_bytes(h, d);
  const float one = 1.0f, zero = 0.0f;
  if (db != nullptr)
    check_cudnn(cudnnConvolutionBackwardBias(h, &one, d.y, dy, &one, d.bias, db),
                "cudnnConvolutionBackwardBias");
  if (dw != nullptr)
    check_cudnn(cudnnConvolutionBackwardFilter(h, &one, d.x, x, d.y, dy, d.conv, kBackwardFilter,
                                               workspace, bytes, &one, d.w, dw),
                "cudnnConvolutionBackwardFilter");
  if (dx != nullptr)
    check_cudnn(cudnnConvolutionBackwardData(h, &one, d.w, w, d.y, dy, d.conv, kBackwardData,
                                             workspace, bytes, &zero, d.x, dx),
                "cudnnConvolutionBackwardData");
}

size_t cudnn_version() { return cudnnGetVersion(); }

}  // namespace tessel::ops::cuda
