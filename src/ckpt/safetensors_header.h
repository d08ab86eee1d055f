// Private to ckpt: the encoding of a safetensors file's head, shared by write_safetensors (which
// holds every tensor) and the writers that stream data they never hold whole (write_shard,
// export_model). Checking names (empty, reserved, repeated) is the caller's part.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tessel/ckpt/safetensors.h"

namespace tessel::ckpt::detail {

// The head of a safetensors file holding `tensors` back to back, in this order: the 8-byte
// little-endian header length, then the JSON header padded with spaces to a multiple of 8 bytes
// (so every tensor stays 8-byte aligned in a memory-mapped file). The metadata keeps the order
// given. Throws InvalidArgument naming `path` when a string is not valid UTF-8.
std::string safetensors_header(const std::vector<TensorInfo>& tensors,
                               const std::vector<std::pair<std::string, std::string>>& metadata,
                               const std::string& path);

}  // namespace tessel::ckpt::detail
