// Validation of a safetensors header: the 8-byte length, the JSON (no duplicate keys), each
// tensor's dtype, shape and data_offsets into a TensorInfo, the "__metadata__" strings, and the
// coverage of the data section (no overlap, no hole). Part of gpt2/safetensors.hpp: include that.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
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

// `v` as JSON text for a message, at most max_quoted_json characters.
inline std::string quote_json(const nlohmann::json& v) {
  std::string text = v.dump();
  if (text.size() > max_quoted_json) text = text.substr(0, max_quoted_json - 3) + "...";
  return text;
}

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

// First pass over the header: rejects duplicate keys in any object (the format gives them no
// meaning) and nesting deeper than max_header_depth, without building anything. Its own SAX
// handler, not a parser callback: nlohmann's callback parser scans the enclosing object at the end
// of every nested object (linear in its size), so a header of n tensors would cost O(n^2).
class HeaderChecker : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit HeaderChecker(const std::string& label) : label_(label) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open();
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& key) override {
    if (!keys_.back().insert(key).second)
      throw gpt2::detail::file_error(label_, "header has a duplicate key '" + key + "'");
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    open();
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::json::exception& e) override {
    throw gpt2::detail::file_error(label_, std::string("header is not well-formed JSON: ") + e.what());
  }

 private:
  void open() {
    if (depth_ >= max_header_depth)
      throw gpt2::detail::file_error(label_, "header nests objects and arrays deeper than " +
                                                 std::to_string(max_header_depth) + " levels");
    ++depth_;
  }

  const std::string& label_;
  int depth_ = 0;                             // open objects and arrays
  std::vector<std::set<std::string>> keys_;   // keys seen in each open object
};

// Parses the JSON header. Rejects malformed JSON, duplicate keys in any object, nesting deeper
// than max_header_depth and a top level that is not an object. Linear in the header's size: a
// checking pass (HeaderChecker), then nlohmann's plain DOM parser.
inline nlohmann::json parse_header_json(const unsigned char* begin, std::size_t n,
                                        const std::string& label) {
  // nlohmann-json stops at a NUL byte as at the end of input; valid JSON text never contains one.
  if (const void* nul = std::memchr(begin, 0, n))
    throw file_error(label, "header is not well-formed JSON: NUL byte at offset " +
                                std::to_string(static_cast<const unsigned char*>(nul) - begin));
  HeaderChecker checker(label);
  nlohmann::json::sax_parse(begin, begin + n, &checker);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(begin, begin + n);
  } catch (const nlohmann::json::exception& e) {  // not expected after the checking pass
    throw file_error(label, std::string("header is not well-formed JSON: ") + e.what());
  }
  if (!header.is_object())
    throw file_error(label, std::string("header must be a JSON object, got ") + header.type_name());
  return header;
}

// The JSON value as a non-negative integer, or a message saying what is wrong with it.
inline std::optional<std::uint64_t> json_to_count(const nlohmann::json& v, std::string& problem) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) {
    const std::int64_t i = v.get<std::int64_t>();
    if (i >= 0) return static_cast<std::uint64_t>(i);  // "-0"
    problem = "negative value " + std::to_string(i);
    return std::nullopt;
  }
  problem =
      std::string("expected a non-negative integer, got ") +
      (v.is_number_float() ? "the non-integer number " + quote_json(v) : std::string(v.type_name()));
  return std::nullopt;
}

// entry["dtype"]: a known dtype name.
inline Dtype parse_dtype(const nlohmann::json& entry, const std::string& label,
                         const std::string& name) {
  const auto it = entry.find("dtype");
  if (it == entry.end()) throw tensor_error(label, name, "missing 'dtype'");
  if (!it->is_string())
    throw tensor_error(label, name,
                       std::string("'dtype' must be a string, got ") + it->type_name());
  const std::optional<Dtype> dtype = dtype_from_name(it->get_ref<const std::string&>());
  if (!dtype) throw tensor_error(label, name, "unknown dtype " + quote_json(*it));
  return *dtype;
}

