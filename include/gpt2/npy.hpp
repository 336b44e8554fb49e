// gpt2::npy: read and write NumPy .npy files holding activations: float32 or float64,
// little-endian, C order, 1 to 3 dimensions (e.g. x[T, C] or a per-head att[n_head, T, T]).
//
// File layout (numpy.lib.format):
//   "\x93NUMPY" major minor   6 + 2 bytes; versions 1.0 (2-byte header length), 2.0 and 3.0
//   (4-byte) header length             little-endian u16 (1.0) or u32 (2.0, 3.0) header a Python
//   dict literal, padded with spaces, ending in '\n':
//                             {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
//   data                      numel * itemsize bytes, nothing after it
//
// The reader checks every field and sizes before allocating anything; each problem is a
// gpt2::FormatError naming the file and the problem. The writer produces exactly what numpy.save
// writes (version 1.0, header padded to 64 bytes) and replaces its target atomically:
//
//   StagedFile::stage(path, ...)  writes the whole file to "<target>.tmp-XXXXXX" beside the real
//                                 target (a symlink at `path` is followed: the link stays, the file
//                                 it points to is replaced); refuses a target that exists and is
//                                 not a regular file (directory, FIFO, device, socket)
//   StagedFile::commit()          renames the temporary over the target
//   commit_all(files)             commits several staged files all or nothing
//   write(path, ...)              stage + commit
//
// An existing target keeps its permission bits; a new file gets 0666 & ~umask, like open(2).
// Ownership, ACLs and extended attributes of an existing target are not carried over, and hard
// links to it keep the old content (the target is a new inode).
//
// Requires a little-endian host and POSIX (mkstemp, rename, link).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt2/detail/io_util.hpp"
#include "gpt2/error.hpp"
#include "gpt2/types.hpp"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gpt2/npy.hpp: only little-endian hosts are supported"
#endif

namespace gpt2::npy {

// The two element types supported: '<f4' and '<f8'.
enum class Dtype { F32, F64 };

// Bytes per element: 4 or 8.
inline std::size_t dtype_size(Dtype dtype) { return dtype == Dtype::F32 ? 4 : 8; }

// The numpy descr: "<f4" or "<f8".
inline const char* dtype_descr(Dtype dtype) { return dtype == Dtype::F32 ? "<f4" : "<f8"; }

// The dtype stored for T: F32 for float, F64 for double.
template <class T>
constexpr Dtype dtype_of() {
  return gpt2::detail::float_dtype<T>(Dtype::F32, Dtype::F64);
}

// A loaded array: `bytes` holds numel() * dtype_size(dtype) little-endian values in C order and is
// owned by the Array.
struct Array {
  Dtype dtype = Dtype::F32;
  std::vector<std::int64_t> shape;  // 1 to 3 non-negative dimensions
  std::vector<unsigned char> bytes;

  // Product of the shape.
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }

  // An owning copy of the numel() values in C order, converted to T (f8 -> float rounds to
  // nearest). Throws ShapeError if bytes.size() does not match shape and dtype.
  template <class T>
  std::vector<T> to_vector() const {
    std::vector<T> out(checked_numel());
    convert_into(out.data());
    return out;
  }

  // An owning copy [shape[0], shape[1]] of a 2-D array, converted to T. Throws ShapeError naming
  // the expected rank and the actual shape for any other rank.
  template <class T>
  RowMatrix<T> to_matrix() const {
    if (shape.size() != 2)
      throw ShapeError("npy::Array::to_matrix: expected rank 2, got rank " +
                       std::to_string(shape.size()) + " (shape " + detail::shape_string(shape) +
                       ")");
    checked_numel();
    RowMatrix<T> m(static_cast<Index>(shape[0]), static_cast<Index>(shape[1]));
    convert_into(m.data());
    return m;
  }

