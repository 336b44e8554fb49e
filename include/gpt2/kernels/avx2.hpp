// The avx2 level of the kernel layer: float kernels on AVX2 + FMA (256-bit vectors), compiled
// with per-function target attributes, so a consumer needs no -m flag and the level is chosen at
// run time (the caller checks that the CPU has avx2 and fma before calling anything here).
//   gemm, gemm_packed:        C[M, N] += A[M, K] * B[K, N]     (the projections, att v)
//   row_times_matrix/packed:  c[1, N] += a[1, K] * B[K, N]     (a decode step's projections)
//   row_times_transposed:     c[1, N]  = a[1, K] * B[N, K]^T   (q k^T: one query against its keys)
//   softmax_row:              row = softmax(row[0, n) * scale), zeros in [n, n_keys)
//   kexp:                     exp(x) for the softmax
// The results are bitwise those of the avx512 level (the bit-for-bit orders of the kernel interface:
// gemm is one chain of fused multiply-adds per element, k in order; row_times_transposed 16 lane
// sums and a fixed tree; the softmax 16 lane sums and a fixed tree): avx2 and avx512 give the
// same bits. tests/kernel_emulation.hpp emulates those orders in scalar code.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gpt2/kernels/cpu.hpp"
#include "gpt2/kernels/layout.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AVX2
#include <immintrin.h>
#define GPT2_KERNEL_AVX2 __attribute__((target("avx2,fma")))

