// The int8 products with VPDPBUSD (AVX512-VNNI): C[M, N] = bias + A[M, K] B[K, N], B int8-packed
// (kernels/int8.hpp's panel layout), A float32 quantized on the fly. The arithmetic is
// kernels/int8.hpp's, bit for bit: the quantization of A vectorized (the same float32 operations,
// VCVTPS2DQ rounding to nearest even as nearbyint does), each block's integer dot product exact
// (VPDPBUSD, unsigned stored weights times signed activations, started from the row's correction
// -128 sum qa), then one fused multiply-add per block, in block order. The avx512, avx512_bf16 and
// amx levels run it where the CPU has AVX512-VNNI; levels or CPUs without it run the plain C++.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gpt2/kernels/cpu.hpp"
#include "gpt2/kernels/int8.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AVX512
#include <immintrin.h>

#define GPT2_KERNEL_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma")))

namespace gpt2::kernels::avx512_vnni {

// Rows of C per micro-tile: 2 R int32 block sums and 2 R float32 accumulators in registers.
inline constexpr int kTileRows = 6;
// Weight bytes ahead of the one being read that a one-row product prefetches in each panel.
inline constexpr Index kPrefetchBytes = 2 * kInt8BlockBytes;

// Lanes j .. j + 15 of n columns.
GPT2_KERNEL_AVX512_VNNI inline __mmask16 lanes(Index j, Index n) {
  const Index left = n - j;
  return left >= 16 ? __mmask16(0xffff) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1u);
}

// quantize_rows (kernels/int8.hpp), vectorized: the same scales, values and corrections.
GPT2_KERNEL_AVX512_VNNI inline void quantize_rows_vnni(Index rows, Index K, const float* A, Index lda,
                                                  const Int8Rows& r) {
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (Index i = 0; i < rows; ++i) {
    const float* a = A + i * lda;
    std::int8_t* q = r.q + i * r.Kp;
    for (Index b = 0; b < r.nb; ++b) {
      const Index k0 = b * kInt8Block, n = std::min(kInt8Block, K - k0);
      const __mmask16 m0 = lanes(0, n), m1 = lanes(16, n);
      const __m512 x0 = _mm512_maskz_loadu_ps(m0, a + k0), x1 = _mm512_maskz_loadu_ps(m1, a + k0 + 16);
      const __m512 ax = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1));
      float amax = _mm512_reduce_max_ps(ax);
      // a NaN anywhere: the scalar code's amax is NaN (max_ps drops it)
      if (_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q))
        amax = std::numeric_limits<float>::quiet_NaN();
      const float scale = int8_scale(amax), inv = int8_inverse(amax);
      const __m512 vinv = _mm512_set1_ps(inv);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x0, vinv), lo), hi));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x1, vinv), lo), hi));
      // lanes past n: x = 0 -> q = 0 (and a NaN inv gives -127 there: zero them)
      const __m512i z0 = _mm512_maskz_mov_epi32(m0, q0), z1 = _mm512_maskz_mov_epi32(m1, q1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k0), _mm512_cvtepi32_epi8(z0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k0 + 16), _mm512_cvtepi32_epi8(z1));
      r.scale[i * r.nb + b] = scale;
      r.corr[i * r.nb + b] = -kInt8Offset * _mm512_reduce_add_epi32(_mm512_add_epi32(z0, z1));
    }
  }
}

// C rows i0 .. i0 + R - 1, the 32 columns of one panel (m0, m1: the lanes inside N): c = bias +
// sum over the blocks, or c += without a bias.
template <int R>
GPT2_KERNEL_AVX512_VNNI inline void tile(const Int8Rows& r, Index i0, const std::uint8_t* panel,
                                         float* c, Index ldc, __mmask16 m0, __mmask16 m1,
                                         const float* bias) {
  __m512 acc[R][2];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    acc[i][0] = _mm512_maskz_loadu_ps(m0, bias ? bias : c + i * ldc);
    acc[i][1] = _mm512_maskz_loadu_ps(m1, bias ? bias + 16 : c + i * ldc + 16);
  }
  const std::int8_t* a = r.q + i0 * r.Kp;
  for (Index b = 0; b < r.nb; ++b) {
    const std::uint8_t* block = panel + b * kInt8BlockBytes;
    __m512i d[R][2];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) d[i][0] = d[i][1] = _mm512_set1_epi32(r.corr[(i0 + i) * r.nb + b]);
#pragma GCC unroll 8
    for (Index g = 0; g < kInt8Block / 4; ++g) {
      const __m512i w0 = _mm512_load_si512(block + g * 128);
      const __m512i w1 = _mm512_load_si512(block + g * 128 + 64);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        std::int32_t four;
        std::memcpy(&four, a + i * r.Kp + b * kInt8Block + 4 * g, 4);
        const __m512i x = _mm512_set1_epi32(four);
        d[i][0] = _mm512_dpbusd_epi32(d[i][0], w0, x);
        d[i][1] = _mm512_dpbusd_epi32(d[i][1], w1, x);
      }
    }
    const __m512 sw0 = _mm512_load_ps(block + kInt8WeightBytes);
    const __m512 sw1 = _mm512_load_ps(block + kInt8WeightBytes + 64);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 sa = _mm512_set1_ps(r.scale[(i0 + i) * r.nb + b]);
      acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[i][0]), _mm512_mul_ps(sa, sw0), acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[i][1]), _mm512_mul_ps(sa, sw1), acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, acc[i][0]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc[i][1]);
  }
}

