// safetensors reader and writer. The reader trusts nothing in the file: every length, offset
// and shape is checked against the file size before a byte of tensor data is allocated, and
// the data section must be covered exactly (no overlaps, no holes, no trailing bytes), which is
// what the reference Rust implementation enforces too. SafetensorsReader does all of that
// checking; read_safetensors is SafetensorsReader reading every tensor whole.
#include "tessel/ckpt/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "posix_io.h"
#include "safetensors_header.h"

namespace tessel::ckpt {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; a big-endian host needs byte swapping");

using Json = nlohmann::ordered_json;  // keeps the tensors in the order they were given
using detail::Fd;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypes[] = {{DType::kF32, "F32"}, {DType::kF16, "F16"}, {DType::kBF16, "BF16"},
                                 {DType::kI32, "I32"}, {DType::kI64, "I64"}, {DType::kU8, "U8"}};

const char* st_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  throw InvalidArgument(str("checkpoint: dtype ", dtype_name(t), " has no safetensors name"));
}

bool st_dtype(const std::string& name, DType* out) {
  for (const auto& d : kDTypes)
    if (name == d.name) {
      *out = d.dtype;
      return true;
    }
  return false;
}

[[noreturn]] void corrupt(const std::string& path, const std::string& defect) {
  throw IoError(
      str("checkpoint: ", path, ": ", defect, "; the file is corrupt or not a safetensors file"));
}

bool as_u64(const Json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

Entry parse_entry(const std::string& path, const std::string& name, const Json& v,
                  uint64_t data_bytes) {
  const std::string who = "tensor '" + name + "'";
  if (!v.is_object()) corrupt(path, who + " is not a JSON object");
  Entry e{name, DType::kF32, {}, 0, 0};
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) corrupt(path, who + " has no string \"dtype\"");
  if (!st_dtype(dt->get<std::string>(), &e.dtype))
    corrupt(path, str(who, " has unsupported dtype '", dt->get<std::string>(),
                      "' (tessel reads F32, F16, BF16, I32, I64, U8)"));
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) corrupt(path, who + " has no \"shape\" array");
  uint64_t numel = 1;
  for (const Json& d : *sh) {
    uint64_t n = 0;
    if (!as_u64(d, &n) || n > (1ull << 62) || __builtin_mul_overflow(numel, n, &numel))
      corrupt(path, str(who, " has an invalid shape ", sh->dump()));
    e.shape.push_back(static_cast<int64_t>(n));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !as_u64((*off)[0], &e.begin) ||
      !as_u64((*off)[1], &e.end))
    corrupt(path, who + " has no \"data_offsets\" pair of non-negative integers");
  if (e.end < e.begin)
    corrupt(path,
            str(who, " has data_offsets [", e.begin, ", ", e.end, "] ending before they begin"));
  if (e.end > data_bytes)
    corrupt(path, str(who, " has data_offsets [", e.begin, ", ", e.end, "] beyond the ", data_bytes,
                      "-byte data section (is the file truncated?)"));
  uint64_t want = 0;
  if (__builtin_mul_overflow(numel, dtype_size(e.dtype), &want) || want != e.end - e.begin)
    corrupt(path, str(who, " has shape ", sh->dump(), " of ", dt->get<std::string>(), " (", want,
                      " bytes) but its data_offsets span ", e.end - e.begin, " bytes"));
  return e;
}

// Checks that the entries tile [0, data_bytes) exactly and sorts them into file order.
void check_layout(const std::string& path, std::vector<Entry>& entries, uint64_t data_bytes) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered)
      corrupt(path, str("tensors '", prev->name, "' and '", e.name, "' overlap"));
    if (e.begin > covered)
      corrupt(path, str("the ", e.begin - covered, " bytes before tensor '", e.name,
                        "' belong to no tensor"));
    covered = e.end;
    prev = &e;
  }
  if (covered != data_bytes)
    corrupt(path, str("the last ", data_bytes - covered,
                      " bytes of the data section belong to no "
                      "tensor"));
}

// Reads and parses the length-prefixed JSON header of a file of `size` bytes.
Json read_header(Fd& fd, uint64_t size, uint64_t* header_bytes) {
  const std::string& path = fd.path();
  if (size < 8)
    corrupt(path, str("file too short (", size, " bytes; the header length alone is 8)"));
  uint8_t len[8];
  if (!detail::pread_all(fd, len, 8, 0)) corrupt(path, "file shrank while reading");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{len[i]} << (8 * i);
  if (n > kMaxHeaderBytes)
    corrupt(path, str("header length ", n, " exceeds the ", kMaxHeaderBytes, "-byte limit"));
  if (n > size - 8)
    corrupt(path, str("header length ", n, " exceeds the ", size - 8, " bytes after it"));
  std::string text(n, '\0');
  if (!detail::pread_all(fd, text.data(), n, 8)) corrupt(path, "file shrank while reading");
  if (text.empty() || text[0] != '{') corrupt(path, "header does not start with '{'");
  Json header;
  try {
    header = Json::parse(text);
  } catch (const Json::parse_error& e) {
    corrupt(path, str("header is not valid JSON (error at byte ", e.byte, ")"));
  }
  if (!header.is_object()) corrupt(path, "header is not a JSON object");
  *header_bytes = n;
  return header;
}

}  // namespace