namespace gpt2::kernels::avx2 {

// ---------------------------------------------------------------------------------------------
// Lanes [0, count) of an 8-float vector as a maskload/maskstore mask (count clamped to [0, 8]).
GPT2_KERNEL_AVX2 inline __m256i lanes(Index count) {
  const int n = static_cast<int>(std::max<Index>(0, std::min<Index>(8, count)));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// ---------------------------------------------------------------------------------------------
// GEMM. The micro-tile is R <= 6 rows by 16 columns of C in 12 accumulators (two vectors a row),
// B read from a panel of 32 columns (row stride 32: one 64-byte line of the panel per k), A's
// elements broadcast. Per k: 2 loads of B, R broadcasts, 2R fused multiply-adds.
inline constexpr int kTileRows = 6;
inline constexpr Index kTileCols = 16;
// Blocking of gemm_packed (chosen by measurement on the projections' shapes: bench/results/history-speed.md). For each
// [256, 16] strip of B (16 KB) the 8 row tiles of a [48, 256] block of A pass; the [K, 256]
// panels of a column block stay in L2 while every row block passes, and a [48, 256] tile of C
// stays in L1 / L2 while its depth blocks pass (C is read and written once per 256 k).
inline constexpr Index kRowBlock = 48;
inline constexpr Index kPackedDepthBlock = 256;
inline constexpr Index kPackedColBlock = 256;
// Blocking of gemm: B's [256, 128] blocks (128 KB) packed into panels, one at a time, each swept
// by all of A's rows.
inline constexpr Index kDepthBlock = 256;
inline constexpr Index kColBlock = 128;
static_assert(kDepthBlock * kColBlock <= kPackFloats, "gemm's packed block fits the pack buffer");

// C[R, 16] += A[R, depth] * B[depth, 16] for one micro-tile. a: the tile's first element of A
// (row stride lda); b: the strip's first element in a panel (row stride 32, 16 readable floats a
// row: zeros past the matrix's columns); c: the tile's first element of C (row stride ldc).
// Full: all 16 columns are in C; otherwise m0 / m1 are the lanes of columns 0-7 / 8-15 that are
// (the others are neither read nor written).
template <int R, bool Full>
GPT2_KERNEL_AVX2 inline void micro_tile(const float* a, Index lda, const float* b, float* c,
                                        Index ldc, Index depth, __m256i m0, __m256i m1) {
  __m256 acc0[R], acc1[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    if constexpr (Full) {
      acc0[r] = _mm256_loadu_ps(c + r * ldc);
      acc1[r] = _mm256_loadu_ps(c + r * ldc + 8);
    } else {
      acc0[r] = _mm256_maskload_ps(c + r * ldc, m0);
      acc1[r] = _mm256_maskload_ps(c + r * ldc + 8, m1);
    }
  }
#pragma GCC unroll 4  // the loop's own instructions amortized
  for (Index k = 0; k < depth; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * kPanelCols);
    const __m256 b1 = _mm256_loadu_ps(b + k * kPanelCols + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r * lda + k);
      acc0[r] = _mm256_fmadd_ps(ar, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(ar, b1, acc1[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    if constexpr (Full) {
      _mm256_storeu_ps(c + r * ldc, acc0[r]);
      _mm256_storeu_ps(c + r * ldc + 8, acc1[r]);
    } else {
      _mm256_maskstore_ps(c + r * ldc, m0, acc0[r]);
      _mm256_maskstore_ps(c + r * ldc + 8, m1, acc1[r]);
    }
  }
}

// micro_tile for a run-time row count 1 <= rows <= 6 (Full: 16 columns, else those of m0 / m1).
template <bool Full>
GPT2_KERNEL_AVX2 inline void micro_tile_rows(int rows, const float* a, Index lda, const float* b,
                                             float* c, Index ldc, Index depth, __m256i m0,
                                             __m256i m1) {
  switch (rows) {
    case 6: micro_tile<6, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 5: micro_tile<5, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 4: micro_tile<4, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 3: micro_tile<3, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 2: micro_tile<2, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    default: micro_tile<1, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
  }
}

// C[M, cols] += A[M, depth] * B[depth, cols], B given as panels of 32 columns: row k of panel p
// at panels + p * panel_stride + k * 32 (zeros past `cols`). A's [kRowBlock, depth] blocks are
// swept by every 16-column strip of B; each strip stays in L1 while the block's row tiles pass.
GPT2_KERNEL_AVX2 inline void block_product(Index M, Index cols, Index depth, const float* A,
                                           Index lda, const float* panels, Index panel_stride,
                                           float* C, Index ldc) {
  const __m256i none = _mm256_setzero_si256();
  for (Index ib = 0; ib < M; ib += kRowBlock) {
    const Index block_end = std::min(M, ib + kRowBlock);
    for (Index j0 = 0; j0 < cols; j0 += kTileCols) {
      const float* strip = panels + (j0 / kPanelCols) * panel_stride + j0 % kPanelCols;
      const bool full = cols - j0 >= kTileCols;
      const __m256i m0 = full ? none : lanes(cols - j0), m1 = full ? none : lanes(cols - j0 - 8);
      for (Index i0 = ib; i0 < block_end; i0 += kTileRows) {
        const int rows = static_cast<int>(std::min<Index>(kTileRows, block_end - i0));
        if (full)
          micro_tile_rows<true>(rows, A + i0 * lda, lda, strip, C + i0 * ldc + j0, ldc, depth, m0,
                                m1);
        else
          micro_tile_rows<false>(rows, A + i0 * lda, lda, strip, C + i0 * ldc + j0, ldc, depth,
                                 m0, m1);
      }
    }
  }
}

// packed[p][k][0 .. 32) = B[k, 32 p .. 32 p + 32) for k < depth and the panels of `cols`
// columns, zeros past them (B row-major, row stride ldb).
GPT2_KERNEL_AVX2 inline void pack_block(const float* B, Index ldb, Index depth, Index cols,
                                        float* packed) {
  for (Index j0 = 0; j0 < cols; j0 += kPanelCols) {
    float* dst = packed + (j0 / kPanelCols) * depth * kPanelCols;
    if (cols - j0 >= kPanelCols) {
      for (Index k = 0; k < depth; ++k) {
        const float* src = B + k * ldb + j0;
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v)
          _mm256_storeu_ps(dst + k * kPanelCols + 8 * v, _mm256_loadu_ps(src + 8 * v));
      }
    } else {
      __m256i m[4];
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) m[v] = lanes(cols - j0 - 8 * v);
      for (Index k = 0; k < depth; ++k) {
        const float* src = B + k * ldb + j0;
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v)
          _mm256_storeu_ps(dst + k * kPanelCols + 8 * v, _mm256_maskload_ps(src + 8 * v, m[v]));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One-row products, written for B streaming from DRAM (a decode step reads every weight once).

// Rows of B ahead of the one being read that row_strip prefetches (as the avx512 level).
inline constexpr Index kPrefetchRows = 4;

// acc[v] += ak * B's row at b (8 V floats; lanes outside m masked when Masked).
template <int V, bool Masked>
GPT2_KERNEL_AVX2 inline void strip_step(__m256 (&acc)[V], const __m256i (&m)[V], __m256 ak,
                                        const float* b) {
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v) {
    const __m256 bv = Masked ? _mm256_maskload_ps(b + 8 * v, m[v]) : _mm256_loadu_ps(b + 8 * v);
    acc[v] = _mm256_fmadd_ps(ak, bv, acc[v]);
  }
}

// c[j0, j0 + 8 V) += a[1, K] * B[K, j0 .. j0 + 8 V) in V accumulators (Masked: columns past N
// neither read nor written), prefetching row k + kPrefetchRows of the strip while reading row k.
template <int V, bool Masked>
GPT2_KERNEL_AVX2 inline void row_strip(Index j0, Index N, Index K, const float* a, const float* B,
                                       Index ldb, float* c) {
  __m256i m[V];
  __m256 acc[V];
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v) {
    m[v] = lanes(N - j0 - 8 * v);
    acc[v] = Masked ? _mm256_maskload_ps(c + j0 + 8 * v, m[v]) : _mm256_loadu_ps(c + j0 + 8 * v);
  }
  // the 64-byte lines that hold the strip's columns of one row
  const Index strip_bytes = 4 * (std::min<Index>(N, j0 + 8 * V) - j0);
  const Index lines = (strip_bytes + 63) / 64;
  Index k = 0;
  for (; k + kPrefetchRows < K; ++k) {
    const char* ahead = reinterpret_cast<const char*>(B + (k + kPrefetchRows) * ldb + j0);
    if (Masked) {
      for (Index l = 0; l < lines; ++l) _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
    } else {
#pragma GCC unroll 16
      for (int l = 0; l < V / 2; ++l) _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
    }
    strip_step<V, Masked>(acc, m, _mm256_broadcast_ss(a + k), B + k * ldb + j0);
  }
  for (; k < K; ++k) strip_step<V, Masked>(acc, m, _mm256_broadcast_ss(a + k), B + k * ldb + j0);
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v) {
    if (Masked)
      _mm256_maskstore_ps(c + j0 + 8 * v, m[v], acc[v]);
    else
      _mm256_storeu_ps(c + j0 + 8 * v, acc[v]);
  }
}

// Columns of c row_times_matrix computes together: 12 accumulators, 384 contiguous bytes of each
// row of B (GPT-2 small's 768 and 2304 columns are multiples of 96).
inline constexpr int kRowStripVectors = 12;

// c[1, N] += a[1, K] * B[K, N] (B row-major, row stride ldb): 96 columns at a time while B's rows
// stream by, the last columns 32 at a time. Each element is one chain of fused multiply-adds, k
// in order: the bits of gemm's row.
GPT2_KERNEL_AVX2 inline void row_times_matrix(Index N, Index K, const float* a, const float* B,
                                              Index ldb, float* c) {
  constexpr Index kWide = 8 * kRowStripVectors;
  Index j0 = 0;
  for (; j0 + kWide <= N; j0 += kWide) row_strip<kRowStripVectors, false>(j0, N, K, a, B, ldb, c);
  for (; j0 + 32 <= N; j0 += 32) row_strip<4, false>(j0, N, K, a, B, ldb, c);
  if (j0 < N) row_strip<4, true>(j0, N, K, a, B, ldb, c);
}

// Rows (of 32 floats) ahead that row_times_packed prefetches in each panel it reads.
inline constexpr Index kPanelPrefetchRows = 8;

// c[32 p0, 32 (p0 + P)) += a[1, K] * (panels p0 .. p0 + P of Bp), 4 P accumulators (Masked:
// columns past N of c neither read nor written; the panels themselves are padded with zeros).
template <int P, bool Masked>
GPT2_KERNEL_AVX2 inline void panel_strip(Index p0, Index N, Index K, const float* a,
                                         const float* Bp, float* c) {
  constexpr int V = 4 * P;
  const Index j0 = p0 * kPanelCols;
  __m256i m[V];
  __m256 acc[V];
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v) {
    m[v] = lanes(N - j0 - 8 * v);
    acc[v] = Masked ? _mm256_maskload_ps(c + j0 + 8 * v, m[v]) : _mm256_loadu_ps(c + j0 + 8 * v);
  }
  const float* panel0 = Bp + p0 * K * kPanelCols;
  const Index panel_stride = K * kPanelCols;
  for (Index k = 0; k < K; ++k) {
    const __m256 ak = _mm256_broadcast_ss(a + k);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const float* row = panel0 + p * panel_stride + k * kPanelCols;
      if (k + kPanelPrefetchRows < K) {
        const char* ahead = reinterpret_cast<const char*>(row + kPanelPrefetchRows * kPanelCols);
        _mm_prefetch(ahead, _MM_HINT_T0);
        _mm_prefetch(ahead + 64, _MM_HINT_T0);
      }
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q)
        acc[4 * p + q] = _mm256_fmadd_ps(ak, _mm256_loadu_ps(row + 8 * q), acc[4 * p + q]);
    }
  }
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v) {
    if (Masked)
      _mm256_maskstore_ps(c + j0 + 8 * v, m[v], acc[v]);
    else
      _mm256_storeu_ps(c + j0 + 8 * v, acc[v]);
  }
}

