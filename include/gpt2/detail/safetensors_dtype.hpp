// The element types of gpt2::safetensors: Dtype, its size and header name, the Dtype stored for
// float/double, and the exact F16 and BF16 -> float decoders. Part of gpt2/safetensors.hpp:
// include that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "gpt2/detail/io_util.hpp"

namespace gpt2::safetensors {

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

}  // namespace gpt2::safetensors
