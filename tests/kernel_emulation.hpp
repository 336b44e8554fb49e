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
  const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<int>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return mul(y, two_n);
}

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

// The fused attention core (kernels/attention_tile.hpp's steps) for `rows` query rows at positions
// first_pos .. (row stride ldq), key and value row j at keys[j], values[j] (head_dim floats), one
// row at a time; out rows ldo apart.
inline void attention_tile(Index rows, Index first_pos, Index head_dim, const float* q, Index ldq,
                           const float* const* keys, const float* const* values, float scale,
                           float* out, Index ldo) {
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
      for (Index j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (Index d = 0; d < head_dim; ++d) acc = std::fma(qs[d], keys[b0 + j][d], acc);
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
        p[j] = j < n ? kexp(sub(s[j], zb)) : 0.0f;
        lanes[j % 16] = add(lanes[j % 16], p[j]);
      }
      float u[8], v[4], w[2];
      for (int i = 0; i < 8; ++i) u[i] = add(lanes[i], lanes[i + 8]);
      for (int i = 0; i < 4; ++i) v[i] = add(u[i], u[i + 4]);
      for (int i = 0; i < 2; ++i) w[i] = add(v[i], v[i + 2]);
      const float lb = add(w[0], w[1]);
      const float m_new = (std::isnan(m) || std::isnan(mb)) ? nan : std::max(m, mb);
      const float z_new = m_new == minus_inf ? 0.0f : m_new;
      const float a = m == minus_inf ? 0.0f : kexp(sub(z, z_new));
      const float c = mb == minus_inf ? 0.0f : kexp(sub(zb, z_new));
      l = std::fma(lb, c, mul(l, a));
      for (Index d = 0; d < head_dim; ++d) {
        float acc = 0.0f;
        for (Index j = 0; j < n; ++j) acc = std::fma(p[j], values[b0 + j][d], acc);
        o[d] = std::fma(acc, c, mul(o[d], a));
      }
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
