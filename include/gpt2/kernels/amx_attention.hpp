// The fused attention core on AMX tiles, for bf16 weights at the amx level (tile.bf16): one tile
// of up to 256 query rows of one head (in row groups of 64), online softmax over the same 64-key blocks at absolute
// positions as kernels/attention_tile.hpp, with the two products in bf16 on TDPBF16PS:
//   qs   = q * scale, split into q_hi = bf16(qs), q_lo = bf16(qs - q_hi)   (once per tile)
//   per key block b (keys 64 b .. 64 b + 63 that exist; the others zero), k split alike:
//     s    = q_hi k_hi^T + q_hi k_lo^T + q_lo k_hi^T, float32 accumulation (16-row x 16-key
//            tiles over d; the three products in this order, each over d in order): q and k to
//            about 16 bits, which the logits need (a logit of 80 moves by 0.3 with one bf16)
//     m_b  = max of the row's visible s (NaN if any is NaN); z_b = m_b, or 0 when -inf
//     p    = kexpe(s - z_b) for the visible keys, 0 for the others, split into two bf16 parts
//            p_hi = bf16(p), p_lo = bf16(p - p_hi) (p to about 16 bits, where one bf16 holds 8)
//     l_b  = the sum of the row's p (_mm512_reduce_add_ps's order)
//     o_b  = p_hi v_hi + p_lo v_hi + p_hi v_lo (v split alike), float32 accumulation (16 x 16
//            tiles over keys, the products in this order); a block with a NaN or infinite value
//            sums (p_hi + p_lo) v over each row's visible keys in float32 instead (a tile would
//            give 0 * NaN = NaN to the rows that do not see that key)
//     merged into the running (m, z, l, o) as attention_tile.hpp writes it (kexpe factors a, c)
//   out = o / l
// Every step of a row depends only on its own data and position (an AMX tile computes its rows
// independently), so a row gets the same bits in any tile of kAmxMinRows rows or more; tiles with
// fewer rows (decode steps) run the float32 core instead, so at the amx level a sequence fed in
// chunks agrees with one forward to rounding only (bitwise at the other levels). Needs head_dim a multiple of 32 (at most 256); the caller checks (dispatch falls back
// to the float32 core otherwise).
//
// Scratch (attention_floats(head_dim) floats; D = head_dim), for up to 256 query rows:
//   qb, ql [256, D] bf16 (q_hi, q_lo) | kt, kl [D / 2, 64] bf16 pairs (k_hi, k_lo) (k^T: pair row r holds (k[j][2r], k[j][2r+1]) for
//   the 64 keys j) | vp, vl [32, D] bf16 pairs (v_hi, v_lo: pair row r holds (v[2r][d], v[2r+1][d]) for each d)
//   | s [64, 64] float | pb, pl [64, 64] bf16 (p_hi, p_lo) | ob [64, D] | o [256, D] | m, z, l
//   [256] | mb, lb, a, c [64] float (s, p, ob and the block statistics: one row group of 64)
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "gpt2/kernels/amx_attention_size.hpp"
#include "gpt2/kernels/amx_tiles.hpp"
#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/avx512_attention.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AMX
namespace gpt2::kernels::amx {

struct AmxTileScratch {
  std::uint16_t *qb, *ql, *kt, *kl, *vp, *vl, *pb, *pl;
  float *s, *ob, *o, *m, *z, *l, *mb, *lb, *a, *c, *kw, *vw;
  AmxTileScratch(float* base, Index D) {
    qb = reinterpret_cast<std::uint16_t*>(base);        // [256, D]
    ql = qb + kAmxTileMaxRows * D;                      // [256, D]
    kt = ql + kAmxTileMaxRows * D;                      // [D / 2, 64] pairs
    kl = kt + 64 * D;
    vp = kl + 64 * D;                                   // [32, D] pairs
    vl = vp + 64 * D;
    s = reinterpret_cast<float*>(vl + 64 * D);          // [64, 64] (one row group)
    pb = reinterpret_cast<std::uint16_t*>(s + 64 * 64); // [64, 64]
    pl = pb + 64 * 64;
    ob = reinterpret_cast<float*>(pl + 64 * 64);        // [64, D]
    o = ob + 64 * D;                                    // [256, D]
    m = o + kAmxTileMaxRows * D;                        // [256] each
    z = m + kAmxTileMaxRows;
    l = z + kAmxTileMaxRows;
    mb = l + kAmxTileMaxRows;                           // [64] each (one row group)
    lb = mb + 64;
    a = lb + 64;
    c = a + 64;
    kw = c + 64;                                        // [64, D] a block's keys widened from bf16
    vw = kw + 64 * D;                                   // [64, D] its values
  }
};

// The bf16 parts of 32 floats: hi = bf16(x), lo = bf16(x - hi).
GPT2_KERNEL_AMX inline void split_bf16x32(__m512 x0, __m512 x1, __m512i& hi, __m512i& lo) {
  hi = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(x1, x0));
  const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16));
  const __m512 h1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1)), 16));
  lo = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, h1), _mm512_sub_ps(x0, h0)));
}

