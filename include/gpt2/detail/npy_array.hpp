// The element types and the loaded-array type of gpt2::npy: Dtype ('<f4' or '<f8') and Array, an
// owning array with its conversions to std::vector and RowMatrix. Part of gpt2/npy.hpp: include
// that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "gpt2/detail/io_util.hpp"
#include "gpt2/error.hpp"
#include "gpt2/types.hpp"

namespace gpt2::npy {

// The most dimensions an array may have: 8. numpy itself allows 32 (64 since numpy 2.0); the reader
// stops at 8 so that a hostile header costs little (the rank is checked, with the header's other
// fields, before any data are read or allocated), and the writer refuses more too, so that
// everything written here can be read here.
inline constexpr std::size_t max_dims = 8;

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
  std::vector<std::int64_t> shape;  // 1 to max_dims (8) non-negative dimensions
  std::vector<unsigned char> bytes;

  // Product of the shape. A zero dimension makes it 0 whatever the others are (a parsed shape's
  // nonzero dimensions are checked against the file size, but (huge, huge, 0) is 0 bytes: multiply
  // only when no dimension is 0, so the product cannot overflow; found by fuzz_npy).
  std::int64_t numel() const {
    for (std::int64_t d : shape)
      if (d == 0) return 0;
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

}  // namespace gpt2::npy
