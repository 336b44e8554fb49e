// The avx512_bf16 level's attention core for bf16 weights (AttentionTile::bf16): avx512's fused
// core (the same 64-key blocks at absolute positions, online softmax and merges, in float32) with
// both products on VDPBF16PS in the key blocks before a row's own.
//
// A row at position pos, for a block b < pos / 64 (a block it sees whole, before its own):
//   s_j = one chain over the pairs of components (2k, 2k + 1), k = 0, 1, .. from +0, each step
//         one VDPBF16PS lane: s += bf16(qs_2k+1) bf16(k_j[2k+1]), then s += bf16(qs_2k) bf16(k_j[2k])
//   m_b, z_b, p_j, l_b as in attention_tile.hpp, in float32 on those scores (l_b on unrounded p)
//   o_b[d] = one chain over the pairs of keys (2i, 2i + 1), i = 0 .. 31, from +0:
//         o += bf16(p_2i+1) bf16(v_2i+1[d]), then o += bf16(p_2i) bf16(v_2i[d])
// (each product exact, each sum rounded to nearest, bf16 subnormals as zero; qs, k, p and v
// rounded to nearest even by VCVTNE2PS2BF16; components past head_dim count as 0). The row's own
// block (keys 64 (pos / 64) .. pos) keeps attention_tile.hpp's float32 chains: rounding there
// would move rows that see few keys, or weigh one key heavily, past PyTorch's own bf16 error
// (tests/reference/bf16_attention_options.py, its all_bf16_offdiag column against all_bf16).
// Which arithmetic a block takes depends only on the row's position, so a row keeps its bits in
// any tile, chunk, batch or thread split, decode steps included (tests/kernel_emulation.hpp
// emulates it; tests/test_attention_core.cpp checks it).
//
// Layouts (all in the tile's scratch, none depending on T):
//   q pairs   qp[k][row] = bf16(qs[row][2k]) | bf16(qs[row][2k + 1]) << 16 (rows in lanes)
//   key rows  kb[j][d]   = bf16(k_j[d]), 64 rows of padded_head_dim (a 32-bit word is a pair)
//   values    vp[i][d]   = bf16(v_2i[d]) | bf16(v_2i+1[d]) << 16
//   p pairs   in place in the row-vector p: pair i of a row at the word of key 2i
// A tile whose rows lie in more than one block runs as one tile per block (row-exact, so the same
// bits): then every row of a tile has the same own block, the tile's last.
//
// Only tiles flagged bf16 (bf16 weights) take it; float32 tiles run avx512's core, whose bits the
// avx512_bf16 level keeps for float32 weights.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

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

// acc + the pair products of a and b, lane by lane (VDPBF16PS).
GPT2_KERNEL_AVX512_BF16 inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
}
GPT2_KERNEL_AVX512_BF16 inline __m512i broadcast_pair(const std::uint32_t* p) {
  return _mm512_set1_epi32(static_cast<int>(*p));
}

// Where the bf16 layouts live in a tile's scratch: the parts the float32 core uses for k^T and
// the block's values, free while a bf16 block runs.
struct PairScratch {
  std::uint32_t* qp;  // [hdp / 2][kTileMaxRows]
  std::uint16_t* kb;  // [kKeyBlock][hdp]
  std::uint32_t* vp;  // [kKeyBlock / 2][hdp]
  explicit PairScratch(const TileScratch<float>& ts, Index head_dim)
      : qp(reinterpret_cast<std::uint32_t*>(ts.kt + padded_head_dim(head_dim) * kKeyBlock)),
        kb(reinterpret_cast<std::uint16_t*>(ts.kt)),
        vp(reinterpret_cast<std::uint32_t*>(ts.vb)) {}
};

// qp from qs^T (ts.qt) for row vectors 0 .. groups - 1.
GPT2_KERNEL_AVX512_BF16 inline void pack_query_pairs(Index groups, Index head_dim,
                                                     const TileScratch<float>& ts,
                                                     const PairScratch& ps) {
  const Index hdp = padded_head_dim(head_dim);
  for (Index k = 0; k < hdp / 2; ++k)
    for (Index g = 0; g < groups; ++g)
      _mm512_store_si512(ps.qp + k * kTileMaxRows + 16 * g,
                         round_pairs(_mm512_load_ps(ts.qt + 2 * k * kTileMaxRows + 16 * g),
                                     _mm512_load_ps(ts.qt + (2 * k + 1) * kTileMaxRows + 16 * g)));
}

