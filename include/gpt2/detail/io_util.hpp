// Helpers shared by the I/O headers gpt2/npy.hpp and gpt2/safetensors.hpp: the "label: problem"
// FormatError, a file-descriptor closer, whole-buffer read and write with EINTR and short-transfer
// handling, the overflow-checked byte size of a shape, the dtype of float/double, the process
// umask, symlink resolution and a same-file test. Not part of the public API.
//
// Requires POSIX.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt2/error.hpp"

namespace gpt2::detail {

// "label: problem"
inline FormatError file_error(const std::string& label, const std::string& problem) {
  return FormatError(label + ": " + problem);
}

// Closes a file descriptor when it goes out of scope (a negative fd is ignored). Move-only.
class FdCloser {
 public:
  explicit FdCloser(int fd = -1) noexcept : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  FdCloser(FdCloser&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FdCloser& operator=(FdCloser&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~FdCloser() { reset(); }

  int get() const noexcept { return fd_; }

  // Gives up ownership: the caller closes the fd.
  int release() noexcept { return std::exchange(fd_, -1); }

  // Closes the fd now; returns close()'s result (0 when there was nothing to close).
  int reset() noexcept {
    const int fd = std::exchange(fd_, -1);
    return fd >= 0 ? ::close(fd) : 0;
  }

 private:
  int fd_;
};

// The element type of float (`f32`) or double (`f64`) in a format's own Dtype enum.
template <class T, class Dtype>
constexpr Dtype float_dtype(Dtype f32, Dtype f64) {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "gpt2: T must be float or double");
  return std::is_same<T, float>::value ? f32 : f64;
}

// numel(shape) * itemsize into `bytes`, for non-negative dimensions. Returns "" on success, else
// the problem: "shape [a, b]: element count overflows" or "shape [a, b] <dtype_name>: byte size
// overflows" (both int64 and size_t must hold the sizes). A shape with a 0 is empty: 0 bytes.
inline std::string checked_byte_size(const std::vector<std::int64_t>& shape, std::size_t itemsize,
                                     const std::string& dtype_name, std::size_t& bytes) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    bytes = 0;  // an empty array, whatever the other dimensions
    return "";
  }
  const std::uint64_t limit = std::min<std::uint64_t>(std::numeric_limits<std::int64_t>::max(),
                                                      std::numeric_limits<std::size_t>::max());
  std::uint64_t numel = 1;
  for (std::int64_t d : shape) {
    const auto du = static_cast<std::uint64_t>(d);
    if (numel > limit / du) return "shape " + shape_string(shape) + ": element count overflows";
    numel *= du;
  }
  if (numel > limit / itemsize)
    return "shape " + shape_string(shape) + " " + dtype_name + ": byte size overflows";
  bytes = static_cast<std::size_t>(numel * itemsize);
  return "";
}

// Writes all n bytes to fd, retrying short writes and EINTR. Returns false with errno set.
inline bool write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    if (w == 0) {
      errno = EIO;
      return false;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// Reads exactly n bytes from fd at offset into out. Returns false with errno set (EIO on a short
// file: it changed under us).
inline bool read_all(int fd, unsigned char* out, std::size_t n, std::uint64_t offset) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) {
      errno = EIO;
      return false;
    }
    out += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return true;
}

// The process umask, read without changing it (umask() would race with other threads creating
// files): the "Umask:" line of /proc/self/status (Linux 4.7+), else the usual 022.
inline mode_t process_umask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) != 0) continue;
    mode_t mask = 0;
    bool digits = false;
    for (std::size_t i = 6; i < line.size(); ++i) {
      const char c = line[i];
      if (c == ' ' || c == '\t') {
        if (digits) break;
        continue;
      }
      if (c < '0' || c > '7') return 022;
      mask = static_cast<mode_t>(mask * 8 + static_cast<mode_t>(c - '0'));
      digits = true;
    }
    return digits ? (mask & 0777) : 022;
  }
  return 022;
}

// `path` with its final component's symbolic links followed (a chain, up to 40 links): the path
// that rename(2) must replace so that a symlink at `path` stays and its target changes. A link
// whose target does not exist resolves to that (missing) target. Directory components are left
// as they are (the kernel follows them). Returns false with errno set (ELOOP, EACCES, ...).
inline bool resolve_final_symlinks(const std::string& path, std::string& resolved) {
  std::string p = path;
  for (int hops = 0; hops <= 40; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) {
      if (errno != ENOENT) return false;
      resolved = p;  // a file still to be created
      return true;
    }
    if (!S_ISLNK(st.st_mode)) {
      resolved = p;
      return true;
    }
    std::string link(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 255) + 1, '\0');
    ssize_t n;
    while ((n = ::readlink(p.c_str(), link.data(), link.size())) >= 0 &&
           static_cast<std::size_t>(n) == link.size())
      link.resize(link.size() * 2);  // the link grew since lstat
    if (n < 0) return false;
    link.resize(static_cast<std::size_t>(n));
    if (link.empty()) {
      errno = ENOENT;
      return false;
    }
    if (link.front() == '/') {
      p = link;
    } else {
      const std::size_t slash = p.find_last_of('/');
      p = slash == std::string::npos ? link : p.substr(0, slash + 1) + link;
    }
  }
  errno = ELOOP;
  return false;
}

// True when `a` and `b` name the same file: after following symbolic links (even dangling ones,
// whose missing targets are compared by name), their weakly canonical absolute paths are equal,
// or both exist with the same (st_dev, st_ino) (which also catches hard links).
inline bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
      sa.st_ino == sb.st_ino)
    return true;
  const auto canonical = [](const std::string& path) {
    std::string resolved;
    if (!resolve_final_symlinks(path, resolved)) resolved = path;
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(resolved, ec);
    if (ec) return std::filesystem::path(resolved).lexically_normal();
    std::filesystem::path p = std::filesystem::weakly_canonical(absolute, ec);
    return ec ? absolute.lexically_normal() : p.lexically_normal();
  };
  return canonical(a) == canonical(b);
}

}  // namespace gpt2::detail
