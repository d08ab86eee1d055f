// safetensors files (https://huggingface.co/docs/safetensors): 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then
// the raw little-endian tensor bytes. Readable by Python's safetensors and by PyTorch.
// Reading validates everything (header length, JSON, dtypes, offsets inside the file, no
// overlaps, shapes matching byte counts) and throws IoError naming the file and the defect.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel::ckpt {

struct TensorFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order
  std::map<std::string, std::string> metadata;
  const Tensor* find(const std::string& name) const;  // null when absent
};

// Writes to `path` exactly (no temporary name; see checkpoint.h for safe commits) and fsyncs.
void write_safetensors(const std::string& path, const TensorFile& file);
TensorFile read_safetensors(const std::string& path);

}  // namespace tessel::ckpt
