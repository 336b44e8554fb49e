// gpt2::safetensors: read Hugging Face .safetensors files through a read-only memory mapping and
// hand out zero-copy Eigen views of their tensors.
//
// File layout (https://github.com/huggingface/safetensors):
//   [8 bytes]  N, the header length, unsigned 64-bit little-endian
//   [N bytes]  a UTF-8 JSON object {"name": {"dtype": "F32", "shape": [768, 2304],
//              "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value", ...}}
//   [rest]     the data section; data_offsets are relative to its start, little-endian, C order.
//
// File::open and File::parse validate the whole header before anything is handed out: every tensor
// lies inside the data section, has exactly numel * dtype_size bytes, no two tensors overlap and
// every byte of the data section belongs to a tensor. Each problem is a gpt2::FormatError whose
// message names the file, the tensor and the problem, e.g.
//   "model.safetensors: tensor 'h.0.attn.c_attn.bias': data_offsets [0, 9000] end past the data
//    section (9216 bytes)".
//
// Views (File::matrix, File::vector) never copy: they need the stored dtype to be exactly T and the
// data to be aligned for T. Conversions (F16/BF16 -> float, F32 -> double, ...) are explicit calls
// (File::to_vector) that return an owning copy. A mapped file must not be truncated by another
// process while it is open (the kernel would raise SIGBUS on access).
//
// Requires a little-endian host, POSIX mmap and nlohmann-json.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
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
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt2/config.hpp"
#include "gpt2/detail/io_util.hpp"
#include "gpt2/error.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gpt2/safetensors.hpp: safetensors data is little-endian; big-endian hosts are not supported"
#endif

namespace gpt2::safetensors {

// ---------------------------------------------------------------------------------------------
// Dtypes
// ---------------------------------------------------------------------------------------------

// The element types of the safetensors format that have a whole number of bytes per element.
// (The sub-byte types F4/F6 are not supported: a file using them is rejected as "unknown dtype".)
enum class Dtype {
  F64,
  F32,
  F16,
  BF16,
  I64,
  I32,
  I16,
  I8,
  U64,
  U32,
  U16,
  U8,
  BOOL,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0
};

// Bytes per element, e.g. dtype_size(Dtype::BF16) == 2.
inline std::size_t dtype_size(Dtype dtype) {
  switch (dtype) {
    case Dtype::F64:
    case Dtype::I64:
    case Dtype::U64:
      return 8;
    case Dtype::F32:
    case Dtype::I32:
    case Dtype::U32:
      return 4;
    case Dtype::F16:
    case Dtype::BF16:
    case Dtype::I16:
    case Dtype::U16:
      return 2;
    case Dtype::I8:
    case Dtype::U8:
    case Dtype::BOOL:
    case Dtype::F8_E5M2:
    case Dtype::F8_E4M3:
    case Dtype::F8_E8M0:
      return 1;
  }
  return 0;
}

// The name the format uses in the header, e.g. "BF16".
inline const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::F64:
      return "F64";
    case Dtype::F32:
      return "F32";
    case Dtype::F16:
      return "F16";
    case Dtype::BF16:
      return "BF16";
    case Dtype::I64:
      return "I64";
    case Dtype::I32:
      return "I32";
    case Dtype::I16:
      return "I16";
    case Dtype::I8:
      return "I8";
    case Dtype::U64:
      return "U64";
    case Dtype::U32:
      return "U32";
    case Dtype::U16:
      return "U16";
    case Dtype::U8:
      return "U8";
    case Dtype::BOOL:
      return "BOOL";
    case Dtype::F8_E5M2:
      return "F8_E5M2";
    case Dtype::F8_E4M3:
      return "F8_E4M3";
    case Dtype::F8_E8M0:
      return "F8_E8M0";
  }
  return "?";
}

// The Dtype whose header name is `name` ("F32" -> F32), or nullopt for an unknown name.
inline std::optional<Dtype> dtype_from_name(const std::string& name) {
  static constexpr Dtype all[] = {Dtype::F64,  Dtype::F32,     Dtype::F16,     Dtype::BF16,
                                  Dtype::I64,  Dtype::I32,     Dtype::I16,     Dtype::I8,
                                  Dtype::U64,  Dtype::U32,     Dtype::U16,     Dtype::U8,
                                  Dtype::BOOL, Dtype::F8_E5M2, Dtype::F8_E4M3, Dtype::F8_E8M0};
  for (Dtype d : all)
    if (name == dtype_name(d)) return d;
  return std::nullopt;
}

