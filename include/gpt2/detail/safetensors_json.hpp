// The nlohmann-json half of detail/safetensors_header.hpp: parse_header's definition and its
// steps. Header-only mode: every file that includes gpt2/safetensors.hpp compiles it; compiled
// mode: only the io library's file (src/gpt2_attention_io.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gpt2/detail/io_util.hpp"
#include "gpt2/detail/safetensors_dtype.hpp"
#include "gpt2/detail/safetensors_header.hpp"
#include "gpt2/error.hpp"

namespace gpt2::safetensors {

namespace detail {

// `v` as JSON text for a message, at most max_quoted_json characters.
inline std::string quote_json(const nlohmann::json& v) {
  std::string text = v.dump();
  if (text.size() > max_quoted_json) text = text.substr(0, max_quoted_json - 3) + "...";
  return text;
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

GPT2_ATTENTION_IO_INLINE ParsedHeader parse_header(const unsigned char* bytes, std::size_t n,
                                                   const std::string& label) {
  const std::size_t header_len = read_header_length(bytes, n, label);
  const nlohmann::json header = parse_header_json(bytes + 8, header_len, label);
  const unsigned char* data = bytes + 8 + header_len;
  const std::size_t data_size = n - 8 - header_len;
  ParsedHeader parsed;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__")
      parsed.metadata = parse_metadata(entry, label);
    else
      parsed.tensors.emplace(name, parse_tensor(name, entry, data, data_size, label));
  }
  check_coverage(parsed.tensors, data_size, label);
  return parsed;
}

}  // namespace detail

}  // namespace gpt2::safetensors