 private:
  // numel(), after checking that bytes.size() matches it.
  std::size_t checked_numel() const {
    const std::size_t n = static_cast<std::size_t>(numel());
    if (bytes.size() != n * dtype_size(dtype))
      throw ShapeError("npy::Array: shape " + detail::shape_string(shape) + " " +
                       dtype_descr(dtype) + " needs " + std::to_string(n * dtype_size(dtype)) +
                       " bytes, got " + std::to_string(bytes.size()));
    return n;
  }

  // out[i] = T(value i), for numel() values.
  template <class T>
  void convert_into(T* out) const {
    static_assert(std::is_floating_point<T>::value, "npy::Array: T must be float or double");
    const std::size_t n = bytes.size() / dtype_size(dtype);
    for (std::size_t i = 0; i < n; ++i) {
      if (dtype == Dtype::F32) {
        float v;
        std::memcpy(&v, bytes.data() + 4 * i, 4);
        out[i] = static_cast<T>(v);
      } else {
        double v;
        std::memcpy(&v, bytes.data() + 8 * i, 8);
        out[i] = static_cast<T>(v);
      }
    }
  }
};

namespace detail {

// Largest header accepted. numpy's own reader refuses headers over 10000 bytes by default.
inline constexpr std::size_t max_header_bytes = 65536;

// Magic, version and header-length field of the longest format version.
inline constexpr std::size_t max_preamble_bytes = 12;

inline FormatError error(const std::string& label, const std::string& problem) {
  return FormatError(label + ": " + problem);
}

// What the header says: dtype, shape, where the data starts and how many bytes it has.
struct Header {
  Dtype dtype = Dtype::F32;
  std::vector<std::int64_t> shape;
  std::size_t data_offset = 0;  // bytes before the data
  std::size_t data_bytes = 0;   // numel * itemsize
};

// A strict parser for the header's Python dict literal: string keys, and values that are strings,
// True/False, or tuples of integers. Nothing else (no nesting, no escapes) occurs in a valid
// header for the arrays this reader accepts.
class DictParser {
 public:
  DictParser(const std::string& text, const std::string& label) : s_(text), label_(label) {}

  // One parsed value.
  struct Value {
    enum class Kind { String, Bool, Tuple } kind = Kind::String;
    std::string text;                // String
    bool flag = false;               // Bool
    std::vector<std::int64_t> ints;  // Tuple
    std::string source;              // as written, for messages
  };

  // Parses the dict; calls on_item(key, value) for each item. The whole text must be consumed.
  template <class OnItem>
  void parse(OnItem on_item) {
    expect('{');
    skip_space();
    while (peek() != '}') {
      const std::string key = parse_string("a quoted key");
      expect(':');
      on_item(key, parse_value());
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail("expected ',' or '}'");
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != s_.size()) fail("unexpected text after the closing '}'");
  }