// kt, kl: the block's keys (rows[j], j < nk; zero for nk <= j < 64) split into bf16 parts,
// transposed into pair rows over d (16 x 16 transposes of 32-bit pairs).
GPT2_KERNEL_AMX inline void pack_keys_bf16(const float* const* rows, Index nk, Index D,
                                           std::uint16_t* kt, std::uint16_t* kl) {
  for (Index g = 0; g < 4; ++g) {
    for (Index pg = 0; pg < D / 32; ++pg) {
      __m512 r[16], e[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const Index j = 16 * g + i;
        __m512i hi = _mm512_setzero_si512(), lo = _mm512_setzero_si512();
        if (j < nk)
          split_bf16x32(_mm512_loadu_ps(rows[j] + 32 * pg), _mm512_loadu_ps(rows[j] + 32 * pg + 16), hi, lo);
        r[i] = _mm512_castsi512_ps(hi);
        e[i] = _mm512_castsi512_ps(lo);
      }
      avx512::transpose16(r);
      avx512::transpose16(e);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        _mm512_store_ps(reinterpret_cast<float*>(kt + (16 * pg + i) * 128 + 32 * g), r[i]);
        _mm512_store_ps(reinterpret_cast<float*>(kl + (16 * pg + i) * 128 + 32 * g), e[i]);
      }
    }
  }
}

// vp, vl: the block's values split into bf16 parts, keys interleaved in pairs (rows past nk zero).
// Returns whether every value is finite (else the block's p v runs block_values_float: a tile
// would multiply a masked key's p = 0 by its NaN or infinity).
GPT2_KERNEL_AMX inline bool pack_values_bf16(const float* const* rows, Index nk, Index D,
                                             std::uint16_t* vp, std::uint16_t* vl) {
  __mmask16 nonfinite = 0;
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  for (Index j = 0; j < nk; ++j)
    for (Index d = 0; d < D; d += 16) {
      const __m512i bits = _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(rows[j] + d)), exponent);
      nonfinite |= _mm512_cmpeq_epi32_mask(bits, exponent);
    }
  alignas(64) static constexpr std::uint16_t kLo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5,
                                                        37, 6, 38, 7, 39, 8, 40, 9, 41, 10, 42,
                                                        11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr std::uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                        53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                        27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo_idx = _mm512_load_si512(kLo), hi_idx = _mm512_load_si512(kHi);
  for (Index r = 0; r < 32; ++r) {
    const Index j0 = 2 * r, j1 = 2 * r + 1;
    for (Index d0 = 0; d0 < D; d0 += 32) {
      __m512i e = _mm512_setzero_si512(), el = e, f = e, fl = e;
      if (j0 < nk) split_bf16x32(_mm512_loadu_ps(rows[j0] + d0), _mm512_loadu_ps(rows[j0] + d0 + 16), e, el);
      if (j1 < nk) split_bf16x32(_mm512_loadu_ps(rows[j1] + d0), _mm512_loadu_ps(rows[j1] + d0 + 16), f, fl);
      std::uint16_t* dst = vp + r * 2 * D + 2 * d0;
      _mm512_store_si512(dst, _mm512_permutex2var_epi16(e, lo_idx, f));
      _mm512_store_si512(dst + 32, _mm512_permutex2var_epi16(e, hi_idx, f));
      std::uint16_t* low = vl + r * 2 * D + 2 * d0;
      _mm512_store_si512(low, _mm512_permutex2var_epi16(el, lo_idx, fl));
      _mm512_store_si512(low + 32, _mm512_permutex2var_epi16(el, hi_idx, fl));
    }
  }
  return nonfinite == 0;
}

