// The data layouts every kernel level reads: the float32 panel layout of a packed weight, the
// bfloat16 number format, and the bf16 panel layout of a bf16 weight (kernels/pack.hpp makes both
// copies). Constants and conversions only: any header of the kernel layer may include it.
//
// Float32 panel layout of B [K, N]: ceil(N / 32) panels; panel p holds columns [32 p, 32 p + 32)
// as K rows of 32 floats, zeros past N: element (k, j) at data[(j / 32) * K * 32 + k * 32 + j % 32].
//
// bfloat16 is the upper half of a float32: 1 sign bit, 8 exponent bits, 7 mantissa bits. Widening
// to float32 is exact (the bits shifted up by 16); rounding a float32 to bf16 is to nearest, ties
// to even (as PyTorch's .to(torch.bfloat16), oneDNN and VCVTNE2PS2BF16 do), NaN staying a quiet NaN
// of the same sign.
//
// bf16 panel layout of B [K, N]: depth Kp = K rounded up to a multiple of 32 (zero rows past K),
// ceil(N / 32) panels of 32 columns (zero columns past N). Panel p holds Kp / 2 "pair rows" of 64
// bf16 (128 bytes): pair row r has B[2r, 32p + c] at 2c and B[2r + 1, 32p + c] at 2c + 1:
//   element (k, j) at data[(j / 32) * Kp * 32 + (k / 2) * 64 + (j % 32) * 2 + k % 2]
// It is the operand layout of both bf16 instructions (VNNI pairs): half a pair row is what
// VDPBF16PS takes for 16 columns, and 16 pair rows of one half are an AMX B tile; the widening
// levels split the same load into k even and k odd. Both layouts are 64-byte aligned.
#pragma once

#include <cstdint>
#include <cstring>

#include "gpt2/types.hpp"

namespace gpt2::kernels {

inline constexpr Index kPanelCols = 32;       // columns of a float32 panel
inline constexpr Index kPackFloats = 32768;   // floats of a per-call packing buffer (GemmScratch)
inline constexpr Index kBf16DepthAlign = 32;  // Kp: K rounded up to this (an AMX tile's depth)
inline constexpr Index kBf16PanelCols = 32;   // columns of a bf16 panel (two AMX tiles' width)

// K rounded up to a multiple of kBf16DepthAlign.
inline Index bf16_depth(Index K) {
  return (K + kBf16DepthAlign - 1) / kBf16DepthAlign * kBf16DepthAlign;
}

// Bits of float x.
inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// x rounded to the nearest bfloat16, ties to even; NaN -> a quiet NaN with x's sign; infinities
// and zeros keep their sign; float32 subnormals round to bf16 subnormals (as PyTorch does).
inline std::uint16_t round_to_bf16(float x) {
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

// The float32 value of bf16 bits b (exact).
inline float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// Element (k, j) of a bf16-packed B of depth Kp.
inline Index bf16_packed_offset(Index k, Index j, Index Kp) {
  return (j / kBf16PanelCols) * Kp * kBf16PanelCols + (k / 2) * 2 * kBf16PanelCols +
         (j % kBf16PanelCols) * 2 + k % 2;
}

}  // namespace gpt2::kernels