 private:
  // Throws "label: malformed header at offset N: what (header: <its first 200 bytes, printable>)".
  [[noreturn]] void fail(const std::string& what) const {
    std::string shown = s_.substr(0, 200);
    for (char& c : shown)
      if (c < 0x20 || c > 0x7E) c = '?';
    throw error(label_, "malformed header at offset " + std::to_string(pos_) + ": " + what +
                            " (header: " + shown + ")");
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string(const char* what) {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(std::string("expected ") + what);
    const std::size_t start = ++pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\' || s_[pos_] == '\n') fail("unsupported character in a string");
      ++pos_;
    }
    if (pos_ == s_.size()) fail("unterminated string");
    return s_.substr(start, pos_++ - start);
  }
  std::int64_t parse_int() {
    skip_space();
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    if (peek() < '0' || peek() > '9') fail("expected an integer");
    std::uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const unsigned digit = static_cast<unsigned>(peek() - '0');
      if (v > (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) - digit) / 10)
        fail("integer too large");
      v = v * 10 + digit;
      ++pos_;
    }
    return negative ? -static_cast<std::int64_t>(v) : static_cast<std::int64_t>(v);
  }
  // "()" or "(a,)" or "(a, b)" or "(a, b,)": a one-element tuple needs its comma, "(a)" is an int.
  std::vector<std::int64_t> parse_tuple() {
    std::vector<std::int64_t> ints;
    ++pos_;  // '('
    skip_space();
    bool trailing_comma = false;
    while (peek() != ')') {
      ints.push_back(parse_int());
      skip_space();
      trailing_comma = peek() == ',';
      if (trailing_comma) {
        ++pos_;
        skip_space();
      } else if (peek() != ')') {
        fail("expected ',' or ')' in a tuple");
      }
    }
    ++pos_;
    if (ints.size() == 1 && !trailing_comma)
      fail("'(n)' is not a tuple; a 1-d shape is written '(n,)'");
    return ints;
  }
  Value parse_value() {
    skip_space();
    Value v;
    const std::size_t start = pos_;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = Value::Kind::String;
      v.text = parse_string("a string");
    } else if (c == '(') {
      v.kind = Value::Kind::Tuple;
      v.ints = parse_tuple();
    } else if (s_.compare(pos_, 4, "True") == 0 || s_.compare(pos_, 5, "False") == 0) {
      v.kind = Value::Kind::Bool;
      v.flag = s_[pos_] == 'T';
      pos_ += v.flag ? 4 : 5;
    } else {
      fail("expected a string, True, False or a tuple");
    }
    v.source = s_.substr(start, pos_ - start);
    return v;
  }

  const std::string& s_;
  const std::string& label_;
  std::size_t pos_ = 0;
};

// Computes numel * itemsize for `shape` into `bytes`. Returns "" when the shape has 1 to 3
// non-negative dimensions and the size fits in int64 and size_t, else the problem.
inline std::string data_bytes(const std::vector<std::int64_t>& shape, Dtype dtype,
                              std::size_t& bytes) {
  const std::string shape_str = gpt2::detail::shape_string(shape);
  if (shape.empty() || shape.size() > 3)
    return "expected 1 to 3 dimensions, got " + std::to_string(shape.size()) + " (shape " +
           shape_str + ")";
  for (std::int64_t d : shape)
    if (d < 0) return "negative dimension in shape " + shape_str;
  return gpt2::detail::checked_byte_size(shape, dtype_size(dtype), dtype_descr(dtype), bytes);
}

// Interprets the header dict: exactly the keys descr, fortran_order and shape.
inline void parse_header_dict(const std::string& text, const std::string& label, Header& h) {
  bool has_descr = false, has_order = false, has_shape = false;
  DictParser(text, label).parse([&](const std::string& key, const DictParser::Value& v) {
    using Kind = DictParser::Value::Kind;
    if ((key == "descr" && has_descr) || (key == "fortran_order" && has_order) ||
        (key == "shape" && has_shape))
      throw error(label, "duplicate key '" + key + "' in the header");
    if (key == "descr") {
      if (v.kind != Kind::String || (v.text != "<f4" && v.text != "<f8"))
        throw error(label, "unsupported dtype descr " + v.source +
                               " (expected '<f4' or '<f8': little-endian float32 or float64)");
      h.dtype = v.text == "<f4" ? Dtype::F32 : Dtype::F64;
      has_descr = true;
    } else if (key == "fortran_order") {
      if (v.kind != Kind::Bool)
        throw error(label, "fortran_order must be True or False, got " + v.source);
      if (v.flag)
        throw error(label,
                    "Fortran order (fortran_order: True) is not supported; save a C-order array");
      has_order = true;
    } else if (key == "shape") {
      if (v.kind != Kind::Tuple)
        throw error(label, "shape must be a tuple of integers, got " + v.source);
      h.shape = v.ints;
      has_shape = true;
    } else {
      throw error(label, "unexpected key '" + key + "' in the header");
    }
  });
  if (!has_descr) throw error(label, "header has no 'descr'");
  if (!has_order) throw error(label, "header has no 'fortran_order'");
  if (!has_shape) throw error(label, "header has no 'shape'");
}

