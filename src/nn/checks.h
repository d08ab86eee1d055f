// Checks the blocks of src/nn share.
#pragma once

#include "tessel/core/error.h"
#include "tessel/tensor/tensor.h"

namespace tessel::nn {

// dy, the gradient a block's backward is given, must be of the block's type t and output shape.
inline void check_gradient(const Tensor& dy, const Shape& shape, DType t, const char* layer) {
  TESSEL_CHECK(dy.defined() && dy.shape() == shape && dy.dtype() == t, layer,
               ": backward gradient ",
               dy.defined() ? str(dtype_name(dy.dtype()), " ", shape_str(dy.shape())) : "undefined",
               ", expected ", dtype_name(t), " ", shape_str(shape));
}

}  // namespace tessel::nn
