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

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpt2/config.hpp"
#include "gpt2/detail/io_util.hpp"
#include "gpt2/detail/mapping.hpp"             // read-only mmap
#include "gpt2/detail/safetensors_dtype.hpp"   // Dtype, F16/BF16 decoding
#include "gpt2/detail/safetensors_file.hpp"    // File: views and conversions
#include "gpt2/detail/safetensors_header.hpp"  // TensorInfo, header validation
#include "gpt2/error.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gpt2/safetensors.hpp: safetensors data is little-endian; big-endian hosts are not supported"
#endif

namespace gpt2::safetensors {

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
// Throws FormatError for a missing tensor (listing the names looked for, the file's first names,
// its tensor count and the closest name: File::tensor_hint) or a non-floating dtype,
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
                         "c_attn.weight' (also looked for '" + prefixed + "c_attn.weight'; " +
                         file.tensor_hint({plain + "c_attn.weight", prefixed + "c_attn.weight"}) +
                         ")");
  return has_plain ? plain : prefixed;
}

// Tensor `name` of an attention sublayer: present, of rank `rank` and a floating dtype.
inline const TensorInfo& attention_tensor(const File& file, const std::string& name,
                                          std::size_t rank) {
  if (!file.contains(name))
    throw file_error(file.label(), "attention: missing tensor '" + name + "' (" +
                                       file.tensor_hint({name}) + ")");
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
