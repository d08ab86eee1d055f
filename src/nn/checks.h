// Checks the blocks of src/nn share.
#pragma once

#include <string>

#include "tessel/core/error.h"
#include "tessel/tensor/tensor.h"

namespace tessel::nn {

// A tensor as the blocks' messages name it: "f32 [2, 3]", or "undefined".
inline std::string described(const Tensor& t) {
  return t.defined() ? str(dtype_name(t.dtype()), " ", shape_str(t.shape())) : "undefined";
}

// Whether t holds activations of a float type (f32, bf16 or f16: train.precision).
inline bool float_typed(const Tensor& t) {
  return t.defined() &&
         (t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16);
}

// dy, the gradient a block's backward is given, must be of the block's type t and output shape.
inline void check_gradient(const Tensor& dy, const Shape& shape, DType t, const char* layer) {
  TESSEL_CHECK(dy.defined() && dy.shape() == shape && dy.dtype() == t, layer,
               ": backward gradient ", described(dy), ", expected ", dtype_name(t), " ",
               shape_str(shape));
}

}  // namespace tessel::nn
