// Scalar emulation of the kernel layer's bit-for-bit orders (the "Bit-for-bit contracts" of the
// kernel interface), with std::fma and plain float operations, one element at a time.
// Every ISA level's kernels are compared with these bit for bit. Slow and obviously in order:
// each rounding the contract names is one operation here, and every product and sum goes through
// rounded() (a volatile store) so that the compiler cannot contract a product and a sum into a
// fused multiply-add (GCC does so across statements under -std=gnu++17's -ffp-contract=fast).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/layout.hpp"
#include "gpt2/types.hpp"

namespace gpt2::test::emulation {

using gpt2::Index;

// v rounded to float and opaque to the optimizer (no contraction with what follows).
inline float rounded(float v) {
  volatile float stored = v;
  return stored;
}
inline float mul(float a, float b) { return rounded(a * b); }
inline float add(float a, float b) { return rounded(a + b); }
inline float sub(float a, float b) { return rounded(a - b); }

// C[M, N] += A[M, K] * B[K, N], row-major with row strides lda, ldb, ldc: each element one chain
// of fused multiply-adds, k = 0 .. K-1, from C's value.
inline void gemm(Index M, Index N, Index K, const float* A, Index lda, const float* B, Index ldb,
                 float* C, Index ldc) {
  for (Index i = 0; i < M; ++i)
    for (Index j = 0; j < N; ++j) {
      float c = C[i * ldc + j];
      for (Index k = 0; k < K; ++k) c = std::fma(A[i * lda + k], B[k * ldb + j], c);
      C[i * ldc + j] = c;
    }
}

// c[1, N] += a[1, K] * B[K, N]: gemm's row.
inline void row_times_matrix(Index N, Index K, const float* a, const float* B, Index ldb,
                             float* c) {
  gemm(1, N, K, a, K, B, ldb, c, N);
}

// The sum of 16 lane values in the fixed tree of lane_sums16:
// t_g = (x[4g] + x[4g+2]) + (x[4g+1] + x[4g+3]), sum = (t_0 + t_1) + (t_2 + t_3).
inline float lane_sums16(const float (&x)[16]) {
  float t[4];
  for (int g = 0; g < 4; ++g)
    t[g] = add(add(x[4 * g], x[4 * g + 2]), add(x[4 * g + 1], x[4 * g + 3]));
  return add(add(t[0], t[1]), add(t[2], t[3]));
}

// c[j] = dot(a[0, K), row j of B) for j < N (row stride ldb): lane l (0..15) a fused
// multiply-add chain over d = l, l + 16, ... from +0, then lane_sums16.
inline void row_times_transposed(Index N, Index K, const float* a, const float* B, Index ldb,
                                 float* c) {
  for (Index j = 0; j < N; ++j) {
    float lane[16] = {};
    for (Index d = 0; d < K; ++d) lane[d % 16] = std::fma(a[d], B[j * ldb + d], lane[d % 16]);
    c[j] = lane_sums16(lane);
  }
}

// y * 2^n rounded once, for a whole n in [-126, 127] (2^n built in the exponent field): the last
// step of kexp and kexp2.
inline float times_pow2(float y, float n) {
  const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<int>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return mul(y, two_n);
}

// exp(x) in the documented order: NaN kept, 0 below -87.33654, x capped at 88, n =
// nearbyint(x log2 e), r = x - n ln 2 in two steps, a degree-5 polynomial p, y = p r^2 + r + 1,
// y * 2^n.
inline float kexp(float x) {
  if (std::isnan(x)) return x;
  if (x < -87.33654f) return 0.0f;
  if (x > 88.0f) x = 88.0f;
  const float n = std::nearbyint(mul(x, 1.44269504088896341f));
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500E-4f;
  p = std::fma(p, r, 1.3981999507E-3f);
  p = std::fma(p, r, 8.3334519073E-3f);
  p = std::fma(p, r, 4.1665795894E-2f);
  p = std::fma(p, r, 1.6666665459E-1f);
  p = std::fma(p, r, 5.0000001201E-1f);
  const float y = add(std::fma(p, mul(r, r), r), 1.0f);
  return times_pow2(y, n);
}

// 2^x in the fused core's order (kernels/attention_tile.hpp's kexp2): NaN kept, 0 below -126, x
// capped at 127, n = nearbyint(x), f = x - n (exact), p = c6, p = fma(p, f, c_k) for k = 5 .. 1,
// y = fma(p, f, 1), y * 2^n.
inline float kexp2(float x) {
  if (std::isnan(x)) return x;
  if (x < -126.0f) return 0.0f;
  if (x > 127.0f) x = 127.0f;
  const float n = std::nearbyint(x);
  const float f = sub(x, n);
  float p = gpt2::kernels::kExp2Poly[0];
  for (int k = 1; k < 6; ++k) p = std::fma(p, f, gpt2::kernels::kExp2Poly[k]);
  return times_pow2(std::fma(p, f, 1.0f), n);
}

// e^x in the fused core's order (kernels/attention_tile.hpp's kexpe): kexp2(x L), x L rounded.
inline float kexpe(float x) { return kexp2(mul(x, gpt2::kernels::kLog2eF)); }

// In place: x_j = row[j] * scale; row[j] = softmax(x)_j for j < n; row[j] = 0 for n <= j < n_keys.
// Steps: max from -inf (NaN if any x is NaN); e_j = kexp(x_j - max); 16 lane sums (lane j mod 16)
// reduced s_i + s_{i+8}, + 4, + 2, + 1; row[j] = e_j * (1 / sum).
inline void softmax_row(float* row, Index n, Index n_keys, float scale) {
  std::vector<float> x(static_cast<std::size_t>(n)), e(static_cast<std::size_t>(n));
  float m = -std::numeric_limits<float>::infinity();
  bool any_nan = false;
  for (Index j = 0; j < n; ++j) {
    x[j] = mul(row[j], scale);
    if (std::isnan(x[j]))
      any_nan = true;
    else if (x[j] > m)
      m = x[j];
  }
  if (any_nan) m = std::numeric_limits<float>::quiet_NaN();
  float s[16] = {};
  for (Index j = 0; j < n; ++j) {
    e[j] = kexp(sub(x[j], m));
    s[j % 16] = add(s[j % 16], e[j]);
  }
  float u[8], v[4], w[2];
  for (int i = 0; i < 8; ++i) u[i] = add(s[i], s[i + 8]);
  for (int i = 0; i < 4; ++i) v[i] = add(u[i], u[i + 4]);
  for (int i = 0; i < 2; ++i) w[i] = add(v[i], v[i + 2]);
  const float sum = add(w[0], w[1]);
  const float inv = rounded(1.0f / sum);
  for (Index j = 0; j < n; ++j) row[j] = mul(e[j], inv);
  for (Index j = n; j < n_keys; ++j) row[j] = 0.0f;
}

// x as a bf16 instruction reads it: rounded to bf16 (nearest even), a bf16 subnormal as zero. (The
// hardware's rounding flushes a float32 subnormal first, so one just below 2^-126 that rounds up to
// 2^-126 would differ: the tests' data has none.)
inline float bf16_operand(float x) {
  const std::uint16_t b = gpt2::kernels::round_to_bf16(x);
  if ((b & 0x7f80u) == 0) return (b & 0x8000u) != 0 ? -0.0f : 0.0f;
  return gpt2::kernels::bf16_to_float(b);
}

// acc + a_hi b_hi, then + a_lo b_lo: one VDPBF16PS lane (each product exact in float32, each sum
// rounded; the operands as bf16_operand reads them). Subnormal sums and accumulators, which the
// instruction flushes to zero, are left as they are: the tests' data never makes them.
inline float dot_pair(float acc, float a_lo, float a_hi, float b_lo, float b_hi) {
  acc = std::fma(bf16_operand(a_hi), bf16_operand(b_hi), acc);
  return std::fma(bf16_operand(a_lo), bf16_operand(b_lo), acc);
}

// The score of qs against one key over head_dim components, from +0: one fused multiply-add
// chain over d in order, or, in bf16 pairs (avx512_bf16's core for bf16 weights over the blocks
// before a row's own, kernels/avx512_bf16_attention.hpp), one dot_pair per pair of components
// (2k, 2k + 1) in order (0 past head_dim).
inline float block_score(const float* qs, const float* key, Index head_dim, bool pairs) {
  float acc = 0.0f;
  if (!pairs) {
    for (Index d = 0; d < head_dim; ++d) acc = std::fma(qs[d], key[d], acc);
    return acc;
  }
  for (Index d = 0; d < head_dim; d += 2)
    acc = dot_pair(acc, qs[d], d + 1 < head_dim ? qs[d + 1] : 0.0f, key[d],
                   d + 1 < head_dim ? key[d + 1] : 0.0f);
  return acc;
}

// Column d of a block's p v over its n visible keys, from +0: one fused multiply-add chain over the
// keys in order, or in bf16 pairs one dot_pair per pair of keys (2i, 2i + 1) in order (a full
// block).
inline float block_pv(const float* p, const float* const* values, Index d, Index n, bool pairs) {
  float acc = 0.0f;
  if (!pairs) {
    for (Index j = 0; j < n; ++j) acc = std::fma(p[j], values[j][d], acc);
    return acc;
  }
  for (Index j = 0; j < n; j += 2) acc = dot_pair(acc, p[j], p[j + 1], values[j][d], values[j + 1][d]);
  return acc;
}

// The fused attention core (kernels/attention_tile.hpp's steps) for `rows` query rows at positions
// first_pos .. (row stride ldq), key and value row j at keys[j], values[j] (head_dim floats), one
// row at a time; out rows ldo apart. bf16_pairs: both products in bf16 pairs for the blocks
// before a row's own (avx512_bf16's core for bf16 weights; its own block stays float32).
inline void attention_tile(Index rows, Index first_pos, Index head_dim, const float* q, Index ldq,
                           const float* const* keys, const float* const* values, float scale,
                           float* out, Index ldo, bool bf16_pairs = false) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> qs(static_cast<std::size_t>(head_dim)), o(qs.size()), ob(qs.size());
  for (Index r = 0; r < rows; ++r) {
    const Index pos = first_pos + r;
    for (Index d = 0; d < head_dim; ++d) qs[d] = mul(q[r * ldq + d], scale);
    float m = minus_inf, z = 0.0f, l = 0.0f;
    std::fill(o.begin(), o.end(), 0.0f);
    for (Index b0 = 0; b0 <= pos; b0 += 64) {
      const Index n = std::min<Index>(64, pos + 1 - b0);
      float s[64], p[64];
      float mb = minus_inf;
      bool any_nan = false;
      const bool pairs = bf16_pairs && b0 + 64 <= pos;  // a block before the row's own
      for (Index j = 0; j < n; ++j) {
        const float acc = block_score(qs.data(), keys[b0 + j], head_dim, pairs);
        s[j] = acc;
        if (std::isnan(acc))
          any_nan = true;
        else if (acc > mb)
          mb = acc;
      }
      if (any_nan) mb = nan;
      const float zb = mb == minus_inf ? 0.0f : mb;
      float lanes[16] = {};
      for (Index j = 0; j < 64; ++j) {
        p[j] = j < n ? kexpe(sub(s[j], zb)) : 0.0f;
        lanes[j % 16] = add(lanes[j % 16], p[j]);
      }
      float u[8], v[4], w[2];
      for (int i = 0; i < 8; ++i) u[i] = add(lanes[i], lanes[i + 8]);
      for (int i = 0; i < 4; ++i) v[i] = add(u[i], u[i + 4]);
      for (int i = 0; i < 2; ++i) w[i] = add(v[i], v[i + 2]);
      const float lb = add(w[0], w[1]);
      const float m_new = (std::isnan(m) || std::isnan(mb)) ? nan : std::max(m, mb);
      const float z_new = m_new == minus_inf ? 0.0f : m_new;
      const float a = m == minus_inf ? 0.0f : kexpe(sub(z, z_new));
      const float c = mb == minus_inf ? 0.0f : kexpe(sub(zb, z_new));
      l = std::fma(lb, c, mul(l, a));
      for (Index d = 0; d < head_dim; ++d)
        o[d] = std::fma(block_pv(p, values + b0, d, n, pairs), c, mul(o[d], a));
      m = m_new;
      z = z_new;
    }
    for (Index d = 0; d < head_dim; ++d) out[r * ldo + d] = rounded(o[d] / l);
  }
}

// B[K, N] (row stride ldb) in the panel layout: ceil(N / 32) panels of K rows of 32 floats,
// element (k, j) at [(j / 32) * K * 32 + k * 32 + j % 32], zeros past N.
inline std::vector<float> pack_panels_reference(Index K, Index N, const float* B, Index ldb) {
  const Index panels = (N + 31) / 32;
  std::vector<float> packed(static_cast<std::size_t>(panels * K * 32), 0.0f);
  for (Index k = 0; k < K; ++k)
    for (Index j = 0; j < N; ++j) packed[(j / 32) * K * 32 + k * 32 + j % 32] = B[k * ldb + j];
  return packed;
}

}  // namespace gpt2::test::emulation
