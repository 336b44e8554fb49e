// The .npy header: the preamble (magic, version, header length), the dict's keys (descr,
// fortran_order, shape) read into a Header and checked against the file size, and the version 1.0
// header numpy.save writes. Part of gpt2/npy.hpp; not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpt2/detail/io_util.hpp"
#include "gpt2/detail/npy_array.hpp"
#include "gpt2/detail/npy_dict_parser.hpp"
#include "gpt2/error.hpp"

namespace gpt2::npy::detail {

// Largest header accepted. numpy's own reader refuses headers over 10000 bytes by default.
inline constexpr std::size_t max_header_bytes = 65536;

// Magic, version and header-length field of the longest format version.
inline constexpr std::size_t max_preamble_bytes = 12;

// What the header says: dtype, shape, where the data starts and how many bytes it has.
struct Header {
  Dtype dtype = Dtype::F32;
  std::vector<std::int64_t> shape;
  std::size_t data_offset = 0;  // bytes before the data
  std::size_t data_bytes = 0;   // numel * itemsize
};

// Computes numel * itemsize for `shape` into `bytes`. Returns "" when the shape has 1 to max_dims
// (8) non-negative dimensions and the size fits in int64 and size_t, else the problem, e.g.
// "expected 1 to 8 dimensions, got 9 (shape [...])".
inline std::string data_bytes(const std::vector<std::int64_t>& shape, Dtype dtype,
                              std::size_t& bytes) {
  const std::string shape_str = gpt2::detail::shape_string(shape);
  if (shape.empty() || shape.size() > max_dims)
    return "expected 1 to " + std::to_string(max_dims) + " dimensions, got " +
           std::to_string(shape.size()) + " (shape " + shape_str + ")";
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
// `shape` has been checked by data_bytes: at most max_dims dimensions of at most 19 digits keep
// the dict far below the 65535 bytes a version 1.0 length field holds.
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

}  // namespace gpt2::npy::detail