// The 16 floats of row p from d0 (head_dim long; 0 past it): a plain load where all 16 lie within.
GPT2_KERNEL_AVX512_BF16 inline __m512 load_part(const float* p, Index d0, Index head_dim) {
  return d0 + 16 <= head_dim ? _mm512_loadu_ps(p + d0)
                             : _mm512_maskz_loadu_ps(avx512::lanes(d0, head_dim), p + d0);
}

// kb from a full block's 64 key rows, vp from its 64 value rows.
GPT2_KERNEL_AVX512_BF16 inline void pack_block(const float* const* krow, const float* const* vrow,
                                               Index head_dim, const PairScratch& ps) {
  const Index hdp = padded_head_dim(head_dim);
  for (Index j = 0; j < kKeyBlock; ++j)
    for (Index d0 = 0; d0 < hdp; d0 += 16)
      _mm256_store_si256(reinterpret_cast<__m256i*>(ps.kb + j * hdp + d0),
                         reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(load_part(krow[j], d0, head_dim))));
  for (Index i = 0; i < kKeyBlock / 2; ++i)
    for (Index d0 = 0; d0 < hdp; d0 += 16)
      _mm512_store_si512(ps.vp + i * hdp + d0, round_pairs(load_part(vrow[2 * i], d0, head_dim),
                                                           load_part(vrow[2 * i + 1], d0, head_dim)));
}

// st[j][row0 .. row0 + 16 G) = the pair-chain scores of keys j0 .. j0 + J - 1 against rows row0 ..
// (every row sees the whole block); their maxima over the active rows into bm.
template <int J, int G>
GPT2_KERNEL_AVX512_BF16 inline void pair_scores(Index row0, Index j0, Index ra, Index nb,
                                                Index head_dim, const TileScratch<float>& ts,
                                                const PairScratch& ps, avx512::BlockMax& bm) {
  const Index hdp = padded_head_dim(head_dim);
  __m512 acc[J][G];
#pragma GCC unroll 8
  for (int jj = 0; jj < J; ++jj)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[jj][g] = _mm512_setzero_ps();
  const std::uint32_t* k[J];
#pragma GCC unroll 8
  for (int jj = 0; jj < J; ++jj) k[jj] = reinterpret_cast<const std::uint32_t*>(ps.kb + (j0 + jj) * hdp);
  const Index pairs = (head_dim + 1) / 2;
  for (Index kk = 0; kk < pairs; ++kk) {
    __m512i qv[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) qv[g] = _mm512_load_si512(ps.qp + kk * kTileMaxRows + row0 + 16 * g);
#pragma GCC unroll 8
    for (int jj = 0; jj < J; ++jj) {
      const __m512i kp = broadcast_pair(k[jj] + kk);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[jj][g] = dot_pairs(acc[jj][g], qv[g], kp);
    }
  }
  avx512::store_scores_t<J, G>(acc, row0, j0, ts);
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const Index gg = row0 / 16 + g;
    avx512::gather_max<J, G>(acc, g, gg, avx512::active_rows(gg, ra, nb), bm);
  }
}

template <int G>
GPT2_KERNEL_AVX512_BF16 inline void pair_scores_block(Index nb, Index head_dim,
                                                      const TileScratch<float>& ts,
                                                      const PairScratch& ps, avx512::BlockMax& bm) {
  for (Index j = 0; j + 6 <= kKeyBlock; j += 6) pair_scores<6, G>(0, j, 0, nb, head_dim, ts, ps, bm);
  pair_scores<kKeyBlock % 6, G>(0, kKeyBlock / 6 * 6, 0, nb, head_dim, ts, ps, bm);
}

// Row vectors 0 .. groups - 1 of st as pairs of keys, in place: pair i of a row at the word of key
// 2i.
GPT2_KERNEL_AVX512_BF16 inline void probs_to_pairs(float* p, Index groups) {
  for (Index i = 0; i < kKeyBlock / 2; ++i) {
    float* even = p + 2 * i * kTileMaxRows;
    const float* odd = even + kTileMaxRows;
    for (Index g = 0; g < groups; ++g)
      _mm512_store_si512(even + 16 * g,
                         round_pairs(_mm512_load_ps(even + 16 * g), _mm512_load_ps(odd + 16 * g)));
  }
}