// c[1, N] += a[1, K] * B[K, N], B in the panel layout: three panels (96 columns, three
// contiguous streams) at a time, then one. The bits of row_times_matrix and gemm.
GPT2_KERNEL_AVX2 inline void row_times_packed(Index N, Index K, const float* a, const float* Bp,
                                              float* c) {
  const Index full_panels = N / kPanelCols, panels = (N + kPanelCols - 1) / kPanelCols;
  Index p = 0;
  for (; p + 3 <= full_panels; p += 3) panel_strip<3, false>(p, N, K, a, Bp, c);
  for (; p < full_panels; ++p) panel_strip<1, false>(p, N, K, a, Bp, c);
  if (p < panels) panel_strip<1, true>(p, N, K, a, Bp, c);
}

// C[M, N] += A[M, K] * B[K, N] with B in the panel layout (gpt2::PackedMatrix, kernels/pack.hpp): no
// packing. One chain of fused multiply-adds per element of C, k in order, from C's value.
GPT2_KERNEL_AVX2 inline void gemm_packed(Index M, Index N, Index K, const float* A, Index lda,
                                         const float* Bp, float* C, Index ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return;  // C unchanged (nothing read or written)
  if (M == 1) {
    row_times_packed(N, K, A, Bp, C);
    return;
  }
  for (Index jb = 0; jb < N; jb += kPackedColBlock) {
    const Index cols = std::min(kPackedColBlock, N - jb);
    const float* panels = Bp + (jb / kPanelCols) * K * kPanelCols;
    for (Index ib = 0; ib < M; ib += kRowBlock) {
      const Index rows = std::min(kRowBlock, M - ib);
      for (Index k0 = 0; k0 < K; k0 += kPackedDepthBlock) {
        const Index depth = std::min(kPackedDepthBlock, K - k0);
        block_product(rows, cols, depth, A + ib * lda + k0, lda, panels + k0 * kPanelCols,
                      K * kPanelCols, C + ib * ldc + jb, ldc);
      }
    }
  }
}