// ob[i] = sum over the row's visible keys j of p_ij v_j in float32 (p = p_hi + p_lo), for a block
// whose values are not all finite: masked keys are left out, so their NaN or infinity reaches
// only the rows that see them (as in the float32 core).
GPT2_KERNEL_AMX inline void block_values_float(const AmxTileScratch& ts, const float* const* vrow,
                                               const Index* visible, Index group_rows, Index D) {
  for (Index i = 0; i < group_rows; ++i) {
    float* ob = ts.ob + i * D;
    for (Index d = 0; d < D; d += 16) _mm512_store_ps(ob + d, _mm512_setzero_ps());
    for (Index j = 0; j < visible[i]; ++j) {
      const __m512 p = _mm512_set1_ps(bf16_to_float(ts.pb[i * 64 + j]) + bf16_to_float(ts.pl[i * 64 + j]));
      for (Index d = 0; d < D; d += 16)
        _mm512_store_ps(ob + d, _mm512_fmadd_ps(p, _mm512_loadu_ps(vrow[j] + d), _mm512_load_ps(ob + d)));
    }
  }
}

// s[16 rows of sub-tile i16 of the group, 64] = q kt (the rows' scores against the block's 64
// keys), the group's rows starting at row r0 of the tile.
GPT2_KERNEL_AMX inline void block_scores(const AmxTileScratch& ts, Index r0, Index i16, Index D) {
  constexpr Index kPairRowBytes = 128 * sizeof(std::uint16_t);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const Index q_bytes = D * static_cast<Index>(sizeof(std::uint16_t));
  const Index steps = D / 32;
  for (Index step = 0; step < 3 * steps; ++step) {  // q_hi k_hi, q_hi k_lo, q_lo k_hi; d in order
    const Index kk = step % steps, part = step / steps;
    _tile_loadd(4, (part == 2 ? ts.ql : ts.qb) + (r0 + 16 * i16) * D + 32 * kk, q_bytes);
    const std::uint16_t* kt = (part == 1 ? ts.kl : ts.kt) + 16 * kk * 128;
    _tile_loadd(5, kt, kPairRowBytes);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, kt + 32, kPairRowBytes);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, kt + 64, kPairRowBytes);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, kt + 96, kPairRowBytes);
    _tile_dpbf16ps(3, 4, 5);
  }
  constexpr Index kRowBytes = 64 * sizeof(float);
  float* s = ts.s + 16 * i16 * 64;
  _tile_stored(0, s, kRowBytes);
  _tile_stored(1, s + 16, kRowBytes);
  _tile_stored(2, s + 32, kRowBytes);
  _tile_stored(3, s + 48, kRowBytes);
}

// ob[16 rows of sub-tile i16, D] = pb vp.
GPT2_KERNEL_AMX inline void block_values(const AmxTileScratch& ts, Index i16, Index D) {
  const Index vp_bytes = 4 * D;  // a pair row: D pairs of two bf16
  const Index ob_bytes = D * static_cast<Index>(sizeof(float));
  constexpr Index kPRowBytes = 64 * sizeof(std::uint16_t);
  for (Index d0 = 0; d0 < D; d0 += 64) {
    const int chunks = static_cast<int>(std::min<Index>(4, (D - d0) / 16));
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (Index kk = 0; kk < 6; ++kk) {  // p_hi v_hi, p_lo v_hi, p_hi v_lo; keys 32 (kk % 2) .. + 31
      const std::uint16_t* p = kk / 2 == 1 ? ts.pl : ts.pb;
      _tile_loadd(4, p + 16 * i16 * 64 + 32 * (kk % 2), kPRowBytes);
      const std::uint16_t* v = (kk / 2 == 2 ? ts.vl : ts.vp) + 16 * (kk % 2) * 2 * D + 2 * d0;
      _tile_loadd(5, v, vp_bytes);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, v + 32, vp_bytes);
      _tile_dpbf16ps(1, 4, 6);
      if (chunks == 4) {
        _tile_loadd(7, v + 64, vp_bytes);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, v + 96, vp_bytes);
        _tile_dpbf16ps(3, 4, 5);
      }
    }
    float* ob = ts.ob + 16 * i16 * D + d0;
    _tile_stored(0, ob, ob_bytes);
    _tile_stored(1, ob + 16, ob_bytes);
    if (chunks == 4) {
      _tile_stored(2, ob + 32, ob_bytes);
      _tile_stored(3, ob + 48, ob_bytes);
    }
  }
}