// Parses the preamble and header from `prefix` (the first prefix_n bytes of a file of file_size
// bytes; prefix_n >= min(file_size, max_preamble_bytes + max_header_bytes)) and checks that the
// file holds exactly the data the header describes. Allocates nothing sized by the file's contents.
inline Header parse_header(const unsigned char* prefix, std::size_t prefix_n,
                           std::uint64_t file_size, const std::string& label) {
  static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (prefix_n < 6 || std::memcmp(prefix, magic, 6) != 0)
    throw error(label, "not a .npy file: bad magic (expected \"\\x93NUMPY\", file has " +
                           std::to_string(file_size) + " bytes)");
  if (prefix_n < 8) throw error(label, "file truncated in the version field");
  const unsigned major = prefix[6], minor = prefix[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    throw error(label, "unsupported .npy format version " + std::to_string(major) + "." +
                           std::to_string(minor) + " (expected 1.0, 2.0 or 3.0)");
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (prefix_n < 8 + len_bytes) throw error(label, "file truncated in the header length field");
  std::uint64_t header_len = 0;
  for (std::size_t i = len_bytes; i > 0; --i) header_len = (header_len << 8) | prefix[8 + i - 1];
  if (header_len > max_header_bytes)
    throw error(label, "header length " + std::to_string(header_len) + " exceeds the cap of " +
                           std::to_string(max_header_bytes) + " bytes");
  if (header_len > file_size - 8 - len_bytes)
    throw error(label, "header length " + std::to_string(header_len) + " exceeds the file: only " +
                           std::to_string(file_size - 8 - len_bytes) +
                           " bytes follow the length field (truncated?)");
  Header h;
  h.data_offset = 8 + len_bytes + static_cast<std::size_t>(header_len);
  const std::string text(reinterpret_cast<const char*>(prefix) + 8 + len_bytes,
                         static_cast<std::size_t>(header_len));
  parse_header_dict(text, label, h);
  const std::string shape_problem = data_bytes(h.shape, h.dtype, h.data_bytes);
  if (!shape_problem.empty()) throw error(label, shape_problem);
  const std::uint64_t available = file_size - h.data_offset;
  const std::string what = std::to_string(h.data_bytes) + " bytes of data for shape " +
                           gpt2::detail::shape_string(h.shape) + " " + dtype_descr(h.dtype);
  if (available < h.data_bytes)
    throw error(label, "data truncated: expected " + what + ", got " + std::to_string(available));
  if (available > h.data_bytes)
    throw error(label, std::to_string(available - h.data_bytes) +
                           " unexpected trailing bytes after the data (expected " + what +
                           ", got " + std::to_string(available) + ")");
  return h;
}

// The version 1.0 header numpy.save writes: dict, spaces, '\n', total preamble a multiple of 64.
inline std::string encode_header(Dtype dtype, const std::vector<std::int64_t>& shape) {
  std::string dict =
      std::string("{'descr': '") + dtype_descr(dtype) + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(shape[i]);
  dict += shape.size() == 1 ? ",), }" : "), }";
  const std::size_t unpadded = 10 + dict.size() + 1;  // magic, version, u16 length, dict, '\n'
  dict.append(64 - unpadded % 64, ' ');               // numpy pads 64 when already aligned
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xFF);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict;
}

// "a directory", "a FIFO", ...: what a file that is not a regular file is.
inline std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "of an unknown type";
}

// What is at an output target: nothing, or a regular file with these permission bits.
struct TargetState {
  bool exists = false;
  mode_t mode = 0;  // st_mode & 07777 when it exists
};

