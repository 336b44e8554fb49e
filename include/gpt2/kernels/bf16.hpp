// bfloat16 for the kernel layer: the number format, the packed layout of a bf16 weight, and the
// generic level's bf16 product.
//
// bfloat16 is the upper half of a float32: 1 sign bit, 8 exponent bits, 7 mantissa bits (the
// range of float32, 3 significant digits). Widening to float32 is exact (the bits shifted up by
// 16); rounding a float32 to bf16 is to nearest, ties to even (as PyTorch's .to(torch.bfloat16),
// oneDNN and VCVTNE2PS2BF16 do), NaN staying a (quiet) NaN of the same sign.
//
// bf16 panel layout of B [K, N] (a weight, packed once by PackedMatrix(B, WeightDtype::bf16)):
//   depth Kp = K rounded up to a multiple of 32 (zero rows past K), ceil(N / 32) panels of 32
//   columns (zero columns past N). Panel p holds Kp / 2 "pair rows" of 64 bf16 (128 bytes): pair
//   row r has B[2r, 32p + c] at 2c and B[2r + 1, 32p + c] at 2c + 1, for c = 0 .. 31:
//     element (k, j) at data[(j / 32) * Kp * 32 + (k / 2) * 64 + (j % 32) * 2 + k % 2]
//   64-byte aligned. It is the operand layout of both bf16 instructions (VNNI pairs): a 512-bit
//   load of half a pair row is what VDPBF16PS takes for 16 columns, and 16 pair rows of one half,
//   128 bytes apart, are an AMX B tile (16 rows of 64 bytes); the widening levels split the same
//   load into k even (the low halves shifted up) and k odd (the high halves masked).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gpt2/types.hpp"

namespace gpt2 {

namespace kernels {

inline constexpr Index kBf16DepthAlign = 32;  // Kp: K rounded up to this (an AMX tile's depth)
inline constexpr Index kBf16PanelCols = 32;   // columns of a bf16 panel (two AMX tiles' width)

// K rounded up to a multiple of kBf16DepthAlign.
inline Index bf16_depth(Index K) { return (K + kBf16DepthAlign - 1) / kBf16DepthAlign * kBf16DepthAlign; }

// Bits of float x.
inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// x rounded to the nearest bfloat16, ties to even; NaN -> a quiet NaN with x's sign; infinities
// and zeros keep their sign; float32 subnormals round to bf16 subnormals (exactly representable
// range, as PyTorch does).
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

// Element (k, j) of a bf16-packed B of depth Kp (see the layout above).
inline Index bf16_packed_offset(Index k, Index j, Index Kp) {
  return (j / kBf16PanelCols) * Kp * kBf16PanelCols + (k / 2) * 2 * kBf16PanelCols +
         (j % kBf16PanelCols) * 2 + k % 2;
}

}  // namespace kernels

namespace kernels::generic {

// C[M, N] += A[M, K] * B[K, N], B bf16-packed (depth Kp, from its first panel): each 32-column
// panel is widened to float32 into `buffer` (kPackFloats floats; up to 1024 rows of the panel at a
// time) and multiplied by Eigen (`multiply(A_block, B_block, C_block)`, which accumulates). A
// stays float32: the widening levels' arithmetic, in Eigen's order.
template <class Multiply>
void gemm_bf16(Index M, Index N, Index K, const float* A, Index lda, const std::uint16_t* Bp,
               Index Kp, float* C, Index ldc, float* buffer, Index buffer_floats,
               const Multiply& multiply) {
  const Index depth_block = std::max<Index>(2, buffer_floats / kBf16PanelCols / 2 * 2);
  for (Index j0 = 0; j0 < N; j0 += kBf16PanelCols) {
    const Index cols = std::min(kBf16PanelCols, N - j0);
    const std::uint16_t* panel = Bp + (j0 / kBf16PanelCols) * Kp * kBf16PanelCols;
    for (Index k0 = 0; k0 < K; k0 += depth_block) {
      const Index depth = std::min(depth_block, K - k0);
      for (Index k = 0; k < depth; ++k) {
        const std::uint16_t* pair_row = panel + ((k0 + k) / 2) * 2 * kBf16PanelCols + (k0 + k) % 2;
        for (Index c = 0; c < cols; ++c) buffer[k * cols + c] = bf16_to_float(pair_row[2 * c]);
      }
      using ConstStrided = Eigen::Map<const RowMatrix<float>, 0, Eigen::OuterStride<>>;
      using Strided = Eigen::Map<RowMatrix<float>, 0, Eigen::OuterStride<>>;
      const ConstMatrixRef<float> a(ConstStrided(A + k0, M, depth, Eigen::OuterStride<>(lda)));
      const ConstMatrixRef<float> b(ConstStrided(buffer, depth, cols, Eigen::OuterStride<>(cols)));
      MatrixRef<float> c(Strided(C + j0, M, cols, Eigen::OuterStride<>(ldc)));
      multiply(a, b, c);
    }
  }
}

}  // namespace kernels::generic
}  // namespace gpt2
