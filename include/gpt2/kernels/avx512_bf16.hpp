// The bf16 products of the avx512 and avx512_bf16 levels: C[M, N] += A[M, K] * B[K, N], A float32
// (row-major), B a bf16 weight in the bf16 panel layout of kernels/layout.hpp (depth Kp).
//
//   avx512::gemm_bf16        B widened to float32 in registers (k even: a pair row's low halves
//                            shifted up 16 bits; k odd: its high halves), A float32: every element
//                            of C is one chain of fused multiply-adds, k in order, from C's value:
//                            bitwise the float32 gemm on the widened weight (and the avx2 level's).
//   avx512_bf16::gemm_bf16   VDPBF16PS: A rounded to bf16 (nearest even, VCVTNE2PS2BF16), each
//                            lane adding a[k] b[k] + a[k + 1] b[k + 1] per pair, k in order, from
//                            C's value, in float32 (the instruction's DAZ and FTZ: bf16 subnormals
//                            count as zero).
// Both give a row the same bits whatever rows are computed with it (decode == prefill).
#pragma once

#include <algorithm>
#include <cstdint>

#include "gpt2/kernels/avx512.hpp"
#include "gpt2/kernels/layout.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AVX512
#define GPT2_KERNEL_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")))

namespace gpt2::kernels::avx512 {

// Rows of C per bf16 micro-tile (24 accumulators), and rows of A per block (a block of A and its
// bf16 copy stay in L1 while a column block of panels passes).
inline constexpr int kBf16TileRows = 12;
inline constexpr Index kBf16RowBlock = 2 * kBf16TileRows;
inline constexpr Index kBf16ColBlock = 256;  // columns of B per pass (8 panels: 384 KB at K = 768)

// k even and k odd of half a pair row (16 columns), widened to float32.
GPT2_KERNEL_AVX512 inline __m512 widen_even(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
}
GPT2_KERNEL_AVX512 inline __m512 widen_odd(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// acc[r] += a[r, k] * (b0 | b1) for the tile's R rows (one k of the FMA chains).
template <int R>
GPT2_KERNEL_AVX512 inline void widened_step(__m512 (&acc0)[R], __m512 (&acc1)[R], const float* a,
                                            Index lda, Index k, __m512 b0, __m512 b1) {
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    const __m512 ar = _mm512_set1_ps(a[r * lda + k]);
    acc0[r] = _mm512_fmadd_ps(ar, b0, acc0[r]);
    acc1[r] = _mm512_fmadd_ps(ar, b1, acc1[r]);
  }
}

// C[R, 32] += A[R, depth] * B[depth, 32] with B's panel widened: b points at the panel's pair row
// of the block's first k (k even). Masked lanes of C are neither read nor written.
template <int R>
GPT2_KERNEL_AVX512 inline void widened_tile(const float* a, Index lda, const std::uint16_t* b,
                                            float* c, Index ldc, Index depth, __mmask16 m0,
                                            __mmask16 m1, const float* bias) {
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm512_maskz_loadu_ps(m0, bias ? bias : c + r * ldc);
    acc1[r] = _mm512_maskz_loadu_ps(m1, bias ? bias + 16 : c + r * ldc + 16);
  }
  Index k = 0;
  for (; k + 2 <= depth; k += 2) {
    const __m512i p0 = _mm512_load_si512(b + k * kBf16PanelCols);
    const __m512i p1 = _mm512_load_si512(b + k * kBf16PanelCols + 32);
    widened_step<R>(acc0, acc1, a, lda, k, widen_even(p0), widen_even(p1));
    widened_step<R>(acc0, acc1, a, lda, k + 1, widen_odd(p0), widen_odd(p1));
  }
  if (k < depth)  // an odd last k: the even halves only (a[k + 1] is past the row)
    widened_step<R>(acc0, acc1, a, lda, k, widen_even(_mm512_load_si512(b + k * kBf16PanelCols)),
                    widen_even(_mm512_load_si512(b + k * kBf16PanelCols + 32)));
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, m0, acc0[r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc1[r]);
  }
}