// lstat(target) (`target` is `path` with its symbolic links followed). Throws FormatError
// "<path>: not a regular file (it is a FIFO)" for anything but a regular file or nothing. Never
// opens the target, so a FIFO cannot block and a device is never touched.
inline TargetState check_target(const std::string& path, const std::string& target) {
  struct stat st {};
  if (::lstat(target.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    throw error(path, std::string("cannot stat: ") + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    const std::string kind = file_kind(st.st_mode);
    throw error(path, "not a regular file (" +
                          (target == path ? "it is " + kind : "it links to " + target + ", " + kind) +
                          ")");
  }
  return {true, static_cast<mode_t>(st.st_mode & 07777)};
}

// "<pid>-<n>", n counting up within the process: part of a fresh file name.
inline std::string unique_suffix() {
  static std::atomic<unsigned long> counter{0};
  return std::to_string(static_cast<long>(::getpid())) + "-" + std::to_string(counter++);
}

// Copies the regular file `target` to a new "<target>.bak-XXXXXX" with permission bits `mode`;
// returns its name. Throws FormatError naming `path` (nothing is left behind).
inline std::string copy_backup(const std::string& path, const std::string& target, mode_t mode) {
  const auto fail = [&](const std::string& what, int err) {
    return error(path, "cannot back up its previous content: " + what + ": " + std::strerror(err));
  };
  gpt2::detail::FdCloser in(::open(target.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (in.get() < 0) throw fail("cannot open", errno);
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) throw fail("cannot stat", errno);
  if (!S_ISREG(st.st_mode)) throw fail("not a regular file", EINVAL);
  std::string name = target + ".bak-XXXXXX";
  gpt2::detail::FdCloser out(::mkstemp(name.data()));
  if (out.get() < 0) throw fail("cannot create a file beside it", errno);
  const auto remove_and_throw = [&](const char* what) {
    const int err = errno;
    out.reset();
    ::unlink(name.c_str());
    throw fail(what, err);
  };
  if (::fchmod(out.get(), mode) != 0) remove_and_throw("cannot set the permissions of the copy");
  std::vector<unsigned char> buffer(1 << 16);
  for (;;) {
    const ssize_t r = ::read(in.get(), buffer.data(), buffer.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) remove_and_throw("cannot read");
    if (r == 0) break;
    if (!gpt2::detail::write_all(out.get(), buffer.data(), static_cast<std::size_t>(r)))
      remove_and_throw("cannot write the copy");
  }
  if (out.reset() != 0) remove_and_throw("cannot write the copy (close failed)");
  return name;
}

// A second name "<target>.bak-<pid>-<n>" for the regular file `target` (a hard link, so it keeps
// the very inode: content, mode, owner), or, where hard links are not possible, a copy. Returns
// the backup's name. Throws FormatError naming `path`.
inline std::string make_backup(const std::string& path, const std::string& target, mode_t mode) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string name = target + ".bak-" + unique_suffix();
    if (::link(target.c_str(), name.c_str()) == 0) return name;
    if (errno != EEXIST) break;
  }
  return copy_backup(path, target, mode);
}

// True when the row-major (or vector) direct-access matrix `m` lies in memory in C order without
// gaps: what a .npy file's data section is.
template <class Derived>
bool is_contiguous(const Eigen::MatrixBase<Derived>& m) {
  const Derived& d = m.derived();
  return d.size() <= 1 ||
         (d.innerStride() == 1 && (d.outerSize() <= 1 || d.outerStride() == d.innerSize()));
}

}  // namespace detail

// Parses the n bytes at `bytes` (not kept: the data are copied into the Array). `label` names the
// buffer in error messages. Throws FormatError naming the label and the problem.
inline Array parse(const unsigned char* bytes, std::size_t n,
                   const std::string& label = "<memory>") {
  const detail::Header h = detail::parse_header(bytes, n, n, label);
  Array a;
  a.dtype = h.dtype;
  a.shape = h.shape;
  a.bytes.assign(bytes + h.data_offset, bytes + h.data_offset + h.data_bytes);
  return a;
}