const Tensor* TensorFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

std::string detail::safetensors_header(
    const std::vector<TensorInfo>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata, const std::string& path) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const TensorInfo& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", st_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception&) {
    throw InvalidArgument(str("checkpoint: a tensor name or metadata string for ", path,
                              " is not valid UTF-8; use UTF-8 names"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{text.size()} >> (8 * i));
  return out + text;
}

void write_safetensors(const std::string& path, const TensorFile& file) {
  std::set<std::string> seen;
  std::vector<TensorInfo> tensors;
  for (const auto& [name, t] : file.tensors) {
    if (name.empty() || name == "__metadata__" || !seen.insert(name).second)
      throw InvalidArgument(str("checkpoint: tensor name '", name, "' in ", path,
                                " is empty, reserved or repeated; give each tensor a unique name"));
    if (!t.defined())
      throw InvalidArgument(str("checkpoint: tensor '", name, "' in ", path, " is undefined"));
    tensors.push_back({name, t.dtype(), t.shape()});
  }
  const std::string head =
      detail::safetensors_header(tensors, {file.metadata.begin(), file.metadata.end()}, path);

  Fd fd(path, O_WRONLY | O_CREAT | O_TRUNC);
  if (!fd.ok()) detail::io_fail("creating", path, errno);
  detail::write_all(fd, head.data(), head.size());
  for (const auto& entry : file.tensors)
    detail::write_all(fd, entry.second.raw(), entry.second.nbytes());
  detail::fsync_fd(fd);
  fd.close_checked();
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  Fd fd(path, O_RDONLY);
  if (!fd.ok())
    throw IoError(
        str("checkpoint: cannot open ", path, ": ", std::strerror(errno), "; check the path"));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) detail::io_fail("stat of", path, errno);
  if (!S_ISREG(st.st_mode)) corrupt(path, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t header_bytes = 0;
  const Json header = read_header(fd, size, &header_bytes);
  const uint64_t data_start = 8 + header_bytes;

  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) corrupt(path, "\"__metadata__\" is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) corrupt(path, str("metadata value of '", mk, "' is not a string"));
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, key, value, size - data_start));
  }
  check_layout(path, entries, size - data_start);

  for (Entry& e : entries) {
    tensors_.push_back({std::move(e.name), e.dtype, std::move(e.shape)});
    offsets_.push_back(static_cast<int64_t>(e.begin));
  }
  file_bytes_ = static_cast<int64_t>(size);
  data_start_ = static_cast<int64_t>(data_start);
  fd_ = fd.release();
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo* SafetensorsReader::find(const std::string& name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

void SafetensorsReader::read(const std::string& name, int64_t first, int64_t count,
                             void* dst) const {
  const TensorInfo* t = find(name);
  if (t == nullptr)
    throw IoError(str("checkpoint: ", path_, " has no tensor '", name,
                      "'; check the name against the file's header"));
  const int64_t numel = shape_numel(t->shape);
  if (first < 0 || count < 0 || count > numel || first > numel - count)
    throw IoError(str("checkpoint: ", path_, ": ", count, " elements from element ", first,
                      " of tensor '", name, "' lie outside its ", numel,
                      " elements; ask for a range inside the tensor"));
  const int64_t elem = static_cast<int64_t>(dtype_size(t->dtype));
  const int64_t at =
      data_start_ + offsets_[static_cast<size_t>(t - tensors_.data())] + first * elem;
  if (!detail::pread_all(fd_, path_, dst, static_cast<size_t>(count * elem),
                         static_cast<off_t>(at)))
    corrupt(path_, "file shrank while reading");
}

TensorFile read_safetensors(const std::string& path) {
  const SafetensorsReader reader(path);
  TensorFile out;
  out.metadata = reader.metadata();
  for (const TensorInfo& info : reader.tensors()) {
    Tensor t = Tensor::empty(info.shape, info.dtype);
    reader.read(info.name, 0, t.numel(), t.raw());
    out.tensors.emplace_back(info.name, std::move(t));
  }
  return out;
}

}  // namespace tessel::ckpt
