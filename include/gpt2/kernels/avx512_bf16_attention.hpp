// The avx512_bf16 level's attention core for bf16 weights: avx512's fused core (the same blocks,
// scores, block softmax and merges, in float32) with p v on VDPBF16PS over the key blocks before a
// row's own.
//
// A row at position pos computes o_b of a full block b < pos / 64 (one it sees whole, not its own
// "diagonal" block) per column d as one chain over the pairs of keys (2k, 2k + 1), k = 0 .. 31 in
// order, from +0: each step one VDPBF16PS lane,
//   o += bf16(p_2k+1) bf16(v_2k+1[d]), then o += bf16(p_2k) bf16(v_2k[d])
// (each product exact, each sum rounded to nearest; bf16 subnormals as zero; p and v rounded to
// nearest even by VCVTNE2PS2BF16). Its own block (the keys from 64 (pos / 64) to pos) keeps the
// float32 chain of attention_tile.hpp: rounding v to bf16 there would move the rows that see few
// keys, or weigh one key heavily, past PyTorch's own bf16 error (tests/reference/
// bf16_attention_options.py: merged 5.33e-3 against PyTorch's 4.69e-3 on small_T7 with every block
// in bf16; the float32 diagonal keeps every case within the bars). l_b, the merges and the division
// stay float32, on the unrounded p. Which chain a block takes depends only on the row's position,
// so a row keeps its bits in any tile, chunk, batch or thread split, decode steps included
// (tests/kernel_emulation.hpp emulates it).
//
// Only tiles flagged bf16 (bf16 weights) take it; float32 tiles run avx512's core, whose bits
// the avx512_bf16 level keeps for float32 weights.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/avx512_attention.hpp"
#include "gpt2/kernels/avx512_bf16.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AVX512
namespace gpt2::kernels::avx512_bf16 {

// Words [a0 .. a15 | b0 .. b15] of v as 16 pairs: lane d = a_d (low half) | b_d (high half).
GPT2_KERNEL_AVX512_BF16 inline __m512i interleave_pairs(__m512i v) {
  const __m512i index = _mm512_setr_epi32(
      0x00100000, 0x00110001, 0x00120002, 0x00130003, 0x00140004, 0x00150005, 0x00160006,
      0x00170007, 0x00180008, 0x00190009, 0x001a000a, 0x001b000b, 0x001c000c, 0x001d000d,
      0x001e000e, 0x001f000f);
  return _mm512_permutexvar_epi16(index, v);
}

// Lane d = bf16(a_d) | bf16(b_d) << 16: two vectors of 16 floats rounded to nearest even.
GPT2_KERNEL_AVX512_BF16 inline __m512i round_pairs(__m512 a, __m512 b) {
  return interleave_pairs(reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
}

// The pairs of columns d0 .. d0 + 15 of two value rows a and b (lanes ma and mb; the others 0):
// float32 rounded to bf16, or bf16 bits as they are.
GPT2_KERNEL_AVX512_BF16 inline __m512i value_pairs(const float* a, const float* b, __mmask16 ma,
                                                   __mmask16 mb) {
  return round_pairs(_mm512_maskz_loadu_ps(ma, a), _mm512_maskz_loadu_ps(mb, b));
}
GPT2_KERNEL_AVX512_BF16 inline __m512i value_pairs(const std::uint16_t* a, const std::uint16_t* b,
                                                   __mmask16 ma, __mmask16 mb) {
  const __m256i lo = _mm256_maskz_loadu_epi16(ma, a), hi = _mm256_maskz_loadu_epi16(mb, b);
  return interleave_pairs(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}

GPT2_KERNEL_AVX512_BF16 inline __m512 dot_pairs(__m512 acc, std::uint32_t p_pair, __m512i v_pairs) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(p_pair))),
                          reinterpret_cast<__m512bh>(v_pairs));
}

// vb[k][0 .. hdp) = the pairs of value rows 2k, 2k + 1, k < 32 (a full block), as 32-bit words,
// hdp = padded_head_dim apart.
GPT2_KERNEL_AVX512_BF16 inline void pack_value_pairs(const float* const* rows, Index head_dim,
                                                     std::uint32_t* vb) {
  const Index hdp = padded_head_dim(head_dim);
  for (Index k = 0; k < kKeyBlock / 2; ++k)
    for (Index d0 = 0; d0 < hdp; d0 += 16) {
      const __mmask16 dm = lanes(d0, head_dim);
      _mm512_store_si512(vb + k * hdp + d0,
                         value_pairs(rows[2 * k] + d0, rows[2 * k + 1] + d0, dm, dm));
    }
}