// The dtype stored for T: F32 for float, F64 for double.
template <class T>
constexpr Dtype dtype_of() {
  return gpt2::detail::float_dtype<T>(Dtype::F32, Dtype::F64);
}

// Exact IEEE binary16 -> binary32: every half value (signed zeros, subnormals, normals, infinities,
// NaN with its payload) is representable as a float, so nothing is rounded.
inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  const std::uint32_t mantissa = h & 0x3FFu;
  std::uint32_t bits = sign;
  if (exponent == 0x1F) {  // infinity or NaN
    bits |= 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    bits |= ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {  // subnormal mantissa * 2^-24: normalise into a float normal
    std::uint32_t m = mantissa;
    std::uint32_t shift = 0;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      ++shift;
    }
    bits |= ((113u - shift) << 23) | ((m & 0x3FFu) << 13);  // 2^(-14 - shift), biased by 127
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Exact bfloat16 -> binary32: bfloat16 is the upper half of a float.
inline float bf16_to_float(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// ---------------------------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------------------------

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

// Largest header accepted, as in the reference implementation.
inline constexpr std::uint64_t max_header_bytes = 100ull << 20;  // 100 MiB

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
    const gpt2::detail::FdCloser fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
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

// "label: problem"
inline FormatError file_error(const std::string& label, const std::string& problem) {
  return FormatError(label + ": " + problem);
}

// "label: tensor 'name': problem"
inline FormatError tensor_error(const std::string& label, const std::string& name,
                                const std::string& problem) {
  return FormatError(label + ": tensor '" + name + "': " + problem);
}

// Reads the 8-byte little-endian header length and checks it against the 100 MiB cap and the
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
                                std::to_string(max_header_bytes) + " bytes (100 MiB)");
  if (header_len > n - 8)
    throw file_error(label, "header length " + std::to_string(header_len) +
                                " exceeds the file: only " + std::to_string(n - 8) +
                                " bytes follow the length field (truncated?)");
  return static_cast<std::size_t>(header_len);
}

