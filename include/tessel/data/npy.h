// NumPy arrays: the .npy header (format 1.x-3.x), element conversion to f32, and the members of
// an .npz archive (a zip of .npy files, stored or deflated). Training tables (data.kind = npy)
// and predict's input reader share these, so both take any bool, int, uint or float dtype.
// Free functions, no state; each throws IoError naming the file and what to do.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace tessel::data {

// An array's element type and shape, as its header states them.
struct NpyHeader {
  char kind = 'f';  // 'f' float, 'i' signed int, 'u' unsigned int, 'b' bool
  int width = 4;    // bytes per element: f 2/4/8, i/u 1/2/4/8, b 1
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// Reads the magic, header length and header dict from `f` and leaves `f` at the first element.
// Throws IoError for a file that is not .npy or is truncated, InvalidArgument for a dtype
// tessel does not convert (big-endian, complex, strings, records, Fortran order).
NpyHeader read_npy_header(std::FILE* f, const std::string& path);

// Converts n elements of type h.kind/h.width at src (little-endian) to f32.
void npy_to_f32(float* dst, const void* src, int64_t n, const NpyHeader& h);

// A whole array read into memory, converted to f32 (row-major, shape as stored).
struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The .npy file at `path`.
NpyArray read_npy(const std::string& path);
// Member `name` (without ".npy") of the .npz archive at `path`; a missing member names those
// the archive has.
NpyArray read_npz_member(const std::string& path, const std::string& name);

}  // namespace tessel::data
