// The bf16 product of the avx2 level: C[M, N] += A[M, K] * B[K, N], A float32, B a bf16 weight in
// the bf16 panel layout of kernels/layout.hpp (depth Kp), widened to float32 in registers (k even:
// the low halves of a pair row shifted up 16 bits; k odd: the high halves). Every element of C is
// one chain of fused multiply-adds, k in order, from C's value: bitwise the avx512 level's
// widening product (and the float32 gemm on the widened weight).
#pragma once

#include <algorithm>
#include <cstdint>

#include "gpt2/kernels/avx2.hpp"
#include "gpt2/kernels/layout.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AVX2
namespace gpt2::kernels::avx2 {

inline constexpr int kBf16TileRows = 6;
inline constexpr Index kBf16RowBlock = 48;
inline constexpr Index kBf16ColBlock = 256;

GPT2_KERNEL_AVX2 inline __m256 widen_even(__m256i pairs) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
}
GPT2_KERNEL_AVX2 inline __m256 widen_odd(__m256i pairs) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// acc[r] += a[r, k] * (b0 | b1) for the tile's R rows.
template <int R>
GPT2_KERNEL_AVX2 inline void widened_step(__m256 (&acc0)[R], __m256 (&acc1)[R], const float* a,
                                          Index lda, Index k, __m256 b0, __m256 b1) {
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    const __m256 ar = _mm256_broadcast_ss(a + r * lda + k);
    acc0[r] = _mm256_fmadd_ps(ar, b0, acc0[r]);
    acc1[r] = _mm256_fmadd_ps(ar, b1, acc1[r]);
  }
}

// C[R, 16] += A[R, depth] * B[depth, 16]: b points at the 16-column strip of the panel's pair row
// of the block's first k (k even; pair rows 64 bf16 apart); m0 / m1: the lanes of columns 0-7 /
// 8-15 that are in C.
template <int R>
GPT2_KERNEL_AVX2 inline void widened_tile(const float* a, Index lda, const std::uint16_t* b,
                                          float* c, Index ldc, Index depth, __m256i m0,
                                          __m256i m1, const float* bias) {
  __m256 acc0[R], acc1[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm256_maskload_ps(bias ? bias : c + r * ldc, m0);
    acc1[r] = _mm256_maskload_ps(bias ? bias + 8 : c + r * ldc + 8, m1);
  }
  Index k = 0;
  for (; k + 2 <= depth; k += 2) {
    const std::uint16_t* pairs = b + k * kBf16PanelCols;
    const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs));
    const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs + 16));
    widened_step<R>(acc0, acc1, a, lda, k, widen_even(p0), widen_even(p1));
    widened_step<R>(acc0, acc1, a, lda, k + 1, widen_odd(p0), widen_odd(p1));
  }
  if (k < depth) {  // an odd last k: the even halves only
    const std::uint16_t* pairs = b + k * kBf16PanelCols;
    widened_step<R>(acc0, acc1, a, lda, k,
                    widen_even(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs))),
                    widen_even(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs + 16))));
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    _mm256_maskstore_ps(c + r * ldc, m0, acc0[r]);
    _mm256_maskstore_ps(c + r * ldc + 8, m1, acc1[r]);
  }
}

GPT2_KERNEL_AVX2 inline void widened_tile_rows(int rows, const float* a, Index lda,
                                               const std::uint16_t* b, float* c, Index ldc,
                                               Index depth, __m256i m0, __m256i m1,
                                               const float* bias) {
  switch (rows) {
    case 6: widened_tile<6>(a, lda, b, c, ldc, depth, m0, m1, bias); break;
    case 5: widened_tile<5>(a, lda, b, c, ldc, depth, m0, m1, bias); break;
    case 4: widened_tile<4>(a, lda, b, c, ldc, depth, m0, m1, bias); break;
    case 3: widened_tile<3>(a, lda, b, c, ldc, depth, m0, m1, bias); break;
    case 2: widened_tile<2>(a, lda, b, c, ldc, depth, m0, m1, bias); break;
    default: widened_tile<1>(a, lda, b, c, ldc, depth, m0, m1, bias); break;
  }
}

// C[M, N] += A[M, K] * B[K, N], B bf16-packed (depth Kp, from its first panel), widened; with a
// bias [N], C = bias + A B instead (C not read).
GPT2_KERNEL_AVX2 inline void gemm_bf16(Index M, Index N, Index K, const float* A, Index lda,
                                       const std::uint16_t* Bp, Index Kp, float* C, Index ldc,
                                       float* /*scratch*/, const float* bias) {
  for (Index jb = 0; jb < N; jb += kBf16ColBlock) {
    const Index cols = std::min(kBf16ColBlock, N - jb);
    for (Index ib = 0; ib < M; ib += kBf16RowBlock) {
      const Index block_end = std::min(M, ib + kBf16RowBlock);
      for (Index j0 = jb; j0 < jb + cols; j0 += 16) {
        const std::uint16_t* strip =
            Bp + (j0 / kBf16PanelCols) * Kp * kBf16PanelCols + 2 * (j0 % kBf16PanelCols);
        const __m256i m0 = lanes(N - j0), m1 = lanes(N - j0 - 8);
        for (Index i0 = ib; i0 < block_end; i0 += kBf16TileRows) {
          const int rows = static_cast<int>(std::min<Index>(kBf16TileRows, block_end - i0));
          widened_tile_rows(rows, A + i0 * lda, lda, strip, C + i0 * ldc + j0, ldc, K, m0, m1,
                            bias ? bias + j0 : nullptr);
        }
      }
    }
  }
}

}  // namespace gpt2::kernels::avx2
#endif  // GPT2_KERNELS_HAVE_AVX2