// Parses the JSON header. Rejects malformed JSON, duplicate keys in any object (the format
// gives them no meaning) and a top level that is not an object.
inline nlohmann::json parse_header_json(const unsigned char* begin, std::size_t n,
                                        const std::string& label) {
  std::vector<std::set<std::string>> open_objects;  // keys seen in each enclosing object
  const auto reject_duplicates = [&](int, nlohmann::json::parse_event_t event,
                                     nlohmann::json& parsed) {
    using event_t = nlohmann::json::parse_event_t;
    if (event == event_t::object_start) open_objects.emplace_back();
    if (event == event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == event_t::key && !open_objects.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second)
        throw file_error(label, "header has a duplicate key '" + key + "'");
    }
    return true;
  };
  // nlohmann-json stops at a NUL byte as at the end of input; valid JSON text never contains one.
  if (const void* nul = std::memchr(begin, 0, n))
    throw file_error(label, "header is not well-formed JSON: NUL byte at offset " +
                                std::to_string(static_cast<const unsigned char*>(nul) - begin));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(begin, begin + n, reject_duplicates);
  } catch (const nlohmann::json::exception& e) {
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
      (v.is_number_float() ? "the non-integer number " + v.dump() : std::string(v.type_name()));
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
  if (!dtype) throw tensor_error(label, name, "unknown dtype " + it->dump());
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
                         "shape " + it->dump() + ": entry " + std::to_string(i) + ": " + problem);
    if (*d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw tensor_error(label, name, "shape " + it->dump() + ": dimension too large");
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
                       "'data_offsets' must be an array [begin, end], got " + it->dump());
  std::array<std::uint64_t, 2> offsets{};
  for (std::size_t i = 0; i < 2; ++i) {
    std::string problem;
    const std::optional<std::uint64_t> v = json_to_count((*it)[i], problem);
    if (!v) throw tensor_error(label, name, "data_offsets " + it->dump() + ": " + problem);
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

// ---------------------------------------------------------------------------------------------
// File
// ---------------------------------------------------------------------------------------------

// A validated safetensors file. Move-only; when opened from a path it owns a read-only mapping that
// its destructor unmaps. Every pointer and view it hands out (TensorInfo::data, matrix, vector)
// points into that mapping (or into the caller's buffer for parse) and dies with it.
class File {
 public:
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  File(File&&) = default;
  File& operator=(File&&) = default;
  ~File() = default;

  // Maps `path` read-only and validates it (see the top of this header). Throws FormatError naming
  // the path: strerror for a missing file or one that is not a regular file, the problem otherwise.
  static File open(const std::string& path) {
    detail::Mapping mapping = detail::Mapping::map_file(path);
    File file = parse(mapping.data(), mapping.size(), path);
    file.mapping_ = std::move(mapping);
    return file;
  }

  // Validates the n bytes at `bytes`, a buffer the caller owns and keeps alive (and unchanged) for
  // the life of the File: nothing is copied. `label` names the buffer in error messages.
  static File parse(const unsigned char* bytes, std::size_t n, std::string label = "<memory>") {
    File file;
    file.label_ = std::move(label);
    file.bytes_ = bytes;
    file.size_ = n;
    const std::size_t header_len = detail::read_header_length(bytes, n, file.label_);
    const nlohmann::json header = detail::parse_header_json(bytes + 8, header_len, file.label_);
    const unsigned char* data = bytes + 8 + header_len;
    const std::size_t data_size = n - 8 - header_len;
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__")
        file.metadata_ = detail::parse_metadata(entry, file.label_);
      else
        file.tensors_.emplace(name,
                              detail::parse_tensor(name, entry, data, data_size, file.label_));
    }
    detail::check_coverage(file.tensors_, data_size, file.label_);
    return file;
  }

  // The path (open) or label (parse) used in error messages.
  const std::string& label() const { return label_; }

  // The whole file: the mapping (open) or the caller's buffer (parse); size() bytes.
  const unsigned char* bytes() const { return bytes_; }
  std::size_t size() const { return size_; }

  // Number of tensors (the "__metadata__" entry is not a tensor).
  std::size_t tensor_count() const { return tensors_.size(); }

  // True when the file has a tensor called `name`.
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  // The tensor called `name`; throws FormatError naming the file and the missing tensor.
  const TensorInfo& tensor(const std::string& name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end())
      throw detail::file_error(label_, "no tensor named '" + name + "' (the file has " +
                                           std::to_string(tensors_.size()) + " tensors)");
    return it->second;
  }

  // All tensor names, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(tensors_.size());
    for (const auto& entry : tensors_) out.push_back(entry.first);
    return out;
  }

  // The "__metadata__" object (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // True when matrix<T>/vector<T> can view tensor `name` without a copy: its dtype is exactly
  // dtype_of<T>() and its data is aligned to alignof(T). Throws if there is no such tensor.
  template <class T>
  bool can_view(const std::string& name) const {
    const TensorInfo& info = tensor(name);
    return info.dtype == dtype_of<T>() && is_aligned<T>(info.data);
  }

  // Zero-copy view [rows, cols] of rank-2 tensor `name`, into the file's bytes. Requires dtype ==
  // dtype_of<T>() (FormatError), rank 2 (ShapeError) and data aligned to alignof(T) (FormatError);
  // use to_vector<T> for an explicit converting copy instead.
  template <class T>
  ConstMatrixMap<T> matrix(const std::string& name) const {
    const TensorInfo& info = checked_view<T>(name, 2, "matrix");
    return {reinterpret_cast<const T*>(info.data), static_cast<Index>(info.shape[0]),
            static_cast<Index>(info.shape[1])};
  }

  // Zero-copy view [n] of rank-1 tensor `name`; same requirements as matrix<T>.
  template <class T>
  ConstVectorMap<T> vector(const std::string& name) const {
    const TensorInfo& info = checked_view<T>(name, 1, "vector");
    return {reinterpret_cast<const T*>(info.data), static_cast<Index>(info.shape[0])};
  }

  // An owning, converted copy of tensor `name`, numel() values in C order, from F64, F32, F16 or
  // BF16 (F16 and BF16 exactly; F64 -> float rounds to nearest). Any alignment, any rank. Other
  // dtypes throw FormatError. This is the explicit (costly) path; views never convert.
  template <class T>
  std::vector<T> to_vector(const std::string& name) const {
    static_assert(std::is_floating_point<T>::value, "to_vector<T>: T must be float or double");
    const TensorInfo& info = tensor(name);
    const std::size_t n = static_cast<std::size_t>(info.numel());
    std::vector<T> out(n);
    switch (info.dtype) {
      case Dtype::F64:
        convert<double>(info.data, n, out.data(), [](double v) { return v; });
        break;
      case Dtype::F32:
        convert<float>(info.data, n, out.data(), [](float v) { return v; });
        break;
      case Dtype::F16:
        convert<std::uint16_t>(info.data, n, out.data(), f16_to_float);
        break;
      case Dtype::BF16:
        convert<std::uint16_t>(info.data, n, out.data(), bf16_to_float);
        break;
      default:
        throw detail::tensor_error(
            label_, name,
            std::string("to_vector converts F64, F32, F16 or BF16, got ") + dtype_name(info.dtype));
    }
    return out;
  }

 private:
  File() = default;

  template <class T>
  static bool is_aligned(const unsigned char* p) {
    return reinterpret_cast<std::uintptr_t>(p) % alignof(T) == 0;
  }

  // The checks shared by matrix<T> and vector<T>.
  template <class T>
  const TensorInfo& checked_view(const std::string& name, std::size_t rank,
                                 const char* what) const {
    const TensorInfo& info = tensor(name);
    const std::string call = std::string(what) + "<" + dtype_name(dtype_of<T>()) + ">";
    if (info.dtype != dtype_of<T>())
      throw detail::tensor_error(label_, name,
                                 call + " needs dtype " + dtype_name(dtype_of<T>()) + ", got " +
                                     dtype_name(info.dtype) +
                                     " (to_vector<T> makes an explicit converting copy)");
    if (info.shape.size() != rank)
      throw ShapeError(label_ + ": tensor '" + name + "': " + call + " expected rank " +
                       std::to_string(rank) + ", got rank " + std::to_string(info.shape.size()) +
                       " (shape " + gpt2::detail::shape_string(info.shape) + ")");
    if (!is_aligned<T>(info.data))
      throw detail::tensor_error(
          label_, name,
          call + " needs data aligned to " + std::to_string(alignof(T)) +
              " bytes, got data_offsets[0] = " + std::to_string(info.data_offset) +
              " (address misaligned by " +
              std::to_string(reinterpret_cast<std::uintptr_t>(info.data) % alignof(T)) +
              "; to_vector<T> makes an aligned copy)");
    return info;
  }

  // out[i] = T(decode(stored[i])) for n little-endian values of type Stored at `src` (any
  // alignment).
  template <class Stored, class T, class Decode>
  static void convert(const unsigned char* src, std::size_t n, T* out, Decode decode) {
    for (std::size_t i = 0; i < n; ++i) {
      Stored v;
      std::memcpy(&v, src + i * sizeof(Stored), sizeof(Stored));
      out[i] = static_cast<T>(decode(v));
    }
  }

  std::string label_;
  const unsigned char* bytes_ = nullptr;
  std::size_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  detail::Mapping mapping_;  // empty for parse()
};

