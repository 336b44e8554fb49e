// The avx512 kernel level: AVX-512 (F, BW, DQ, VL) float kernels of the interface in
// kernels/dispatch.hpp, compiled with per-function target attributes so that they need no -m flag
// from the consumer; dispatch.hpp runs them only on a CPU (and OS) that has AVX-512.
//
// Bit-for-bit contracts (the same at the avx2 level, checked by tests/test_kernels.cpp against the
// scalar emulation of tests/kernel_emulation.hpp):
// - gemm, gemm_packed, row_times_matrix, row_times_packed: every element of C is one chain of fused
//   multiply-adds in the order k = 0, 1, ..., K - 1, starting from C's value. Blocking, the row
//   count M and the split of the columns over threads only decide which elements are computed
//   together, never how one is: a row's result does not depend on the rows computed with it.
// - row_times_transposed: 16 lane partial sums (lane l adds a[d] b[d] over d = l mod 16, in
//   order, from +0), then the fixed tree of lane_sums16.
// - softmax_row: as dispatch.hpp writes it (x = row * scale, max from -inf, kexp, 16-lane sum
//   reduced by halves, times 1 / sum).
#pragma once

#include <algorithm>
#include <cstdint>

#include "gpt2/kernels/cpu.hpp"
#include "gpt2/kernels/layout.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AVX512
// GCC 12's avx512fintrin.h initializes "undefined" vectors with `__m512 __Y = __Y;`, which its
// -Wmaybe-uninitialized reports in the code that inlines them (GCC bug 105593): silenced here,
// for this file's kernels only, so that consumers building with -Wall -Werror are not affected.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define GPT2_KERNELS_AVX512_DIAGNOSTICS_PUSHED 1
#endif
#include <immintrin.h>
#define GPT2_KERNEL_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#endif

#if GPT2_KERNELS_HAVE_AVX512
namespace gpt2::kernels::avx512 {

// Lanes of a 16-float vector that hold columns [j, n) (all 16 when n - j >= 16).
GPT2_KERNEL_AVX512 inline __mmask16 lanes(Index j, Index n) {
  const Index count = std::max<Index>(0, std::min<Index>(16, n - j));
  return static_cast<__mmask16>((std::uint32_t(1) << count) - 1);
}

// ---- One row on the left (a decode step): c[1, N] += a[1, K] B[K, N] --------------------------

inline constexpr int kTileRows = 12;       // rows of C per micro-tile: 24 accumulators
inline constexpr Index kTileCols = 32;     // columns of a panel / a micro-tile: two 16-float vectors

// Rows of B ahead of the one being read that the strips prefetch: c_attn.weight's rows are 9 KB
// apart, each on another 4 KB page, where the hardware prefetchers stop (the distance was chosen
// by measurement from DRAM: bench/results/history-speed.md).
inline constexpr Index kPrefetchRows = 4;

// acc[v] += a_k * b[16 v ..] for V vectors, lanes masked by m.
template <int V>
GPT2_KERNEL_AVX512 inline void strip_step(__m512 (&acc)[V], const __mmask16 (&m)[V], float a_k,
                                          const float* b) {
  const __m512 ak = _mm512_set1_ps(a_k);
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v)
    acc[v] = _mm512_fmadd_ps(ak, _mm512_maskz_loadu_ps(m[v], b + 16 * v), acc[v]);
}

// c[j0, j0 + 16 V) += a[1, K] * B[K, j0 .. j0 + 16 V) in V accumulators (columns past N masked),
// prefetching row k + kPrefetchRows while reading row k.
template <int V>
GPT2_KERNEL_AVX512 inline void row_strip(Index j0, Index N, Index K, const float* a,
                                         const float* B, Index ldb, float* c) {
  __mmask16 m[V];
  __m512 acc[V];
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v) {
    m[v] = lanes(j0 + 16 * v, N);
    acc[v] = _mm512_maskz_loadu_ps(m[v], c + j0 + 16 * v);
  }
  Index k = 0;
  for (; k + kPrefetchRows < K; ++k) {
    const char* ahead = reinterpret_cast<const char*>(B + (k + kPrefetchRows) * ldb + j0);
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) _mm_prefetch(ahead + 64 * v, _MM_HINT_T0);
    strip_step<V>(acc, m, a[k], B + k * ldb + j0);
  }
  for (; k < K; ++k) strip_step<V>(acc, m, a[k], B + k * ldb + j0);
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(c + j0 + 16 * v, m[v], acc[v]);
}

