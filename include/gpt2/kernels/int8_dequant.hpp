// An int8 KV cache's rows back to float32 (kv_cache.hpp: KVCache<int8>), the one step between the
// cache and the float attention core (detail/pipeline.hpp dequantizes a tile's or a decode chunk's
// keys and values into a thread's scratch, then runs the float kernels on them).
//
//   row i of a run: head_dim int8 values q[i][0, head_dim) and one float32 scale s[i] (the scheme
//   of kernels/int8.hpp: quantize_block of the row), to dst[i][d] = float(q[i][d]) * s[i], one
//   float32 multiply per value (float(q) is exact), and zeros on [head_dim, ld).
//
// A contiguous cache's keys are also kept transposed in blocks of kKeyBlock positions (as a float
// cache's are): dequantize_key_blocks converts those, element (d, j) = float(q[d][j]) * s[j], for
// the one-row decode steps, which read keys transposed.
//
// The bf16 variants (dequantize_rows_bf16, dequantize_key_blocks_bf16) round each such value to
// bf16 bits, to nearest even (VCVTNEPS2BF16 at avx512_bf16; round_to_bf16 in the scalar code,
// which differs only in keeping float32 subnormals as bf16 subnormals, which VDPBF16PS reads as
// zero): exactly the operands a level with bf16 pair products (Kernels::bf16_pair_decode) makes
// of the float32 values, for the key blocks it reads in bf16, at half the bytes.
//
// One multiply per value: every level (scalar, avx2, avx512) gives the same bits, so the level only
// decides the speed. A decode step is bound by the bytes it reads; reading int8 keys and values
// instead of float32 is the point of the cache, so the conversion runs vectorized (16 values per
// instruction at avx512) out of the cache line it has just loaded.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/cpu.hpp"
#include "gpt2/kernels/isa.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AVX512
// GCC 12's intrinsics headers initialize "undefined" vectors with `__m512i __Y = __Y;` (GCC bug
// 105593, as in kernels/avx512.hpp): silenced for this file's kernels only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define GPT2_KERNELS_INT8_DEQUANT_DIAGNOSTICS_PUSHED 1
#endif
#include <immintrin.h>
#define GPT2_KERNEL_INT8_DEQUANT_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#define GPT2_KERNEL_INT8_DEQUANT_AVX2 __attribute__((target("avx2,fma")))
#define GPT2_KERNEL_INT8_DEQUANT_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")))
#endif

namespace gpt2::kernels {

// Bytes ahead of the one being converted that the vector conversions prefetch: a decode step reads
// the cache once, from memory, and converts it a chunk at a time, so the hardware's stream
// prefetchers would start over at every chunk.
inline constexpr Index kDequantAhead = 2048;

// n rows of int8 values (q, rows q_stride apart) with their scales (scale[0, n)) into dst [n, ld]
// (ld >= head_dim): the scalar code.
inline void dequantize_run_scalar(const std::int8_t* q, Index q_stride, const float* scale, Index n,
                                  Index head_dim, float* dst, Index ld) {
  for (Index i = 0; i < n; ++i) {
    const std::int8_t* src = q + i * q_stride;
    float* row = dst + i * ld;
    const float s = scale[i];
    for (Index d = 0; d < head_dim; ++d) row[d] = static_cast<float>(src[d]) * s;
    for (Index d = head_dim; d < ld; ++d) row[d] = 0.0f;
  }
}

// Transposed key blocks [b0, b1) (block b at kt + b * head_dim * kKeyBlock, element (d, j) of key
// kKeyBlock b + j at d * kKeyBlock + j) with the keys' scales (key p's at scale[p]) into dst, the
// same layout and offsets: the scalar code.
inline void dequantize_key_blocks_scalar(const std::int8_t* kt, const float* scale, Index b0,
                                         Index b1, Index head_dim, float* dst) {
  for (Index b = b0; b < b1; ++b) {
    const Index base = b * head_dim * kKeyBlock;
    const float* s = scale + b * kKeyBlock;
    for (Index d = 0; d < head_dim; ++d)
      for (Index j = 0; j < kKeyBlock; ++j)
        dst[base + d * kKeyBlock + j] = static_cast<float>(kt[base + d * kKeyBlock + j]) * s[j];
  }
}

#if GPT2_KERNELS_HAVE_AVX512
// The same, a block's 64 scales in four vectors, 16 values per step.
GPT2_KERNEL_INT8_DEQUANT_AVX512 inline void dequantize_key_blocks_avx512(const std::int8_t* kt,
                                                                         const float* scale,
                                                                         Index b0, Index b1,
                                                                         Index head_dim,
                                                                         float* dst) {
  for (Index b = b0; b < b1; ++b) {
    const Index base = b * head_dim * kKeyBlock;
    __m512 s[4];
    for (int g = 0; g < 4; ++g) s[g] = _mm512_loadu_ps(scale + b * kKeyBlock + 16 * g);
    _mm_prefetch(reinterpret_cast<const char*>(scale + (b + 1) * kKeyBlock), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(scale + (b + 1) * kKeyBlock + 32), _MM_HINT_T0);
    for (Index d = 0; d < head_dim; ++d) {
      const std::int8_t* src = kt + base + d * kKeyBlock;
      float* out = dst + base + d * kKeyBlock;
      _mm_prefetch(reinterpret_cast<const char*>(src + kDequantAhead), _MM_HINT_T0);
      for (int g = 0; g < 4; ++g) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * g));
        _mm512_storeu_ps(out + 16 * g,
                         _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), s[g]));
      }
    }
  }
}

