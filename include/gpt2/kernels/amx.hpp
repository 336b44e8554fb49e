// The amx level's bf16 product: C[M, N] += A[M, K] * B[K, N] on AMX tiles (TDPBF16PS), A float32
// rounded to bf16 (nearest even), B a bf16 weight in the bf16 panel layout of kernels/layout.hpp,
// float32 accumulation.
//
// Tiles: C as 2 x 2 tiles of 16 x 16 floats (a 32-row, 32-column block: tmm0-3), A as two 16 x 32
// bf16 tiles (tmm4-5, rows of A's bf16 copy), B as two 16-pair-row x 16-column tiles (tmm6-7: the
// two halves of a panel's pair rows, 128 bytes apart, loaded in place: the packed layout is the
// tile layout). Per 32 k: 4 tile loads, 4 TDPBF16PS. Each C block starts from zero, adds the
// depth's tiles in k order, and is then added to C: a row gets the same bits whatever rows go with
// it (decode == prefill).
//
// On Linux a process must ask for the tile data state once (arch_prctl(ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA)) before its first tile instruction; kernels/cpu.hpp's amx_permission() does,
// and its answer decides whether the level is available (dispatch.hpp reports a refusal's reason).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "gpt2/kernels/amx_tiles.hpp"
#include "gpt2/kernels/avx512_bf16.hpp"
#include "gpt2/kernels/layout.hpp"
#include "gpt2/kernels/cpu.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AMX
namespace gpt2::kernels::amx {

inline constexpr Index kBlockRows = 32;   // rows of C per tile block (two A tiles)
inline constexpr Index kTileDepth = 32;   // bf16 of k per tile step
inline constexpr Index kColBlock = 256;   // columns of B per pass (8 panels: 384 KB at K = 768)
inline constexpr Index kWideColBlock = 768;  // the same when the depth fits one pass (1.2 MB at K = 768)
inline constexpr Index kCopyDepth = 1024; // depth of A's bf16 copy per pass
// Scratch: A's bf16 copy (32 rows x kCopyDepth) and the C blocks of a column block's panels.
inline constexpr Index kCopyFloats = kBlockRows * kCopyDepth / 2;
inline constexpr Index kBlockFloats = kBlockRows * kBf16PanelCols;
static_assert(kCopyFloats + (kColBlock / kBf16PanelCols) * kBlockFloats <= kPackFloats,
              "the amx product's scratch fits GemmScratch's buffer");

// The C tiles of a 32 x 32 block (Rows = 32: four tiles; Rows = 16: the upper two) += A's row
// tiles x the panel's two column tiles over `depth` k (a multiple of 32): a points at A's bf16
// copy (row stride a_stride bf16), b at the panel's pair row of the first k. `first`: start from
// zero, else from `block` (float[32][32]); the sums are stored back into block.
template <int Rows>
GPT2_KERNEL_AMX inline void tile_block(const std::uint16_t* a, Index a_stride,
                                       const std::uint16_t* b, Index depth, float* block,
                                       bool first) {
  constexpr Index kBlockStride = kBf16PanelCols * sizeof(float);   // bytes per row of block
  constexpr Index kPairStride = 2 * kBf16PanelCols * sizeof(std::uint16_t);  // bytes per pair row
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (Rows == 32) {
      _tile_zero(2);
      _tile_zero(3);
    }
  } else {
    _tile_loadd(0, block, kBlockStride);
    _tile_loadd(1, block + 16, kBlockStride);
    if constexpr (Rows == 32) {
      _tile_loadd(2, block + 16 * kBf16PanelCols, kBlockStride);
      _tile_loadd(3, block + 16 * kBf16PanelCols + 16, kBlockStride);
    }
  }
  const Index a_bytes = a_stride * static_cast<Index>(sizeof(std::uint16_t));
  for (Index k = 0; k < depth; k += kTileDepth) {
    const std::uint16_t* pairs = b + k * kBf16PanelCols;  // pair row k / 2
    _tile_loadd(4, a + k, a_bytes);
    _tile_loadd(6, pairs, kPairStride);
    _tile_loadd(7, pairs + 32, kPairStride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (Rows == 32) {
      _tile_loadd(5, a + 16 * a_stride + k, a_bytes);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, block, kBlockStride);
  _tile_stored(1, block + 16, kBlockStride);
  if constexpr (Rows == 32) {
    _tile_stored(2, block + 16 * kBf16PanelCols, kBlockStride);
    _tile_stored(3, block + 16 * kBf16PanelCols + 16, kBlockStride);
  }
}

// C[rows, 32] += block[rows, 32] (lanes past N masked); with a bias [32], C = bias + block
// instead (C not read).
GPT2_KERNEL_AMX inline void add_block(const float* block, Index rows, float* c, Index ldc,
                                      __mmask16 m0, __mmask16 m1, const float* bias) {
  const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
  const __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
  for (Index r = 0; r < rows; ++r) {
    float* row = c + r * ldc;
    const float* s = block + r * kBf16PanelCols;
    const __m512 c0 = bias ? b0 : _mm512_maskz_loadu_ps(m0, row);
    const __m512 c1 = bias ? b1 : _mm512_maskz_loadu_ps(m1, row + 16);
    _mm512_mask_storeu_ps(row, m0, _mm512_add_ps(c0, _mm512_load_ps(s)));
    _mm512_mask_storeu_ps(row + 16, m1, _mm512_add_ps(c1, _mm512_load_ps(s + 16)));
  }
}

// C[M, N] += A[M, K] * B[K, N], B bf16-packed (depth Kp, from its first panel); scratch:
// kPackFloats floats, 64-byte aligned. A's copy has zeros past K, as B has zero rows past K. With
// a bias [N], C = bias + A B instead (C not read: one pass over C fewer).
GPT2_KERNEL_AMX inline void gemm_bf16(Index M, Index N, Index K, const float* A, Index lda,
                                      const std::uint16_t* Bp, Index Kp, float* C, Index ldc,
                                      float* scratch, const float* bias) {
  std::uint16_t* copy = reinterpret_cast<std::uint16_t*>(scratch);
  float* blocks = scratch + kCopyFloats;
  load_tile_config();
  if (Kp <= kCopyDepth) {
    // One pass over the depth: each C block is finished by one tile_block and added to C at once
    // (one block of scratch), so the column blocks can be wide (kWideColBlock: B's block stays in
    // L2) and A's rows are rounded to bf16 N / kWideColBlock times rather than N / kColBlock.
    // The same tile operations per element of C as below: the same bits.
    for (Index jb = 0; jb < N; jb += kWideColBlock) {
      const Index cols = std::min(kWideColBlock, N - jb);
      for (Index ib = 0; ib < M; ib += kBlockRows) {
        const Index rows = std::min(kBlockRows, M - ib);
        avx512_bf16::round_rows_to_bf16(rows, K, A + ib * lda, lda, Kp, copy);
        for (Index j0 = jb; j0 < jb + cols; j0 += kBf16PanelCols) {
          const std::uint16_t* panel = Bp + (j0 / kBf16PanelCols) * Kp * kBf16PanelCols;
          if (rows > 16)
            tile_block<32>(copy, Kp, panel, Kp, blocks, true);
          else
            tile_block<16>(copy, Kp, panel, Kp, blocks, true);
          add_block(blocks, rows, C + ib * ldc + j0, ldc, avx512::lanes(j0, N),
                    avx512::lanes(j0 + 16, N), bias ? bias + j0 : nullptr);
        }
      }
    }
    _tile_release();
    return;
  }
  for (Index jb = 0; jb < N; jb += kColBlock) {
    const Index cols = std::min(kColBlock, N - jb);
    for (Index ib = 0; ib < M; ib += kBlockRows) {
      const Index rows = std::min(kBlockRows, M - ib);
      for (Index k0 = 0; k0 < Kp; k0 += kCopyDepth) {
        const Index depth = std::min(kCopyDepth, Kp - k0);  // a multiple of 32
        const Index k_left = std::max<Index>(0, std::min(depth, K - k0));
        avx512_bf16::round_rows_to_bf16(rows, k_left, A + ib * lda + k0, lda, depth, copy);
        // Rows of the copy past `rows` hold whatever an earlier block left there: they only feed
        // rows of the C block that are never added to C (tile instructions raise no exceptions).
        for (Index j0 = jb; j0 < jb + cols; j0 += kBf16PanelCols) {
          const std::uint16_t* panel =
              Bp + (j0 / kBf16PanelCols) * Kp * kBf16PanelCols + k0 * kBf16PanelCols;
          float* block = blocks + ((j0 - jb) / kBf16PanelCols) * kBlockFloats;
          if (rows > 16)
            tile_block<32>(copy, depth, panel, depth, block, k0 == 0);
          else
            tile_block<16>(copy, depth, panel, depth, block, k0 == 0);
        }
      }
      for (Index j0 = jb; j0 < jb + cols; j0 += kBf16PanelCols)
        add_block(blocks + ((j0 - jb) / kBf16PanelCols) * kBlockFloats, rows, C + ib * ldc + j0, ldc,
                  avx512::lanes(j0, N), avx512::lanes(j0 + 16, N), bias ? bias + j0 : nullptr);
    }
  }
  _tile_release();
}

}  // namespace gpt2::kernels::amx
#endif  // GPT2_KERNELS_HAVE_AMX
