// The four predict input readers. Each holds one open file and its position; IDX goes through
// zlib (which reads a plain file as it is), .npy, CSV and text through stdio.
#include "tessel/infer/input.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "tessel/data/csv.h"
#include "tessel/data/npy.h"

namespace tessel::infer {
namespace {

using File = std::unique_ptr<FILE, int (*)(FILE*)>;

File open_file(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f)
    throw IoError(str("predict: cannot open input ", path, ", got \"", std::strerror(errno),
                      "\"; check --input"));
  return f;
}

// `count` rows of shape `row` in a fresh tensor [count, row...], to be filled.
Rows dense_rows(int64_t count, Shape row) {
  Rows r;
  r.count = count;
  row.insert(row.begin(), count);
  r.x = Tensor::empty(row);
  return r;
}

// IDX u8 images [N, H, W]: rows through a lookup table, shaped as the model's input.
class IdxReader final : public InputReader {
 public:
  IdxReader(const std::string& path, const ModelInfo& model, const data::DataSpec& data)
      : path_(path), gz_(gzopen(path.c_str(), "rb"), gzclose), shape_(model.spec.input_shape) {
    if (!gz_) throw IoError(str("predict: cannot open input ", path, "; check --input"));
    gzbuffer(gz_.get(), 1 << 20);
    uint8_t h[16];
    if (gzread(gz_.get(), h, sizeof h) != static_cast<int>(sizeof h))
      throw IoError(str("predict: ", path,
                        " is too short for an IDX images header, got under 16 "
                        "bytes; the file is truncated or not IDX"));
    auto be32 = [&h](int i) {
      return (uint32_t{h[i]} << 24) | (uint32_t{h[i + 1]} << 16) | (uint32_t{h[i + 2]} << 8) |
             uint32_t{h[i + 3]};
    };
    if (be32(0) != 0x00000803)
      throw IoError(str("predict: ", path, " is not an IDX u8 image file, got magic 0x", std::hex,
                        be32(0), std::dec, ", expected 0x00000803 (idx3-ubyte)"));
    total_ = be32(4);
    pixels_ = int64_t{be32(8)} * be32(12);
    if (pixels_ != shape_numel(shape_))
      throw InvalidArgument(str("predict: ", path, " holds ", be32(8), "x", be32(12),
                                " images, got ", pixels_, " pixels per row but the model takes ",
                                shape_str(shape_), "; use images of the training size"));
    // A checkpoint with its input map (model_io) normalises in the replica, as for any raw row;
    // one from before normalises here with the config's data.mean and data.std.
    for (int p = 0; p < 256; ++p)
      lut_[p] = model.input_mean.empty() ? (static_cast<float>(p) / 255.0f - data.mean) / data.std
                                         : static_cast<float>(p);
  }

  // The bytes land in the last quarter of the rows' own f32 buffer and are widened in place,
  // front to back: float i (bytes 4i..4i+3) never reaches a byte not yet widened (3n+i+1 on).
  Rows read(int64_t n) override {
    Rows r = dense_rows(std::min(n, total_ - done_), shape_);
    const size_t count = static_cast<size_t>(r.count * pixels_);
    float* dst = r.x.data<float>();
    uint8_t* bytes = reinterpret_cast<uint8_t*>(dst) + 3 * count;
    read_bytes(bytes, count);
    for (size_t i = 0; i < count; ++i) dst[i] = lut_[bytes[i]];
    done_ += r.count;
    return r;
  }

  int64_t skip(int64_t n) override {
    const int64_t k = std::min(n, total_ - done_);
    if (gzseek(gz_.get(), static_cast<z_off_t>(k * pixels_), SEEK_CUR) < 0)
      throw IoError(str("predict: cannot skip in ", path_, "; the file is truncated or corrupt"));
    done_ += k;
    return k;
  }

 private:
  void read_bytes(uint8_t* dst, size_t n) {
    size_t have = 0;
    while (have < n) {
      const int got = gzread(gz_.get(), dst + have,
                             static_cast<unsigned>(std::min<size_t>(n - have, 1u << 30)));
      if (got <= 0)
        throw IoError(str("predict: ", path_, " ends inside row ",
                          done_ + static_cast<int64_t>(have) / pixels_, " of the ", total_,
                          " its header declares; the file is truncated"));
      have += static_cast<size_t>(got);
    }
  }