// c[1, N] += a[1, K] * B[K, N]: 128 columns at a time in 8 accumulators while B's rows stream by
// (512 contiguous bytes of each, the width chosen by measurement on GPT-2 small's shapes); the
// last columns 64 at a time.
GPT2_KERNEL_AVX512 inline void row_times_matrix(Index N, Index K, const float* a, const float* B,
                                                Index ldb, float* c) {
  Index j0 = 0;
  for (; j0 + 128 <= N; j0 += 128) row_strip<8>(j0, N, K, a, B, ldb, c);
  for (; j0 < N; j0 += 64) row_strip<4>(j0, N, K, a, B, ldb, c);
}

// Rows (of 128 bytes, two cache lines) ahead that packed_strip prefetches in each panel. Both
// lines of a row: prefetching one line per row (the row's first) left every other line of the
// stream to the hardware (the distance and the hint chosen by measurement: bench/results/history-speed.md).
inline constexpr Index kPanelPrefetchRows = 8;

// c[p0 * 32, ...) += a[1, K] * (P panels of a packed B from panel p0): 2 P accumulators; each
// panel is one contiguous stream (K rows of 128 bytes), both lines of a row prefetched
// kPanelPrefetchRows rows ahead.
template <int P>
GPT2_KERNEL_AVX512 inline void packed_strip(Index p0, Index N, Index K, const float* a,
                                            const float* Bp, float* c) {
  __mmask16 m[2 * P];
  __m512 acc[2 * P];
  const Index j0 = p0 * kTileCols;
#pragma GCC unroll 16
  for (int v = 0; v < 2 * P; ++v) {
    m[v] = lanes(j0 + 16 * v, N);
    acc[v] = _mm512_maskz_loadu_ps(m[v], c + j0 + 16 * v);
  }
  const float* panel = Bp + p0 * K * kTileCols;
  for (Index k = 0; k < K; ++k) {
    const __m512 ak = _mm512_set1_ps(a[k]);
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
      const float* row = panel + p * K * kTileCols + k * kTileCols;
      if (k + kPanelPrefetchRows < K) {
        const char* ahead = reinterpret_cast<const char*>(row + kPanelPrefetchRows * kTileCols);
        _mm_prefetch(ahead, _MM_HINT_T0);
        _mm_prefetch(ahead + 64, _MM_HINT_T0);
      }
      acc[2 * p] = _mm512_fmadd_ps(ak, _mm512_load_ps(row), acc[2 * p]);
      acc[2 * p + 1] = _mm512_fmadd_ps(ak, _mm512_load_ps(row + 16), acc[2 * p + 1]);
    }
  }
#pragma GCC unroll 16
  for (int v = 0; v < 2 * P; ++v) _mm512_mask_storeu_ps(c + j0 + 16 * v, m[v], acc[v]);
}

// c[1, N] += a[1, K] * B[K, N], B in the panel layout: 4 panels (128 columns) at a time.
GPT2_KERNEL_AVX512 inline void row_times_packed(Index N, Index K, const float* a, const float* Bp,
                                                float* c) {
  const Index panels = (N + kTileCols - 1) / kTileCols;
  Index p = 0;
  for (; p + 4 <= panels; p += 4) packed_strip<4>(p, N, K, a, Bp, c);
  for (; p < panels; ++p) packed_strip<1>(p, N, K, a, Bp, c);
}

// ---- GEMM: C[M, N] += A[M, K] B[K, N] -------------------------------------------------------

inline constexpr Index kDepthBlock = 128;  // k per pass: B's [128, 32] panel (16 KB) stays in L1
inline constexpr Index kRowBlock = 48;     // rows of A per block: A's [48, 128] block in L1
inline constexpr Index kColBlock = 256;    // columns of B per packed block
static_assert(kDepthBlock * kColBlock <= kernels::kPackFloats && kTileCols == kernels::kPanelCols,
              "avx512::gemm packs a block into GemmScratch's buffer, in pack.hpp's panels");