// C[M, N] += A[M, K] * B[K, N] (B row-major, row stride ldb); pack: kPackFloats floats. For each
// block of kColBlock columns and kDepthBlock depths, B's block is packed into panels once, then
// swept by every row tile of A. One chain of fused multiply-adds per element of C, k in order.
GPT2_KERNEL_AVX2 inline void gemm(Index M, Index N, Index K, const float* A, Index lda,
                                  const float* B, Index ldb, float* C, Index ldc, float* pack) {
  if (M <= 0 || N <= 0 || K <= 0) return;  // C unchanged (nothing read or written)
  if (M == 1) {
    row_times_matrix(N, K, A, B, ldb, C);
    return;
  }
  for (Index jb = 0; jb < N; jb += kColBlock) {
    const Index cols = std::min(kColBlock, N - jb);
    for (Index k0 = 0; k0 < K; k0 += kDepthBlock) {
      const Index depth = std::min(kDepthBlock, K - k0);
      pack_block(B + k0 * ldb + jb, ldb, depth, cols, pack);
      block_product(M, cols, depth, A + k0, lda, pack, depth * kPanelCols, C + jb, ldc);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// row_times_transposed: c[j] = dot(a, row j of B) as 16 lane partial sums (lane l over
// d = l, l + 16, ...: lanes 0-7 in one vector, 8-15 in another) and the fixed tree of the avx512
// level's lane_sums16: t_g = (x[4g] + x[4g+2]) + (x[4g+1] + x[4g+3]), sum = (t_0 + t_1) + (t_2 + t_3).

// fma(a, b, acc) in the lanes of m; acc unchanged in the others. (An fma with zeros there instead
// would turn a lane's -0 into +0: a lane of tiny negative products rounds to -0.)
GPT2_KERNEL_AVX2 inline __m256 masked_fmadd(__m256 a, __m256 b, __m256 acc, __m256i m) {
  return _mm256_blendv_ps(acc, _mm256_fmadd_ps(a, b, acc), _mm256_castsi256_ps(m));
}

// The 16 partial sums of a[0, K) . r[0, K) into lo (lanes 0-7) and hi (8-15). kDepth: K known at
// compile time (the loop unrolled), or 0 for a run-time K.
template <Index kDepth>
GPT2_KERNEL_AVX2 inline void dot_lanes4(const float* a, const float* B, Index ldb, Index K,
                                        __m256 (&lo)[4], __m256 (&hi)[4]) {
  if constexpr (kDepth > 0) K = kDepth;
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
  Index d = 0;
#pragma GCC unroll 4
  for (; d + 16 <= K; d += 16) {
    const __m256 a0 = _mm256_loadu_ps(a + d), a1 = _mm256_loadu_ps(a + d + 8);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      lo[i] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(B + i * ldb + d), lo[i]);
      hi[i] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(B + i * ldb + d + 8), hi[i]);
    }
  }
  if (d < K) {
    const __m256i m0 = lanes(K - d), m1 = lanes(K - d - 8);
    const __m256 a0 = _mm256_maskload_ps(a + d, m0), a1 = _mm256_maskload_ps(a + d + 8, m1);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      lo[i] = masked_fmadd(a0, _mm256_maskload_ps(B + i * ldb + d, m0), lo[i], m0);
      hi[i] = masked_fmadd(a1, _mm256_maskload_ps(B + i * ldb + d + 8, m1), hi[i], m1);
    }
  }
}

