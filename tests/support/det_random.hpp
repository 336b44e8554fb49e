// Deterministic, counter-based test data, reproduced bit for bit by tests/reference/generate.py.
//
// The reference fixtures store only a few rows of each result; the inputs (x and the four weight
// tensors) are regenerated here from a case's base seed S and the scales in its metadata:
//
//   mix(z)         = splitmix64 finaliser (det_mix below); all arithmetic mod 2^64
//   u(seed, i)     = mix(seed * 0x9E3779B97F4A7C15 + (i + 1) * 0xD1B54A32D192ED03)
//   value(seed, i) = ((u >> 11) * 2^-53) * 2 - 1       a double in [-1, 1); every step is exact
//   tensor[i]      = scale * value(seed, i)            i = row-major flat index
//
// Tensor seeds: x = S + 0, c_attn.weight = S + 1, c_attn.bias = S + 2, c_proj.weight = S + 3,
// c_proj.bias = S + 4 (the kSeedOffset* constants).
//
// For T = float the double `scale * value` is computed first and then rounded to nearest by
// static_cast, exactly like numpy's astype(np.float32) in the generator. The double product is a
// single IEEE multiply, so the values match bit for bit on any conforming platform.
#pragma once

#include <cstdint>

#include "gpt2/types.hpp"

namespace gpt2::test {

inline constexpr std::uint64_t kSeedOffsetX = 0;
inline constexpr std::uint64_t kSeedOffsetCAttnWeight = 1;
inline constexpr std::uint64_t kSeedOffsetCAttnBias = 2;
inline constexpr std::uint64_t kSeedOffsetCProjWeight = 3;
inline constexpr std::uint64_t kSeedOffsetCProjBias = 4;

// splitmix64's finaliser: a bijection on 64-bit integers with good avalanche.
constexpr std::uint64_t det_mix(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The 64 random bits for element i of the stream `seed`.
constexpr std::uint64_t det_bits(std::uint64_t seed, std::uint64_t i) noexcept {
  return det_mix(seed * 0x9E3779B97F4A7C15ULL + (i + 1) * 0xD1B54A32D192ED03ULL);
}

// value(seed, i): a double in [-1, 1) with 53 random bits. (u >> 11) < 2^53 converts exactly, the
// scaling by 2^-53 and 2 is exact, and so is the subtraction of 1, so no rounding mode, FMA
// contraction or x87 excess precision can change the result.
constexpr double det_value(std::uint64_t seed, std::uint64_t i) noexcept {
  return static_cast<double>(det_bits(seed, i) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

// rows x cols matrix, element (r, c) = T(scale * det_value(seed, r * cols + c)).
template <class T>
RowMatrix<T> det_matrix(std::uint64_t seed, Index rows, Index cols, double scale) {
  RowMatrix<T> m(rows, cols);
  for (Index r = 0; r < rows; ++r)
    for (Index c = 0; c < cols; ++c) {
      const auto i = static_cast<std::uint64_t>(r) * static_cast<std::uint64_t>(cols) +
                     static_cast<std::uint64_t>(c);
      m(r, c) = static_cast<T>(scale * det_value(seed, i));
    }
  return m;
}

// Vector of n elements, element i = T(scale * det_value(seed, i)) (a bias).
template <class T>
RowVector<T> det_vector(std::uint64_t seed, Index n, double scale) {
  RowVector<T> v(n);
  for (Index i = 0; i < n; ++i)
    v(i) = static_cast<T>(scale * det_value(seed, static_cast<std::uint64_t>(i)));
  return v;
}

}  // namespace gpt2::test