// Calls tile<R>(...) for a run-time R in [1, kBf16TileRows].
template <template <int> class Tile, class... Args>
GPT2_KERNEL_AVX512 inline void with_rows(int rows, Args... args) {
  switch (rows) {
    case 12: Tile<12>::run(args...); break;
    case 11: Tile<11>::run(args...); break;
    case 10: Tile<10>::run(args...); break;
    case 9: Tile<9>::run(args...); break;
    case 8: Tile<8>::run(args...); break;
    case 7: Tile<7>::run(args...); break;
    case 6: Tile<6>::run(args...); break;
    case 5: Tile<5>::run(args...); break;
    case 4: Tile<4>::run(args...); break;
    case 3: Tile<3>::run(args...); break;
    case 2: Tile<2>::run(args...); break;
    default: Tile<1>::run(args...); break;
  }
}

template <int R>
struct WidenedTile {
  GPT2_KERNEL_AVX512 static void run(const float* a, Index lda, const std::uint16_t* b, float* c,
                                     Index ldc, Index depth, __mmask16 m0, __mmask16 m1,
                                     const float* bias) {
    widened_tile<R>(a, lda, b, c, ldc, depth, m0, m1, bias);
  }
};

// C[M, N] += A[M, K] * B[K, N], B bf16-packed (depth Kp, from its first panel), widened; with a
// bias [N], C = bias + A B instead (C not read).
GPT2_KERNEL_AVX512 inline void gemm_bf16(Index M, Index N, Index K, const float* A, Index lda,
                                         const std::uint16_t* Bp, Index Kp, float* C, Index ldc,
                                         float* /*scratch*/, const float* bias) {
  for (Index jb = 0; jb < N; jb += kBf16ColBlock) {
    const Index cols = std::min(kBf16ColBlock, N - jb);
    for (Index ib = 0; ib < M; ib += kBf16RowBlock) {
      const Index block_rows = std::min(kBf16RowBlock, M - ib);
      for (Index j0 = jb; j0 < jb + cols; j0 += kBf16PanelCols) {
        const __mmask16 m0 = lanes(j0, N), m1 = lanes(j0 + 16, N);
        const std::uint16_t* panel = Bp + (j0 / kBf16PanelCols) * Kp * kBf16PanelCols;
        for (Index i0 = ib; i0 < ib + block_rows; i0 += kBf16TileRows) {
          const int rows = static_cast<int>(std::min<Index>(kBf16TileRows, ib + block_rows - i0));
          with_rows<WidenedTile>(rows, A + i0 * lda, lda, panel, C + i0 * ldc + j0, ldc, K, m0, m1,
                                 bias ? bias + j0 : nullptr);
        }
      }
    }
  }
}

}  // namespace gpt2::kernels::avx512

namespace gpt2::kernels::avx512_bf16 {

using avx512::kBf16ColBlock;
using avx512::kBf16RowBlock;
using avx512::kBf16TileRows;
using avx512::lanes;

// Floats of the scratch a bf16 product needs for A's bf16 copy: `rows` rows of `depth` bf16.
inline constexpr Index bf16_copy_floats(Index rows, Index depth) { return (rows * depth + 1) / 2; }

// dst[r, 0 .. depth) = bf16(A[r, 0 .. depth)) for r < rows, zeros past K (depth even, >= K; dst
// 64-byte aligned, row stride `depth`): VCVTNE2PS2BF16, nearest even. Plain loads and stores where
// all 32 elements lie within K: a prefill's A comes from L3 once per column block, where masked
// loads slow the copy down (bench/results/history-bf16.md).
GPT2_KERNEL_AVX512_BF16 inline void round_rows_to_bf16(Index rows, Index K, const float* A,
                                                       Index lda, Index depth, std::uint16_t* dst) {
  for (Index r = 0; r < rows; ++r) {
    const float* a = A + r * lda;
    std::uint16_t* d = dst + r * depth;
    Index k = 0;
    for (; k + 32 <= K; k += 32) {  // K <= depth
      const __m512i packed = reinterpret_cast<__m512i>(
          _mm512_cvtne2ps_pbh(_mm512_loadu_ps(a + k + 16), _mm512_loadu_ps(a + k)));
      _mm512_storeu_si512(d + k, packed);
    }
    for (; k < depth; k += 32) {
      const __m512 lo = _mm512_maskz_loadu_ps(lanes(k, K), a + k);
      const __m512 hi = _mm512_maskz_loadu_ps(lanes(k + 16, K), a + k + 16);
      const __m512i packed = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
      const Index left = std::min<Index>(32, depth - k);
      _mm512_mask_storeu_epi16(d + k, static_cast<__mmask32>((std::uint64_t(1) << left) - 1), packed);
    }
  }
}

// C[R, 32] += A[R, depth] * B[depth, 32], A as bf16 pairs (row stride lda_pairs 32-bit pairs), B
// the panel's pair rows from the block's first k: one VDPBF16PS per pair and vector.
template <int R>
GPT2_KERNEL_AVX512_BF16 inline void dot_tile(const std::uint32_t* a, Index lda_pairs,
                                             const std::uint16_t* b, float* c, Index ldc,
                                             Index pairs, __mmask16 m0, __mmask16 m1,
                                             const float* bias) {
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm512_maskz_loadu_ps(m0, bias ? bias : c + r * ldc);
    acc1[r] = _mm512_maskz_loadu_ps(m1, bias ? bias + 16 : c + r * ldc + 16);
  }
  for (Index p = 0; p < pairs; ++p) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_load_si512(b + p * 2 * kBf16PanelCols));
    const __m512bh b1 =
        reinterpret_cast<__m512bh>(_mm512_load_si512(b + p * 2 * kBf16PanelCols + 32));
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512bh ar = reinterpret_cast<__m512bh>(
          _mm512_set1_epi32(static_cast<int>(a[r * lda_pairs + p])));
      acc0[r] = _mm512_dpbf16_ps(acc0[r], ar, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], ar, b1);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, m0, acc0[r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc1[r]);
  }
}

