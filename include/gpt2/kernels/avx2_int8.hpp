// The avx2 level's int8 products: C[M, N] = bias + A[M, K] B[K, N], B int8-packed
// (kernels/int8.hpp's panel layout), A float32 quantized on the fly, on 256-bit registers. The
// arithmetic is kernels/int8.hpp's, bit for bit: the quantization of A vectorized (the same float32
// operations, VCVTPS2DQ rounding to nearest even as nearbyint does), each block's integer dot
// product exact, then one fused multiply-add per block, in block order. Two ways to the integer
// dot products, chosen at run time:
//   VnniDot  VPDPBUSD on ymm (AVX-VNNI: Intel from Alder Lake and Sapphire Rapids, AMD from Zen 5),
//            unsigned stored weights times signed activations, from the row's correction -128 sum qa;
//   MaddDot  plain AVX2: |qa| times qw with qa's sign (VPSIGNB), pairs added in 16 bits
//            (VPMADDUBSW: at most 2 * 127 * 127, never saturating), then in 32 (VPMADDWD), from 0.
// Both give every block's exact sum, hence the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gpt2/kernels/cpu.hpp"
#include "gpt2/kernels/int8.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AVX2
#include <immintrin.h>

#define GPT2_KERNEL_AVX2_INT8 __attribute__((target("avx2,fma")))
#define GPT2_KERNEL_AVX_VNNI __attribute__((target("avx2,fma,avxvnni")))

namespace gpt2::kernels::avx2_int8 {

// quantize_rows (kernels/int8.hpp) on ymm: the same scales, values and corrections.
GPT2_KERNEL_AVX2_INT8 inline void quantize_rows_avx2(Index rows, Index K, const float* A, Index lda,
                                                const Int8Rows& r) {
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (Index i = 0; i < rows; ++i) {
    const float* a = A + i * lda;
    std::int8_t* q = r.q + i * r.Kp;
    for (Index b = 0; b < r.nb; ++b) {
      const Index k0 = b * kInt8Block, n = std::min(kInt8Block, K - k0);
      alignas(32) float x[kInt8Block] = {};
      std::memcpy(x, a + k0, static_cast<std::size_t>(n) * sizeof(float));
      __m256 v[4], amax = _mm256_setzero_ps();
      bool nan = false;
      for (int u = 0; u < 4; ++u) {
        v[u] = _mm256_load_ps(x + 8 * u);
        amax = _mm256_max_ps(amax, _mm256_and_ps(v[u], abs_mask));
        nan |= _mm256_movemask_ps(_mm256_cmp_ps(v[u], v[u], _CMP_UNORD_Q)) != 0;
      }
      alignas(32) float m[8];
      _mm256_store_ps(m, amax);
      float top = m[0];
      for (int l = 1; l < 8; ++l) top = m[l] > top ? m[l] : top;
      if (nan) top = std::numeric_limits<float>::quiet_NaN();
      const __m256 inv = _mm256_set1_ps(int8_inverse(top));
      alignas(32) std::int32_t qi[kInt8Block];
      for (int u = 0; u < 4; ++u)
        _mm256_store_si256(reinterpret_cast<__m256i*>(qi + 8 * u),
                           _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[u], inv), lo), hi)));
      std::int32_t sum = 0;
      for (Index k = 0; k < kInt8Block; ++k) {
        const std::int32_t value = k < n ? qi[k] : 0;  // past n: zeros (a NaN inv gives -127)
        q[k0 + k] = static_cast<std::int8_t>(value);
        sum += value;
      }
      r.scale[i * r.nb + b] = int8_scale(top);
      r.corr[i * r.nb + b] = -kInt8Offset * sum;
    }
  }
}

struct VnniDot {
  static constexpr bool kOffset = true;  // sums the stored (offset) weights: start from corr
  GPT2_KERNEL_AVX_VNNI static __m256i dot(__m256i acc, __m256i w, __m256i a) {
    return _mm256_dpbusd_avx_epi32(acc, w, a);
  }
};

struct MaddDot {
  static constexpr bool kOffset = false;  // sums qa qw directly: start from 0
  GPT2_KERNEL_AVX2_INT8 static __m256i dot(__m256i acc, __m256i w, __m256i a) {
    const __m256i qw = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));  // - 128
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(qw, a));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
};

// Lanes of columns j .. j + 7 inside n columns, as a blend mask of -1 / 0 words.
GPT2_KERNEL_AVX2_INT8 inline __m256i lanes(Index j, Index n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const Index left = std::max<Index>(0, std::min<Index>(8, n - j));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), idx);
}

// The panel's 32 columns are two halves of 16 (h = 0, 1): 64 bytes of a k4 group each.
inline constexpr int kTileRows = 2;

