// IDX datasets (the MNIST file format) for kinds fashion_mnist and mnist_idx.
//
// An IDX file is a big-endian header - magic 0x000008NN (0x08 = u8 elements, NN = number of
// dimensions), then NN u32 dimensions - followed by the elements. A folder holds four files
// (train/t10k images idx3, labels idx1), each plain or gzip-compressed (".gz" preferred).
// Every file is read whole into memory and validated (magic, sizes against the header, trailing
// bytes, gzip integrity, image/label counts) before a Dataset is built; the class count is the
// largest label + 1 over both splits (or data.classes, checked against them); pixels stay
// u8 (60000 x 784 bytes for Fashion-MNIST) and are normalised per sample in get().
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

#include "datasets_internal.h"

namespace tessel::data::detail {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kImagesMagic = 0x00000803;  // u8, 3 dimensions: count, rows, cols
constexpr uint32_t kLabelsMagic = 0x00000801;  // u8, 1 dimension: count
// Larger than any IDX image set in use; a header claiming more is corrupt, and capping reads
// keeps a corrupt gzip stream from exhausting memory.
constexpr size_t kMaxFileBytes = size_t{1} << 32;

// The one place zlib's gzip status becomes an IoError.
[[noreturn]] void throw_gz_error(gzFile gz, const std::string& path, const char* what) {
  int errnum = Z_OK;
  const char* msg = gz != nullptr ? gzerror(gz, &errnum) : "cannot open";
  if (errnum == Z_ERRNO) msg = std::strerror(errno);
  throw IoError(str("data: ", what, " ", path, ", got zlib error \"", msg ? msg : "?",
                    "\"; the file is truncated or corrupt, download it again"));
}

std::vector<uint8_t> read_gz(const std::string& path) {
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) throw_gz_error(nullptr, path, "cannot open");
  std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(gz, gzclose);
  gzbuffer(gz, 1 << 20);  // fewer read() calls; makes 26 MB of gz a ~0.1 s job
  std::error_code ec;
  uintmax_t compressed = fs::file_size(path, ec);
  size_t cap = ec ? (size_t{1} << 20) : std::max<size_t>(1 << 16, 4 * compressed);
  std::vector<uint8_t> bytes(std::min(cap, kMaxFileBytes));
  size_t have = 0;
  for (;;) {
    if (have == bytes.size()) {
      if (bytes.size() >= kMaxFileBytes)
        throw IoError(str("data: ", path, " decompresses to more than ", kMaxFileBytes,
                          " bytes; the file is corrupt or not an IDX file"));
      bytes.resize(std::min(bytes.size() * 2, kMaxFileBytes));
    }
    unsigned want = static_cast<unsigned>(std::min<size_t>(bytes.size() - have, 1u << 30));
    int got = gzread(gz, bytes.data() + have, want);
    if (got < 0) throw_gz_error(gz, path, "cannot decompress");
    if (got == 0) break;
    have += static_cast<size_t>(got);
  }
  // gzread reports a stream cut short as Z_BUF_ERROR with a short (not negative) count.
  int errnum = Z_OK;
  gzerror(gz, &errnum);
  if (errnum != Z_OK) throw_gz_error(gz, path, "cannot decompress");
  // zlib reads a non-gzip file through unchanged; a ".gz" name promises compression.
  if (gzdirect(gz))
    throw IoError(str("data: ", path,
                      " is not a gzip file, got first bytes that are no gzip header; "
                      "replace it with the original .gz download or remove the .gz name"));
  bytes.resize(have);
  return bytes;
}

std::vector<uint8_t> read_plain(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) throw IoError(str("data: cannot open ", path, ", got \"", std::strerror(errno), "\""));
  std::error_code ec;
  uintmax_t size = fs::file_size(path, ec);
  if (ec) throw IoError(str("data: cannot stat ", path, ", got \"", ec.message(), "\""));
  if (size > kMaxFileBytes)
    throw IoError(
        str("data: ", path, " has ", size, " bytes, more than any IDX file; check data.path"));
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f.get());
  if (got != bytes.size())
    throw IoError(str("data: cannot read ", path, ", got ", got, " of ", bytes.size(), " bytes"));
  return bytes;
}

