// Input files of `tessel predict`, read front to back a chunk at a time so that a file larger
// than memory streams through:
//   IDX images (name with "ubyte" or ".idx", plain or ".gz"): u8 [N, H, W], normalised as the
//     training data is (data.mean, data.std) and shaped as the model's input;
//   NumPy ".npy" (format 1.x-3.x, C order): any bool/int/uint/float dtype [N, ...] (converted
//     to f32), each row the model's input size;
//   CSV (".csv"): a header line of column names, then rows of numbers; a model trained on a
//     CSV reads its feature columns by name (any order; its target column ignored, any other
//     column an error), any other model exactly its input size of columns in order;
//   text lines (".txt"): one prompt per line for a gpt model ("\n" or "\r\n" ends a line).
// A reader checks the header against the model before the first row and names the file, row
// and what is wrong when the data does not fit. One reader per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/data/dataset.h"
#include "tessel/infer/replica.h"
#include "tessel/tensor/tensor.h"

namespace tessel::infer {

// Rows of the input: x [count, ...] for IDX, .npy and CSV, the lines for text.
struct Rows {
  int64_t count = 0;
  Tensor x;
  std::vector<std::string> lines;
};

class InputReader {
 public:
  virtual ~InputReader() = default;
  // Up to n next rows (fewer at the end; none once the input is done).
  virtual Rows read(int64_t n) = 0;
  // Skips up to n rows; returns how many there were.
  virtual int64_t skip(int64_t n) = 0;
};

// A reader for the file at `path`, chosen by its name, checked against the model; `data` gives
// the IDX normalisation. Throws InvalidArgument for a name of no known kind or an input of the
// wrong kind for the model, IoError for an unreadable or malformed file.
std::unique_ptr<InputReader> open_input(const std::string& path, const ModelInfo& model,
                                        const data::DataSpec& data);

}  // namespace tessel::infer
