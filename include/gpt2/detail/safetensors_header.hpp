// A safetensors header: TensorInfo, the 8-byte length, and parse_header, which validates the JSON
// (no duplicate keys), each tensor's dtype, shape and data_offsets into a TensorInfo, the
// "__metadata__" strings, and the coverage of the data section (no overlap, no hole). Part of
// gpt2/safetensors.hpp: include that. parse_header is defined in detail/safetensors_json.hpp
// (nlohmann-json), which only the io library's file compiles in the compiled mode
// (GPT2_ATTENTION_SEPARATE_IO: the CMake target gpt2::io, pkg-config gpt2-attention-io).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gpt2/detail/io_util.hpp"
#include "gpt2/detail/safetensors_dtype.hpp"
#include "gpt2/error.hpp"

namespace gpt2::safetensors {

// One validated tensor of a File. `data` points into the File's bytes (the mapping or the caller's
// buffer) and is valid as long as the File is; it has no alignment guarantee beyond 1.
struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<std::int64_t> shape;      // C order; [] is a scalar with one element
  const unsigned char* data = nullptr;  // nbytes bytes, little-endian
  std::size_t nbytes = 0;               // numel() * dtype_size(dtype)
  std::size_t data_offset = 0;          // data_offsets[0], relative to the data section

  // Product of the shape (1 for a scalar). Cannot overflow: checked when the file was validated.
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
};

namespace detail {

// Largest header accepted: 16 MiB. The length is checked against this cap and the file size before
// anything is allocated. Parsing holds about 17 bytes per header byte (a header of empty tensors,
// the worst case: 10 MiB -> 180 MB), so the cap bounds what a hostile header can cost to about
// 300 MB. The reference implementation allows 100 MB; real headers are far smaller (a tensor's
// entry is about 100 bytes: 16 MiB is over 100000 tensors).
inline constexpr std::uint64_t max_header_bytes = 16ull << 20;  // 16 MiB

// Deepest nesting of objects and arrays accepted in the header. A valid header nests three levels
// ({"name": {"shape": [...]}}); a hostile one could nest millions, and anything recursive over the
// parsed value (nlohmann's dump(), used in messages) would then overflow the stack.
inline constexpr int max_header_depth = 32;

// Longest JSON excerpt quoted in a message; longer ones are cut and end in "...".
inline constexpr std::size_t max_quoted_json = 80;

// "label: problem"
using gpt2::detail::file_error;

// "label: tensor 'name': problem"
inline FormatError tensor_error(const std::string& label, const std::string& name,
                                const std::string& problem) {
  return FormatError(label + ": tensor '" + name + "': " + problem);
}

// Reads the 8-byte little-endian header length and checks it against the 16 MiB cap and the
// file size, before anything is allocated. Returns N.
inline std::size_t read_header_length(const unsigned char* bytes, std::size_t n,
                                      const std::string& label) {
  if (n < 8)
    throw file_error(label, "file is " + std::to_string(n) +
                                " bytes, shorter than the 8-byte header length field (truncated?)");
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > max_header_bytes)
    throw file_error(label, "header length " + std::to_string(header_len) + " exceeds the cap of " +
                                std::to_string(max_header_bytes) + " bytes (16 MiB)");
  if (header_len > n - 8)
    throw file_error(label, "header length " + std::to_string(header_len) +
                                " exceeds the file: only " + std::to_string(n - 8) +
                                " bytes follow the length field (truncated?)");
  return static_cast<std::size_t>(header_len);
}

// A header's tensors by name and its "__metadata__" strings.
struct ParsedHeader {
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

#if defined(GPT2_ATTENTION_SEPARATE_IO)
#define GPT2_ATTENTION_IO_INLINE  // defined once, in the io library
#else
#define GPT2_ATTENTION_IO_INLINE inline
#endif

// Validates the header of the n-byte file at `bytes` (its length checked: read_header_length) and
// the data section's coverage: its tensors (data pointers into `bytes`) and metadata. FormatError
// naming `label` and the problem.
GPT2_ATTENTION_IO_INLINE ParsedHeader parse_header(const unsigned char* bytes, std::size_t n,
                                                   const std::string& label);

}  // namespace detail

}  // namespace gpt2::safetensors

#if !defined(GPT2_ATTENTION_SEPARATE_IO) || defined(GPT2_ATTENTION_IO_IMPLEMENTATION)
#include "gpt2/detail/safetensors_json.hpp"
#endif