// ---------------------------------------------------------------------------------------------
// One layer's attention weights
// ---------------------------------------------------------------------------------------------

template <class T>
class LoadedAttention;

// Loads layer `layer`'s attention sublayer: the tensors h.{layer}.attn.c_attn.weight [C, 3C],
// .c_attn.bias [3C], .c_proj.weight [C, C] and .c_proj.bias [C] (also under the prefix
// "transformer."). n_embd C is c_proj.bias's length (or c_attn.bias's / 3 when c_proj.bias is the
// odd one out); every other shape is checked against it. n_head = 0 means C / 64 (every GPT-2
// size).
//
// Ownership: a tensor stored as exactly T and aligned is a view into `file` (zero copy). Any other
// floating dtype (F16, BF16, F32 for T = double, F64 for T = float) or a misaligned tensor is
// converted explicitly into a buffer owned by the returned LoadedAttention, and zero_copy() is then
// false. `file` must outlive the result either way.
//
// Throws FormatError for a missing tensor (listing the names looked for) or a non-floating dtype,
// ShapeError for a wrong rank or shape (naming the tensor, expected and actual; a c_attn.weight
// stored [3C, C], as nn.Linear does, gets a hint that GPT-2's Conv1D stores [in, out]),
// ConfigError for a bad n_head.
template <class T>
LoadedAttention<T> load_attention(const File& file, int layer, Index n_head = 0);

