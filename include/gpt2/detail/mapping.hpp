// Mapping: a read-only private memory mapping of a whole file, unmapped by its destructor. The
// bytes under safetensors::File::open. Not part of the public API.
//
// Requires POSIX mmap.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "gpt2/detail/io_util.hpp"
#include "gpt2/error.hpp"

namespace gpt2::detail {

// A read-only private mapping of a whole file; unmapped by the destructor. Move-only.
class Mapping {
 public:
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping(Mapping&& other) noexcept
      : addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  Mapping& operator=(Mapping&& other) noexcept {
    if (this != &other) {
      unmap();
      addr_ = std::exchange(other.addr_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~Mapping() { unmap(); }

  // Maps `path` read-only. An empty file gets no mapping (mmap of length 0 fails): data() is null
  // and size() is 0. Throws FormatError naming the path and strerror.
  static Mapping map_file(const std::string& path) {
    const FdCloser fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) throw FormatError(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0)
      throw FormatError(path + ": cannot stat: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode))
      throw FormatError(path + ": cannot open: not a regular file (" +
                        std::strerror(S_ISDIR(st.st_mode) ? EISDIR : EINVAL) + ")");
    if (static_cast<std::uint64_t>(st.st_size) > std::numeric_limits<std::size_t>::max())
      throw FormatError(path + ": cannot map: file too large for the address space");
    Mapping mapping;
    mapping.size_ = static_cast<std::size_t>(st.st_size);
    if (mapping.size_ == 0) return mapping;
    void* addr = ::mmap(nullptr, mapping.size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (addr == MAP_FAILED) throw FormatError(path + ": cannot mmap: " + std::strerror(errno));
    mapping.addr_ = addr;
    return mapping;
  }

  const unsigned char* data() const { return static_cast<const unsigned char*>(addr_); }
  std::size_t size() const { return size_; }

 private:
  void unmap() {
    if (addr_ != nullptr) ::munmap(addr_, size_);
    addr_ = nullptr;
    size_ = 0;
  }

  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace gpt2::detail
