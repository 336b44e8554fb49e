// The fused attention core at the avx512 level: kernels/attention_tile.hpp's arithmetic, key blocks
// of 64 (four 16-float vectors), rows in registers.
//
// Per key block: k^T of the block is packed once (16 x 16 transposes in registers) and read by
// every row of the tile; the scores of up to 6 rows (24 accumulators) are computed, masked,
// exponentiated and summed in registers, their p stored; then p v runs for up to 4 rows at a time
// (16 accumulators for head_dim 64) and is merged into the running o.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/avx512.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AVX512
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace gpt2::kernels::avx512 {

inline constexpr int kScoreRows = 6;  // rows of one score group: 24 accumulators
inline constexpr int kValueRows = 4;  // rows of one p v group: 16 accumulators (head_dim 64)

// r[0 .. 16) = the 16 x 16 transpose of r (r[i][j] -> r[j][i]).
GPT2_KERNEL_AVX512 inline void transpose16(__m512 (&r)[16]) {
  __m512 a[16], b[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // pairs of rows interleaved by 32-bit elements
    a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {  // four rows 4g .. 4g + 3: column 4L + c in 128-bit lane L of b[4g + c]
    const __m512d lo0 = _mm512_castps_pd(a[4 * g]), hi0 = _mm512_castps_pd(a[4 * g + 1]);
    const __m512d lo1 = _mm512_castps_pd(a[4 * g + 2]), hi1 = _mm512_castps_pd(a[4 * g + 3]);
    b[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
    b[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
    b[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
    b[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {  // output row 4L + c gathers lane L of b[c], b[4 + c], b[8 + c], b[12 + c]
    const __m512 u0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x44);
    const __m512 u1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xEE);
    const __m512 u2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x44);
    const __m512 u3 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xEE);
    r[c] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(u0, u2, 0xDD);
    r[8 + c] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(u1, u3, 0xDD);
  }
}

// kt[d][j] = rows[j][d] for j < n, 0 for n <= j < kKeyBlock; d < head_dim.
GPT2_KERNEL_AVX512 inline void pack_keys_t(const float* const* rows, Index n, Index head_dim,
                                           float* kt) {
  __m512 r[16];
  for (Index j0 = 0; j0 < kKeyBlock; j0 += 16) {
    for (Index d0 = 0; d0 < head_dim; d0 += 16) {
      const __mmask16 dm = lanes(d0, head_dim);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = j0 + i < n ? _mm512_maskz_loadu_ps(dm, rows[j0 + i] + d0) : _mm512_setzero_ps();
      transpose16(r);
      const Index dn = std::min<Index>(16, head_dim - d0);
      for (Index i = 0; i < dn; ++i) _mm512_store_ps(kt + (d0 + i) * kKeyBlock + j0, r[i]);
    }
  }
}

// The sum of 16 lanes by halves: s_t + s_{t+8}, then + 4, + 2, + 1.
GPT2_KERNEL_AVX512 inline float sum_by_halves(__m512 sum) {
  const __m256 u = _mm256_add_ps(_mm512_castps512_ps256(sum), _mm512_extractf32x8_ps(sum, 1));
  const __m128 v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
  const __m128 w = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

GPT2_KERNEL_AVX512 inline float kexp1(float x) {
  return _mm_cvtss_f32(_mm512_castps512_ps128(kexp(_mm512_set1_ps(x))));
}

// Row r's block statistics from its 64 scores s (n of them visible): p stored, then the merge
// factors a and c, and the running m, z, l updated (attention_tile.hpp's steps).
GPT2_KERNEL_AVX512 inline void block_softmax(const __m512 (&s)[4], Index n, Index r,
                                             TileScratch<float>& ts) {
  const float minus_inf = -__builtin_inff();
  __mmask16 live[4], nan = 0;
  __m512 mx = _mm512_set1_ps(minus_inf);
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    live[v] = lanes(16 * v, n);
    nan |= _mm512_mask_cmp_ps_mask(live[v], s[v], s[v], _CMP_UNORD_Q);
    mx = _mm512_mask_max_ps(mx, live[v], mx, s[v]);
  }
  const float mb = nan ? __builtin_nanf("") : _mm512_reduce_max_ps(mx);
  const float zb = mb == minus_inf ? 0.0f : mb;
  const __m512 z = _mm512_set1_ps(zb);
  __m512 sum = _mm512_setzero_ps();
  float* p = ts.p + r * kKeyBlock;
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    const __m512 e = _mm512_maskz_mov_ps(live[v], kexp(_mm512_sub_ps(s[v], z)));
    _mm512_store_ps(p + 16 * v, e);
    sum = _mm512_add_ps(sum, e);
  }
  const float lb = sum_by_halves(sum);
  const float m_old = ts.m[r];
  const float m_new = (m_old != m_old || mb != mb) ? __builtin_nanf("") : std::max(m_old, mb);
  const float z_new = m_new == minus_inf ? 0.0f : m_new;
  const float a = m_old == minus_inf ? 0.0f : kexp1(ts.z[r] - z_new);
  const float c = mb == minus_inf ? 0.0f : kexp1(zb - z_new);
  ts.l[r] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(lb), _mm_set_ss(c),
                                       _mm_mul_ss(_mm_set_ss(ts.l[r]), _mm_set_ss(a))));
  ts.m[r] = m_new;
  ts.z[r] = z_new;
  ts.a[r] = a;
  ts.c[r] = c;
}