// Rows i .. i + R - 1's block statistics from their scores s[i + r] (n[r] of the 64 visible, n[r]
// may be 0): mb, lb, and p split into pb (p_hi) and pl (p_lo). R rows at once (independent
// chains, interleaved); each row's arithmetic is the same whatever R.
template <int R>
GPT2_KERNEL_AMX inline void rows_block_softmax(const AmxTileScratch& ts, Index i, const Index* n) {
  __m512 x[R][4];
  __mmask16 vis[R][4];
  float m[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const float* s = ts.s + (i + r) * 64;
    bool nan = false;
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      vis[r][v] = avx512::lanes(16 * v, n[r]);
      x[r][v] = _mm512_maskz_loadu_ps(vis[r][v], s + 16 * v);
      nan |= _mm512_mask_cmp_ps_mask(vis[r][v], x[r][v], x[r][v], _CMP_UNORD_Q) != 0;
      mx = _mm512_mask_max_ps(mx, vis[r][v], mx, x[r][v]);
    }
    m[r] = nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(mx);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const float z = m[r] == -std::numeric_limits<float>::infinity() ? 0.0f : m[r];
    const __m512 zv = _mm512_set1_ps(z);
    __m512 sum = _mm512_setzero_ps();
    std::uint16_t* pb = ts.pb + (i + r) * 64;
    std::uint16_t* pl = ts.pl + (i + r) * 64;
#pragma GCC unroll 2
    for (int v = 0; v < 4; v += 2) {
      const __m512 p0 = _mm512_maskz_mov_ps(vis[r][v], avx512::kexpe(_mm512_sub_ps(x[r][v], zv)));
      const __m512 p1 = _mm512_maskz_mov_ps(vis[r][v + 1], avx512::kexpe(_mm512_sub_ps(x[r][v + 1], zv)));
      __m512i hi, lo;
      split_bf16x32(p0, p1, hi, lo);
      _mm512_store_si512(pb + 16 * v, hi);
      _mm512_store_si512(pl + 16 * v, lo);
      sum = _mm512_add_ps(sum, p0);
      sum = _mm512_add_ps(sum, p1);
    }
    ts.mb[i + r] = m[r];
    ts.lb[i + r] = _mm512_reduce_add_ps(sum);
  }
}

// Rows [0, rows) of the group at tile row g0: merge the block's (mb, lb, ob) into the running
// (m, z, l, o).
GPT2_KERNEL_AMX inline void merge_block(const AmxTileScratch& ts, Index g0, Index rows, Index D) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  float* const tm = ts.m + g0;
  float* const tz = ts.z + g0;
  float* const tl = ts.l + g0;
  for (Index r0 = 0; r0 < rows; r0 += 16) {
    const __mmask16 k = avx512::lanes(r0, rows);
    const __m512 m = _mm512_maskz_loadu_ps(k, tm + r0), mb = _mm512_maskz_loadu_ps(k, ts.mb + r0);
    const __m512 z = _mm512_maskz_loadu_ps(k, tz + r0);
    const __mmask16 nan = _mm512_cmp_ps_mask(m, mb, _CMP_UNORD_Q);
    __m512 m2 = _mm512_max_ps(m, mb);
    m2 = _mm512_mask_mov_ps(m2, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
    const __mmask16 m2_inf = _mm512_cmp_ps_mask(m2, neg_inf, _CMP_EQ_OQ);
    const __m512 z2 = _mm512_mask_mov_ps(m2, m2_inf, _mm512_setzero_ps());
    const __mmask16 m_inf = _mm512_cmp_ps_mask(m, neg_inf, _CMP_EQ_OQ);
    const __mmask16 mb_inf = _mm512_cmp_ps_mask(mb, neg_inf, _CMP_EQ_OQ);
    const __m512 zb = _mm512_mask_mov_ps(mb, mb_inf, _mm512_setzero_ps());
    const __m512 a = _mm512_mask_mov_ps(avx512::kexpe(_mm512_sub_ps(z, z2)), m_inf, _mm512_setzero_ps());
    const __m512 c = _mm512_mask_mov_ps(avx512::kexpe(_mm512_sub_ps(zb, z2)), mb_inf, _mm512_setzero_ps());
    const __m512 l = _mm512_maskz_loadu_ps(k, tl + r0), lb = _mm512_maskz_loadu_ps(k, ts.lb + r0);
    _mm512_mask_storeu_ps(tl + r0, k, _mm512_fmadd_ps(lb, c, _mm512_mul_ps(l, a)));
    _mm512_mask_storeu_ps(tm + r0, k, m2);
    _mm512_mask_storeu_ps(tz + r0, k, z2);
    _mm512_mask_storeu_ps(ts.a + r0, k, a);
    _mm512_mask_storeu_ps(ts.c + r0, k, c);
  }
  for (Index i = 0; i < rows; ++i) {
    const __m512 a = _mm512_set1_ps(ts.a[i]), c = _mm512_set1_ps(ts.c[i]);
    float* o = ts.o + (g0 + i) * D;
    const float* ob = ts.ob + i * D;
    for (Index d = 0; d < D; d += 16)
      _mm512_store_ps(o + d, _mm512_fmadd_ps(_mm512_load_ps(ob + d), c, _mm512_mul_ps(_mm512_load_ps(o + d), a)));
  }
}