template <int R>
struct DotTile {
  GPT2_KERNEL_AVX512_BF16 static void run(const std::uint32_t* a, Index lda_pairs,
                                          const std::uint16_t* b, float* c, Index ldc, Index pairs,
                                          __mmask16 m0, __mmask16 m1, const float* bias) {
    dot_tile<R>(a, lda_pairs, b, c, ldc, pairs, m0, m1, bias);
  }
};

// ---- one row of A (a decode step's projections) ---------------------------------------------
// One row cannot fill a tile's chains, and the step reads every weight once, so it is paced by
// memory: P panels side by side (2 P independent chains), each panel's stream fetched
// kBf16PrefetchPairs pair rows ahead, as the float32 strips do theirs (avx512.hpp). Every element
// of c is the chain dot_tile computes for it (pairs in order, from c's value or the bias): the same
// bits.

// Pair rows (128 bytes each) ahead of the one being read that dot_row prefetches in each panel
// (chosen by measurement from DRAM with gpt2_decode_phases: bench/results/history-bf16.md).
inline constexpr Index kBf16PrefetchPairs = 16;

// c[0, 32 P) += a (bf16 pairs) * P panels from `panel` (Kp deep, kBf16PanelCols columns each;
// columns past N masked by m), over `pairs` pairs; with a bias, c = bias + a B (c not read).
template <int P>
GPT2_KERNEL_AVX512_BF16 inline void dot_row_panels(const std::uint32_t* a, const std::uint16_t* panel,
                                                   Index Kp, float* c, Index pairs,
                                                   const __mmask16 (&m)[2 * P], const float* bias) {
  __m512 acc[2 * P];
#pragma GCC unroll 16
  for (int v = 0; v < 2 * P; ++v) acc[v] = _mm512_maskz_loadu_ps(m[v], bias ? bias + 16 * v : c + 16 * v);
  const Index panel_stride = Kp * kBf16PanelCols, pair_row = 2 * kBf16PanelCols;
  for (Index p = 0; p < pairs; ++p) {
    const __m512bh ap = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[p])));
#pragma GCC unroll 8
    for (int q = 0; q < P; ++q) {
      const std::uint16_t* row = panel + q * panel_stride + p * pair_row;
      _mm_prefetch(reinterpret_cast<const char*>(row + kBf16PrefetchPairs * pair_row), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + kBf16PrefetchPairs * pair_row + 32), _MM_HINT_T0);
      acc[2 * q] = _mm512_dpbf16_ps(acc[2 * q], ap, reinterpret_cast<__m512bh>(_mm512_load_si512(row)));
      acc[2 * q + 1] =
          _mm512_dpbf16_ps(acc[2 * q + 1], ap, reinterpret_cast<__m512bh>(_mm512_load_si512(row + 32)));
    }
  }
#pragma GCC unroll 16
  for (int v = 0; v < 2 * P; ++v) _mm512_mask_storeu_ps(c + 16 * v, m[v], acc[v]);
}