// Rows [r_begin, nb) of the per-row p layout (row r's 64 p at p + 64 r) as 32 pairs each, in
// place: pair k of row r at the 32-bit word 64 r + k.
GPT2_KERNEL_AVX512_BF16 inline void row_probs_to_pairs(float* p, Index r_begin, Index nb) {
  for (Index r = r_begin; r < nb; ++r) {
    float* row = p + r * kKeyBlock;
    const __m512 s0 = _mm512_load_ps(row), s1 = _mm512_load_ps(row + 16);
    const __m512 s2 = _mm512_load_ps(row + 32), s3 = _mm512_load_ps(row + 48);
    _mm512_store_si512(row, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(s1, s0)));
    _mm512_store_si512(row + 16, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(s3, s2)));
  }
}

// The row-vector layout (p of key j, rows 16 g .. at p + j kTileMaxRows + 16 g) for row vectors
// [g_begin, groups) as pairs of a full block, in place: pair k of a row at the word of key 2k.
GPT2_KERNEL_AVX512_BF16 inline void vector_probs_to_pairs(float* p, Index g_begin, Index groups) {
  for (Index k = 0; k < kKeyBlock / 2; ++k) {
    float* even = p + 2 * k * kTileMaxRows;
    const float* odd = even + kTileMaxRows;
    for (Index g = g_begin; g < groups; ++g)
      _mm512_store_si512(even + 16 * g,
                         round_pairs(_mm512_load_ps(even + 16 * g), _mm512_load_ps(odd + 16 * g)));
  }
}

// p v for avx512's core drivers (avx512_attention.hpp's policy interface): VDPBF16PS over the full
// blocks before a row's own, FloatPV's float32 chain over its own.
struct PairPV {
  // Rows [r_begin, nb): those whose own block this is (positions b0 .. b0 + 63) in float32 first,
  // then the value pairs into ts.vb, the other rows' p to pairs in place, and their pair chains.
  GPT2_KERNEL_AVX512_BF16 static void block_values(Index b0, Index n_blk, Index r_begin, Index nb,
                                                   const float* const* vrow,
                                                   const AttentionTile<float>& t,
                                                   TileScratch<float>& ts, bool transposed) {
    const Index r_mid = std::min(nb, std::max(r_begin, b0 + kKeyBlock - t.first_pos));
    if (r_mid > r_begin)
      avx512::value_rows_from<avx512::FloatPV>(r_begin, r_mid, b0, vrow, t, ts, transposed);
    if (r_mid == nb) return;
    (void)n_blk;  // == kKeyBlock: rows from r_mid on see the whole block
    pack_value_pairs(vrow, t.head_dim, reinterpret_cast<std::uint32_t*>(ts.vb));
    if (transposed)
      vector_probs_to_pairs(ts.p, r_mid / 16, (nb + 15) / 16);
    else
      row_probs_to_pairs(ts.p, r_mid, nb);
    avx512::value_rows_from<PairPV>(r_mid, nb, b0, vrow, t, ts, transposed);
  }

  // o[r + i][d0 .. d0 + 16 V) = fma(o_b, c, o * a), o_b the pair chain of row r + i over the whole
  // block (value pairs from ts.vb; n and vsrc unused: every row sees 64 keys).
  template <int R, int V>
  GPT2_KERNEL_AVX512_BF16 static void value_rows(Index r, Index d0,
                                                 const Index (&)[avx512::kValueRows],
                                                 const float* const*, const AttentionTile<float>& t,
                                                 TileScratch<float>& ts, bool transposed) {
    const Index hdp = padded_head_dim(t.head_dim);
    const Index prs = transposed ? 1 : kKeyBlock, pks = transposed ? 2 * kTileMaxRows : 1;
    const std::uint32_t* pp = reinterpret_cast<const std::uint32_t*>(ts.p) + r * prs;
    const std::uint32_t* vb = reinterpret_cast<const std::uint32_t*>(ts.vb) + d0;
    __m512 acc[R][V];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
    for (Index k = 0; k < kKeyBlock / 2; ++k) {
      __m512i vv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) vv[v] = _mm512_load_si512(vb + k * hdp + 16 * v);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const std::uint32_t pk = pp[i * prs + k * pks];
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[i][v] = dot_pairs(acc[i][v], pk, vv[v]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 a = _mm512_set1_ps(ts.a[r + i]), c = _mm512_set1_ps(ts.c[r + i]);
      float* o = ts.o + (r + i) * hdp + d0;
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        _mm512_store_ps(o + 16 * v, _mm512_fmadd_ps(acc[i][v], c,
                                                     _mm512_mul_ps(_mm512_load_ps(o + 16 * v), a)));
    }
  }

  // Blocks of a decode step (NB from b0, b0 <= its position) that come before the row's own: as
  // many as end before its position (the others, at most the last, keep float32).
  static int pair_blocks(Index b0, int nb_blocks, const AttentionTile<float>& t) {
    const Index before = (t.first_pos - b0) / kKeyBlock;  // blocks from b0 ending before pos
    return static_cast<int>(std::min<Index>(nb_blocks, std::max<Index>(0, before)));
  }