// Scores of rows r .. r + R - 1 against the packed block (kt), then their block softmax.
template <int R>
GPT2_KERNEL_AVX512 inline void score_rows(Index r, Index b0, const AttentionTile<float>& t,
                                          TileScratch<float>& ts) {
  const Index hdp = padded_head_dim(t.head_dim);
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[i][v] = _mm512_setzero_ps();
  const float* q = ts.qs + r * hdp;
  for (Index d = 0; d < t.head_dim; ++d) {
    const float* kd = ts.kt + d * kKeyBlock;
    const __m512 k0 = _mm512_load_ps(kd), k1 = _mm512_load_ps(kd + 16);
    const __m512 k2 = _mm512_load_ps(kd + 32), k3 = _mm512_load_ps(kd + 48);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 qd = _mm512_set1_ps(q[i * hdp + d]);
      acc[i][0] = _mm512_fmadd_ps(qd, k0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(qd, k1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(qd, k2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(qd, k3, acc[i][3]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
    block_softmax(acc[i], visible_in_block(t.first_pos + r + i, b0), r + i, ts);
}

// o[r + i][d0 .. d0 + 16 V) = fma(o_b, c, o * a) with o_b = sum_j p_j v_j over the keys row r + i
// sees, for R rows (their key counts n[i] do not decrease with i).
template <int R, int V>
GPT2_KERNEL_AVX512 inline void value_rows(Index r, Index d0, const Index (&n)[kValueRows],
                                          const float* const* vrow, const AttentionTile<float>& t,
                                          TileScratch<float>& ts) {
  const Index hdp = padded_head_dim(t.head_dim);
  __mmask16 dm[V];
  __m512 acc[R][V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) dm[v] = lanes(d0 + 16 * v, t.head_dim);
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  const float* p = ts.p + r * kKeyBlock;
  Index j = 0;
  for (; j < n[0]; ++j) {  // keys every row of the group sees
    __m512 vv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) vv[v] = _mm512_maskz_loadu_ps(dm[v], vrow[j] + d0 + 16 * v);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const __m512 pj = _mm512_set1_ps(p[i * kKeyBlock + j]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(pj, vv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 4
  for (int i = 1; i < R; ++i) {  // the later rows' own last keys (the diagonal block)
    for (Index jj = n[0]; jj < n[i]; ++jj) {
      const __m512 pj = _mm512_set1_ps(p[i * kKeyBlock + jj]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[i][v] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(dm[v], vrow[jj] + d0 + 16 * v),
                                    acc[i][v]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    const __m512 a = _mm512_set1_ps(ts.a[r + i]), c = _mm512_set1_ps(ts.c[r + i]);
    float* o = ts.o + (r + i) * hdp + d0;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      _mm512_store_ps(o + 16 * v,
                      _mm512_fmadd_ps(acc[i][v], c, _mm512_mul_ps(_mm512_load_ps(o + 16 * v), a)));
  }
}

template <int R>
GPT2_KERNEL_AVX512 inline void value_rows_all(Index r, Index b0, const float* const* vrow,
                                              const AttentionTile<float>& t,
                                              TileScratch<float>& ts) {
  Index n[kValueRows] = {};
  for (int i = 0; i < R; ++i) n[i] = visible_in_block(t.first_pos + r + i, b0);
  Index d0 = 0;
  for (; d0 + 64 <= t.head_dim; d0 += 64) value_rows<R, 4>(r, d0, n, vrow, t, ts);
  const Index rest = t.head_dim - d0;
  if (rest > 48)
    value_rows<R, 4>(r, d0, n, vrow, t, ts);
  else if (rest > 32)
    value_rows<R, 3>(r, d0, n, vrow, t, ts);
  else if (rest > 16)
    value_rows<R, 2>(r, d0, n, vrow, t, ts);
  else if (rest > 0)
    value_rows<R, 1>(r, d0, n, vrow, t, ts);
}

// The tile (attention_tile.hpp's interface and arithmetic).
GPT2_KERNEL_AVX512 inline void attention_tile(const AttentionTile<float>& t) {
  const Index hd = t.head_dim, hdp = padded_head_dim(hd), nb = t.rows;
  TileScratch<float> ts(t.scratch, hd);
  const __m512 scale = _mm512_set1_ps(t.scale);
  for (Index r = 0; r < nb; ++r) {
    for (Index d0 = 0; d0 < hdp; d0 += 16) {
      const __mmask16 dm = lanes(d0, hd);
      // rounded on its own (an explicit-rounding intrinsic: never fused into a later operation)
      _mm512_store_ps(ts.qs + r * hdp + d0,
                      _mm512_maskz_mul_round_ps(dm, _mm512_maskz_loadu_ps(dm, t.q + r * t.ldq + d0),
                                                scale, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      _mm512_store_ps(ts.o + r * hdp + d0, _mm512_setzero_ps());
    }
    ts.m[r] = -__builtin_inff();
    ts.z[r] = 0.0f;
    ts.l[r] = 0.0f;
  }
  const Index last = t.first_pos + nb - 1;
  const float* krow[kKeyBlock];
  const float* vrow[kKeyBlock];
  for (Index b0 = 0; b0 <= last; b0 += kKeyBlock) {
    const Index n_blk = std::min(kKeyBlock, last + 1 - b0);
    page_rows_of<float>(t.key_pages, t.page_rows, t.key_stride, b0, n_blk, krow);
    page_rows_of<float>(t.value_pages, t.page_rows, t.value_stride, b0, n_blk, vrow);
    pack_keys_t(krow, n_blk, hd, ts.kt);
    const Index r_begin = std::max<Index>(0, b0 - t.first_pos);
    Index r = r_begin;
    for (; r + kScoreRows <= nb; r += kScoreRows) score_rows<kScoreRows>(r, b0, t, ts);
    switch (nb - r) {
      case 5: score_rows<5>(r, b0, t, ts); break;
      case 4: score_rows<4>(r, b0, t, ts); break;
      case 3: score_rows<3>(r, b0, t, ts); break;
      case 2: score_rows<2>(r, b0, t, ts); break;
      case 1: score_rows<1>(r, b0, t, ts); break;
      default: break;
    }
    r = r_begin;
    for (; r + kValueRows <= nb; r += kValueRows) value_rows_all<kValueRows>(r, b0, vrow, t, ts);
    switch (nb - r) {
      case 3: value_rows_all<3>(r, b0, vrow, t, ts); break;
      case 2: value_rows_all<2>(r, b0, vrow, t, ts); break;
      case 1: value_rows_all<1>(r, b0, vrow, t, ts); break;
      default: break;
    }
  }
  for (Index r = 0; r < nb; ++r) {
    const __m512 l = _mm512_set1_ps(ts.l[r]);
    for (Index d0 = 0; d0 < hd; d0 += 16)
      _mm512_mask_storeu_ps(t.out + r * t.ldo + d0, lanes(d0, hd),
                            _mm512_div_ps(_mm512_load_ps(ts.o + r * hdp + d0), l));
  }
}

}  // namespace gpt2::kernels::avx512

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
