// safetensors::File: a validated safetensors file (mapped from a path, or over the caller's
// buffer), its tensors and metadata, zero-copy Eigen views (matrix, vector) and explicit
// converting copies (to_vector). Part of gpt2/safetensors.hpp: include that.
//
// Requires POSIX mmap (and nlohmann-json in the header-only mode: detail/safetensors_header.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt2/detail/io_util.hpp"
#include "gpt2/detail/mapping.hpp"             // read-only mmap
#include "gpt2/detail/safetensors_dtype.hpp"   // Dtype, F16/BF16 decoding
#include "gpt2/detail/safetensors_header.hpp"  // TensorInfo, header validation
#include "gpt2/error.hpp"
#include "gpt2/types.hpp"

namespace gpt2::safetensors {

namespace detail {

// Levenshtein distance between a and b (insertions, deletions, substitutions), or a value above
// `bound` once it is certain to exceed it (the caller keeps the best so far: most names are
// abandoned after a row or two). Two rows of b.size() + 1 counts.
inline std::size_t edit_distance(const std::string& a, const std::string& b, std::size_t bound) {
  const std::size_t gap = a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
  if (gap > bound) return bound + 1;
  std::vector<std::size_t> prev(b.size() + 1), row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    std::size_t row_min = row[0];
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({prev[j] + 1, row[j - 1] + 1, substitute});
      row_min = std::min(row_min, row[j]);
    }
    if (row_min > bound) return bound + 1;
    std::swap(prev, row);
  }
  return prev[b.size()];
}

// A name as quoted in a message: cut at 80 characters ("...").
inline std::string quoted_name(const std::string& name) {
  constexpr std::size_t max_chars = 80;
  return "'" + (name.size() > max_chars ? name.substr(0, max_chars) + "..." : name) + "'";
}

// "the file has 7 tensors: 'a', 'b', 'c', 'd', 'e' and 2 more; closest: 'h.0.attn.c_attn.weight'"
// for a file whose tensors (sorted) do not include any of `wanted`: the first five names, the
// count, and the name nearest to one of `wanted` by edit distance (the first in sorted order on a
// tie; names over 1024 characters are listed but not compared, so a hostile header cannot make
// the message costly). "the file has no tensors" for an empty file.
template <class Tensors>
std::string tensor_names_hint(const Tensors& tensors, const std::vector<std::string>& wanted) {
  if (tensors.empty()) return "the file has no tensors";
  constexpr std::size_t listed = 5;
  std::string out = "the file has " + std::to_string(tensors.size()) +
                    (tensors.size() == 1 ? " tensor: " : " tensors: ");
  std::size_t i = 0;
  const std::string* closest = nullptr;
  std::size_t best = static_cast<std::size_t>(-1);
  for (const auto& entry : tensors) {
    const std::string& name = entry.first;
    if (i < listed) out += (i ? ", " : "") + quoted_name(name);
    ++i;
    if (name.size() > 1024) continue;
    for (const std::string& w : wanted) {
      const std::size_t d = edit_distance(name, w, best);  // exact when at most best
      if (d < best) {
        best = d;
        closest = &name;
      }
    }
  }
  if (tensors.size() > listed) out += " and " + std::to_string(tensors.size() - listed) + " more";
  return closest == nullptr ? out : out + "; closest: " + quoted_name(*closest);
}

}  // namespace detail

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
  // the path: strerror for a missing file or one that is not a regular file, the problem otherwise;
  // "safetensors: empty file name" for "" (there is no path to name).
  static File open(const std::string& path) {
    if (path.empty()) throw FormatError("safetensors: empty file name");
    gpt2::detail::Mapping mapping = gpt2::detail::Mapping::map_file(path);
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
    detail::ParsedHeader parsed = detail::parse_header(bytes, n, file.label_);
    file.tensors_ = std::move(parsed.tensors);
    file.metadata_ = std::move(parsed.metadata);
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

  // The tensor called `name`; throws FormatError naming the file and the missing tensor, with
  // tensor_hint({name}): "x.safetensors: no tensor named 'h.0.attn.c_atn.weight' (the file has 7
  // tensors: 'h.0.attn.c_attn.bias', ... and 2 more; closest: 'h.0.attn.c_attn.weight')".
  const TensorInfo& tensor(const std::string& name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end())
      throw detail::file_error(label_, "no tensor named " + detail::quoted_name(name) + " (" +
                                           tensor_hint({name}) + ")");
    return it->second;
  }

  // What a message about a missing tensor says of the file: its tensor count, the first five
  // names (sorted) and the name closest (by edit distance) to one of `wanted`, e.g.
  // "the file has 7 tensors: 'a', 'b', 'c', 'd', 'e' and 2 more; closest: 'h.0.attn.c_attn.weight'",
  // or "the file has no tensors". Names are cut at 80 characters.
  std::string tensor_hint(const std::vector<std::string>& wanted) const {
    return detail::tensor_names_hint(tensors_, wanted);
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
  gpt2::detail::Mapping mapping_;  // empty for parse()
};

}  // namespace gpt2::safetensors
