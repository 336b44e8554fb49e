// An AVX-512 float kernel for C[M, N] += A[M, K] * B[K, N], all row-major: the products of the
// projections (x @ c_attn.weight, merged @ c_proj.weight) and att @ v. Used by gemm_accumulate for
// float when the code is compiled with AVX-512 (e.g. -march=native on a machine that has it);
// other builds, double, and the q k^T product use Eigen's GEMM.
//
// Every element of C is one chain of fused multiply-adds in the order k = 0, 1, ..., K - 1,
// starting from C's value: c = fma(a[K-1], b[K-1], ... fma(a[0], b[0], c)). The blocking, the row
// count M and the split of the columns over threads only decide which elements are computed
// together, never how one is computed, so a row's result does not depend on how many rows were
// computed with it (a decode step gives bitwise what a prefill gives for the same row) nor on
// the number of threads.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gpt2/gemv_kernel.hpp"
#include "gpt2/types.hpp"

#if GPT2_ATTENTION_AVX512_GEMM
namespace gpt2::detail::avx512 {

inline constexpr int kTileRows = 12;      // rows of C per micro-tile: 24 accumulators
inline constexpr Index kTileCols = 32;    // columns of C per micro-tile: two 16-float vectors
inline constexpr Index kDepthBlock = 128; // k per pass: B's [128, 32] panel (16 KB) stays in L1

// C[R, cols] += A[R, depth] * B[depth, cols] for one micro-tile: cols <= 32 columns, given by the
// lane masks m0 (columns 0-15) and m1 (16-31). a, b, c point at the tile's first element; lda,
// ldb, ldc are row strides. Masked lanes are neither read nor written.
template <int R>
inline void micro_tile(const float* a, Index lda, const float* b, Index ldb, float* c, Index ldc,
                       Index depth, __mmask16 m0, __mmask16 m1) {
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm512_maskz_loadu_ps(m0, c + r * ldc);
    acc1[r] = _mm512_maskz_loadu_ps(m1, c + r * ldc + 16);
  }
  for (Index k = 0; k < depth; ++k) {
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, b + k * ldb);
    const __m512 b1 = _mm512_maskz_loadu_ps(m1, b + k * ldb + 16);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * lda + k]);
      acc0[r] = _mm512_fmadd_ps(ar, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(ar, b1, acc1[r]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, m0, acc0[r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc1[r]);
  }
}

// micro_tile with a run-time row count 1 <= rows <= kTileRows.
inline void micro_tile_rows(int rows, const float* a, Index lda, const float* b, Index ldb,
                            float* c, Index ldc, Index depth, __mmask16 m0, __mmask16 m1) {
  switch (rows) {
    case 12: micro_tile<12>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
    case 11: micro_tile<11>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
    case 10: micro_tile<10>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
    case 9: micro_tile<9>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
    case 8: micro_tile<8>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
    case 7: micro_tile<7>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
    case 6: micro_tile<6>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
    case 5: micro_tile<5>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
    case 4: micro_tile<4>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
    case 3: micro_tile<3>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
    case 2: micro_tile<2>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
    default: micro_tile<1>(a, lda, b, ldb, c, ldc, depth, m0, m1); break;
  }
}

inline constexpr Index kRowBlock = 48;   // rows of A per block: A's [48, 128] block (24 KB) in L1
inline constexpr Index kColBlock = 256;  // columns of B per packed block
// Floats of the buffer gemm packs B's blocks into: [kColBlock / 32 panels][kDepthBlock][32].
inline constexpr Index kPackedSize = kDepthBlock * kColBlock;

// packed[p][k][0 .. 32) = B[k, 32 p .. 32 p + 32) for k < depth and the panels of `cols` columns
// (zeros past them). B is row-major with row stride ldb; packed is 64-byte aligned. Packing makes
// the kernel's reads of B contiguous, whatever B's row stride: its speed then no longer depends on
// where B's rows fall in the caches (a strided B ran up to 2x slower from one run to the next).
inline void pack_b(const float* B, Index ldb, Index depth, Index cols, float* packed) {
  for (Index j0 = 0; j0 < cols; j0 += kTileCols) {
    const __mmask16 m0 = lanes(j0, cols), m1 = lanes(j0 + 16, cols);
    float* dst = packed + (j0 / kTileCols) * depth * kTileCols;
    for (Index k = 0; k < depth; ++k) {
      _mm512_store_ps(dst + k * kTileCols, _mm512_maskz_loadu_ps(m0, B + k * ldb + j0));
      _mm512_store_ps(dst + k * kTileCols + 16, _mm512_maskz_loadu_ps(m1, B + k * ldb + j0 + 16));
    }
  }
}

// C[M, N] += A[M, K] * B[K, N]; row-major with row strides lda, ldb, ldc; C must not overlap A
// or B; packed: kPackedSize floats, 64-byte aligned. For each block of kColBlock columns and
// kDepthBlock depths, B's block is packed once, then swept by every row tile of A (A's
// [kRowBlock, kDepthBlock] blocks stay in L1, the packed block in L2).
inline void gemm(Index M, Index N, Index K, const float* A, Index lda, const float* B, Index ldb,
                 float* C, Index ldc, float* packed) {
  if (M == 1) {
    row_times_matrix(N, K, A, B, ldb, C);
    return;
  }
  for (Index jb = 0; jb < N; jb += kColBlock) {
    const Index cols = std::min(kColBlock, N - jb);
    for (Index k0 = 0; k0 < K; k0 += kDepthBlock) {
      const Index depth = std::min(kDepthBlock, K - k0);
      pack_b(B + k0 * ldb + jb, ldb, depth, cols, packed);
      for (Index ib = 0; ib < M; ib += kRowBlock) {
        const Index block_rows = std::min(kRowBlock, M - ib);
        for (Index j0 = 0; j0 < cols; j0 += kTileCols) {
          const __mmask16 m0 = lanes(j0, cols), m1 = lanes(j0 + 16, cols);
          const float* panel = packed + (j0 / kTileCols) * depth * kTileCols;
          for (Index i0 = ib; i0 < ib + block_rows; i0 += kTileRows) {
            const int rows = static_cast<int>(std::min<Index>(kTileRows, ib + block_rows - i0));
            micro_tile_rows(rows, A + i0 * lda + k0, lda, panel, kTileCols,
                            C + i0 * ldc + jb + j0, ldc, depth, m0, m1);
          }
        }
      }
    }
  }
}

}  // namespace gpt2::detail::avx512
#endif
