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
// writes (version 1.0, header padded to 64 bytes) and replaces its target atomically.
//
// Requires a little-endian host and POSIX (mkstemp, rename) for the atomic write.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "gpt2::npy: T must be float or double");
  return std::is_same<T, float>::value ? Dtype::F32 : Dtype::F64;
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
  const std::uint64_t limit = std::min<std::uint64_t>(std::numeric_limits<std::int64_t>::max(),
                                                      std::numeric_limits<std::size_t>::max());
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    bytes = 0;  // an empty array, whatever the other dimensions
    return "";
  }
  std::uint64_t numel = 1;
  for (std::int64_t d : shape) {
    if (numel > limit / static_cast<std::uint64_t>(d))
      return "shape " + shape_str + ": element count overflows";
    numel *= static_cast<std::uint64_t>(d);
  }
  if (numel > limit / dtype_size(dtype)) return "shape " + shape_str + ": byte size overflows";
  bytes = static_cast<std::size_t>(numel * dtype_size(dtype));
  return "";
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

// Writes all n bytes to fd, retrying short writes and EINTR. Returns false with errno set.
inline bool write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
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

// A temporary file "<path>.tmp-XXXXXX" beside `path`, removed by the destructor unless committed
// (renamed over `path`). Every failure throws FormatError naming `path` and strerror.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp-XXXXXX") {
    fd_ = ::mkstemp(tmp_.data());
    if (fd_ < 0) fail("cannot create a temporary file beside it");
    created_ = true;
    if (::fchmod(fd_, 0644) != 0) fail("cannot set the permissions of the temporary file");
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (created_) ::unlink(tmp_.c_str());
  }

  // Appends n bytes.
  void write(const void* data, std::size_t n) {
    if (!write_all(fd_, data, n)) fail("cannot write");
  }

  // Closes the temporary and renames it over `path`.
  void commit() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail("cannot write (close failed)");
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      fail("cannot rename the temporary file over it");
    created_ = false;  // it is `path` now
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    const int saved = errno;
    throw FormatError(path_ + ": " + what + ": " + std::strerror(saved));
  }

  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool created_ = false;  // the temporary exists and must be removed
};

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
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw detail::error(path, std::string("cannot open: ") + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw detail::error(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw detail::error(path, "cannot read: not a regular file");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  std::vector<unsigned char> prefix(static_cast<std::size_t>(
      std::min<std::uint64_t>(file_size, detail::max_preamble_bytes + detail::max_header_bytes)));
  if (!detail::read_all(fd, prefix.data(), prefix.size(), 0))
    throw detail::error(path, std::string("cannot read: ") + std::strerror(errno));
  const detail::Header h = detail::parse_header(prefix.data(), prefix.size(), file_size, path);
  Array a;
  a.dtype = h.dtype;
  a.shape = h.shape;
  a.bytes.resize(h.data_bytes);  // checked against the file size by parse_header
  if (!detail::read_all(fd, a.bytes.data(), a.bytes.size(), h.data_offset))
    throw detail::error(path, std::string("cannot read: ") + std::strerror(errno));
  return a;
}

// Writes the numel(shape) values at `data` (C order; caller-owned, only read) to `path` as a
// version 1.0 .npy file of dtype '<f4' (float) or '<f8' (double), the way numpy.save does. The file
// is written to "<path>.tmp-XXXXXX" and renamed over `path`: on failure nothing is left behind and
// an existing `path` is untouched. Throws ShapeError for a shape that is not 1..3 non-negative
// dimensions, FormatError naming the path and strerror for I/O errors. New files get mode 0644.
template <class T>
void write(const std::string& path, const T* data, const std::vector<std::int64_t>& shape) {
  constexpr Dtype dtype = dtype_of<T>();
  std::size_t n = 0;
  const std::string shape_problem = detail::data_bytes(shape, dtype, n);
  if (!shape_problem.empty()) throw ShapeError("npy::write(" + path + "): " + shape_problem);
  if (data == nullptr && n > 0)
    throw ShapeError("npy::write(" + path + "): expected data, got a null pointer");
  const std::string header = detail::encode_header(dtype, shape);
  detail::AtomicFile file(path);
  file.write(header.data(), header.size());
  file.write(data, n);
  file.commit();
}

// Writes a row-major matrix m [rows, cols] as a 2-D array; see write(path, data, shape).
template <class T>
void write(const std::string& path, const RowMatrix<T>& m) {
  write(path, m.data(), {static_cast<std::int64_t>(m.rows()), static_cast<std::int64_t>(m.cols())});
}

}  // namespace gpt2::npy
