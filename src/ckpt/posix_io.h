// Private to ckpt: thin POSIX file helpers that turn errno into IoError. Durability needs
// fsync and partial reads need pread, which std::fstream cannot do, hence raw file descriptors.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "tessel/core/error.h"

namespace tessel::ckpt::detail {

[[noreturn]] inline void io_fail(const std::string& what, const std::string& path, int err) {
  throw IoError(str("checkpoint: ", what, " ", path, " failed: ", std::strerror(err),
                    "; check that the folder exists, is writable and has free space"));
}

// Owns one file descriptor; closing in the destructor ignores errors (close_checked reports).
class Fd {
 public:
  Fd(const std::string& path, int flags, mode_t mode = 0644)
      : fd_(::open(path.c_str(), flags | O_CLOEXEC, mode)), path_(path) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  bool ok() const { return fd_ >= 0; }
  int get() const { return fd_; }
  const std::string& path() const { return path_; }
  // Hands the descriptor to the caller, who closes it from then on.
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close_checked() {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) io_fail("closing", path_, errno);
  }

 private:
  int fd_;
  std::string path_;
};

inline void write_all(Fd& fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd.get(), p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      io_fail("writing", fd.path(), errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Reads exactly n bytes at offset of `fd` (opened from `path`); returns false on a short read
// (the file shrank or ends). pread keeps no file position, so threads may share one fd.
inline bool pread_all(int fd, const std::string& path, void* data, size_t n, off_t offset) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, offset);
    if (r < 0) {
      if (errno == EINTR) continue;
      io_fail("reading", path, errno);
    }
    if (r == 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += r;
  }
  return true;
}

inline bool pread_all(Fd& fd, void* data, size_t n, off_t offset) {
  return pread_all(fd.get(), fd.path(), data, n, offset);
}

inline void fsync_fd(Fd& fd) {
  if (::fsync(fd.get()) != 0) io_fail("fsync of", fd.path(), errno);
}

// The whole content of the file at `path`.
inline std::string read_text(const std::string& path) {
  Fd fd(path, O_RDONLY);
  if (!fd.ok())
    throw IoError(
        str("checkpoint: cannot open ", path, ": ", std::strerror(errno), "; check the path"));
  std::string out;
  char buf[1 << 16];
  for (off_t at = 0;;) {
    ssize_t r = ::pread(fd.get(), buf, sizeof buf, at);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) io_fail("reading", path, errno);
    if (r == 0) return out;
    out.append(buf, static_cast<size_t>(r));
    at += r;
  }
}

// Creates (truncating) `path`, writes `bytes`, fsyncs and closes it.
inline void write_file_durable(const std::string& path, const std::string& bytes) {
  Fd fd(path, O_WRONLY | O_CREAT | O_TRUNC);
  if (!fd.ok()) io_fail("creating", path, errno);
  write_all(fd, bytes.data(), bytes.size());
  fsync_fd(fd);
  fd.close_checked();
}

}  // namespace tessel::ckpt::detail
