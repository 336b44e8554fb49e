// AVX-512 float kernels for products with one row on the left (a decode step), all row-major:
//   row_times_matrix:     c[1, N] += a[1, K] * B[K, N]    (the projections, att v)
//   row_times_transposed: c[1, N]  = a[1, K] * B[N, K]^T  (q k^T: one query against its keys)
// A decode step reads every weight and cached key and value once and does little arithmetic with
// each, so these kernels are written for the memory system: long contiguous reads, and software
// prefetches where the hardware's own do not reach (the rows of B, 9 KB apart in c_attn.weight,
// each on another 4 KB page).
#pragma once

#include <algorithm>
#include <cstdint>

#include "gpt2/types.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#define GPT2_ATTENTION_AVX512_GEMM 1
#else
#define GPT2_ATTENTION_AVX512_GEMM 0
#endif

#if GPT2_ATTENTION_AVX512_GEMM
namespace gpt2::detail::avx512 {

// Lanes of a 16-float vector that hold columns [j, n) (all 16 when n - j >= 16).
inline __mmask16 lanes(Index j, Index n) {
  const Index count = std::max<Index>(0, std::min<Index>(16, n - j));
  return static_cast<__mmask16>((std::uint32_t(1) << count) - 1);
}

// Rows of B ahead of the one being read that row_strip prefetches. Measured from DRAM (12 distinct
// layers): the QKV product went from about 15 to 34 GB/s on 1 thread; 4 rows was a little ahead of
// 8, 16 and 32 on 2 threads. att v's reads of the values, contiguous, gain too (a decode step's
// attention ran 40% slower without it).
inline constexpr Index kPrefetchRows = 4;

// c[j0, j0 + 16 V) += a[1, K] * B[K, j0 .. j0 + 16 V) in V accumulators (columns past N masked),
// prefetching the strip's row k + kPrefetchRows while reading row k.
template <int V>
inline void row_strip(Index j0, Index N, Index K, const float* a, const float* B, Index ldb,
                      float* c) {
  __mmask16 m[V];
  __m512 acc[V];
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v) {
    m[v] = lanes(j0 + 16 * v, N);
    acc[v] = _mm512_maskz_loadu_ps(m[v], c + j0 + 16 * v);
  }
  const auto step = [&](Index k) {
    const __m512 ak = _mm512_set1_ps(a[k]);
    const float* b = B + k * ldb + j0;
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v)
      acc[v] = _mm512_fmadd_ps(ak, _mm512_maskz_loadu_ps(m[v], b + 16 * v), acc[v]);
  };
  Index k = 0;
  for (; k + kPrefetchRows < K; ++k) {
    const char* ahead = reinterpret_cast<const char*>(B + (k + kPrefetchRows) * ldb + j0);
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) _mm_prefetch(ahead + 64 * v, _MM_HINT_T0);
    step(k);
  }
  for (; k < K; ++k) step(k);
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(c + j0 + 16 * v, m[v], acc[v]);
}

// C[1, N] += a[1, K] * B[K, N]: 128 columns at a time in 8 accumulators while B's rows stream by,
// 512 contiguous bytes of each (measured faster than 64, 96, 256 or 384 columns, and than Eigen's
// GEMV, on GPT-2 small's shapes); the last columns 64 at a time. Same sums as gemm_kernel.hpp's
// micro_tile: one chain of multiply-adds per element, k in order, so a row gives the same bits
// here as in a product of many rows.
inline void row_times_matrix(Index N, Index K, const float* a, const float* B, Index ldb, float* c) {
  Index j0 = 0;
  for (; j0 + 128 <= N; j0 += 128) row_strip<8>(j0, N, K, a, B, ldb, c);
  for (; j0 < N; j0 += 64) row_strip<4>(j0, N, K, a, B, ldb, c);
}

// The 16 sums of 16 vectors: lane i of the result is the sum of x = p[i]'s 16 lanes, added in this
// fixed order (a bit-for-bit contract, checked by tests/test_gemm.cpp):
//   t_g = (x[4g] + x[4g+2]) + (x[4g+1] + x[4g+3])   for g = 0 .. 3
//   sum = (t_0 + t_1) + (t_2 + t_3)
// 15 vector additions for the 16 sums.
inline __m512 lane_sums16(const __m512 (&p)[16]) {
  __m512 q[8], r[4], s[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // lanes 4l..4l+3 of q[i]: p[2i], p[2i+1], p[2i], p[2i+1] partials
    q[i] = _mm512_add_ps(_mm512_unpacklo_ps(p[2 * i], p[2 * i + 1]),
                         _mm512_unpackhi_ps(p[2 * i], p[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // each 128-bit lane of r[i]: one partial of p[4i] .. p[4i+3]
    r[i] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * i], q[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(q[2 * i], q[2 * i + 1], 0xEE));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // 128-bit lanes: r[2i] halves, then r[2i+1] halves
    s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s[0], s[1], 0x88),
                       _mm512_shuffle_f32x4(s[0], s[1], 0xDD));
}

// The 16 partial sums of a[0, K) . r[0, K): lane l adds a[d] r[d] over d = l (mod 16), in order.
// kDepth: K known at compile time (the loop unrolled), or 0 for a run-time K.
template <Index kDepth>
inline __m512 dot_lanes(const float* a, const float* r, Index K) {
  if constexpr (kDepth > 0) K = kDepth;
  __m512 acc = _mm512_setzero_ps();
  Index d = 0;
#pragma GCC unroll 8
  for (; d + 16 <= K; d += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(r + d), acc);
  if (d < K) {
    const __mmask16 m = lanes(d, K);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + d), _mm512_maskz_loadu_ps(m, r + d), acc);
  }
  return acc;
}

// row_times_transposed with dot_lanes<kDepth>.
template <Index kDepth>
inline void dot_rows(Index N, Index K, const float* a, const float* B, Index ldb, float* c) {
  __m512 p[16];
  Index j0 = 0;
  for (; j0 + 16 <= N; j0 += 16) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) p[i] = dot_lanes<kDepth>(a, B + (j0 + i) * ldb, K);
    _mm512_storeu_ps(c + j0, lane_sums16(p));
  }
  if (j0 == N) return;
  for (int i = 0; i < 16; ++i)
    p[i] = j0 + i < N ? dot_lanes<kDepth>(a, B + (j0 + i) * ldb, K) : _mm512_setzero_ps();
  _mm512_mask_storeu_ps(c + j0, lanes(j0, N), lane_sums16(p));
}

// c[1, N] = a[1, K] * B[N, K]^T: c[j] is the dot product of a with row j of B (row stride ldb).
// 16 rows at a time: 16 vectors of partial sums, then one tree of lane_sums16 for all 16 (not a
// horizontal sum per row). Each c[j] is computed the same way whatever N and j are (the same
// partial sums and tree for a given K).
inline void row_times_transposed(Index N, Index K, const float* a, const float* B, Index ldb,
                                 float* c) {
  if (K == 64)  // GPT-2's head size (every model size): unrolled, a tenth faster from DRAM
    dot_rows<64>(N, K, a, B, ldb, c);
  else
    dot_rows<0>(N, K, a, B, ldb, c);
}

}  // namespace gpt2::detail::avx512
#endif
