// Private to src/infer: the common request bodies of tessel serve read without building a JSON
// document. Profiled under 64 wrk connections, nlohmann::json's parse of a 784-number request
// (a document node per number, strtod) took ten times the forward pass of its row in a batch.
#pragma once

#include <cstdint>
#include <string_view>

#include "tessel/tensor/tensor.h"

namespace tessel::infer {

// The rows of a body that is exactly {"inputs": [[number, ...], ...]} (any JSON whitespace)
// with 1 to max_rows rows of shape_numel(row) numbers each, as x [rows, row...] f32: the double
// each number's text denotes, rounded to float, as nlohmann::json's get<float>() gives.
// Anything else -- another key, another shape, a string, a malformed number -- returns an
// undefined tensor, and the caller parses the body in full to say what is wrong.
Tensor read_inputs(std::string_view body, const Shape& row, int64_t max_rows);

// The same for a KServe v2 infer body that is exactly {"inputs": [{"name": "input", "shape":
// [rows, row...], "datatype": "FP32", "data": [number, ...]}]} (the tensor's keys in any order,
// data flat): x [rows, row...]. Anything else (an "id", "outputs", parameters, another datatype,
// nested data...) returns an undefined tensor, and the caller parses the body in full.
Tensor read_v2_inputs(std::string_view body, const Shape& row, int64_t max_rows);

}  // namespace tessel::infer
