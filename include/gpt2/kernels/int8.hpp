// The int8 scheme (docs/int8.md): how a float32 vector becomes int8 values and a scale, the
// packed layout of an int8 weight, and the scalar product every level reproduces bit for bit.
// Constants, scalar code and layout only: any header of the kernel layer may include it.
//
// Quantizing a block x[0, n) (n <= 32 for weights and activations, head_dim for the KV cache),
// every step a float32 operation, rounding to nearest even:
//   amax = max |x_k|; amax == 0: scale 0, every q_k = 0;
//   else scale = amax / 127, inv = 127 / amax, q_k = nearbyint(x_k * inv) clamped to [-127, 127]
//   (a NaN product counts as -127: a non-finite block gives a non-finite scale, hence non-finite
//   results). The value q_k * scale stands for x_k.
//
// A projection C[M, N] = bias + A[M, K] B[K, N] with an int8 weight:
//   B: blocks of kInt8Block rows of each column quantized (scale sw[b][j]); K padded with zero rows
//      up to Kp, a multiple of kInt8Block;
//   A: each row's blocks of kInt8Block columns quantized as the product runs (sa[i][b]: dynamic,
//      per row and block, so a row's values depend on that row alone);
//   C[i][j] = bias[j], then for b = 0, 1, ... in order, in float32:
//      C[i][j] = fma(float(d), sa[i][b] * sw[b][j], C[i][j]),  d = sum_k qa[i][k] qw[k][j]
//   (d: an exact integer, |d| <= 32 * 127 * 127 < 2^24, so float(d) is exact). Every level gives
//   these bits, whatever the rows, blocking or threads: decode == prefill.
//
// Int8 panel layout of B [K, N]: ceil(N / 32) panels of 32 columns (zero columns past N); panel p
// holds Kp / 32 blocks, each kInt8BlockBytes bytes: 1024 bytes of weights, then 32 float32 scales
// (sw[b][32 p + c] at float c). Byte (g, c, t) of a block, g = k4 group 0..7, c = column, t = k % 4,
// at g * 128 + c * 4 + t, holds qw + 128 (as unsigned: 1 .. 255, the operand VPDPBUSD takes
// unsigned; the activations are the signed one, and sum_k qa (qw + 128) - 128 sum_k qa = d).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "gpt2/types.hpp"

