// NumPy .npy and .npz reading.
//
// .npy: "\x93NUMPY", a major/minor version byte pair, the header length (u16 for 1.x, u32 for
// 2.x/3.x), then a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (N, F)}
// padded with spaces, then the elements in C order.
// .npz: a zip archive (numpy.savez: stored; numpy.savez_compressed: raw deflate) of "NAME.npy"
// members. Members are found through the central directory at the end of the file (its sizes
// are final, while numpy writes the local headers with zip64 placeholders), their data read
// after each local header, inflated with zlib and checked against the CRC-32.
#include "tessel/data/npy.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <memory>

#include "tessel/core/error.h"
#include "tessel/tensor/tensor.h"

namespace tessel::data {
namespace {

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

// The value of 'key' in a .npy header dict: a quoted string, a tuple or a bare word.
std::string header_field(const std::string& header, const std::string& key,
                         const std::string& path) {
  size_t at = header.find("'" + key + "'");
  if (at != std::string::npos) at = header.find(':', at);
  if (at == std::string::npos)
    throw IoError(str("data: ", path, " has no '", key, "' in its .npy header, got ", header,
                      "; write it with numpy.save"));
  at = header.find_first_not_of(' ', at + 1);
  const char open = at < header.size() ? header[at] : ' ';
  const size_t end = open == '\''  ? header.find('\'', at + 1) + 1
                     : open == '(' ? header.find(')', at) + 1
                                   : header.find_first_of(",}", at);
  return header.substr(at, end == std::string::npos || end == 0 ? std::string::npos : end - at);
}

std::vector<int64_t> parse_shape(const std::string& tuple) {
  std::vector<int64_t> dims;
  for (size_t i = 0; i < tuple.size();) {
    if (!std::isdigit(static_cast<unsigned char>(tuple[i]))) {
      ++i;
      continue;
    }
    size_t used = 0;
    dims.push_back(std::stoll(tuple.substr(i), &used));
    i += used;
  }
  return dims;
}

template <typename T>
void widen(float* dst, const void* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, static_cast<const char*>(src) + i * sizeof(T), sizeof(T));
    dst[i] = static_cast<float>(v);
  }
}

uint32_t le(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint64_t le64(const uint8_t* p) { return le(p, 4) | (uint64_t{le(p + 4, 4)} << 32); }

std::vector<uint8_t> read_whole(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) throw IoError(str("data: cannot open ", path, ", got \"", std::strerror(errno), "\""));
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  for (size_t got; (got = std::fread(buf, 1, sizeof buf, f.get())) > 0;)
    bytes.insert(bytes.end(), buf, buf + got);
  if (std::ferror(f.get())) throw IoError(str("data: cannot read ", path));
  return bytes;
}

// One member of a zip's central directory.
struct ZipEntry {
  std::string name;
  int method = 0;
  uint32_t crc = 0;
  uint64_t packed = 0, size = 0, local = 0;  // sizes and local header offset
};

[[noreturn]] void bad_zip(const std::string& path, const std::string& what) {
  throw IoError(str("data: ", path, " is not a readable .npz (zip) archive, got ", what,
                    "; write it with numpy.savez or numpy.savez_compressed"));
}

