// Private to ops: the two implementations behind the conv2d kernels of cpu.h, declared here so
// that the tests can run each one on every shape.
//   - im2col + GEMM (conv.cc): any shape, any build; the portable path.
//   - direct (conv_direct_portable.cc, and conv_direct_driver.h compiled at the AVX2 and AVX-512
//     levels): no column matrix; stride 1, kernel width <= kDirectMaxKW, padding < kernel size;
//     the same bits at every level (kernels.h). Single-threaded.
// conv.cc takes the direct one wherever conv2d_direct_supported says so. Same contracts as in
// cpu.h, plus the fusions below.
#pragma once

#include <cstdint>

#include "tessel/ops/cpu.h"

namespace tessel::ops::detail {

// What follows the convolution. relu: y = max(conv + b, 0). pool_k > 0 (with relu): y is
// maxpool2d(relu(conv + b), pool_k, pool_stride) and argmax its argmax. Backward: dy and y are
// the gradient and the output of the last step (the pooled ones when pooling).
struct ConvFusion {
  bool relu = false;
  int64_t pool_k = 0, pool_stride = 0;
  bool pooled() const { return pool_k > 0; }
};

// The pooled output's size of one image (all its channels).
int64_t conv_pooled_size(const Conv2dShape& s, const ConvFusion& f);

// ---- im2col + GEMM ----
// relu_y (backward): the ReLU's output when fused, else null.
int64_t conv2d_im2col_scratch_floats(const Conv2dShape& s);
void conv2d_im2col_forward(float* y, const float* x, const float* w, const float* b,
                           const Conv2dShape& s, float* scratch);
void conv2d_im2col_backward(float* dx, float* dw, float* db, const float* dy, const float* relu_y,
                            const float* x, const float* w, const Conv2dShape& s, float* scratch);

// ---- direct ----
constexpr int64_t kDirectMaxKW = 7;
bool conv2d_direct_supported(const Conv2dShape& s);
int64_t conv2d_direct_scratch_floats(const Conv2dShape& s, const ConvFusion& f);
void conv2d_direct_forward(float* y, int32_t* argmax, const float* x, const float* w,
                           const float* b, const ConvFusion& f, const Conv2dShape& s,
                           float* scratch);
void conv2d_direct_backward(float* dx, float* dw, float* db, const float* dy, const float* y,
                            const int32_t* argmax, const ConvFusion& f, const float* x,
                            const float* w, const Conv2dShape& s, float* scratch);

// ---- shared by both ----
// One image's convolution output gradient behind a fused ReLU + max pool: dconv[OC, OH, OW] =
// what maxpool2d_backward then relu_backward make of the pooled gradient dy[OC, PH, PW] (the
// ReLU's output at a window's winner is the window's pooled output y).
void pool_relu_grad_image(float* dconv, const float* dy, const int32_t* argmax, const float* y,
                          const Conv2dShape& s, int64_t k, int64_t stride);

// ---- on a device (conv_device.cc) ----
// The fused conv2d + ReLU + max pool inside a DeviceScope, as the device's convolution, ReLU
// and pooling slots in sequence (device_kernels.h). Scratch: the device's own memory, of
// conv2d_relu_maxpool_device_floats(s, k, stride) floats.
int64_t conv2d_relu_maxpool_device_floats(const Conv2dShape& s, int64_t k, int64_t stride);
void conv2d_relu_maxpool_forward_device(float* y, int32_t* argmax, const float* x, const float* w,
                                        const float* b, const Conv2dShape& s, int64_t k,
                                        int64_t stride, float* scratch);
void conv2d_relu_maxpool_backward_device(float* dx, float* dw, float* db, const float* dy,
                                         const int32_t* argmax, const float* y, const float* x,
                                         const float* w, const Conv2dShape& s, int64_t k,
                                         int64_t stride, float* scratch);

}  // namespace tessel::ops::detail