// C[R, cols] += A[R, depth] * B[depth, cols] for one micro-tile: cols <= 32 columns, given by the
// lane masks m0 (columns 0-15) and m1 (16-31) (Full: all 32, unmasked loads and stores of C). a,
// c point at the tile's first element, lda, ldc are row strides; b is a 32-column panel (64-byte
// aligned rows 32 floats apart, zeros past the last column), read unmasked. Masked lanes of C are
// neither read nor written.
template <int R, bool Full>
GPT2_KERNEL_AVX512 inline void micro_tile(const float* a, Index lda, const float* b, float* c,
                                          Index ldc, Index depth, __mmask16 m0, __mmask16 m1) {
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    acc0[r] = Full ? _mm512_loadu_ps(c + r * ldc) : _mm512_maskz_loadu_ps(m0, c + r * ldc);
    acc1[r] = Full ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_maskz_loadu_ps(m1, c + r * ldc + 16);
  }
  for (Index k = 0; k < depth; ++k) {
    const __m512 b0 = _mm512_load_ps(b + k * kTileCols);
    const __m512 b1 = _mm512_load_ps(b + k * kTileCols + 16);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * lda + k]);
      acc0[r] = _mm512_fmadd_ps(ar, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(ar, b1, acc1[r]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    if (Full) {
      _mm512_storeu_ps(c + r * ldc, acc0[r]);
      _mm512_storeu_ps(c + r * ldc + 16, acc1[r]);
    } else {
      _mm512_mask_storeu_ps(c + r * ldc, m0, acc0[r]);
      _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc1[r]);
    }
  }
}

// micro_tile with a run-time row count 1 <= rows <= kTileRows.
template <bool Full>
GPT2_KERNEL_AVX512 inline void micro_tile_rows(int rows, const float* a, Index lda, const float* b,
                                               float* c, Index ldc, Index depth, __mmask16 m0,
                                               __mmask16 m1) {
  switch (rows) {
    case 12: micro_tile<12, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 11: micro_tile<11, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 10: micro_tile<10, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 9: micro_tile<9, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 8: micro_tile<8, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 7: micro_tile<7, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 6: micro_tile<6, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 5: micro_tile<5, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 4: micro_tile<4, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 3: micro_tile<3, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    case 2: micro_tile<2, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
    default: micro_tile<1, Full>(a, lda, b, c, ldc, depth, m0, m1); break;
  }
}

// One packed block of B (kColBlock columns or fewer, `depth` rows) swept by every row tile of A:
// C[M, cols] += A[M, depth] * block. The block's 32-column panels are panel_stride floats apart,
// each with rows 32 floats apart. A's [kRowBlock, depth] blocks stay in L1, the block in L2.
GPT2_KERNEL_AVX512 inline void sweep_block(Index M, Index cols, Index depth, const float* A,
                                           Index lda, const float* block, Index panel_stride,
                                           float* C, Index ldc) {
  for (Index ib = 0; ib < M; ib += kRowBlock) {
    const Index block_rows = std::min(kRowBlock, M - ib);
    for (Index j0 = 0; j0 < cols; j0 += kTileCols) {
      const __mmask16 m0 = lanes(j0, cols), m1 = lanes(j0 + 16, cols);
      const bool full = j0 + kTileCols <= cols;
      const float* panel = block + (j0 / kTileCols) * panel_stride;
      for (Index i0 = ib; i0 < ib + block_rows; i0 += kTileRows) {
        const int rows = static_cast<int>(std::min<Index>(kTileRows, ib + block_rows - i0));
        if (full)
          micro_tile_rows<true>(rows, A + i0 * lda, lda, panel, C + i0 * ldc + j0, ldc, depth, m0, m1);
        else
          micro_tile_rows<false>(rows, A + i0 * lda, lda, panel, C + i0 * ldc + j0, ldc, depth, m0, m1);
      }
    }
  }
}

// packed[p][k][0 .. 32) = B[k, 32 p .. 32 p + 32) for k < depth and the panels of `cols` columns
// (zeros past them). B is row-major with row stride ldb; packed is 64-byte aligned.
GPT2_KERNEL_AVX512 inline void pack_block(const float* B, Index ldb, Index depth, Index cols,
                                          float* packed) {
  for (Index j0 = 0; j0 < cols; j0 += kTileCols) {
    const __mmask16 m0 = lanes(j0, cols), m1 = lanes(j0 + 16, cols);
    float* dst = packed + (j0 / kTileCols) * depth * kTileCols;
    for (Index k = 0; k < depth; ++k) {
      _mm512_store_ps(dst + k * kTileCols, _mm512_maskz_loadu_ps(m0, B + k * ldb + j0));
      _mm512_store_ps(dst + k * kTileCols + 16, _mm512_maskz_loadu_ps(m1, B + k * ldb + j0 + 16));
    }
  }
}

