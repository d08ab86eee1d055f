// The fused conv2d + ReLU + max pool on a device. A device has no fused kernel: its convolution
// writes the whole [N,OC,OH,OW] output into scratch, the ReLU runs in place there and the pool
// reads it. The CPU's fused kernels give the same bits as these steps in sequence (cpu.h), and
// the backward's order is theirs: the pooled gradient masked where the pooled output is not
// positive (the ReLU's mask at each window's winner), scattered to the winners, then the
// convolution's backward.
//
// Scratch: conv[N*OC*OH*OW] (the forward's output, the backward's dconv), then masked[N*OC*PH*PW]
// (the backward's masked pooled gradient).
#include "conv_impl.h"
#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"

namespace tessel::ops::detail {
namespace {

int64_t conv_floats(const Conv2dShape& s) { return s.N * s.OC * s.OH() * s.OW(); }

int64_t pooled_floats(const Conv2dShape& s, int64_t k, int64_t stride) {
  return s.N * conv_pooled_size(s, ConvFusion{true, k, stride});
}

}  // namespace

int64_t conv2d_relu_maxpool_device_floats(const Conv2dShape& s, int64_t k, int64_t stride) {
  return conv_floats(s) + pooled_floats(s, k, stride);
}

void conv2d_relu_maxpool_forward_device(float* y, int32_t* argmax, const float* x, const float* w,
                                        const float* b, const Conv2dShape& s, int64_t k,
                                        int64_t stride, float* scratch) {
  const char* op = "conv2d_relu_maxpool_forward";
  void* stream = current_stream();
  float* conv = scratch;
  device_kernel(&DeviceKernels::conv2d_forward, op)(conv, x, w, b, s, stream);
  device_kernel(&DeviceKernels::relu_forward, op)(conv, conv, conv_floats(s), DType::kF32, stream);
  device_kernel(&DeviceKernels::maxpool2d_forward, op)(y, argmax, conv, s.N, s.OC, s.OH(), s.OW(),
                                                       k, stride, stream);
}

void conv2d_relu_maxpool_backward_device(float* dx, float* dw, float* db, const float* dy,
                                         const int32_t* argmax, const float* y, const float* x,
                                         const float* w, const Conv2dShape& s, int64_t k,
                                         int64_t stride, float* scratch) {
  const char* op = "conv2d_relu_maxpool_backward";
  void* stream = current_stream();
  float* dconv = scratch;
  float* masked = scratch + conv_floats(s);
  device_kernel(&DeviceKernels::relu_backward, op)(masked, dy, y, pooled_floats(s, k, stride),
                                                   DType::kF32, stream);
  device_kernel(&DeviceKernels::maxpool2d_backward, op)(dconv, masked, argmax, s.N, s.OC, s.OH(),
                                                        s.OW(), k, stride, stream);
  device_kernel(&DeviceKernels::conv2d_backward, op)(dx, dw, db, dconv, x, w, s, stream);
}

}  // namespace tessel::ops::detail