// entry["shape"]: an array of non-negative integers, each at most INT64_MAX.
inline std::vector<std::int64_t> parse_shape(const nlohmann::json& entry, const std::string& label,
                                             const std::string& name) {
  const auto it = entry.find("shape");
  if (it == entry.end()) throw tensor_error(label, name, "missing 'shape'");
  if (!it->is_array())
    throw tensor_error(label, name,
                       std::string("'shape' must be an array, got ") + it->type_name());
  std::vector<std::int64_t> shape;
  for (std::size_t i = 0; i < it->size(); ++i) {
    std::string problem;
    const std::optional<std::uint64_t> d = json_to_count((*it)[i], problem);
    if (!d)
      throw tensor_error(label, name,
                         "shape " + quote_json(*it) + ": entry " + std::to_string(i) + ": " + problem);
    if (*d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw tensor_error(label, name, "shape " + quote_json(*it) + ": dimension too large");
    shape.push_back(static_cast<std::int64_t>(*d));
  }
  return shape;
}

// numel(shape) * dtype_size, or a FormatError if it overflows int64 / size_t.
inline std::size_t checked_nbytes(const std::vector<std::int64_t>& shape, Dtype dtype,
                                  const std::string& label, const std::string& name) {
  std::size_t bytes = 0;
  const std::string problem =
      gpt2::detail::checked_byte_size(shape, dtype_size(dtype), dtype_name(dtype), bytes);
  if (!problem.empty()) throw tensor_error(label, name, problem);
  return bytes;
}

// entry["data_offsets"]: [begin, end] with begin <= end <= data_size and end - begin == nbytes.
// Returns begin.
inline std::size_t parse_data_offsets(const nlohmann::json& entry, std::size_t data_size,
                                      std::size_t nbytes, const std::string& label,
                                      const std::string& name) {
  const auto it = entry.find("data_offsets");
  if (it == entry.end()) throw tensor_error(label, name, "missing 'data_offsets'");
  if (!it->is_array() || it->size() != 2)
    throw tensor_error(label, name,
                       "'data_offsets' must be an array [begin, end], got " + quote_json(*it));
  std::array<std::uint64_t, 2> offsets{};
  for (std::size_t i = 0; i < 2; ++i) {
    std::string problem;
    const std::optional<std::uint64_t> v = json_to_count((*it)[i], problem);
    if (!v) throw tensor_error(label, name, "data_offsets " + quote_json(*it) + ": " + problem);
    offsets[i] = *v;
  }
  const std::string where =
      "data_offsets [" + std::to_string(offsets[0]) + ", " + std::to_string(offsets[1]) + "]";
  if (offsets[0] > offsets[1]) throw tensor_error(label, name, where + " begin > end");
  if (offsets[1] > data_size)
    throw tensor_error(
        label, name,
        where + " end past the data section (" + std::to_string(data_size) + " bytes)");
  if (offsets[1] - offsets[0] != nbytes)
    throw tensor_error(label, name,
                       where + " hold " + std::to_string(offsets[1] - offsets[0]) +
                           " bytes, but shape and dtype need " + std::to_string(nbytes));
  return static_cast<std::size_t>(offsets[0]);
}

// One header entry -> TensorInfo pointing into `data` (the data section, data_size bytes).
inline TensorInfo parse_tensor(const std::string& name, const nlohmann::json& entry,
                               const unsigned char* data, std::size_t data_size,
                               const std::string& label) {
  if (!entry.is_object())
    throw tensor_error(label, name,
                       std::string("entry must be an object, got ") + entry.type_name());
  TensorInfo info;
  info.name = name;
  info.dtype = parse_dtype(entry, label, name);
  info.shape = parse_shape(entry, label, name);
  info.nbytes = checked_nbytes(info.shape, info.dtype, label, name);
  info.data_offset = parse_data_offsets(entry, data_size, info.nbytes, label, name);
  info.data = data + info.data_offset;
  return info;
}

// The "__metadata__" value: an object whose values are all strings.
inline std::map<std::string, std::string> parse_metadata(const nlohmann::json& value,
                                                         const std::string& label) {
  if (!value.is_object())
    throw file_error(
        label, std::string("__metadata__ must be an object of strings, got ") + value.type_name());
  std::map<std::string, std::string> metadata;
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string())
      throw file_error(
          label, "__metadata__ must be an object of strings: '" + key + "' is " + v.type_name());
    metadata.emplace(key, v.get<std::string>());
  }
  return metadata;
}

// The spec requires the data section to be entirely indexed: sorted by offsets, the tensors must
// tile [0, data_size) exactly, with no overlap and no hole. (Empty tensors may share an offset.)
inline void check_coverage(const std::map<std::string, TensorInfo>& tensors, std::size_t data_size,
                           const std::string& label) {
  struct Range {
    std::size_t begin, end;
    const std::string* name;
    bool operator<(const Range& o) const { return std::tie(begin, end) < std::tie(o.begin, o.end); }
    std::string str() const {
      return "'" + *name + "' [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    }
  };
  std::vector<Range> ranges;
  for (const auto& [name, info] : tensors)
    ranges.push_back({info.data_offset, info.data_offset + info.nbytes, &name});
  std::stable_sort(ranges.begin(), ranges.end());  // ties stay in name order
  std::size_t covered = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (r.begin < covered)
      throw file_error(label, "overlapping tensors: " + ranges[i - 1].str() + " and " + r.str());
    if (r.begin > covered)
      throw file_error(label, "hole in the data section: bytes [" + std::to_string(covered) + ", " +
                                  std::to_string(r.begin) +
                                  ") are not covered by any tensor (before '" + *r.name + "')");
    covered = r.end;
  }
  if (covered != data_size)
    throw file_error(label, "hole in the data section: bytes [" + std::to_string(covered) + ", " +
                                std::to_string(data_size) +
                                ") at its end are not covered by any tensor");
}

}  // namespace detail

}  // namespace gpt2::safetensors
