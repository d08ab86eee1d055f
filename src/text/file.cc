#include "tessel/text/file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "tessel/core/error.h"

namespace tessel::text {

std::string read_file(const std::string& path, const std::string& key) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw IoError(
        str(key, ": file not found, got \"", path, "\"; give the path of a readable file"));
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) throw IoError(str(key, ": cannot open ", path, ", got \"", std::strerror(errno), "\""));
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw IoError(str(key, ": cannot stat ", path, ", got \"", ec.message(), "\""));
  std::string bytes(static_cast<size_t>(size), '\0');
  const size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f.get());
  if (got != bytes.size())
    throw IoError(str(key, ": cannot read ", path, ", got ", got, " of ", bytes.size(), " bytes"));
  return bytes;
}

}  // namespace tessel::text