// C[M, N] += A[M, K] * B[K, N]; B row-major (stride ldb), its [kDepthBlock, kColBlock] blocks
// packed into `pack` (kDepthBlock * kColBlock floats, 64-byte aligned) one at a time.
GPT2_KERNEL_AVX512 inline void gemm(Index M, Index N, Index K, const float* A, Index lda,
                                    const float* B, Index ldb, float* C, Index ldc, float* pack) {
  if (M == 1) {
    row_times_matrix(N, K, A, B, ldb, C);
    return;
  }
  for (Index jb = 0; jb < N; jb += kColBlock) {
    const Index cols = std::min(kColBlock, N - jb);
    for (Index k0 = 0; k0 < K; k0 += kDepthBlock) {
      const Index depth = std::min(kDepthBlock, K - k0);
      pack_block(B + k0 * ldb + jb, ldb, depth, cols, pack);
      sweep_block(M, cols, depth, A + k0, lda, pack, depth * kTileCols, C + jb, ldc);
    }
  }
}

// gemm_packed's blocking: B in the panel layout needs no packing, so a micro-tile runs the whole
// depth (up to kPackedDepth) at once and C is read and written once; kPackedRowBlock rows of A
// (72 KB at K = 768) sweep kColBlock columns of panels (768 KB, in L2): the blocking chosen by
// measurement on the qkv and proj shapes (bench/results/history-speed.md).
inline constexpr Index kPackedRowBlock = 2 * kTileRows;
inline constexpr Index kPackedDepth = 2048;

// C[M, N] += A[M, K] * B[K, N] with B in the panel layout (kernels/pack.hpp): panel p's row k at
// Bp + p * K * 32 + k * 32.
GPT2_KERNEL_AVX512 inline void gemm_packed(Index M, Index N, Index K, const float* A, Index lda,
                                           const float* Bp, float* C, Index ldc) {
  if (M == 1) {
    row_times_packed(N, K, A, Bp, C);
    return;
  }
  for (Index jb = 0; jb < N; jb += kColBlock) {
    const Index cols = std::min(kColBlock, N - jb);
    const float* panels = Bp + (jb / kTileCols) * K * kTileCols;
    for (Index ib = 0; ib < M; ib += kPackedRowBlock) {
      const Index rows = std::min(kPackedRowBlock, M - ib);
      for (Index k0 = 0; k0 < K; k0 += kPackedDepth) {
        const Index depth = std::min(kPackedDepth, K - k0);
        sweep_block(rows, cols, depth, A + ib * lda + k0, lda, panels + k0 * kTileCols,
                    K * kTileCols, C + ib * ldc + jb, ldc);
      }
    }
  }
}

// ---- q k^T of one row: c[1, N] = a[1, K] B[N, K]^T --------------------------------------------

// The 16 sums of 16 vectors: lane i of the result is the sum of x = p[i]'s 16 lanes, added in this
// fixed order (a bit-for-bit contract):
//   t_g = (x[4g] + x[4g+2]) + (x[4g+1] + x[4g+3])   for g = 0 .. 3
//   sum = (t_0 + t_1) + (t_2 + t_3)
GPT2_KERNEL_AVX512 inline __m512 lane_sums16(const __m512 (&p)[16]) {
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
GPT2_KERNEL_AVX512 inline __m512 dot_lanes(const float* a, const float* r, Index K) {
  if constexpr (kDepth > 0) K = kDepth;
  __m512 acc = _mm512_setzero_ps();
  Index d = 0;
#pragma GCC unroll 8
  for (; d + 16 <= K; d += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(r + d), acc);
  if (d < K) {
    const __mmask16 m = lanes(d, K);
    // lanes past K keep their sum (a -0 stays -0: the documented order adds nothing there)
    acc = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, a + d), _mm512_maskz_loadu_ps(m, r + d), acc, m);
  }
  return acc;
}

// row_times_transposed with dot_lanes<kDepth>.
template <Index kDepth>
GPT2_KERNEL_AVX512 inline void dot_rows(Index N, Index K, const float* a, const float* B,
                                        Index ldb, float* c) {
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
// 16 rows at a time: 16 vectors of partial sums, then one tree of lane_sums16 for all 16.
GPT2_KERNEL_AVX512 inline void row_times_transposed(Index N, Index K, const float* a,
                                                    const float* B, Index ldb, float* c) {
  if (K == 64)  // GPT-2's head size (every model size): unrolled
    dot_rows<64>(N, K, a, B, ldb, c);
  else
    dot_rows<0>(N, K, a, B, ldb, c);
}

// ---- softmax of one score row ----------------------------------------------------------------

// exp(x) = y * 2^n for x <= 88, before the scaling: n = round(x log2 e), y = exp(r) on
// r = x - n ln 2 (ln 2 in two parts), Cephes' polynomial. kexp's steps.
struct ExpParts {
  __m512 y, n;
};
GPT2_KERNEL_AVX512 inline ExpParts kexp_parts(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  return {_mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f)), n};
}