namespace gpt2::kernels {

inline constexpr Index kInt8Block = 32;                      // K per quantization block
inline constexpr Index kInt8PanelCols = 32;                  // columns of an int8 panel
inline constexpr Index kInt8WeightBytes = kInt8Block * kInt8PanelCols;  // 1024
inline constexpr Index kInt8BlockBytes = kInt8WeightBytes + kInt8PanelCols * 4;  // + scales
inline constexpr int kInt8Offset = 128;                      // stored weight = qw + 128

// K rounded up to a multiple of kInt8Block; the number of blocks.
inline Index int8_depth(Index K) { return (K + kInt8Block - 1) / kInt8Block * kInt8Block; }
inline Index int8_blocks(Index K) { return (K + kInt8Block - 1) / kInt8Block; }

// The block's scale from its largest magnitude amax (>= 0 or NaN): amax / 127 (0 for 0).
inline float int8_scale(float amax) { return amax == 0.0f ? 0.0f : amax / 127.0f; }
// The factor values are multiplied by before rounding: 127 / amax (0 for 0).
inline float int8_inverse(float amax) { return amax == 0.0f ? 0.0f : 127.0f / amax; }

// One value: nearbyint(x * inv) clamped to [-127, 127], NaN as -127 (the vector levels' max/min
// order: max(v, -127) gives -127 for a NaN v).
inline std::int8_t quantize_value(float x, float inv) {
  float v = x * inv;
  v = v >= -127.0f ? v : -127.0f;  // NaN -> -127
  v = v <= 127.0f ? v : 127.0f;
  return static_cast<std::int8_t>(std::nearbyint(v));
}

// The largest |x_k| of x[0, n) (NaN if any x_k is NaN).
inline float int8_amax(const float* x, Index n) {
  float amax = 0.0f;
  for (Index k = 0; k < n; ++k) {
    const float a = std::fabs(x[k]);
    amax = (a > amax || a != a) ? a : amax;
    if (amax != amax) return amax;
  }
  return amax;
}

// Quantizes x[0, n) into q[0, n): returns the block's scale.
inline float quantize_block(const float* x, Index n, std::int8_t* q) {
  const float amax = int8_amax(x, n);
  const float inv = int8_inverse(amax);
  for (Index k = 0; k < n; ++k) q[k] = quantize_value(x[k], inv);
  return int8_scale(amax);
}

// Byte offset of weight (k, j) (k within its block: k % 32) in block b of panel j / 32 of an int8
// packed matrix of nb blocks, and the offset of that block's scales.
inline Index int8_block_offset(Index b, Index j, Index nb) {
  return ((j / kInt8PanelCols) * nb + b) * kInt8BlockBytes;
}
inline Index int8_weight_offset(Index k, Index j, Index nb) {
  const Index kk = k % kInt8Block;
  return int8_block_offset(k / kInt8Block, j, nb) + (kk / 4) * 128 + (j % kInt8PanelCols) * 4 + kk % 4;
}

// Activations quantized for a projection: per row, Kp int8 values and, per block, its scale and
// -128 times the sum of its values (the correction of the unsigned weights' offset).
// int8_row_bytes(K): the bytes one row takes in a quantized block of rows.
inline Index int8_row_bytes(Index K) { return int8_depth(K) + int8_blocks(K) * 8; }

// Quantizes rows [0, rows) of A (stride lda, K columns) into buf: row i's Kp values at
// buf + i * Kp, then (after all rows) its nb scales (float) and nb corrections (int32) at
// buf + rows * Kp + (i * nb) * 8: scales first, then corrections, both [rows][nb] arrays.
struct Int8Rows {
  std::int8_t* q = nullptr;     // [rows][Kp]
  float* scale = nullptr;       // [rows][nb]
  std::int32_t* corr = nullptr; // [rows][nb]
  Index Kp = 0, nb = 0;
};
inline Int8Rows int8_rows_in(void* buf, Index rows, Index K) {
  Int8Rows r;
  r.Kp = int8_depth(K);
  r.nb = int8_blocks(K);
  r.q = static_cast<std::int8_t*>(buf);
  r.scale = reinterpret_cast<float*>(r.q + rows * r.Kp);
  r.corr = reinterpret_cast<std::int32_t*>(r.scale + rows * r.nb);
  return r;
}

// The scalar quantization of A's rows (every level's: the vector levels call it too, so that the
// quantized values cannot differ between levels; it is O(M K), beside the product's O(M N K)).
inline void quantize_rows(Index rows, Index K, const float* A, Index lda, const Int8Rows& r) {
  for (Index i = 0; i < rows; ++i) {
    const float* a = A + i * lda;
    std::int8_t* q = r.q + i * r.Kp;
    for (Index b = 0; b < r.nb; ++b) {
      const Index k0 = b * kInt8Block, n = K - k0 < kInt8Block ? K - k0 : kInt8Block;
      const float s = quantize_block(a + k0, n, q + k0);
      std::int32_t sum = 0;
      for (Index k = 0; k < n; ++k) sum += q[k0 + k];
      for (Index k = n; k < kInt8Block; ++k) q[k0 + k] = 0;
      r.scale[i * r.nb + b] = s;
      r.corr[i * r.nb + b] = -kInt8Offset * sum;
    }
  }
}

// Rows of A quantized at a time (the scratch a projection needs: kInt8ChunkRows rows of
// int8_row_bytes(K) bytes).
inline constexpr Index kInt8ChunkRows = 96;

// c[0, cols) of row i of the quantized rows r times one int8 panel (nb blocks): the scheme's
// arithmetic in plain C++ (the reference for the vector kernels): c = bias + ..., or c += ...
// without a bias.
inline void int8_row_panel(const Int8Rows& r, Index i, const std::uint8_t* panel, Index cols,
                           float* c, const float* bias) {
  float acc[kInt8PanelCols];
  for (Index j = 0; j < cols; ++j) acc[j] = bias != nullptr ? bias[j] : c[j];
  const std::int8_t* a = r.q + i * r.Kp;
  for (Index b = 0; b < r.nb; ++b, a += kInt8Block) {
    const std::uint8_t* block = panel + b * kInt8BlockBytes;
    std::int32_t d[kInt8PanelCols];
    for (Index j = 0; j < kInt8PanelCols; ++j) d[j] = r.corr[i * r.nb + b];
    for (Index g = 0; g < kInt8Block / 4; ++g)
      for (Index j = 0; j < kInt8PanelCols; ++j)
        for (Index t = 0; t < 4; ++t) d[j] += a[4 * g + t] * block[g * 128 + j * 4 + t];
    float sw[kInt8PanelCols];
    std::memcpy(sw, block + kInt8WeightBytes, sizeof sw);
    const float sa = r.scale[i * r.nb + b];
    for (Index j = 0; j < cols; ++j) acc[j] = std::fma(static_cast<float>(d[j]), sa * sw[j], acc[j]);
  }
  std::copy_n(acc, cols, c);
}

// C[M, N] = bias + A[M, K] B (or C += A B without a bias), B int8-packed from its first panel
// (Bp: PackedMatrix::int8_panels_from), in plain C++: A's rows quantized kInt8ChunkRows at a time
// into buf (int8_row_bytes(K) * min(M, kInt8ChunkRows) bytes, 4-byte aligned).
inline void gemm_int8_scalar(Index M, Index N, Index K, const float* A, Index lda,
                             const std::uint8_t* Bp, float* C, Index ldc, const float* bias,
                             void* buf) {
  const Index nb = int8_blocks(K);
  for (Index i0 = 0; i0 < M; i0 += kInt8ChunkRows) {
    const Index rows = std::min(kInt8ChunkRows, M - i0);
    const Int8Rows r = int8_rows_in(buf, rows, K);
    quantize_rows(rows, K, A + i0 * lda, lda, r);
    for (Index j0 = 0; j0 < N; j0 += kInt8PanelCols) {
      const std::uint8_t* panel = Bp + (j0 / kInt8PanelCols) * nb * kInt8BlockBytes;
      const Index cols = std::min(kInt8PanelCols, N - j0);
      for (Index i = 0; i < rows; ++i)
        int8_row_panel(r, i, panel, cols, C + (i0 + i) * ldc + j0,
                       bias != nullptr ? bias + j0 : nullptr);
    }
  }
}

}  // namespace gpt2::kernels