// Reads the .npy file at `path` into an owning Array. Throws FormatError naming the path and the
// problem (strerror for I/O errors). Only the header (at most 64 KiB) is read before the data size
// has been checked against the file size.
inline Array read(const std::string& path) {
  const gpt2::detail::FdCloser fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw detail::error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw detail::error(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw detail::error(path, "cannot read: not a regular file");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  std::vector<unsigned char> prefix(static_cast<std::size_t>(
      std::min<std::uint64_t>(file_size, detail::max_preamble_bytes + detail::max_header_bytes)));
  if (!gpt2::detail::read_all(fd.get(), prefix.data(), prefix.size(), 0))
    throw detail::error(path, std::string("cannot read: ") + std::strerror(errno));
  const detail::Header h = detail::parse_header(prefix.data(), prefix.size(), file_size, path);
  Array a;
  a.dtype = h.dtype;
  a.shape = h.shape;
  a.bytes.resize(h.data_bytes);  // checked against the file size by parse_header
  if (!gpt2::detail::read_all(fd.get(), a.bytes.data(), a.bytes.size(), h.data_offset))
    throw detail::error(path, std::string("cannot read: ") + std::strerror(errno));
  return a;
}

// A complete .npy file written to a temporary beside its target but not yet in place: stage()
// writes it, commit() renames it over the target, and the destructor (or discard()) removes it if
// it was never committed. Move-only.
//
//   auto y = npy::StagedFile::stage("y.npy", y_matrix);    // may throw; "y.npy" is untouched
//   y.commit();                                           // "y.npy" now holds y_matrix
//
// The target is `path`, or, when `path` is a symbolic link (a chain of them), the file the links
// lead to (created if missing): the links stay and keep pointing at the new file. A target that
// exists must be a regular file: a directory, FIFO, device or socket is refused (FormatError
// "<path>: not a regular file (it is a FIFO)") and never opened. The new file gets the existing
// target's permission bits (st_mode & 07777), or 0666 & ~umask for a new one.
class StagedFile {
 public:
  // Stages the numel(shape) values at `data` (C order; caller-owned, only read, not kept) as a
  // version 1.0 .npy file of dtype '<f4' (float) or '<f8' (double), the bytes numpy.save writes.
  // Throws ShapeError for a shape that is not 1..3 non-negative dimensions (or null data for a
  // non-empty one), FormatError naming `path` for a target that is not a regular file and for I/O
  // errors (strerror); nothing is left behind then.
  template <class T>
  static StagedFile stage(const std::string& path, const T* data,
                          const std::vector<std::int64_t>& shape) {
    constexpr Dtype dtype = dtype_of<T>();
    std::size_t n = 0;
    const std::string shape_problem = detail::data_bytes(shape, dtype, n);
    if (!shape_problem.empty()) throw ShapeError("npy::write(" + path + "): " + shape_problem);
    if (data == nullptr && n > 0)
      throw ShapeError("npy::write(" + path + "): expected data, got a null pointer");
    return stage_bytes(path, detail::encode_header(dtype, shape), data, n);
  }

  // Stages the matrix m [rows, cols] as a 2-D array of T (default: m's scalar type; float or
  // double). m must be row-major (or a vector): a Matrix, Map, Ref, Block or expression. Its data
  // are written in place when they are contiguous (stride 1, rows back to back) and of type T;
  // anything else (a Ref or Block with a row stride, an expression, another scalar type) is first
  // evaluated explicitly into a RowMatrix<T>. Throws as stage(path, data, shape).
  template <class T = void, class Derived>
  static StagedFile stage(const std::string& path, const Eigen::MatrixBase<Derived>& m) {
    using Scalar = std::conditional_t<std::is_void<T>::value, typename Derived::Scalar, T>;
    static_assert(Derived::IsRowMajor || Derived::RowsAtCompileTime == 1 ||
                      Derived::ColsAtCompileTime == 1,
                  "gpt2::npy: the matrix must be row-major (C order); convert a column-major one "
                  "explicitly, e.g. gpt2::RowMatrix<T>(m)");
    const std::vector<std::int64_t> shape = {static_cast<std::int64_t>(m.rows()),
                                             static_cast<std::int64_t>(m.cols())};
    if constexpr (std::is_same<Scalar, typename Derived::Scalar>::value &&
                  (static_cast<unsigned>(Derived::Flags) & Eigen::DirectAccessBit) != 0) {
      if (detail::is_contiguous(m)) return stage<Scalar>(path, m.derived().data(), shape);
    }
    const RowMatrix<Scalar> copy = m.template cast<Scalar>();
    return stage<Scalar>(path, copy.data(), shape);
  }

  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  StagedFile(StagedFile&& other) noexcept
      : path_(std::move(other.path_)),
        target_(std::move(other.target_)),
        temporary_(std::exchange(other.temporary_, std::string())) {}
  StagedFile& operator=(StagedFile&& other) noexcept {
    if (this != &other) {
      discard();
      path_ = std::move(other.path_);
      target_ = std::move(other.target_);
      temporary_ = std::exchange(other.temporary_, std::string());
    }
    return *this;
  }
  ~StagedFile() { discard(); }

  // The path given to stage(); it names the file in error messages.
  const std::string& path() const { return path_; }

  // The file commit() replaces: path(), or the file its symbolic links lead to.
  const std::string& target() const { return target_; }

  // The temporary "<target>.tmp-XXXXXX"; empty once committed or discarded.
  const std::string& temporary() const { return temporary_; }

  // True until commit() or discard().
  bool staged() const { return !temporary_.empty(); }

  // Checks the target again (it must still be a regular file or nothing) and renames the temporary
  // over it. On failure the temporary is removed, the target is untouched and FormatError names
  // path() and the problem. Throws FormatError if nothing is staged.
  void commit() {
    if (!staged())
      throw detail::error(path_,
                          "npy::StagedFile::commit: nothing staged (committed or discarded)");
    try {
      detail::check_target(path_, target_);
    } catch (...) {
      discard();
      throw;
    }
    if (::rename(temporary_.c_str(), target_.c_str()) != 0) {
      const int err = errno;
      discard();
      throw detail::error(path_, std::string("cannot rename the temporary file over it: ") +
                                     std::strerror(err));
    }
    temporary_.clear();  // it is the target now
  }

  // Removes the temporary, if any; the target is untouched.
  void discard() noexcept {
    if (!temporary_.empty()) ::unlink(temporary_.c_str());
    temporary_.clear();
  }

 private:
  StagedFile() = default;

  // Resolves and checks the target, then writes header + data to a new temporary beside it.
  static StagedFile stage_bytes(const std::string& path, const std::string& header,
                                const void* data, std::size_t n) {
    StagedFile f;
    f.path_ = path;
    if (!gpt2::detail::resolve_final_symlinks(path, f.target_))
      throw detail::error(path, std::string("cannot follow the symbolic link: ") +
                                    std::strerror(errno));
    const detail::TargetState state = detail::check_target(path, f.target_);
    const mode_t mode = state.exists ? state.mode : (0666 & ~gpt2::detail::process_umask());
    std::string tmp = f.target_ + ".tmp-XXXXXX";
    gpt2::detail::FdCloser fd(::mkstemp(tmp.data()));
    if (fd.get() < 0)
      throw detail::error(path, "cannot create a temporary file beside " +
                                    (f.target_ == path ? std::string("it") : f.target_) + ": " +
                                    std::strerror(errno));
    f.temporary_ = tmp;  // from here on, f's destructor removes it if anything fails
    const auto fail = [&](const char* what) {
      const int err = errno;
      throw detail::error(path, std::string(what) + ": " + std::strerror(err));
    };
    if (::fchmod(fd.get(), mode) != 0) fail("cannot set the permissions of the temporary file");
    if (!gpt2::detail::write_all(fd.get(), header.data(), header.size())) fail("cannot write");
    if (!gpt2::detail::write_all(fd.get(), data, n)) fail("cannot write");
    if (fd.reset() != 0) fail("cannot write (close failed)");
    return f;
  }

  std::string path_;
  std::string target_;
  std::string temporary_;
};

// Commits every staged file in `files` or none of them: afterwards either each target holds its
// new file, or each target is as it was before (a target that did not exist does not exist).
//
//   1. check: every file is staged, every target is still a regular file or nothing, and no two
//      targets are the same file; otherwise nothing is committed.
//   2. commit in order. Before a target that exists is replaced (all but the last), a backup is
//      kept under a second name ("<target>.bak-<pid>-<n>", a hard link, or a copy where links are
//      impossible). If a commit still fails (the file system changed under us), the targets
//      committed before it are restored from their backups (or removed if they were new).
//   3. the backups are removed.
//
// Every temporary and backup is removed on success and on failure (unless restoring a target
// itself fails: then the message says where its previous content is). Throws FormatError naming
// the file that failed and the problem, plus which files were rolled back, on one line.
inline void commit_all(std::vector<StagedFile>& files) {
  const auto discard_all = [&] {
    for (StagedFile& f : files) f.discard();
  };
  try {
    for (std::size_t i = 0; i < files.size(); ++i) {
      if (!files[i].staged())
        throw detail::error(files[i].path(),
                            "npy::commit_all: nothing staged (committed or discarded)");
      detail::check_target(files[i].path(), files[i].target());
      for (std::size_t j = 0; j < i; ++j)
        if (gpt2::detail::same_file(files[j].target(), files[i].target()))
          throw detail::error(files[i].path(), "names the same file as " + files[j].path());
    }
  } catch (...) {
    discard_all();
    throw;
  }

  struct Committed {
    std::string backup;  // empty: the target did not exist (or was the last one)
    bool existed = false;
  };
  std::vector<Committed> committed;
  committed.reserve(files.size());
  for (std::size_t i = 0; i < files.size(); ++i) {
    StagedFile& f = files[i];
    std::string backup;
    try {
      const detail::TargetState state = detail::check_target(f.path(), f.target());
      if (state.exists && i + 1 < files.size())
        backup = detail::make_backup(f.path(), f.target(), state.mode);
      f.commit();
      committed.push_back({backup, state.exists});
    } catch (const std::exception& e) {
      if (!backup.empty()) ::unlink(backup.c_str());
      discard_all();
      std::string restored, problems;
      for (std::size_t j = committed.size(); j-- > 0;) {
        const Committed& c = committed[j];
        const std::string& target = files[j].target();
        const int rc = !c.backup.empty() ? ::rename(c.backup.c_str(), target.c_str())
                                         : ::unlink(target.c_str());
        if (rc == 0) {
          restored += (restored.empty() ? "" : ", ") + files[j].path();
        } else {
          problems += "; could not restore " + files[j].path() + ": " + std::strerror(errno);
          if (!c.backup.empty()) problems += " (its previous content is in " + c.backup + ")";
        }
      }
      std::string message = e.what();
      if (!restored.empty()) message += " (rolled back: " + restored + ")";
      throw FormatError(message + problems);
    }
  }
  for (const Committed& c : committed)
    if (!c.backup.empty()) ::unlink(c.backup.c_str());
}

// Writes the numel(shape) values at `data` (C order) to `path` as a version 1.0 .npy file:
// StagedFile::stage(path, data, shape).commit(). On failure nothing is left behind and an existing
// target is untouched.
template <class T>
void write(const std::string& path, const T* data, const std::vector<std::int64_t>& shape) {
  StagedFile::stage<T>(path, data, shape).commit();
}

// Writes the row-major matrix m [rows, cols] as a 2-D array of T (default: m's scalar type):
// StagedFile::stage<T>(path, m).commit().
template <class T = void, class Derived>
void write(const std::string& path, const Eigen::MatrixBase<Derived>& m) {
  StagedFile::stage<T>(path, m).commit();
}

}  // namespace gpt2::npy