std::vector<ZipEntry> zip_directory(const std::vector<uint8_t>& z, const std::string& path) {
  // The end-of-central-directory record (22 bytes plus a comment of up to 64 KiB).
  size_t eocd = std::string::npos;
  for (size_t i = z.size() >= 22 ? z.size() - 22 : 0; z.size() >= 22; --i) {
    if (le(&z[i], 4) == 0x06054b50) {
      eocd = i;
      break;
    }
    if (i == 0 || z.size() - i > 22 + 65535) break;
  }
  if (eocd == std::string::npos) bad_zip(path, "no end-of-central-directory record");
  const size_t count = le(&z[eocd + 10], 2);
  size_t at = le(&z[eocd + 16], 4);
  std::vector<ZipEntry> out;
  for (size_t k = 0; k < count; ++k) {
    if (at + 46 > z.size() || le(&z[at], 4) != 0x02014b50)
      bad_zip(path, str("a broken central directory entry ", k));
    ZipEntry e;
    e.method = static_cast<int>(le(&z[at + 10], 2));
    e.crc = le(&z[at + 16], 4);
    e.packed = le(&z[at + 20], 4);
    e.size = le(&z[at + 24], 4);
    e.local = le(&z[at + 42], 4);
    const size_t name_len = le(&z[at + 28], 2), extra_len = le(&z[at + 30], 2);
    const size_t comment_len = le(&z[at + 32], 2);
    if (at + 46 + name_len + extra_len > z.size()) bad_zip(path, "a truncated directory");
    e.name.assign(reinterpret_cast<const char*>(&z[at + 46]), name_len);
    // Zip64: the fields set to 0xffffffff follow in the extra block 0x0001, in this order.
    for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint32_t id = le(&z[x], 2), len = le(&z[x + 2], 2);
      size_t v = x + 4;
      if (id == 1) {
        for (uint64_t* field : {&e.size, &e.packed, &e.local})
          if (*field == 0xffffffffu && v + 8 <= x + 4 + len) *field = le64(&z[v]), v += 8;
      }
      x += 4 + len;
    }
    out.push_back(std::move(e));
    at += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

std::vector<uint8_t> zip_member(const std::vector<uint8_t>& z, const ZipEntry& e,
                                const std::string& path) {
  const std::string where = str("member ", e.name);
  if (e.local + 30 > z.size() || le(&z[e.local], 4) != 0x04034b50)
    bad_zip(path, str("no local header for ", where));
  const uint64_t data = e.local + 30 + le(&z[e.local + 26], 2) + le(&z[e.local + 28], 2);
  if (data + e.packed > z.size()) bad_zip(path, str("a truncated ", where));
  // Deflate expands at most ~1032x; a larger size is a corrupt directory, not an allocation.
  if (e.size > 1032 * e.packed + 1024 || e.size >= (uint64_t{1} << 32))
    bad_zip(path, str("a size of ", e.size, " bytes from ", e.packed, " for ", where,
                      " (tessel reads members under 4 GiB)"));
  std::vector<uint8_t> out(e.size);
  if (e.method == 0) {
    if (e.packed != e.size) bad_zip(path, str("stored sizes that differ for ", where));
    std::copy_n(&z[data], e.size, out.begin());
  } else if (e.method == 8) {
    z_stream s{};
    if (inflateInit2(&s, -MAX_WBITS) != Z_OK) bad_zip(path, "a zlib that does not start");
    s.next_in = const_cast<Bytef*>(&z[data]);
    s.avail_in = static_cast<uInt>(e.packed);
    s.next_out = out.data();
    s.avail_out = static_cast<uInt>(e.size);
    const int rc = inflate(&s, Z_FINISH);
    const uint64_t produced = s.total_out;
    inflateEnd(&s);
    if (rc != Z_STREAM_END || produced != e.size)
      bad_zip(path, str("a corrupt deflate stream in ", where));
  } else {
    bad_zip(path, str("compression method ", e.method, " in ", where, " (only stored/deflate)"));
  }
  if (crc32_z(0, out.data(), out.size()) != e.crc)
    bad_zip(path, str("a CRC-32 mismatch in ", where));
  return out;
}

// Reads a whole .npy stream (already open) into an NpyArray.
NpyArray read_array(std::FILE* f, const std::string& path) {
  const NpyHeader h = read_npy_header(f, path);
  NpyArray a;
  a.shape = h.shape;
  const int64_t n = h.numel();
  std::vector<uint8_t> raw(static_cast<size_t>(n * h.width));
  if (std::fread(raw.data(), 1, raw.size(), f) != raw.size())
    throw IoError(str("data: ", path, " holds fewer elements than its .npy header's ", n,
                      " (shape ", shape_str(h.shape), "); the file is truncated, write it again"));
  a.values.resize(static_cast<size_t>(n));
  npy_to_f32(a.values.data(), raw.data(), n, h);
  return a;
}

}  // namespace

int64_t NpyHeader::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