// o[r + i][d0 .. d0 + 16 V) = fma(o_b, c, o * a) for R rows, o_b the pair chain over the block
// (value pairs from vp, p pairs from ts.p).
template <int R, int V>
GPT2_KERNEL_AVX512_BF16 inline void pair_values(Index r, Index d0, Index head_dim,
                                                TileScratch<float>& ts, const PairScratch& ps) {
  const Index hdp = padded_head_dim(head_dim);
  const std::uint32_t* pp = reinterpret_cast<const std::uint32_t*>(ts.p) + r;
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  for (Index k = 0; k < kKeyBlock / 2; ++k) {
    __m512i vv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) vv[v] = _mm512_load_si512(ps.vp + k * hdp + d0 + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512i pk = broadcast_pair(pp + i + 2 * k * kTileMaxRows);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = dot_pairs(acc[i][v], pk, vv[v]);
    }
  }
  avx512::merge_values<R, V>(r, d0, hdp, acc, ts);
}

template <int R>
GPT2_KERNEL_AVX512_BF16 inline void pair_values_rows(Index r, Index head_dim,
                                                     TileScratch<float>& ts,
                                                     const PairScratch& ps) {
  const Index hdp = padded_head_dim(head_dim);
  Index d0 = 0;
  for (; d0 + 64 <= hdp; d0 += 64) pair_values<R, 4>(r, d0, head_dim, ts, ps);
  switch ((hdp - d0) / 16) {
    case 3: pair_values<R, 3>(r, d0, head_dim, ts, ps); break;
    case 2: pair_values<R, 2>(r, d0, head_dim, ts, ps); break;
    case 1: pair_values<R, 1>(r, d0, head_dim, ts, ps); break;
    default: break;
  }
}

// One full key block (from b0) before every row of the tile's own block, in bf16 pairs: scores,
// block softmax (float32), p v, merged into the rows' running state. qp is packed.
GPT2_KERNEL_AVX512_BF16 inline void pair_block(Index b0, const AttentionTile<float>& t,
                                               TileScratch<float>& ts, const PairScratch& ps) {
  const Index nb = t.rows, groups = (nb + 15) / 16;
  const float* krow[kKeyBlock];
  const float* vrow[kKeyBlock];
  block_rows<float>(t, b0, kKeyBlock, krow, vrow, ts.kw, ts.vw);
  pack_block(krow, vrow, t.head_dim, ps);
  avx512::BlockMax bm;
  for (Index g = 0; g < groups; ++g) {
    bm.mx[g] = _mm512_set1_ps(-__builtin_inff());
    bm.nan[g] = 0;
  }
  switch (groups) {
    case 4: pair_scores_block<4>(nb, t.head_dim, ts, ps, bm); break;
    case 3: pair_scores_block<3>(nb, t.head_dim, ts, ps, bm); break;
    case 2: pair_scores_block<2>(nb, t.head_dim, ts, ps, bm); break;
    default: pair_scores_block<1>(nb, t.head_dim, ts, ps, bm); break;
  }
  for (Index g = 0; g < groups; ++g) avx512::block_softmax16(g, b0, kKeyBlock, 0, nb, bm, t, ts);
  probs_to_pairs(ts.p, groups);
  Index r = 0;
  for (; r + avx512::kValueRows <= nb; r += avx512::kValueRows)
    pair_values_rows<avx512::kValueRows>(r, t.head_dim, ts, ps);
  switch (nb - r) {
    case 5: pair_values_rows<5>(r, t.head_dim, ts, ps); break;
    case 4: pair_values_rows<4>(r, t.head_dim, ts, ps); break;
    case 3: pair_values_rows<3>(r, t.head_dim, ts, ps); break;
    case 2: pair_values_rows<2>(r, t.head_dim, ts, ps); break;
    case 1: pair_values_rows<1>(r, t.head_dim, ts, ps); break;
    default: break;
  }
}

// A tile of 2 rows or more whose rows all lie in one key block (its last): the blocks before it
// in bf16 pairs, then its own in float32 (avx512's tile_block). The pair blocks always run with
// rows in lanes, whose visibility masks take positions as 32-bit lanes: positions below 2^31,
// which any cache that fits in memory keeps to. (A tile straddling a block boundary packs the
// blocks before it once per part: prefill's tiles start on block boundaries when T is a multiple
// of 64.)
GPT2_KERNEL_AVX512_BF16 inline void block_tile(const AttentionTile<float>& t) {
  const Index hd = t.head_dim, hdp = padded_head_dim(hd), nb = t.rows;
  TileScratch<float> ts(t.scratch, hd);
  const PairScratch ps(ts, hd);
  avx512::init_rows(t, ts);
  const Index own = t.first_pos / kKeyBlock, n_blocks = own + 1;
  const bool row_vectors = avx512::uses_row_vectors(t);
  // q^T for rows in lanes: the pair blocks take them whatever nb is
  if (own > 0 || row_vectors) avx512::transpose_queries(nb, t, ts);
  if (own > 0) pack_query_pairs((nb + 15) / 16, hd, ts, ps);
  for (Index b = 0; b < own; ++b) {
    prefetch_next_queries(t, b, n_blocks);
    pair_block(b * kKeyBlock, t, ts, ps);
  }
  prefetch_next_queries(t, own, n_blocks);
  avx512::tile_block(own * kKeyBlock, row_vectors, t, ts);
  for (Index r = 0; r < nb; ++r) avx512::store_row(ts.o + r * hdp, ts.l[r], hd, t.out + r * t.ldo);
}