// AttentionWeights<T> for one layer, plus the converted buffers it may point into. Movable (the
// buffers move with it, their addresses unchanged), not copyable.
template <class T>
class LoadedAttention {
 public:
  LoadedAttention(const LoadedAttention&) = delete;
  LoadedAttention& operator=(const LoadedAttention&) = delete;
  LoadedAttention(LoadedAttention&&) = default;
  LoadedAttention& operator=(LoadedAttention&&) = default;

  // Views valid while both this object and the File it was loaded from are alive.
  const AttentionWeights<T>& weights() const { return *weights_; }

  // True when all four tensors are views into the mapped file; false when any was converted.
  bool zero_copy() const { return zero_copy_; }

 private:
  friend LoadedAttention<T> load_attention<T>(const File&, int, Index);
  LoadedAttention() = default;

  // A pointer to tensor `name` as T: into the file when possible, else into `owned` (converted).
  const T* bind(const File& file, const std::string& name, std::vector<T>& owned) {
    if (file.can_view<T>(name)) return reinterpret_cast<const T*>(file.tensor(name).data);
    owned = file.to_vector<T>(name);
    zero_copy_ = false;
    return owned.data();
  }

  std::array<std::vector<T>, 4> owned_;  // c_attn.weight, c_attn.bias, c_proj.weight, c_proj.bias
  std::optional<AttentionWeights<T>> weights_;
  bool zero_copy_ = true;
};