// GPT2_AVX2_INT8_KERNELS(Dot, ATTR) defines, for one dot product, in namespace Dot##_kernels:
//   tile<R>(r, i0, panel, h, c, ldc, m, bias): C rows i0 .. i0 + R - 1, columns h * 16 .. + 15 of
//     one panel (m: the lanes inside N; c and bias at the first of those columns): c = bias + the
//     sum over the blocks, or c += without a bias;
//   gemm(M, N, K, A, lda, Bp, C, ldc, bias, buf): C[M, N] = bias + A B, or C += A B without a
//     bias; B int8-packed from its first panel (Bp), buf as gemm_int8_scalar's (kernels/int8.hpp).
// Written once, compiled twice: each with its own target attributes (ATTR), so that the plain
// AVX2 one holds no AVX-VNNI instruction (a compiler may fuse VPMADDWD and VPADDD into VPDPWSSD
// where AVX-VNNI is enabled).
#define GPT2_AVX2_INT8_KERNELS(Dot, ATTR)                                                          \
  namespace Dot##_kernels {                                                                        \
  template <int R>                                                                                 \
  ATTR inline void tile(const Int8Rows& r, Index i0, const std::uint8_t* panel, Index h, float* c, \
                        Index ldc, const __m256i (&m)[2], const float* bias) {                     \
    __m256 acc[R][2];                                                                              \
    for (int i = 0; i < R; ++i)                                                                    \
      for (int v = 0; v < 2; ++v)                                                                  \
        acc[i][v] = _mm256_maskload_ps(bias ? bias + 8 * v : c + i * ldc + 8 * v, m[v]);           \
    const std::int8_t* a = r.q + i0 * r.Kp;                                                        \
    for (Index b = 0; b < r.nb; ++b) {                                                             \
      const std::uint8_t* block = panel + b * kInt8BlockBytes + h * 64;                            \
      __m256i d[R][2];                                                                             \
      for (int i = 0; i < R; ++i)                                                                  \
        d[i][0] = d[i][1] = _mm256_set1_epi32(Dot::kOffset ? r.corr[(i0 + i) * r.nb + b] : 0);     \
      for (Index g = 0; g < kInt8Block / 4; ++g) {                                                 \
        const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(block + g * 128));  \
        const __m256i w1 =                                                                         \
            _mm256_load_si256(reinterpret_cast<const __m256i*>(block + g * 128 + 32));             \
        for (int i = 0; i < R; ++i) {                                                              \
          std::int32_t four;                                                                       \
          std::memcpy(&four, a + i * r.Kp + b * kInt8Block + 4 * g, 4);                            \
          const __m256i x = _mm256_set1_epi32(four);                                               \
          d[i][0] = Dot::dot(d[i][0], w0, x);                                                      \
          d[i][1] = Dot::dot(d[i][1], w1, x);                                                      \
        }                                                                                          \
      }                                                                                            \
      const float* scales =                                                                        \
          reinterpret_cast<const float*>(panel + b * kInt8BlockBytes + kInt8WeightBytes) + h * 16; \
      const __m256 sw0 = _mm256_loadu_ps(scales), sw1 = _mm256_loadu_ps(scales + 8);              \
      for (int i = 0; i < R; ++i) {                                                                \
        const __m256 sa = _mm256_set1_ps(r.scale[(i0 + i) * r.nb + b]);                            \
        acc[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[i][0]), _mm256_mul_ps(sa, sw0), acc[i][0]); \
        acc[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[i][1]), _mm256_mul_ps(sa, sw1), acc[i][1]); \
      }                                                                                            \
    }                                                                                              \
    for (int i = 0; i < R; ++i)                                                                    \
      for (int v = 0; v < 2; ++v) _mm256_maskstore_ps(c + i * ldc + 8 * v, m[v], acc[i][v]);      \
  }                                                                                                \
  ATTR inline void gemm(Index M, Index N, Index K, const float* A, Index lda,                      \
                        const std::uint8_t* Bp, float* C, Index ldc, const float* bias,            \
                        void* buf) {                                                               \
    const Index nb = int8_blocks(K), panel_bytes = nb * kInt8BlockBytes;                           \
    for (Index i0 = 0; i0 < M; i0 += kInt8ChunkRows) {                                             \
      const Index rows = std::min(kInt8ChunkRows, M - i0);                                         \
      const Int8Rows r = int8_rows_in(buf, rows, K);                                               \
      quantize_rows_avx2(rows, K, A + i0 * lda, lda, r);                                           \
      for (Index j0 = 0; j0 < N; j0 += kInt8PanelCols) {                                           \
        const std::uint8_t* panel = Bp + (j0 / kInt8PanelCols) * panel_bytes;                     \
        for (Index h = 0; h < 2 && j0 + 16 * h < N; ++h) {                                         \
          const Index j = j0 + 16 * h;                                                             \
          const __m256i m[2] = {lanes(j, N), lanes(j + 8, N)};                                     \
          const float* bh = bias ? bias + j : nullptr;                                             \
          Index i = 0;                                                                             \
          for (; i + kTileRows <= rows; i += kTileRows)                                            \
            tile<kTileRows>(r, i, panel, h, C + (i0 + i) * ldc + j, ldc, m, bh);                   \
          for (; i < rows; ++i) tile<1>(r, i, panel, h, C + (i0 + i) * ldc + j, ldc, m, bh);       \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  }

GPT2_AVX2_INT8_KERNELS(MaddDot, GPT2_KERNEL_AVX2_INT8)
GPT2_AVX2_INT8_KERNELS(VnniDot, GPT2_KERNEL_AVX_VNNI)
#undef GPT2_AVX2_INT8_KERNELS

// The avx2 level's int8 product: VPDPBUSD on ymm where the CPU has AVX-VNNI, else VPMADDUBSW.
inline void gemm_int8(Index M, Index N, Index K, const float* A, Index lda, const std::uint8_t* Bp,
                      float* C, Index ldc, const float* bias, void* buf) {
  static const bool vnni = cpu_features().avx_vnni;
  if (vnni)
    VnniDot_kernels::gemm(M, N, K, A, lda, Bp, C, ldc, bias, buf);
  else
    MaddDot_kernels::gemm(M, N, K, A, lda, Bp, C, ldc, bias, buf);
}

}  // namespace gpt2::kernels::avx2_int8
#endif  // GPT2_KERNELS_HAVE_AVX2