// As dot_lanes4 for rows < 4 rows of B (the others' sums are zero).
template <Index kDepth>
GPT2_KERNEL_AVX2 inline void dot_lanes_tail(const float* a, const float* B, Index ldb, Index K,
                                            Index rows, __m256 (&lo)[4], __m256 (&hi)[4]) {
  if constexpr (kDepth > 0) K = kDepth;
  for (int i = 0; i < 4; ++i) {
    lo[i] = hi[i] = _mm256_setzero_ps();
    if (i >= rows) continue;
    const float* r = B + i * ldb;
    Index d = 0;
    for (; d + 16 <= K; d += 16) {
      lo[i] = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(r + d), lo[i]);
      hi[i] = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(r + d + 8), hi[i]);
    }
    if (d < K) {
      const __m256i m0 = lanes(K - d), m1 = lanes(K - d - 8);
      lo[i] = masked_fmadd(_mm256_maskload_ps(a + d, m0), _mm256_maskload_ps(r + d, m0), lo[i], m0);
      hi[i] = masked_fmadd(_mm256_maskload_ps(a + d + 8, m1), _mm256_maskload_ps(r + d + 8, m1),
                           hi[i], m1);
    }
  }
}

// Lanes g of the result: t_g of x = p[0..3]'s 8 lanes (g = 0, 1 in each 128-bit half h:
// result lane 4h + i = t_h of p[i]).
GPT2_KERNEL_AVX2 inline __m256 quad_sums(const __m256 (&p)[4]) {
  // lanes of q01 in each 128-bit half: p0[0]+p0[2], p1[0]+p1[2], p0[1]+p0[3], p1[1]+p1[3]
  const __m256 q01 = _mm256_add_ps(_mm256_unpacklo_ps(p[0], p[1]), _mm256_unpackhi_ps(p[0], p[1]));
  const __m256 q23 = _mm256_add_ps(_mm256_unpacklo_ps(p[2], p[3]), _mm256_unpackhi_ps(p[2], p[3]));
  return _mm256_add_ps(_mm256_shuffle_ps(q01, q23, 0x44), _mm256_shuffle_ps(q01, q23, 0xEE));
}