  std::string path_;
  std::unique_ptr<gzFile_s, int (*)(gzFile)> gz_;
  Shape shape_;
  int64_t total_ = 0, pixels_ = 0, done_ = 0;
  std::array<float, 256> lut_{};
};

// NumPy .npy of any bool, int, uint or float dtype in C order, converted to f32 row by row.
class NpyReader final : public InputReader {
 public:
  NpyReader(const std::string& path, const ModelInfo& model)
      : path_(path), f_(open_file(path)), shape_(model.spec.input_shape) {
    header_ = data::read_npy_header(f_.get(), path);
    const std::vector<int64_t>& dims = header_.shape;
    int64_t row = 1;
    for (size_t i = 1; i < dims.size(); ++i) row *= dims[i];
    if (dims.empty() || row != shape_numel(shape_))
      throw InvalidArgument(str("predict: ", path, " has shape ", shape_str(dims), ", got ", row,
                                " values per row but the model takes ", shape_str(shape_), " (",
                                shape_numel(shape_), "); save an array [N, ...] of such rows"));
    total_ = dims[0];
    row_ = row;
  }

  Rows read(int64_t n) override {
    Rows r = dense_rows(std::min(n, total_ - done_), shape_);
    const size_t want = static_cast<size_t>(r.count * row_);
    // Elements up to 8 bytes wide: read into a buffer, then widen into the rows.
    buffer_.resize(want * static_cast<size_t>(header_.width));
    if (std::fread(buffer_.data(), static_cast<size_t>(header_.width), want, f_.get()) != want)
      throw IoError(str("predict: ", path_, " ends before row ", done_ + r.count, " of the ",
                        total_, " its header declares; the file is truncated"));
    data::npy_to_f32(r.x.data<float>(), buffer_.data(), static_cast<int64_t>(want), header_);
    done_ += r.count;
    return r;
  }

  int64_t skip(int64_t n) override {
    const int64_t k = std::min(n, total_ - done_);
    if (std::fseek(f_.get(), static_cast<long>(k * row_ * header_.width), SEEK_CUR) != 0)
      throw IoError(str("predict: cannot skip in ", path_, ", got \"", std::strerror(errno), "\""));
    done_ += k;
    return k;
  }

 private:
  std::string path_;
  File f_;
  Shape shape_;
  data::NpyHeader header_;
  std::vector<uint8_t> buffer_;
  int64_t total_ = 0, row_ = 0, done_ = 0;
};

// A file's lines, front to back ("\n" or "\r\n" ends a line).
class Lines {
 public:
  explicit Lines(const std::string& path) : path_(path), f_(open_file(path)) {}
  ~Lines() { std::free(line_); }
  Lines(const Lines&) = delete;
  Lines& operator=(const Lines&) = delete;

  // The next line into `out`; false at the end of the file.
  bool next(std::string& out) {
    errno = 0;
    const ssize_t got = getline(&line_, &cap_, f_.get());
    if (got < 0) {
      if (errno != 0)
        throw IoError(str("predict: cannot read ", path_, ", got \"", std::strerror(errno), "\""));
      return false;
    }
    size_t n = static_cast<size_t>(got);
    if (n > 0 && line_[n - 1] == '\n') --n;
    if (n > 0 && line_[n - 1] == '\r') --n;
    out.assign(line_, n);
    ++number_;
    return true;
  }
  // The next line that is not blank; false at the end of the file.
  bool next_filled(std::string& out) {
    while (next(out))
      if (out.find_first_not_of(" \t") != std::string::npos) return true;
    return false;
  }
  // Skips up to n lines (`filled`: n lines that are not blank); returns how many it skipped.
  int64_t skip(int64_t n, bool filled) {
    int64_t k = 0;
    std::string line;
    while (k < n && (filled ? next_filled(line) : next(line))) ++k;
    return k;
  }
  int64_t number() const { return number_; }  // of the last line read, from 1

 private:
  std::string path_;
  File f_;
  char* line_ = nullptr;
  size_t cap_ = 0;
  int64_t number_ = 0;
};

// One prompt per line.
class TextReader final : public InputReader {
 public:
  explicit TextReader(const std::string& path) : lines_(path) {}

  Rows read(int64_t n) override {
    Rows r;
    std::string line;
    while (r.count < n && lines_.next(line)) {
      r.lines.push_back(line);
      ++r.count;
    }
    return r;
  }

  int64_t skip(int64_t n) override { return lines_.skip(n, false); }