// c[1, N] += a[1, K] * B[K, N] (a's bf16 pairs: `pairs` of them), B's panels from Bp (depth Kp):
// four panels at a time, the last ones one at a time. With a bias, c = bias + a B.
GPT2_KERNEL_AVX512_BF16 inline void dot_row(Index N, const std::uint32_t* a, Index pairs,
                                            const std::uint16_t* Bp, Index Kp, float* c,
                                            const float* bias) {
  constexpr int P = 4;
  Index j0 = 0;
  for (; j0 + P * kBf16PanelCols <= N; j0 += P * kBf16PanelCols) {
    __mmask16 m[2 * P];
    for (int v = 0; v < 2 * P; ++v) m[v] = lanes(j0 + 16 * v, N);
    dot_row_panels<P>(a, Bp + (j0 / kBf16PanelCols) * Kp * kBf16PanelCols, Kp, c + j0, pairs, m,
                      bias ? bias + j0 : nullptr);
  }
  for (; j0 < N; j0 += kBf16PanelCols) {
    const __mmask16 m[2] = {lanes(j0, N), lanes(j0 + 16, N)};
    dot_row_panels<1>(a, Bp + (j0 / kBf16PanelCols) * Kp * kBf16PanelCols, Kp, c + j0, pairs, m,
                      bias ? bias + j0 : nullptr);
  }
}

// Depth of A's bf16 copy per pass: kBf16RowBlock rows of it fit the scratch (kPackFloats floats).
inline constexpr Index kBf16CopyDepth = 2048;
static_assert(bf16_copy_floats(kBf16RowBlock, kBf16CopyDepth) <= kPackFloats,
              "A's bf16 copy fits GemmScratch's buffer");

// C[M, N] += A[M, K] * B[K, N], B bf16-packed (depth Kp, from its first panel); A's row blocks
// rounded to bf16 into scratch (kPackFloats floats, 64-byte aligned) in depth chunks. With a bias
// [N], C = bias + A B instead (C not read).
GPT2_KERNEL_AVX512_BF16 inline void gemm_bf16(Index M, Index N, Index K, const float* A, Index lda,
                                              const std::uint16_t* Bp, Index Kp, float* C,
                                              Index ldc, float* scratch, const float* bias) {
  std::uint16_t* copy = reinterpret_cast<std::uint16_t*>(scratch);
  if (M == 1 && Kp <= kBf16CopyDepth) {  // a decode step: one row, dot_row
    round_rows_to_bf16(1, K, A, lda, Kp, copy);
    dot_row(N, reinterpret_cast<const std::uint32_t*>(copy), (K + 1) / 2, Bp, Kp, C, bias);
    return;
  }
  for (Index jb = 0; jb < N; jb += kBf16ColBlock) {
    const Index cols = std::min(kBf16ColBlock, N - jb);
    for (Index ib = 0; ib < M; ib += kBf16RowBlock) {
      const Index block_rows = std::min(kBf16RowBlock, M - ib);
      for (Index k0 = 0; k0 < K; k0 += kBf16CopyDepth) {
        const Index depth = std::min(kBf16CopyDepth, Kp - k0);  // even
        const Index k_left = std::min(depth, K - k0);
        round_rows_to_bf16(block_rows, k_left, A + ib * lda + k0, lda, depth, copy);
        const std::uint32_t* pairs = reinterpret_cast<const std::uint32_t*>(copy);
        for (Index j0 = jb; j0 < jb + cols; j0 += kBf16PanelCols) {
          const __mmask16 m0 = lanes(j0, N), m1 = lanes(j0 + 16, N);
          const std::uint16_t* panel =
              Bp + (j0 / kBf16PanelCols) * Kp * kBf16PanelCols + k0 * kBf16PanelCols;
          for (Index i0 = 0; i0 < block_rows; i0 += kBf16TileRows) {
            const int rows = static_cast<int>(std::min<Index>(kBf16TileRows, block_rows - i0));
            avx512::with_rows<DotTile>(rows, pairs + i0 * (depth / 2), depth / 2, panel,
                                       C + (ib + i0) * ldc + j0, ldc, (k_left + 1) / 2, m0, m1,
                                       bias && k0 == 0 ? bias + j0 : nullptr);
          }
        }
      }
    }
  }
}

}  // namespace gpt2::kernels::avx512_bf16
#endif  // GPT2_KERNELS_HAVE_AVX512