// A validated IDX array: `bytes` is the whole file, elements start at `offset`.
struct IdxArray {
  std::vector<uint8_t> bytes;
  size_t offset = 0;
  std::vector<int64_t> dims;
};

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

IdxArray parse_idx(std::vector<uint8_t> bytes, const std::string& path, uint32_t magic) {
  const int ndim = static_cast<int>(magic & 0xff);
  const char* kind = magic == kImagesMagic ? "images" : "labels";
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  uint32_t got_magic = bytes.size() >= 4 ? load_be32(bytes.data()) : magic;
  if (got_magic != magic) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "0x%08x, expected 0x%08x", got_magic, magic);
    throw IoError(str("data: ", path, " has a bad IDX magic number, got ", buf, " (IDX u8 ", kind,
                      "); the file is not an IDX ", kind, " file or is corrupt"));
  }
  if (bytes.size() < header)
    throw IoError(str("data: ", path, " is too short for an IDX ", kind, " header, got ",
                      bytes.size(), " bytes, need ", header, "; the file is truncated"));
  IdxArray a;
  uint64_t elements = 1;
  for (int i = 0; i < ndim; ++i) {
    uint32_t d = load_be32(bytes.data() + 4 + 4 * i);
    a.dims.push_back(d);
    // Each factor < 2^32 and the running product capped below 2^32, so no overflow.
    elements = std::min<uint64_t>(elements * d, kMaxFileBytes);
  }
  uint64_t have = bytes.size() - header;
  if (have < elements)
    throw IoError(str("data: ", path, " is truncated, got ", have, " data bytes, the header says ",
                      elements, "; download the file again"));
  if (have > elements)
    throw IoError(str("data: ", path, " has ", have - elements, " bytes after the ", elements,
                      " its header declares; the file is corrupt or not an IDX ", kind, " file"));
  a.bytes = std::move(bytes);
  a.offset = header;
  return a;
}

// Finds `dir/name.gz`, else `dir/name`, and reads it; a missing file says how to get it.
IdxArray load_idx(const DataSpec& spec, const std::string& name, uint32_t magic) {
  fs::path dir(spec.path);
  std::string gz = (dir / (name + ".gz")).string(), plain = (dir / name).string();
  std::error_code ec;
  if (fs::is_regular_file(gz, ec)) return parse_idx(read_gz(gz), gz, magic);
  if (fs::is_regular_file(plain, ec)) return parse_idx(read_plain(plain), plain, magic);
  std::string fix = spec.path == DataSpec{}.path
                        ? "install Fashion-MNIST with `apt-get install dataset-fashion-mnist` or "
                          "`make setup`"
                        : "set data.path to the folder holding the IDX files";
  throw IoError(str("data: missing IDX file, got neither ", gz, " nor ", plain, "; ", fix));
}

// One split's two files, checked against each other.
// A pixel byte p becomes (p - mean) / std with mean = 255 data.mean, std = 255 data.std: the same
// value as (p / 255 - data.mean) / data.std, in the form inference applies to raw rows (the
// model_io map), so the training rows and a served raw image go through the same arithmetic.
std::pair<float, float> pixel_map(const DataSpec& spec) {
  return {255.0f * spec.mean, 255.0f * spec.std};
}

struct IdxSplit {
  IdxArray images;
  IdxArray labels;
  int64_t largest_label() const {
    const uint8_t* first = labels.bytes.data() + labels.offset;
    return *std::max_element(first, first + labels.dims[0]);
  }
};

class IdxDataset final : public Dataset {
 public:
  IdxDataset(std::string name, IdxSplit split, int64_t classes, const DataSpec& spec)
      : name_(std::move(name)),
        images_(std::move(split.images)),
        labels_(std::move(split.labels)),
        flatten_(spec.flatten),
        classes_(classes) {
    const auto [mean, std] = pixel_map(spec);
    for (int p = 0; p < 256; ++p) lut_[p] = (static_cast<float>(p) - mean) / std;
  }
  std::string name() const override { return name_; }
  int64_t size() const override { return images_.dims[0]; }
  Shape input_shape() const override {
    int64_t rows = images_.dims[1], cols = images_.dims[2];
    return flatten_ ? Shape{rows * cols} : Shape{1, rows, cols};
  }
  DType input_dtype() const override { return DType::kF32; }
  Shape label_shape() const override { return {}; }
  int64_t num_classes() const override { return classes_; }