// ---- one query row (a decode step) ----------------------------------------------------------

// 16 pairs from the 16 elements at a and at b (b null: zeros): lane i = a_i | b_i << 16, float32
// rounded to bf16 (nearest even) or bf16 bits as they are. Both give VDPBF16PS the same operands:
// rounding a normal bf16 value gives it back, and a bf16 subnormal, which the rounding would
// flush, the instruction reads as zero anyway. The last two: lanes outside m read as 0.
GPT2_KERNEL_AVX512_BF16 inline __m512i pairs16(const float* a, const float* b) {
  return round_pairs(_mm512_loadu_ps(a), b != nullptr ? _mm512_loadu_ps(b) : _mm512_setzero_ps());
}
GPT2_KERNEL_AVX512_BF16 inline __m512i pairs16(const std::uint16_t* a, const std::uint16_t* b) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i hi = b != nullptr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b))
                                  : _mm256_setzero_si256();
  return interleave_pairs(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}
GPT2_KERNEL_AVX512_BF16 inline __m512i pairs16(const float* a, const float* b, __mmask16 m) {
  return round_pairs(_mm512_maskz_loadu_ps(m, a), _mm512_maskz_loadu_ps(m, b));
}
GPT2_KERNEL_AVX512_BF16 inline __m512i pairs16(const std::uint16_t* a, const std::uint16_t* b,
                                               __mmask16 m) {
  const __m256i lo = _mm256_maskz_loadu_epi16(m, a), hi = _mm256_maskz_loadu_epi16(m, b);
  return interleave_pairs(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}

// p[0 .. 64) = the pair-chain scores of the row's q pairs (qp: hdp / 2 words) against a full
// block: from its transposed keys kt when the cache keeps them (streamed kStreamAhead ahead), else
// from its rows, transposed in registers.
template <class E>
GPT2_KERNEL_AVX512_BF16 inline void decode_pair_scores(const E* kt, const E* const* rows,
                                                       Index head_dim, const std::uint32_t* qp,
                                                       float* p) {
  constexpr int G = kKeyBlock / 16;
  __m512 acc[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  if (kt != nullptr) {
    for (Index k = 0; 2 * k < head_dim; ++k) {
      const E* even = kt + 2 * k * kKeyBlock;
      const E* odd = 2 * k + 1 < head_dim ? even + kKeyBlock : nullptr;  // an odd head_dim: 0
      avx512::prefetch_stream(even, 2 * kKeyBlock * sizeof(E));
      const __m512i q = broadcast_pair(qp + k);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)
        acc[g] = dot_pairs(acc[g], pairs16(even + 16 * g, odd ? odd + 16 * g : nullptr), q);
    }
  } else {
    for (Index d0 = 0; d0 < head_dim; d0 += 16) {
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        __m512 r[16];
        avx512::load_keys_t16(rows, kKeyBlock, 16 * g, d0, head_dim, r);  // 0 past head_dim
        const Index pairs = std::min<Index>(8, (head_dim - d0 + 1) / 2);
        for (Index i = 0; i < pairs; ++i)
          acc[g] = dot_pairs(acc[g], round_pairs(r[2 * i], r[2 * i + 1]),
                             broadcast_pair(qp + d0 / 2 + i));
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) _mm512_store_ps(p + 16 * g, acc[g]);
}

// o_b[d0 .. d0 + 16 V) of a full block's partial: the pair chain over its value rows (float32 or
// bf16 bits), p pairs at pp; each row fetched kStreamAhead ahead when `ahead`.
template <int V, class E>
GPT2_KERNEL_AVX512_BF16 inline void decode_pair_values(Index d0, Index head_dim,
                                                       const E* const* vrow, bool ahead,
                                                       const std::uint32_t* pp, float* part) {
  __mmask16 dm[V];
  __m512 acc[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) {
    dm[v] = avx512::lanes(d0 + 16 * v, head_dim);
    acc[v] = _mm512_setzero_ps();
  }
  const bool full = d0 + 16 * V <= head_dim;
  const std::uintptr_t row_bytes = static_cast<std::uintptr_t>(head_dim) * sizeof(E);
  for (Index i = 0; i < kKeyBlock / 2; ++i) {
    const E* a = vrow[2 * i] + d0;
    const E* b = vrow[2 * i + 1] + d0;
    if (ahead) {
      avx512::prefetch_stream(a, row_bytes);
      avx512::prefetch_stream(b, row_bytes);
    }
    const __m512i pk = broadcast_pair(pp + i);
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      acc[v] = dot_pairs(acc[v], pk,
                         full ? pairs16(a + 16 * v, b + 16 * v) : pairs16(a + 16 * v, b + 16 * v, dm[v]));
  }
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) _mm512_store_ps(part + kPartialHeader + d0 + 16 * v, acc[v]);
}

// words[w] = bf16(x[2w]) | bf16(x[2w + 1]) << 16, w < n / 2, from n floats (a multiple of 16; a
// last 16 pair with zeros), 64-byte aligned. x's 32 floats from 2w' are read before the words
// from w' are written, so words may lie over x (in place).
GPT2_KERNEL_AVX512_BF16 inline void consecutive_pairs(const float* x, Index n, std::uint32_t* words) {
  for (Index i = 0; i < n; i += 32) {
    const __m512 a = _mm512_load_ps(x + i);
    const __m512 b = i + 16 < n ? _mm512_load_ps(x + i + 16) : _mm512_setzero_ps();
    // cvtne2ps(b, a): words 0 .. 15 = a, 16 .. 31 = b, in order: each 32-bit word a pair
    _mm512_store_si512(words + i / 2, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
  }
}

// The partial of the tile's one row over the full block from b0, which lies before its own: in
// bf16 pairs (q pairs at qp), into part. Keys from rows: the next block's rows before key_end are
// fetched into cache meanwhile.
template <class E>
GPT2_KERNEL_AVX512_BF16 inline void decode_pair_block(Index b0, Index key_end,
                                                      const AttentionTile<float>& t,
                                                      const E* const* key_pages,
                                                      const E* const* value_pages,
                                                      const std::uint32_t* qp,
                                                      TileScratch<float>& ts, float* part) {
  const Index hd = t.head_dim;
  const E* row[kKeyBlock];
  const E* kt = transposed_keys_of<E>(t);
  if (kt != nullptr) {
    decode_pair_scores<E>(kt + (b0 / kKeyBlock) * hd * kKeyBlock, nullptr, hd, qp, ts.p);
  } else {
    prefetch_keys_and_values(t, key_pages, value_pages, b0 + kKeyBlock, kKeyBlock, key_end);
    page_rows_of<E>(key_pages, t.page_rows, t.key_stride, b0, kKeyBlock, row);
    decode_pair_scores<E>(nullptr, row, hd, qp, ts.p);
  }
  page_rows_of<E>(value_pages, t.page_rows, t.value_stride, b0, kKeyBlock, row);
  avx512::block_stats(kKeyBlock, ts.p, part);
  std::uint32_t* pp = reinterpret_cast<std::uint32_t*>(ts.p);  // p as 32 pairs, in place
  consecutive_pairs(ts.p, kKeyBlock, pp);
  const bool streams = kt != nullptr;
  const Index hdp = padded_head_dim(hd);
  Index d0 = 0;
  for (; d0 + 64 <= hdp; d0 += 64) decode_pair_values<4>(d0, hd, row, streams && d0 == 0, pp, part);
  const bool ahead = streams && d0 == 0;
  switch ((hdp - d0) / 16) {
    case 3: decode_pair_values<3>(d0, hd, row, ahead, pp, part); break;
    case 2: decode_pair_values<2>(d0, hd, row, ahead, pp, part); break;
    case 1: decode_pair_values<1>(d0, hd, row, ahead, pp, part); break;
    default: break;
  }
}

// A decode row's start: q scaled into qs (avx512's init_rows), and its pairs into ts.qt, returned.
GPT2_KERNEL_AVX512_BF16 inline const std::uint32_t* start_row(const AttentionTile<float>& t,
                                                              TileScratch<float>& ts) {
  avx512::init_rows(t, ts);
  std::uint32_t* qp = reinterpret_cast<std::uint32_t*>(ts.qt);
  consecutive_pairs(ts.qs, padded_head_dim(t.head_dim), qp);
  return qp;
}

// The row's partial over key block b into part: in bf16 pairs before its own block, its own in
// float32 (avx512's decode_block).
template <class E>
GPT2_KERNEL_AVX512_BF16 inline void row_block_partial(Index b, Index key_end,
                                                      const AttentionTile<float>& t,
                                                      const E* const* key_pages,
                                                      const E* const* value_pages,
                                                      const std::uint32_t* qp,
                                                      TileScratch<float>& ts, float* part) {
  if (b < t.first_pos / kKeyBlock)
    decode_pair_block(b * kKeyBlock, key_end, t, key_pages, value_pages, qp, ts, part);
  else
    avx512::decode_block(b * kKeyBlock, key_end, t, key_pages, value_pages, ts, part);
}

// The partials of the tile's one row over blocks [block_begin, block_end): those before its own
// block in bf16 pairs, its own (the last it sees) in float32 (avx512's decode_block).
template <class E>
GPT2_KERNEL_AVX512_BF16 inline void pair_row_partials(const AttentionTile<float>& t,
                                                      const E* const* key_pages,
                                                      const E* const* value_pages,
                                                      Index block_begin, Index block_end,
                                                      float* parts) {
  TileScratch<float> ts(t.scratch, t.head_dim);
  const Index key_end = block_end * kKeyBlock, stride = partial_stride(t.head_dim);
  avx512::prefetch_decode_start(t, key_pages, value_pages, block_begin, key_end);
  const std::uint32_t* qp = start_row(t, ts);
  for (Index b = block_begin; b < block_end; ++b)
    row_block_partial(b, key_end, t, key_pages, value_pages, qp, ts,
                      parts + (b - block_begin) * stride);
}

// ---- int8 keys and values (an int8 cache), read in place ---------------------------------------

// The 16 values at q (int8) times scale s, as float32: float(q) * s, one multiply (exact
// conversion): the value an int8 cache's row stands for (kernels/int8_dequant.hpp). The masked
// form: lanes outside m are 0.
GPT2_KERNEL_AVX512_BF16 inline __m512 scaled16(const std::int8_t* q, __m512 s) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
}
GPT2_KERNEL_AVX512_BF16 inline __m512 scaled16(const std::int8_t* q, __m512 s, __mmask16 m) {
  const __m128i b = _mm_maskz_loadu_epi8(m, q);
  return _mm512_maskz_mul_ps(m, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
}

// 16 pairs from the 16 int8 values at a and at b: lane i = bf16(float(a_i) * x_i) |
// bf16(float(b_i) * y_i) << 16, where (x_i, y_i) is lane (2 i mod 16, 2 i + 1 mod 16) of s_lo for
// i < 8, of s_hi for i >= 8: round_pairs of the scaled values, with the bytes interleaved before
// the conversion (VPUNPCKLBW, VPUNPCKHBW) instead of the bf16 words after it.
GPT2_KERNEL_AVX512_BF16 inline __m512i scaled_pairs(const std::int8_t* a, const std::int8_t* b,
                                                    __m512 s_lo, __m512 s_hi) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi8(x, y))), s_lo);
  const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi8(x, y))), s_hi);
  // cvtne2ps(hi, lo): words 0 .. 15 = lo (a_0, b_0, .. a_7, b_7), 16 .. 31 = hi
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// decode_pair_scores over a full block's transposed int8 keys kt (the block's 64 key scales at
// scale): the operands of its float32 values, so the same bits.
GPT2_KERNEL_AVX512_BF16 inline void decode_pair_scores_int8(const std::int8_t* kt,
                                                            const float* scale, Index head_dim,
                                                            const std::uint32_t* qp, float* p) {
  constexpr int G = kKeyBlock / 16;
  __m512 acc[G], s[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    acc[g] = _mm512_setzero_ps();
    s[g] = _mm512_loadu_ps(scale + 16 * g);
  }
  // each key's scale twice, for keys 16 g .. 16 g + 7 (ss[2 g]) and 16 g + 8 .. (ss[2 g + 1])
  __m512 ss[2 * G];
  const __m512i twice_lo = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i twice_hi = _mm512_add_epi32(twice_lo, _mm512_set1_epi32(8));
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    ss[2 * g] = _mm512_permutexvar_ps(twice_lo, s[g]);
    ss[2 * g + 1] = _mm512_permutexvar_ps(twice_hi, s[g]);
  }
  for (Index k = 0; 2 * k < head_dim; ++k) {
    const std::int8_t* even = kt + 2 * k * kKeyBlock;
    avx512::prefetch_stream(even, 2 * kKeyBlock);
    const __m512i q = broadcast_pair(qp + k);
    if (2 * k + 1 < head_dim) {
      const std::int8_t* odd = even + kKeyBlock;
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)
        acc[g] = dot_pairs(acc[g], scaled_pairs(even + 16 * g, odd + 16 * g, ss[2 * g], ss[2 * g + 1]),
                           q);
    } else {  // an odd head_dim: the last component pairs with 0
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)
        acc[g] = dot_pairs(acc[g], round_pairs(scaled16(even + 16 * g, s[g]), _mm512_setzero_ps()),
                           q);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) _mm512_store_ps(p + 16 * g, acc[g]);
}

