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

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
};

// A safetensors file opened for reading parts of it: the constructor validates the header and
// the data layout as read_safetensors does, without reading tensor data; read() then reads any
// element range of a tensor with pread. Keeps the file open; read() may be called from
// several threads at once.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t file_bytes() const { return file_bytes_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;  // null when absent
  // Elements [first, first + count) of the flattened tensor `name` into dst (count elements
  // of its dtype). Throws IoError for a name it lacks or a range outside the tensor.
  void read(const std::string& name, int64_t first, int64_t count, void* dst) const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t file_bytes_ = 0;
  int64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::vector<int64_t> offsets_;  // byte offset of each tensor in the data section
  std::map<std::string, std::string> metadata_;
};

}  // namespace tessel::ckpt