// The 4 sums of the rows whose lanes are lo[i] (0-7) and hi[i] (8-15), in the fixed tree.
GPT2_KERNEL_AVX2 inline __m128 lane_sums4(const __m256 (&lo)[4], const __m256 (&hi)[4]) {
  const __m256 t01 = quad_sums(lo), t23 = quad_sums(hi);  // halves: t_0 | t_1, t_2 | t_3
  const __m128 s01 = _mm_add_ps(_mm256_castps256_ps128(t01), _mm256_extractf128_ps(t01, 1));
  const __m128 s23 = _mm_add_ps(_mm256_castps256_ps128(t23), _mm256_extractf128_ps(t23, 1));
  return _mm_add_ps(s01, s23);
}

// row_times_transposed with dot_lanes4<kDepth>, 4 rows of B at a time.
template <Index kDepth>
GPT2_KERNEL_AVX2 inline void dot_rows(Index N, Index K, const float* a, const float* B, Index ldb,
                                      float* c) {
  __m256 lo[4], hi[4];
  Index j0 = 0;
  for (; j0 + 4 <= N; j0 += 4) {
    dot_lanes4<kDepth>(a, B + j0 * ldb, ldb, K, lo, hi);
    _mm_storeu_ps(c + j0, lane_sums4(lo, hi));
  }
  if (j0 == N) return;
  dot_lanes_tail<kDepth>(a, B + j0 * ldb, ldb, K, N - j0, lo, hi);
  const __m128i m = _mm256_castsi256_si128(lanes(N - j0));
  _mm_maskstore_ps(c + j0, m, lane_sums4(lo, hi));
}

// c[1, N] = a[1, K] * B[N, K]^T: c[j] is the dot product of a with row j of B (row stride ldb).
GPT2_KERNEL_AVX2 inline void row_times_transposed(Index N, Index K, const float* a, const float* B,
                                                  Index ldb, float* c) {
  if (K == 64)  // GPT-2's head size (every model size): unrolled
    dot_rows<64>(N, K, a, B, ldb, c);
  else
    dot_rows<0>(N, K, a, B, ldb, c);
}

// ---------------------------------------------------------------------------------------------
// exp and the softmax.

// The last steps of an exponential of x (kexp8, and the fused core's kexp2_8): y * 2^n for n in
// [-126, 127] (the exponent field n + 127; the callers' clamps guarantee that range wherever the
// result is kept), then 0 in the lanes `below` and x itself where x is NaN.
GPT2_KERNEL_AVX2 inline __m256 exp_result8(__m256 x, __m256 y, __m256 n, __m256 below) {
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 scaled = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_blendv_ps(_mm256_blendv_ps(scaled, _mm256_setzero_ps(), below), x, is_nan);
}

// kexp of 8 lanes (the interface's order): NaN stays NaN, x < -87.33654 gives 0,
// otherwise y * 2^n with n = nearbyint(x log2(e)) (x capped at 88) and y a degree-7 polynomial of
// the reduced argument r = x - n ln(2).
GPT2_KERNEL_AVX2 inline __m256 kexp8(__m256 x) {
  const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ);
  const __m256 xc = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), xc);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  const __m256 y =
      _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  return exp_result8(x, y, n, below);  // n in [-126, 127] for x in [-87.33654, 88]
}