  void get(int64_t index, void* x, int32_t* y) const override {
    TESSEL_CHECK(index >= 0 && index < size(), "dataset ", name_, ": index ", index,
                 " outside [0, ", size(), ")");
    const size_t pixels = static_cast<size_t>(images_.dims[1] * images_.dims[2]);
    const uint8_t* src =
        images_.bytes.data() + images_.offset + static_cast<size_t>(index) * pixels;
    float* dst = static_cast<float*>(x);
    for (size_t i = 0; i < pixels; ++i) dst[i] = lut_[src[i]];
    *y = labels_.bytes[labels_.offset + static_cast<size_t>(index)];
  }
  void prefetch(int64_t index) const override {
    if (index < 0 || index >= size()) return;
    const size_t pixels = static_cast<size_t>(images_.dims[1] * images_.dims[2]);
    const uint8_t* src =
        images_.bytes.data() + images_.offset + static_cast<size_t>(index) * pixels;
    for (size_t i = 0; i < pixels; i += 64) __builtin_prefetch(src + i);
    __builtin_prefetch(src + pixels - 1);
  }

 private:
  std::string name_;
  IdxArray images_;
  IdxArray labels_;
  bool flatten_;
  int64_t classes_;
  std::array<float, 256> lut_;  // normalised value of each pixel byte
};

IdxSplit load_split(const DataSpec& spec, const std::string& prefix) {
  IdxArray images = load_idx(spec, prefix + "-images-idx3-ubyte", kImagesMagic);
  IdxArray labels = load_idx(spec, prefix + "-labels-idx1-ubyte", kLabelsMagic);
  std::string where = (fs::path(spec.path) / (prefix + "-*")).string();
  if (images.dims[0] != labels.dims[0])
    throw IoError(str("data: ", where, " image and label counts differ, got ", images.dims[0],
                      " images and ", labels.dims[0],
                      " labels; the files come from different datasets or one is corrupt"));
  if (images.dims[0] == 0 || images.dims[1] == 0 || images.dims[2] == 0)
    throw IoError(str("data: ", where, " holds no pixels, got ", images.dims[0], " images of ",
                      images.dims[1], "x", images.dims[2], "; check data.path"));
  return {std::move(images), std::move(labels)};
}

}  // namespace

Splits make_idx_splits(const DataSpec& spec) {
  if (!(std::isfinite(spec.mean) && std::isfinite(spec.std) && spec.std > 0))
    throw InvalidArgument(str("data: mean and std must be finite with std > 0, got mean ",
                              spec.mean, ", std ", spec.std, "; set data.mean and data.std"));
  Splits s;
  IdxSplit train = load_split(spec, "train"), test = load_split(spec, "t10k");
  const int64_t classes = resolve_classes(std::max(train.largest_label(), test.largest_label()),
                                          spec.classes, spec.path);
  const size_t pixels = static_cast<size_t>(train.images.dims[1] * train.images.dims[2]);
  const auto [mean, std] = pixel_map(spec);
  s.input_mean.assign(pixels, mean);  // stored in checkpoints: serve and predict take raw pixels
  s.input_std.assign(pixels, std);
  s.train = std::make_shared<IdxDataset>(name_of(spec.kind), std::move(train), classes, spec);
  s.test = std::make_shared<IdxDataset>(name_of(spec.kind), std::move(test), classes, spec);
  if (s.train->input_shape() != s.test->input_shape())
    throw IoError(str("data: ", spec.path, " train and test images differ in size, got ",
                      shape_str(s.train->input_shape()), " and ", shape_str(s.test->input_shape()),
                      "; the files come from different datasets"));
  return s;
}

}  // namespace tessel::data::detail