// The same, 8 values per step.
GPT2_KERNEL_INT8_DEQUANT_AVX2 inline void dequantize_key_blocks_avx2(const std::int8_t* kt,
                                                                     const float* scale, Index b0,
                                                                     Index b1, Index head_dim,
                                                                     float* dst) {
  for (Index b = b0; b < b1; ++b) {
    const Index base = b * head_dim * kKeyBlock;
    __m256 s[8];
    for (int g = 0; g < 8; ++g) s[g] = _mm256_loadu_ps(scale + b * kKeyBlock + 8 * g);
    for (Index d = 0; d < head_dim; ++d) {
      const std::int8_t* src = kt + base + d * kKeyBlock;
      float* out = dst + base + d * kKeyBlock;
      for (int g = 0; g < 8; ++g) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 8 * g));
        _mm256_storeu_ps(out + 8 * g,
                         _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), s[g]));
      }
    }
  }
}

// The same, 16 values per step: sign-extended to int32 (VPMOVSXBD), converted (exact) and
// multiplied by the row's scale; lanes past head_dim zero (masked, whatever the scale).
GPT2_KERNEL_INT8_DEQUANT_AVX512 inline void dequantize_run_avx512(const std::int8_t* q,
                                                                  Index q_stride,
                                                                  const float* scale, Index n,
                                                                  Index head_dim, float* dst,
                                                                  Index ld) {
  for (Index i = 0; i < n; ++i) {
    const std::int8_t* src = q + i * q_stride;
    float* row = dst + i * ld;
    for (Index line = 0; line < head_dim; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(src + line + kDequantAhead), _MM_HINT_T0);
    if (i % 16 == 0) _mm_prefetch(reinterpret_cast<const char*>(scale + i + 64), _MM_HINT_T0);
    const __m512 s = _mm512_set1_ps(scale[i]);
    Index d = 0;
    for (; d + 16 <= head_dim; d += 16) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + d));
      _mm512_storeu_ps(row + d, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s));
    }
    for (; d < ld; d += 16) {  // the tail of the row, then zeros up to ld
      const Index live = head_dim - d < 0 ? 0 : head_dim - d;
      const __mmask16 m = static_cast<__mmask16>((std::uint32_t(1) << (live < 16 ? live : 16)) - 1);
      const __m128i b = _mm_maskz_loadu_epi8(m, src + d);
      const __mmask16 store = static_cast<__mmask16>(
          (std::uint32_t(1) << (ld - d < 16 ? ld - d : 16)) - 1);
      _mm512_mask_storeu_ps(row + d, store,
                            _mm512_maskz_mul_ps(m, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s));
    }
  }
}

// The same, 8 values per step (AVX2's VPMOVSXBD), the row's tail in scalar code.
GPT2_KERNEL_INT8_DEQUANT_AVX2 inline void dequantize_run_avx2(const std::int8_t* q, Index q_stride,
                                                              const float* scale, Index n,
                                                              Index head_dim, float* dst,
                                                              Index ld) {
  for (Index i = 0; i < n; ++i) {
    const std::int8_t* src = q + i * q_stride;
    float* row = dst + i * ld;
    const float si = scale[i];
    const __m256 s = _mm256_set1_ps(si);
    Index d = 0;
    for (; d + 8 <= head_dim; d += 8) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + d));
      _mm256_storeu_ps(row + d, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s));
    }
    for (; d < head_dim; ++d) row[d] = static_cast<float>(src[d]) * si;
    for (; d < ld; ++d) row[d] = 0.0f;
  }
}
#endif

// ---- to bf16 bits ----------------------------------------------------------------------------