// The tile (tile.rows <= kAmxTileMaxRows; tile.head_dim a multiple of 32, at most 256; scratch:
// attention_floats(head_dim) floats, 64-byte aligned). Each key block is packed once and then
// serves the tile's row groups of 64 that see it.
GPT2_KERNEL_AMX inline void attention_tile_bf16(const AttentionTile<float>& t) {
  const Index D = t.head_dim, rows = t.rows;
  const AmxTileScratch ts(t.scratch, D);
  load_tile_config();
  // qs = bf16(q * scale); running state from (-inf, 0, 0, 0)
  const __m512 scale = _mm512_set1_ps(t.scale);
  for (Index i = 0; i < rows; ++i) {
    const float* q = t.q + i * t.ldq;
    for (Index d = 0; d < D; d += 32) {
      __m512i hi, lo;
      split_bf16x32(_mm512_mul_ps(_mm512_loadu_ps(q + d), scale),
                    _mm512_mul_ps(_mm512_loadu_ps(q + d + 16), scale), hi, lo);
      _mm512_store_si512(ts.qb + i * D + d, hi);
      _mm512_store_si512(ts.ql + i * D + d, lo);
    }
    ts.m[i] = -std::numeric_limits<float>::infinity();
    ts.z[i] = 0.0f;
    ts.l[i] = 0.0f;
    for (Index d = 0; d < D; d += 16) _mm512_store_ps(ts.o + i * D + d, _mm512_setzero_ps());
  }
  const Index n_keys = t.first_pos + rows;  // keys the last row sees
  const float* krow[kKeyBlock];
  const float* vrow[kKeyBlock];
  for (Index b = 0; b * kKeyBlock < n_keys; ++b) {
    const Index j0 = b * kKeyBlock, nk = std::min(kKeyBlock, n_keys - j0);
    block_rows<float>(t, j0, nk, krow, vrow, ts.kw, ts.vw);
    pack_keys_bf16(krow, nk, D, ts.kt, ts.kl);  // once per block for every row group
    const bool values_finite = pack_values_bf16(vrow, nk, D, ts.vp, ts.vl);
    for (Index g0 = 0; g0 < rows; g0 += 64) {  // the row groups that see the block
      const Index group_rows = std::min<Index>(64, rows - g0);
      if (t.first_pos + g0 + group_rows - 1 < j0) continue;
      const Index sub_tiles = (group_rows + 15) / 16;
      for (Index i16 = 0; i16 < sub_tiles; ++i16) block_scores(ts, g0, i16, D);
      Index visible[64];
      for (Index i = 0; i < group_rows; ++i)
        visible[i] = std::max<Index>(0, std::min(kKeyBlock, t.first_pos + g0 + i + 1 - j0));
      Index i = 0;
      for (; i + 4 <= group_rows; i += 4) rows_block_softmax<4>(ts, i, visible + i);
      for (; i < group_rows; ++i) rows_block_softmax<1>(ts, i, visible + i);
      if (values_finite)
        for (Index i16 = 0; i16 < sub_tiles; ++i16) block_values(ts, i16, D);
      else
        block_values_float(ts, vrow, visible, group_rows, D);
      merge_block(ts, g0, group_rows, D);
    }
  }
  _tile_release();
  for (Index i = 0; i < rows; ++i) {
    const __m512 l = _mm512_set1_ps(ts.l[i]);
    for (Index d = 0; d < D; d += 16)
      _mm512_storeu_ps(t.out + i * t.ldo + d, _mm512_div_ps(_mm512_load_ps(ts.o + i * D + d), l));
  }
}

// The amx level's tile: the AMX core for a bf16 tile (bf16 weights) of kAmxMinRows rows or more
// whose head size it takes, avx512's float32 core for every other (decode steps among them: one
// row would pay for packing every key block into a 16-row tile).
GPT2_KERNEL_AMX inline void attention_tile(const AttentionTile<float>& t) {
  if (t.bf16 && t.rows >= kAmxMinRows && attention_fits(t.head_dim))
    attention_tile_bf16(t);
  else
    avx512::attention_tile(t);
}

// Query rows per tile: the AMX core's kAmxTileMaxRows for bf16 products without probabilities
// (each key block packed once for 4 row groups), else kTileMaxRows.
inline Index tile_rows(bool bf16_products, Index head_dim, bool probabilities) {
  return bf16_products && !probabilities && attention_fits(head_dim) ? kAmxTileMaxRows
                                                                     : kTileMaxRows;
}

}  // namespace gpt2::kernels::amx
#endif  // GPT2_KERNELS_HAVE_AMX