  // Their p (at ts.p + 64 i) as pairs, in place.
  GPT2_KERNEL_AVX512_BF16 static void decode_probs(Index b0, int nb_blocks,
                                                   const AttentionTile<float>& t,
                                                   TileScratch<float>& ts) {
    row_probs_to_pairs(ts.p, 0, pair_blocks(b0, nb_blocks, t));
  }

  // The partials' o_b[d0 .. d0 + 16 V) of NB blocks from b0: the pair chains of the blocks before
  // the row's own, the value pairs made from the rows in registers (values float32 or bf16 bits,
  // E); the row's own block as FloatPV's.
  template <int NB, int V, class E>
  GPT2_KERNEL_AVX512_BF16 static void decode_values(
      Index b0, Index d0, const Index (&n)[kDecodeBlocks],
      const E* const (&vrow)[kDecodeBlocks][kKeyBlock], const AttentionTile<float>& t,
      TileScratch<float>& ts, float* parts) {
    const int pairs = pair_blocks(b0, NB, t);
    if (pairs == NB) {
      decode_pairs<NB, V>(d0, vrow, t, ts, parts);
    } else if (pairs == 0) {
      avx512::decode_values<NB, V>(d0, n, vrow, t, ts, parts);
    } else {  // NB == 2: the first block in pairs, the row's own in float32
      static_assert(kDecodeBlocks == 2, "one block of each");
      decode_pairs<1, V>(d0, vrow, t, ts, parts);
      const Index n1[kDecodeBlocks] = {n[1], 0};
      const E* vrow1[kDecodeBlocks][kKeyBlock];
      for (Index j = 0; j < n[1]; ++j) vrow1[0][j] = vrow[1][j];
      TileScratch<float> ts1 = ts;
      ts1.p = ts.p + kKeyBlock;
      avx512::decode_values<1, V>(d0, n1, vrow1, t, ts1, parts + partial_stride(t.head_dim));
    }
  }

  // The pair chains of NB full blocks (p pairs at ts.p + 64 i) into their partials.
  template <int NB, int V, class E>
  GPT2_KERNEL_AVX512_BF16 static void decode_pairs(Index d0,
                                                   const E* const (&vrow)[kDecodeBlocks][kKeyBlock],
                                                   const AttentionTile<float>& t,
                                                   TileScratch<float>& ts, float* parts) {
    const std::uint32_t* pp = reinterpret_cast<const std::uint32_t*>(ts.p);
    __mmask16 dm[V];
    __m512 acc[NB][V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) dm[v] = lanes(d0 + 16 * v, t.head_dim);
#pragma GCC unroll 4
    for (int i = 0; i < NB; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
    for (Index k = 0; k < kKeyBlock / 2; ++k)
#pragma GCC unroll 4
      for (int i = 0; i < NB; ++i) {
        const std::uint32_t pk = pp[i * kKeyBlock + k];
        const E* a = vrow[i][2 * k] + d0;
        const E* b = vrow[i][2 * k + 1] + d0;
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v)
          acc[i][v] = dot_pairs(acc[i][v], pk, value_pairs(a + 16 * v, b + 16 * v, dm[v], dm[v]));
      }
    const Index stride = partial_stride(t.head_dim);
#pragma GCC unroll 4
    for (int i = 0; i < NB; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        _mm512_store_ps(parts + i * stride + kPartialHeader + d0 + 16 * v, acc[i][v]);
  }
};

// The level's table entries: a bf16 tile (t.bf16) runs the pair core, a float32 one avx512's.
GPT2_KERNEL_AVX512_BF16 inline void attention_tile(const AttentionTile<float>& t) {
  if (t.bf16)
    avx512::attention_tile_with<PairPV>(t);
  else
    avx512::attention_tile(t);
}

GPT2_KERNEL_AVX512_BF16 inline void row_partials(const AttentionTile<float>& t, Index block_begin,
                                                 Index block_end, float* parts) {
  if (t.bf16)
    avx512::row_partials_of<PairPV>(t, t.key_pages, t.value_pages, block_begin, block_end, parts);
  else
    avx512::row_partials(t, block_begin, block_end, parts);
}

GPT2_KERNEL_AVX512_BF16 inline void row_partials_kv_bf16(const AttentionTile<float>& t,
                                                         Index block_begin, Index block_end,
                                                         float* parts) {
  if (t.bf16)
    avx512::row_partials_of<PairPV>(t, t.key_pages_bf16, t.value_pages_bf16, block_begin,
                                    block_end, parts);
  else
    avx512::row_partials_kv_bf16(t, block_begin, block_end, parts);
}

}  // namespace gpt2::kernels::avx512_bf16
#endif  // GPT2_KERNELS_HAVE_AVX512