NpyHeader read_npy_header(std::FILE* f, const std::string& path) {
  char magic[8];
  if (std::fread(magic, 1, 8, f) != 8 || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw IoError(str("data: ", path,
                      " is not a .npy file, got no \\x93NUMPY magic; write it with numpy.save"));
  uint8_t len[4] = {};
  const size_t width = magic[6] == 1 ? 2 : 4;
  if (std::fread(len, 1, width, f) != width)
    throw IoError(str("data: ", path, " is truncated inside its .npy header"));
  const size_t n = le(len, static_cast<int>(width));
  std::string header(n, '\0');
  if (n > (1 << 20) || std::fread(header.data(), 1, n, f) != n)
    throw IoError(str("data: ", path, " has a .npy header of ", n,
                      " bytes that the file does not hold; the file is truncated or corrupt"));
  const std::string descr = header_field(header, "descr", path);
  const std::string order = header_field(header, "fortran_order", path);
  NpyHeader h;
  const bool known = descr.size() == 5 && descr.front() == '\'' && descr.back() == '\'' &&
                     std::strchr("<|=", descr[1]) != nullptr && std::strchr("fiub", descr[2]) &&
                     std::isdigit(static_cast<unsigned char>(descr[3]));
  if (known) {
    h.kind = descr[2];
    h.width = descr[3] - '0';
  }
  const bool sized = h.kind == 'f'   ? h.width == 2 || h.width == 4 || h.width == 8
                     : h.kind == 'b' ? h.width == 1
                                     : h.width == 1 || h.width == 2 || h.width == 4 || h.width == 8;
  if (!known || !sized || order != "False")
    throw InvalidArgument(str("data: ", path, " holds descr ", descr, ", fortran_order ", order,
                              "; tessel reads little-endian bool, int, uint or float arrays in C "
                              "order: save with numpy.save(path, numpy.ascontiguousarray(x))"));
  h.shape = parse_shape(header_field(header, "shape", path));
  for (int64_t d : h.shape)
    if (d > (int64_t{1} << 40))
      throw IoError(str("data: ", path, " has a .npy dimension of ", d, "; the file is corrupt"));
  return h;
}

void npy_to_f32(float* dst, const void* src, int64_t n, const NpyHeader& h) {
  switch (h.kind * 16 + h.width) {
    case 'f' * 16 + 2:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, static_cast<const char*>(src) + 2 * i, 2);
        dst[i] = f16_to_f32(bits);
      }
      return;
    case 'f' * 16 + 4:
      return widen<float>(dst, src, n);
    case 'f' * 16 + 8:
      return widen<double>(dst, src, n);
    case 'i' * 16 + 1:
      return widen<int8_t>(dst, src, n);
    case 'i' * 16 + 2:
      return widen<int16_t>(dst, src, n);
    case 'i' * 16 + 4:
      return widen<int32_t>(dst, src, n);
    case 'i' * 16 + 8:
      return widen<int64_t>(dst, src, n);
    case 'b' * 16 + 1:
    case 'u' * 16 + 1:
      return widen<uint8_t>(dst, src, n);
    case 'u' * 16 + 2:
      return widen<uint16_t>(dst, src, n);
    case 'u' * 16 + 4:
      return widen<uint32_t>(dst, src, n);
    case 'u' * 16 + 8:
      return widen<uint64_t>(dst, src, n);
  }
  TESSEL_CHECK(false, "npy_to_f32: unchecked dtype ", h.kind, h.width);
}

NpyArray read_npy(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) throw IoError(str("data: cannot open ", path, ", got \"", std::strerror(errno), "\""));
  return read_array(f.get(), path);
}

NpyArray read_npz_member(const std::string& path, const std::string& name) {
  const std::vector<uint8_t> z = read_whole(path);
  const std::vector<ZipEntry> entries = zip_directory(z, path);
  std::string names;
  for (const ZipEntry& e : entries) {
    if (e.name == name + ".npy") {
      std::vector<uint8_t> bytes = zip_member(z, e, path);
      const std::string where = str(path, " member ", e.name);
      File f(fmemopen(bytes.data(), bytes.size(), "rb"), std::fclose);
      if (!f) throw IoError(str("data: cannot read ", where, " from memory"));
      return read_array(f.get(), where);
    }
    names += (names.empty() ? "" : ", ") + e.name.substr(0, e.name.rfind(".npy"));
  }
  throw InvalidArgument(str("data: ", path, " has no array '", name, "', got arrays [", names,
                            "]; save it with numpy.savez(path, x=features, y=targets) or set "
                            "data.target to the targets' name"));
}

}  // namespace tessel::data