// n int8 rows to bf16 bits: dst[i][d] = bf16(float(q[i][d]) * s[i]), zeros on [head_dim, ld):
// the scalar code.
inline void dequantize_run_bf16_scalar(const std::int8_t* q, Index q_stride, const float* scale,
                                       Index n, Index head_dim, std::uint16_t* dst, Index ld) {
  for (Index i = 0; i < n; ++i) {
    const std::int8_t* src = q + i * q_stride;
    std::uint16_t* row = dst + i * ld;
    const float s = scale[i];
    for (Index d = 0; d < head_dim; ++d) row[d] = round_to_bf16(static_cast<float>(src[d]) * s);
    for (Index d = head_dim; d < ld; ++d) row[d] = 0;
  }
}

// Transposed key blocks [b0, b1) to bf16 bits (dequantize_key_blocks_scalar's layout and offsets,
// in bf16 elements): the scalar code.
inline void dequantize_key_blocks_bf16_scalar(const std::int8_t* kt, const float* scale, Index b0,
                                              Index b1, Index head_dim, std::uint16_t* dst) {
  for (Index b = b0; b < b1; ++b) {
    const Index base = b * head_dim * kKeyBlock;
    const float* s = scale + b * kKeyBlock;
    for (Index d = 0; d < head_dim; ++d)
      for (Index j = 0; j < kKeyBlock; ++j)
        dst[base + d * kKeyBlock + j] =
            round_to_bf16(static_cast<float>(kt[base + d * kKeyBlock + j]) * s[j]);
  }
}

#if GPT2_KERNELS_HAVE_AVX512
// The same, 16 values per step (dequantize_run_avx512's, then VCVTNEPS2BF16); ld a multiple of 16.
GPT2_KERNEL_INT8_DEQUANT_AVX512_BF16 inline void dequantize_run_bf16_avx512(
    const std::int8_t* q, Index q_stride, const float* scale, Index n, Index head_dim,
    std::uint16_t* dst, Index ld) {
  for (Index i = 0; i < n; ++i) {
    const std::int8_t* src = q + i * q_stride;
    std::uint16_t* row = dst + i * ld;
    for (Index line = 0; line < head_dim; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(src + line + kDequantAhead), _MM_HINT_T0);
    if (i % 16 == 0) _mm_prefetch(reinterpret_cast<const char*>(scale + i + 64), _MM_HINT_T0);
    const __m512 s = _mm512_set1_ps(scale[i]);
    for (Index d = 0; d < ld; d += 16) {
      __m512 x;
      if (d + 16 <= head_dim) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + d));
        x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
      } else {  // the tail of the row, then zeros
        const Index live = head_dim - d < 0 ? 0 : head_dim - d;
        const __mmask16 m = static_cast<__mmask16>((std::uint32_t(1) << live) - 1);
        const __m128i b = _mm_maskz_loadu_epi8(m, src + d);
        x = _mm512_maskz_mul_ps(m, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + d),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
    }
  }
}

// The same for transposed key blocks, 64 values (a block's row d) per step.
GPT2_KERNEL_INT8_DEQUANT_AVX512_BF16 inline void dequantize_key_blocks_bf16_avx512(
    const std::int8_t* kt, const float* scale, Index b0, Index b1, Index head_dim,
    std::uint16_t* dst) {
  for (Index b = b0; b < b1; ++b) {
    const Index base = b * head_dim * kKeyBlock;
    __m512 s[4];
    for (int g = 0; g < 4; ++g) s[g] = _mm512_loadu_ps(scale + b * kKeyBlock + 16 * g);
    _mm_prefetch(reinterpret_cast<const char*>(scale + (b + 1) * kKeyBlock), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(scale + (b + 1) * kKeyBlock + 32), _MM_HINT_T0);
    for (Index d = 0; d < head_dim; ++d) {
      const std::int8_t* src = kt + base + d * kKeyBlock;
      std::uint16_t* out = dst + base + d * kKeyBlock;
      _mm_prefetch(reinterpret_cast<const char*>(src + kDequantAhead), _MM_HINT_T0);
      __m512 x[4];
      for (int g = 0; g < 4; ++g) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * g));
        x[g] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), s[g]);
      }
      // cvtne2ps(b, a): words 0 .. 15 = bf16(a), 16 .. 31 = bf16(b)
      _mm512_storeu_si512(out, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(x[1], x[0])));
      _mm512_storeu_si512(out + 32, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(x[3], x[2])));
    }
  }
}
#endif