// The last steps of an exponential of x (kexp, and the fused core's kexp2): y * 2^n in one rounded
// step (vscalefps: for n in [-126, 127], which the callers' clamps guarantee wherever the result
// is kept, exactly the product with 2^n), then 0 in the lanes `under` and x itself where x is NaN.
GPT2_KERNEL_AVX512 inline __m512 exp_result(__m512 x, const ExpParts& e, __mmask16 under) {
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512 result =
      _mm512_mask_mov_ps(_mm512_scalef_ps(e.y, e.n), under, _mm512_setzero_ps());
  return _mm512_mask_mov_ps(result, nan, x);
}

// kexp (dispatch.hpp's spec) of 16 floats: exp(x) within 2 ulp on [-87.3, 88]; 0 below
// -87.33654; NaN stays NaN.
GPT2_KERNEL_AVX512 inline __m512 kexp(__m512 x) {
  const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ);
  return exp_result(x, kexp_parts(_mm512_min_ps(x, _mm512_set1_ps(88.0f))), under);
}

// In place: x_j = row[j] * scale; row[j] = softmax(x)_j for j < n; row[j] = 0 for n <= j < n_keys.
GPT2_KERNEL_AVX512 inline void softmax_row(float* row, Index n, Index n_keys, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  const __m512 minus_inf = _mm512_set1_ps(-__builtin_inff());
  // 1-2. max of x from -inf; any NaN makes it NaN
  __m512 mx = minus_inf;
  __mmask16 nan = 0;
  for (Index j = 0; j < n; j += 16) {  // lanes past n take no part (whatever the scale's sign)
    const __mmask16 live = lanes(j, n);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, row + j), s);
    nan |= _mm512_mask_cmp_ps_mask(live, x, x, _CMP_UNORD_Q);
    mx = _mm512_mask_max_ps(mx, live, mx, x);
  }
  const __m512 m = nan ? _mm512_set1_ps(__builtin_nanf("")) : _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  // 3-4. e_j = kexp(x_j - m) stored back; 16 lane sums, in order
  __m512 sum = _mm512_setzero_ps();
  for (Index j = 0; j < n; j += 16) {
    const __mmask16 live = lanes(j, n);
    // x rounded on its own: an explicit-rounding intrinsic, which g++ does not fuse with the
    // subtraction below into one fused multiply-subtract (as it would a plain product, under its
    // default -ffp-contract=fast). Masked, so that no lane is left undefined (GCC 12 warns on
    // _mm512_undefined_ps, bug 105593).
    const __m512 x = _mm512_maskz_mul_round_ps(live, _mm512_maskz_loadu_ps(live, row + j), s,
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 e = _mm512_maskz_mov_ps(live, kexp(_mm512_sub_ps(x, m)));
    _mm512_mask_storeu_ps(row + j, live, e);
    sum = _mm512_add_ps(sum, e);
  }
  const __m256 u = _mm256_add_ps(_mm512_castps512_ps256(sum), _mm512_extractf32x8_ps(sum, 1));
  const __m128 v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
  const __m128 w = _mm_add_ps(v, _mm_movehl_ps(v, v));
  const float total = _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
  // 5. times 1 / sum; zeros past n
  const __m512 inv = _mm512_set1_ps(1.0f / total);
  for (Index j = 0; j < n; j += 16) {
    const __mmask16 live = lanes(j, n);
    _mm512_mask_storeu_ps(row + j, live, _mm512_mul_ps(_mm512_maskz_loadu_ps(live, row + j), inv));
  }
  for (Index j = n; j < n_keys; ++j) row[j] = 0.0f;
}

}  // namespace gpt2::kernels::avx512
#endif

#if defined(GPT2_KERNELS_AVX512_DIAGNOSTICS_PUSHED)
#pragma GCC diagnostic pop
#undef GPT2_KERNELS_AVX512_DIAGNOSTICS_PUSHED
#endif