namespace detail {

// "h.{layer}.attn." or "transformer.h.{layer}.attn.", whichever holds c_attn.weight.
inline std::string attention_prefix(const File& file, int layer) {
  const std::string plain = "h." + std::to_string(layer) + ".attn.";
  const std::string prefixed = "transformer." + plain;
  const bool has_plain = file.contains(plain + "c_attn.weight");
  const bool has_prefixed = file.contains(prefixed + "c_attn.weight");
  if (has_plain && has_prefixed)
    throw file_error(file.label(), "layer " + std::to_string(layer) + " attention: both '" + plain +
                                       "c_attn.weight' and '" + prefixed + "c_attn.weight' exist");
  if (!has_plain && !has_prefixed)
    throw file_error(file.label(),
                     "layer " + std::to_string(layer) + " attention: missing tensor '" + plain +
                         "c_attn.weight' (also looked for '" + prefixed + "c_attn.weight')");
  return has_plain ? plain : prefixed;
}

// Tensor `name` of an attention sublayer: present, of rank `rank` and a floating dtype.
inline const TensorInfo& attention_tensor(const File& file, const std::string& name,
                                          std::size_t rank) {
  if (!file.contains(name))
    throw file_error(file.label(), "attention: missing tensor '" + name + "'");
  const TensorInfo& info = file.tensor(name);
  if (info.shape.size() != rank)
    throw ShapeError(file.label() + ": tensor '" + name + "': expected rank " +
                     std::to_string(rank) + ", got rank " + std::to_string(info.shape.size()) +
                     " (shape " + gpt2::detail::shape_string(info.shape) + ")");
  const Dtype d = info.dtype;
  if (d != Dtype::F64 && d != Dtype::F32 && d != Dtype::F16 && d != Dtype::BF16)
    throw tensor_error(
        file.label(), name,
        std::string("expected a floating dtype (F64, F32, F16, BF16), got ") + dtype_name(d));
  return info;
}

// n_head = 0 -> n_embd / 64, as for every GPT-2 size.
inline Index default_n_head(Index n_embd, Index n_head, const std::string& label) {
  if (n_head != 0) return n_head;
  if (n_embd <= 0 || n_embd % 64 != 0)
    throw ConfigError(label +
                      ": n_head = 0 means n_embd / 64, but n_embd = " + std::to_string(n_embd) +
                      " is not a positive multiple of 64; pass n_head explicitly");
  return n_embd / 64;
}

// n_embd C of an attention sublayer, from the shapes of its tensors (c_attn.weight, c_attn.bias,
// c_proj.weight, c_proj.bias; ranks already checked): c_proj.bias [C]. When c_attn.bias is not
// [3C] but c_attn.bias / 3 matches a square c_proj.weight, c_proj.bias is the odd one out and C is
// c_attn.bias / 3. The weights' own shapes never decide: a transposed (nn.Linear [out, in])
// c_attn.weight must be reported against the right C.
inline Index attention_n_embd(const std::array<const TensorInfo*, 4>& infos) {
  const std::int64_t proj_bias = infos[3]->shape[0];
  const std::int64_t attn_bias = infos[1]->shape[0];
  if (attn_bias % 3 == 0 && attn_bias / 3 == proj_bias) return static_cast<Index>(proj_bias);
  const std::vector<std::int64_t>& proj_weight = infos[2]->shape;
  if (attn_bias % 3 == 0 && proj_weight[0] == attn_bias / 3 && proj_weight[1] == attn_bias / 3)
    return static_cast<Index>(attn_bias / 3);
  return static_cast<Index>(proj_bias);
}

// " (looks like nn.Linear [out, in]; ...)" when c_attn.weight's shape is [3C, C], else "".
inline std::string transposed_hint(const TensorInfo& c_attn_weight, Index C) {
  const std::vector<std::int64_t>& s = c_attn_weight.shape;
  if (C > 0 && s[1] == C && s[0] / 3 == C && s[0] % 3 == 0)
    return " (looks like nn.Linear [out, in]; GPT-2's Conv1D stores [in, out])";
  return "";
}

}  // namespace detail

template <class T>
LoadedAttention<T> load_attention(const File& file, int layer, Index n_head) {
  const std::string prefix = detail::attention_prefix(file, layer);
  const std::array<std::string, 4> names = {prefix + "c_attn.weight", prefix + "c_attn.bias",
                                            prefix + "c_proj.weight", prefix + "c_proj.bias"};
  const std::array<std::size_t, 4> ranks = {2, 1, 2, 1};
  std::array<const TensorInfo*, 4> infos{};
  for (std::size_t i = 0; i < 4; ++i)
    infos[i] = &detail::attention_tensor(file, names[i], ranks[i]);

  const Index C = detail::attention_n_embd(infos);
  const AttentionConfig config{C, detail::default_n_head(C, n_head, file.label())};

  LoadedAttention<T> loaded;
  std::array<const T*, 4> data{};
  for (std::size_t i = 0; i < 4; ++i) data[i] = loaded.bind(file, names[i], loaded.owned_[i]);
  const auto dim = [&](std::size_t i, std::size_t d) {
    return static_cast<Index>(infos[i]->shape[d]);
  };
  try {
    loaded.weights_.emplace(config, ConstMatrixMap<T>(data[0], dim(0, 0), dim(0, 1)),
                            ConstVectorMap<T>(data[1], dim(1, 0)),
                            ConstMatrixMap<T>(data[2], dim(2, 0), dim(2, 1)),
                            ConstVectorMap<T>(data[3], dim(3, 0)));
  } catch (const ShapeError& e) {  // "c_attn.weight: expected shape [8, 24], got [8, 16]"
    const std::string what = e.what();
    const std::string hint =
        what.rfind("c_attn.weight:", 0) == 0 ? detail::transposed_hint(*infos[0], C) : "";
    throw ShapeError(file.label() + ": " + prefix + what + hint);
  } catch (const ConfigError& e) {
    throw ConfigError(file.label() + ": layer " + std::to_string(layer) + ": " + e.what());
  }
  return loaded;
}

}  // namespace gpt2::safetensors