// dequantize_rows to bf16 bits (dst [n, ld] of bf16, ld a multiple of 16): VCVTNEPS2BF16 where
// the CPU has AVX512-BF16 and isa is avx512_bf16 or amx, else the scalar code (the same values
// where VDPBF16PS reads them).
inline void dequantize_rows_bf16(Isa isa, const std::int8_t* const* pages,
                                 const float* const* scale_pages, Index page_rows,
                                 Index row_stride, Index j0, Index n, Index head_dim,
                                 std::uint16_t* dst, Index ld) {
  for (Index j = j0; j < j0 + n;) {
    const Index page = j / page_rows, in_page = j % page_rows;
    const Index run = std::min<Index>(j0 + n - j, page_rows - in_page);
    const std::int8_t* q = pages[page] + in_page * row_stride;
    const float* s = scale_pages[page] + in_page;
    std::uint16_t* out = dst + (j - j0) * ld;
#if GPT2_KERNELS_HAVE_AVX512
    if ((isa == Isa::avx512_bf16 || isa == Isa::amx) && cpu_features().avx512_bf16)
      dequantize_run_bf16_avx512(q, row_stride, s, run, head_dim, out, ld);
    else
      dequantize_run_bf16_scalar(q, row_stride, s, run, head_dim, out, ld);
#else
    (void)isa;
    dequantize_run_bf16_scalar(q, row_stride, s, run, head_dim, out, ld);
#endif
    j += run;
  }
}

// dequantize_key_blocks to bf16 bits (the same layout in bf16 elements), as dequantize_rows_bf16.
inline void dequantize_key_blocks_bf16(Isa isa, const std::int8_t* kt, const float* scale,
                                       Index b0, Index b1, Index head_dim, std::uint16_t* dst) {
#if GPT2_KERNELS_HAVE_AVX512
  if ((isa == Isa::avx512_bf16 || isa == Isa::amx) && cpu_features().avx512_bf16)
    dequantize_key_blocks_bf16_avx512(kt, scale, b0, b1, head_dim, dst);
  else
    dequantize_key_blocks_bf16_scalar(kt, scale, b0, b1, head_dim, dst);
#else
  (void)isa;
  dequantize_key_blocks_bf16_scalar(kt, scale, b0, b1, head_dim, dst);
#endif
}

// Rows j0 .. j0 + n - 1 of int8 pages (row j at pages[j / page_rows] + (j % page_rows) *
// row_stride, its scale at scale_pages[j / page_rows][j % page_rows]) into dst [n, ld], run by
// run within each page, with the kernel of level isa (one the CPU has: the forwards pass their
// table's; the same bits at every level).
inline void dequantize_rows(Isa isa, const std::int8_t* const* pages,
                            const float* const* scale_pages, Index page_rows, Index row_stride,
                            Index j0, Index n, Index head_dim, float* dst, Index ld) {
  for (Index j = j0; j < j0 + n;) {
    const Index page = j / page_rows, in_page = j % page_rows;
    const Index run = std::min<Index>(j0 + n - j, page_rows - in_page);
    const std::int8_t* q = pages[page] + in_page * row_stride;
    const float* s = scale_pages[page] + in_page;
    float* out = dst + (j - j0) * ld;
#if GPT2_KERNELS_HAVE_AVX512
    if (isa == Isa::avx512 || isa == Isa::avx512_bf16 || isa == Isa::amx)
      dequantize_run_avx512(q, row_stride, s, run, head_dim, out, ld);
    else if (isa == Isa::avx2)
      dequantize_run_avx2(q, row_stride, s, run, head_dim, out, ld);
    else
      dequantize_run_scalar(q, row_stride, s, run, head_dim, out, ld);
#else
    (void)isa;
    dequantize_run_scalar(q, row_stride, s, run, head_dim, out, ld);
#endif
    j += run;
  }
}

// Transposed key blocks [b0, b1) with the level isa's kernel (dequantize_key_blocks_scalar's
// layout; the same bits at every level).
inline void dequantize_key_blocks(Isa isa, const std::int8_t* kt, const float* scale, Index b0,
                                  Index b1, Index head_dim, float* dst) {
#if GPT2_KERNELS_HAVE_AVX512
  if (isa == Isa::avx512 || isa == Isa::avx512_bf16 || isa == Isa::amx)
    dequantize_key_blocks_avx512(kt, scale, b0, b1, head_dim, dst);
  else if (isa == Isa::avx2)
    dequantize_key_blocks_avx2(kt, scale, b0, b1, head_dim, dst);
  else
    dequantize_key_blocks_scalar(kt, scale, b0, b1, head_dim, dst);
#else
  (void)isa;
  dequantize_key_blocks_scalar(kt, scale, b0, b1, head_dim, dst);
#endif
}

}  // namespace gpt2::kernels

#if defined(GPT2_KERNELS_INT8_DEQUANT_DIAGNOSTICS_PUSHED)
#pragma GCC diagnostic pop
#undef GPT2_KERNELS_INT8_DEQUANT_DIAGNOSTICS_PUSHED
#endif