// decode_pair_values over a full block's int8 value rows vrow (row i's scale at vscale[i]), each
// row fetched kStreamAhead ahead when `ahead`: the operands of their float32 values.
template <int V>
GPT2_KERNEL_AVX512_BF16 inline void decode_pair_values_int8(Index d0, Index head_dim,
                                                            const std::int8_t* const* vrow,
                                                            const float* vscale, bool ahead,
                                                            const std::uint32_t* pp,
                                                            float* part) {
  __mmask16 dm[V];
  __m512 acc[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) {
    dm[v] = avx512::lanes(d0 + 16 * v, head_dim);
    acc[v] = _mm512_setzero_ps();
  }
  const bool full = d0 + 16 * V <= head_dim;
  const std::uintptr_t row_bytes = static_cast<std::uintptr_t>(head_dim);
  for (Index i = 0; i < kKeyBlock / 2; ++i) {
    const std::int8_t* a = vrow[2 * i] + d0;
    const std::int8_t* b = vrow[2 * i + 1] + d0;
    if (ahead) {
      avx512::prefetch_stream(a, row_bytes);
      avx512::prefetch_stream(b, row_bytes);
    }
    const __m512i pk = broadcast_pair(pp + i);
    if (full) {
      std::uint64_t two;  // (scale of row 2 i, of row 2 i + 1) in every 64-bit lane
      std::memcpy(&two, vscale + 2 * i, sizeof two);
      const __m512 sab = _mm512_castsi512_ps(_mm512_set1_epi64(static_cast<long long>(two)));
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[v] = dot_pairs(acc[v], pk, scaled_pairs(a + 16 * v, b + 16 * v, sab, sab));
    } else {
      const __m512 sa = _mm512_set1_ps(vscale[2 * i]), sb = _mm512_set1_ps(vscale[2 * i + 1]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[v] = dot_pairs(acc[v], pk,
                           round_pairs(scaled16(a + 16 * v, sa, dm[v]), scaled16(b + 16 * v, sb, dm[v])));
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) _mm512_store_ps(part + kPartialHeader + d0 + 16 * v, acc[v]);
}

// decode_pair_block over int8 keys and values (t.keys_t_int8, t.value_pages_int8 and their
// scales), converted in registers: the bits decode_pair_block gives over float32 pages holding
// float(q) * scale.
GPT2_KERNEL_AVX512_BF16 inline void decode_pair_block_int8(Index b0, const AttentionTile<float>& t,
                                                           const std::uint32_t* qp,
                                                           TileScratch<float>& ts, float* part) {
  const Index hd = t.head_dim;
  decode_pair_scores_int8(t.keys_t_int8 + (b0 / kKeyBlock) * hd * kKeyBlock, t.key_scales + b0, hd,
                          qp, ts.p);
  const std::int8_t* row[kKeyBlock];
  page_rows_of<std::int8_t>(t.value_pages_int8, t.page_rows, t.value_stride, b0, kKeyBlock, row);
  float vscale[kKeyBlock];
  const float* scales[kKeyBlock];
  page_rows_of<float>(t.value_scale_pages, t.page_rows, 1, b0, kKeyBlock, scales);
  for (Index j = 0; j < kKeyBlock; ++j) vscale[j] = *scales[j];
  avx512::block_stats(kKeyBlock, ts.p, part);
  std::uint32_t* pp = reinterpret_cast<std::uint32_t*>(ts.p);  // p as 32 pairs, in place
  consecutive_pairs(ts.p, kKeyBlock, pp);
  const Index hdp = padded_head_dim(hd);
  Index d0 = 0;
  for (; d0 + 64 <= hdp; d0 += 64)
    decode_pair_values_int8<4>(d0, hd, row, vscale, d0 == 0, pp, part);
  const bool ahead = d0 == 0;
  switch ((hdp - d0) / 16) {
    case 3: decode_pair_values_int8<3>(d0, hd, row, vscale, ahead, pp, part); break;
    case 2: decode_pair_values_int8<2>(d0, hd, row, vscale, ahead, pp, part); break;
    case 1: decode_pair_values_int8<1>(d0, hd, row, vscale, ahead, pp, part); break;
    default: break;
  }
}

// The level's row_partials_int8 (kernels/table.hpp): a one-row bf16 tile's partials over blocks
// [block_begin, block_end), all before its row's own block, its keys and values int8.
GPT2_KERNEL_AVX512_BF16 inline void row_partials_int8(const AttentionTile<float>& t,
                                                      Index block_begin, Index block_end,
                                                      float* parts) {
  TileScratch<float> ts(t.scratch, t.head_dim);
  const Index stride = partial_stride(t.head_dim), hd = t.head_dim;
  if (block_begin < block_end) {
    prefetch_span(t.keys_t_int8 + block_begin * hd * kKeyBlock, avx512::kStreamAhead);
    const std::int8_t* first_value;
    page_rows_of<std::int8_t>(t.value_pages_int8, t.page_rows, t.value_stride,
                              block_begin * kKeyBlock, 1, &first_value);
    prefetch_span(first_value, avx512::kStreamAhead);
  }
  const std::uint32_t* qp = start_row(t, ts);
  for (Index b = block_begin; b < block_end; ++b)
    decode_pair_block_int8(b * kKeyBlock, t, qp, ts, parts + (b - block_begin) * stride);
}

// ---- the level's table entries: a bf16 tile (t.bf16) runs the above, a float32 one avx512's ---

// A one-row bf16 tile over pages of E (float32, or bf16 bits): block by block, each a partial
// merged in order; t.out.
template <class E>
GPT2_KERNEL_AVX512_BF16 inline void decode_row(const AttentionTile<float>& t,
                                               const E* const* key_pages,
                                               const E* const* value_pages) {
  TileScratch<float> ts(t.scratch, t.head_dim);
  const Index key_end = t.first_pos + 1, blocks = t.first_pos / kKeyBlock + 1;
  float* part = ts.vb;  // the partials one at a time, merged into row 0's running state
  avx512::prefetch_decode_start(t, key_pages, value_pages, 0, key_end);
  const std::uint32_t* qp = start_row(t, ts);
  for (Index b = 0; b < blocks; ++b) {
    row_block_partial(b, key_end, t, key_pages, value_pages, qp, ts, part);
    avx512::fold_partial(part, t.head_dim, ts);
  }
  avx512::write_row(t, ts);
}

GPT2_KERNEL_AVX512_BF16 inline void attention_tile(const AttentionTile<float>& t) {
  if (!t.bf16) return avx512::attention_tile(t);
  if (t.rows == 1) {  // a decode step
    if (t.key_pages_bf16 != nullptr)
      decode_row(t, t.key_pages_bf16, t.value_pages_bf16);
    else
      decode_row(t, t.key_pages, t.value_pages);
    return;
  }
  // one tile per key block its rows lie in, in order
  AttentionTile<float> part = t;
  for (Index r0 = 0; r0 < t.rows;) {
    const Index pos = t.first_pos + r0;
    const Index r1 = std::min(t.rows, r0 + (kKeyBlock - pos % kKeyBlock));
    part.rows = r1 - r0;
    part.first_pos = pos;
    part.q = t.q + r0 * t.ldq;
    part.out = t.out + r0 * t.ldo;
    if (part.rows == 1) {  // a single row: the decode arithmetic is the same
      attention_tile(part);
    } else {
      block_tile(part);
    }
    r0 = r1;
  }
}

GPT2_KERNEL_AVX512_BF16 inline void row_partials(const AttentionTile<float>& t, Index block_begin,
                                                 Index block_end, float* parts) {
  if (!t.bf16)
    avx512::row_partials(t, block_begin, block_end, parts);
  else if (t.key_pages_bf16 != nullptr)
    pair_row_partials(t, t.key_pages_bf16, t.value_pages_bf16, block_begin, block_end, parts);
  else
    pair_row_partials(t, t.key_pages, t.value_pages, block_begin, block_end, parts);
}

}  // namespace gpt2::kernels::avx512_bf16
#endif  // GPT2_KERNELS_HAVE_AVX512