 private:
  Lines lines_;
};

std::string bracketed(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return "[" + out + "]";
}

// For each model input, its column in a CSV header: by name for a CSV-trained model (its
// target columns may be there and are ignored, any other column is an error), else the
// header's columns in order, exactly as many as the model's inputs.
std::vector<size_t> csv_columns(const std::vector<std::string>& header, const ModelInfo& model,
                                const std::string& path) {
  const size_t features = static_cast<size_t>(shape_numel(model.spec.input_shape));
  std::vector<size_t> columns;
  if (model.input_names.empty()) {
    if (header.size() != features)
      throw InvalidArgument(str("predict: ", path, " has ", header.size(), " columns ",
                                bracketed(header), ", but the model takes ", features,
                                " values per row and was not trained on a CSV (its columns have "
                                "no names); give ",
                                features, " feature columns in training order"));
    for (size_t c = 0; c < features; ++c) columns.push_back(c);
    return columns;
  }
  std::vector<std::string> missing, extra;
  for (const std::string& name : model.input_names) {
    const auto at = std::find(header.begin(), header.end(), name);
    if (at == header.end()) missing.push_back(name);
    columns.push_back(static_cast<size_t>(at - header.begin()));
  }
  for (size_t c = 0; c < header.size(); ++c) {
    const std::string& name = header[c];
    const bool known = std::count(model.input_names.begin(), model.input_names.end(), name) ||
                       std::count(model.target_names.begin(), model.target_names.end(), name);
    if (!known || std::find(header.begin(), header.end(), name) != header.begin() + c)
      extra.push_back(name);
  }
  if (!missing.empty() || !extra.empty())
    throw InvalidArgument(
        str("predict: ", path, "'s header ", bracketed(header),
            missing.empty() ? "" : str(" lacks the feature columns ", bracketed(missing)),
            !missing.empty() && !extra.empty() ? " and" : "",
            extra.empty()
                ? ""
                : str(" has columns the model was not trained on (or repeated) ", bracketed(extra)),
            "; the model reads the columns ", bracketed(model.input_names),
            model.target_names.empty()
                ? ""
                : str(" (target ", bracketed(model.target_names), ", ignored if present)"),
            " by name, in any order"));
  return columns;
}

// A CSV table with a header line, rows of numbers, blank lines skipped; the columns of
// csv_columns() in the model's input order, each converted to f32.
class CsvReader final : public InputReader {
 public:
  CsvReader(const std::string& path, const ModelInfo& model)
      : path_(path), lines_(path), shape_(model.spec.input_shape) {
    std::string line;
    if (!lines_.next_filled(line))
      throw IoError(str("predict: ", path,
                        " is empty, got no header line; a CSV input starts with a line of "
                        "column names"));
    header_ = data::csv_fields(line);
    columns_ = csv_columns(header_, model, path);
  }

  Rows read(int64_t n) override {
    std::vector<float> values;
    std::string line;
    int64_t count = 0;
    while (count < n && lines_.next_filled(line)) {
      const std::vector<std::string> fields = data::csv_fields(line);
      if (fields.size() != header_.size())
        throw IoError(str("predict: ", path_, " line ", lines_.number(), " has ", fields.size(),
                          " fields, but the header has ", header_.size(),
                          "; give every row one value per column"));
      for (size_t c : columns_) {
        const std::optional<double> v = data::csv_number(fields[c]);
        if (!v)
          throw IoError(str("predict: ", path_, " line ", lines_.number(), " column '", header_[c],
                            "' is not a number, got \"", fields[c],
                            "\"; every feature cell must be numeric"));
        values.push_back(static_cast<float>(*v));
      }
      ++count;
    }
    Rows r = dense_rows(count, shape_);
    std::copy(values.begin(), values.end(), r.x.data<float>());
    return r;
  }

  int64_t skip(int64_t n) override { return lines_.skip(n, true); }

 private:
  std::string path_;
  Lines lines_;
  Shape shape_;
  std::vector<std::string> header_;
  std::vector<size_t> columns_;  // per model input, its column
};

}  // namespace

std::unique_ptr<InputReader> open_input(const std::string& path, const ModelInfo& model,
                                        const data::DataSpec& data) {
  const std::string name = std::filesystem::path(path).filename().string();
  const bool text = name.ends_with(".txt");
  if (!std::filesystem::is_regular_file(path))
    throw IoError(str("predict: input ", path, " is not a readable file; check --input"));
  if (model.generates() != text)
    throw InvalidArgument(model.generates()
                              ? str("predict: a gpt model takes text prompts, one per line, in a "
                                    ".txt file, got --input ",
                                    path)
                              : str("predict: a ", name_of(model.spec.kind),
                                    " model takes IDX images, a .npy array or a .csv table, got "
                                    "--input ",
                                    path, "; text prompts (.txt) are for a gpt model"));
  if (text) return std::make_unique<TextReader>(path);
  if (name.ends_with(".npy")) return std::make_unique<NpyReader>(path, model);
  if (name.ends_with(".csv")) return std::make_unique<CsvReader>(path, model);
  if (name.find("ubyte") != std::string::npos || name.ends_with(".idx") ||
      name.ends_with(".idx.gz"))
    return std::make_unique<IdxReader>(path, model, data);
  throw InvalidArgument(
      str("predict: cannot tell the kind of --input ", path,
          " from its name; use .npy, .csv, an IDX name (*-ubyte[.gz], *.idx[.gz]) "
          "or .txt"));
}

}  // namespace tessel::infer