// kexp of one float: lane 0 of kexp8 (the same bits).
GPT2_KERNEL_AVX2 inline float kexp(float x) {
  return _mm_cvtss_f32(_mm256_castps256_ps128(kexp8(_mm256_set1_ps(x))));
}

// In place, for one score row: x_j = row[j] * scale, row[j] = softmax(x)_j for j < n, row[j] = 0
// for n <= j < n_keys (1 <= n <= n_keys). The interface's order: the max over
// x (NaN if any x is NaN), e_j = kexp(x_j - max), 16 lane sums of e (lane j mod 16, from the row's
// start) reduced s_i + s_{i+8}, then + 4, + 2, + 1; row[j] = e_j * (1 / sum).
GPT2_KERNEL_AVX2 inline void softmax_row(float* row, Index n, Index n_keys, float scale) {
  const __m256 vscale = _mm256_set1_ps(scale), neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  // 1, 2: x = row * scale (stored back, one rounding), its max and whether any is NaN
  __m256 vmax = neg_inf, nan = _mm256_setzero_ps();
  Index j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(row + j), vscale);
    _mm256_storeu_ps(row + j, x);
    vmax = _mm256_max_ps(vmax, x);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  if (j < n) {
    const __m256i m = lanes(n - j);
    const __m256 x = _mm256_mul_ps(_mm256_maskload_ps(row + j, m), vscale);
    _mm256_maskstore_ps(row + j, m, x);
    vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(neg_inf, x, _mm256_castsi256_ps(m)));
    // (the masked lanes hold 0 * scale: NaN for an infinite scale, not an element of the row)
    nan = _mm256_or_ps(nan, _mm256_and_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), _mm256_castsi256_ps(m)));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const bool any_nan = _mm256_movemask_ps(nan) != 0;
  const __m256 vm = any_nan ? _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()) : _mm256_broadcastss_ps(m4);
  // 3, 4: e = kexp(x - max), stored; 16 lane sums (lanes 0-7 in s0, 8-15 in s1)
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256 e0 = kexp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm));
    const __m256 e1 = kexp8(_mm256_sub_ps(_mm256_loadu_ps(row + j + 8), vm));
    _mm256_storeu_ps(row + j, e0);
    _mm256_storeu_ps(row + j + 8, e1);
    s0 = _mm256_add_ps(s0, e0);
    s1 = _mm256_add_ps(s1, e1);
  }
  if (j < n) {
    const __m256i m0 = lanes(n - j), m1 = lanes(n - j - 8);
    const __m256 zero = _mm256_setzero_ps();
    const __m256 e0 = _mm256_blendv_ps(
        zero, kexp8(_mm256_sub_ps(_mm256_maskload_ps(row + j, m0), vm)), _mm256_castsi256_ps(m0));
    const __m256 e1 = _mm256_blendv_ps(
        zero, kexp8(_mm256_sub_ps(_mm256_maskload_ps(row + j + 8, m1), vm)),
        _mm256_castsi256_ps(m1));
    _mm256_maskstore_ps(row + j, m0, e0);
    _mm256_maskstore_ps(row + j + 8, m1, e1);
    s0 = _mm256_add_ps(s0, e0);  // lanes past n add +0: the sums (>= +0 or NaN) do not change
    s1 = _mm256_add_ps(s1, e1);
  }
  const __m256 u = _mm256_add_ps(s0, s1);                                            // s_i + s_{i+8}
  const __m128 v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));  // u_i + u_{i+4}
  const __m128 w = _mm_add_ps(v, _mm_movehl_ps(v, v));                                 // v_i + v_{i+2}
  const float sum = _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));            // w_0 + w_1
  // 5: row = e * (1 / sum); zeros past n
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), inv));
  if (j < n) {
    const __m256i m = lanes(n - j);
    _mm256_maskstore_ps(row + j, m, _mm256_mul_ps(_mm256_maskload_ps(row + j, m), inv));
  }
  std::memset(row + n, 0, static_cast<std::size_t>(n_keys - n) * sizeof(float));
}

}  // namespace gpt2::kernels::avx2

#endif