// One quantized row times P panels side by side (2 P independent chains; the weights stream from
// memory in a decode step, each panel prefetched kPrefetchBytes ahead): the bits tile<1> gives.
template <int P>
GPT2_KERNEL_AVX512_VNNI inline void row_panels(const Int8Rows& r, const std::uint8_t* panel,
                                               Index panel_bytes, float* c,
                                               const __mmask16 (&m)[2 * P], const float* bias) {
  __m512 acc[2 * P];
#pragma GCC unroll 16
  for (int v = 0; v < 2 * P; ++v) acc[v] = _mm512_maskz_loadu_ps(m[v], bias ? bias + 16 * v : c + 16 * v);
  for (Index b = 0; b < r.nb; ++b) {
    const __m512i corr = _mm512_set1_epi32(r.corr[b]);
    __m512i d[2 * P];
#pragma GCC unroll 16
    for (int v = 0; v < 2 * P; ++v) d[v] = corr;
#pragma GCC unroll 8
    for (Index g = 0; g < kInt8Block / 4; ++g) {
      std::int32_t four;
      std::memcpy(&four, r.q + b * kInt8Block + 4 * g, 4);
      const __m512i x = _mm512_set1_epi32(four);
#pragma GCC unroll 8
      for (int p = 0; p < P; ++p) {
        const std::uint8_t* w = panel + p * panel_bytes + b * kInt8BlockBytes + g * 128;
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytes), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytes + 64), _MM_HINT_T0);
        d[2 * p] = _mm512_dpbusd_epi32(d[2 * p], _mm512_load_si512(w), x);
        d[2 * p + 1] = _mm512_dpbusd_epi32(d[2 * p + 1], _mm512_load_si512(w + 64), x);
      }
    }
    const __m512 sa = _mm512_set1_ps(r.scale[b]);
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
      const std::uint8_t* s = panel + p * panel_bytes + b * kInt8BlockBytes + kInt8WeightBytes;
      _mm_prefetch(reinterpret_cast<const char*>(s + kPrefetchBytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(s + kPrefetchBytes + 64), _MM_HINT_T0);
      acc[2 * p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[2 * p]),
                                   _mm512_mul_ps(sa, _mm512_load_ps(s)), acc[2 * p]);
      acc[2 * p + 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[2 * p + 1]),
                                       _mm512_mul_ps(sa, _mm512_load_ps(s + 64)), acc[2 * p + 1]);
    }
  }
#pragma GCC unroll 16
  for (int v = 0; v < 2 * P; ++v) _mm512_mask_storeu_ps(c + 16 * v, m[v], acc[v]);
}

template <int R>
GPT2_KERNEL_AVX512_VNNI inline void tile_rows_upto(int rows, const Int8Rows& r, Index i0,
                                                   const std::uint8_t* panel, float* c, Index ldc,
                                                   __mmask16 m0, __mmask16 m1, const float* bias) {
  if constexpr (R > 1) {
    if (rows < R) return tile_rows_upto<R - 1>(rows, r, i0, panel, c, ldc, m0, m1, bias);
  }
  tile<R>(r, i0, panel, c, ldc, m0, m1, bias);
}

// C[M, N] = bias + A[M, K] B, or C += A B without a bias; B int8-packed from its first panel (Bp),
// buf as gemm_int8_scalar's (kernels/int8.hpp).
GPT2_KERNEL_AVX512_VNNI inline void gemm_int8(Index M, Index N, Index K, const float* A, Index lda,
                                              const std::uint8_t* Bp, float* C, Index ldc,
                                              const float* bias, void* buf) {
  const Index nb = int8_blocks(K), panel_bytes = nb * kInt8BlockBytes;
  for (Index i0 = 0; i0 < M; i0 += kInt8ChunkRows) {
    const Index rows = std::min(kInt8ChunkRows, M - i0);
    const Int8Rows r = int8_rows_in(buf, rows, K);
    quantize_rows_vnni(rows, K, A + i0 * lda, lda, r);
    if (rows == 1) {  // a decode step: one row, four panels at a time
      constexpr int P = 4;
      Index j0 = 0;
      for (; j0 + P * kInt8PanelCols <= N; j0 += P * kInt8PanelCols) {
        __mmask16 m[2 * P];
        for (int v = 0; v < 2 * P; ++v) m[v] = lanes(j0 + 16 * v, N);
        row_panels<P>(r, Bp + (j0 / kInt8PanelCols) * panel_bytes, panel_bytes, C + i0 * ldc + j0,
                      m, bias ? bias + j0 : nullptr);
      }
      for (; j0 < N; j0 += kInt8PanelCols) {
        const __mmask16 m[2] = {lanes(j0, N), lanes(j0 + 16, N)};
        row_panels<1>(r, Bp + (j0 / kInt8PanelCols) * panel_bytes, panel_bytes, C + i0 * ldc + j0,
                      m, bias ? bias + j0 : nullptr);
      }
      continue;
    }
    for (Index j0 = 0; j0 < N; j0 += kInt8PanelCols) {
      const std::uint8_t* panel = Bp + (j0 / kInt8PanelCols) * panel_bytes;
      const __mmask16 m0 = lanes(j0, N), m1 = lanes(j0 + 16, N);
      for (Index i = 0; i < rows; i += kTileRows) {
        const int n = static_cast<int>(std::min<Index>(kTileRows, rows - i));
        tile_rows_upto<kTileRows>(n, r, i, panel, C + (i0 + i) * ldc + j0, ldc, m0, m1,
                                  bias ? bias + j0 : nullptr);
      }
    }
  }
}

}  // namespace gpt2::kernels::avx512_vnni
#endif  // GPT2_KERNELS_HAVE_AVX512
