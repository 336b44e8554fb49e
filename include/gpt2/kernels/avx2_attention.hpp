// The fused attention core at the avx2 level: kernels/attention_tile.hpp's arithmetic (the same
// bits as the avx512 level), key blocks of 64 read as eight 8-float vectors.
//
// Per key block: k^T of the block is packed once (8 x 8 transposes in registers); the scores of up
// to 3 rows are computed 32 keys at a time (12 accumulators) and stored; each row's block softmax
// then runs on its stored scores; the block's values are copied once into aligned rows; p v runs
// for up to 3 rows and 32 columns of head_dim at a time.
//
// One row (a decode step) over a KV cache's transposed key blocks (AttentionTile::keys_t), or split
// over threads, or over a bf16 cache: each block a partial (block_partial: its scores streamed from
// the transposed block, or from 8 x 8 transposes of the key rows), merged in block order; the
// same bits as the tile.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/avx2.hpp"
#include "gpt2/types.hpp"

#if GPT2_KERNELS_HAVE_AVX2
namespace gpt2::kernels::avx2 {

inline constexpr int kScoreRows = 3;  // rows of one score group (32 keys): 12 accumulators
inline constexpr int kValueRows = 3;  // rows of one p v group (32 columns): 12 accumulators

// r = the 8 x 8 transpose of r.
GPT2_KERNEL_AVX2 inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 2
  for (int g = 0; g < 2; ++g) {
    u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

// The 8 elements at p as floats, lanes past `count` (< 8) zero (m = lanes(count)): float32 as they
// are, bf16 bits widened (exact). The float core reads float32 keys and values; a bf16 KV cache's
// decode steps read bf16.
GPT2_KERNEL_AVX2 inline __m256 load8(const float* p, __m256i m, Index) {
  return _mm256_maskload_ps(p, m);
}
GPT2_KERNEL_AVX2 inline __m256 load8(const std::uint16_t* p, __m256i, Index count) {
  __m128i bits;
  if (count >= 8) {
    bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else {  // a row's tail (head_dim not a multiple of 8): no 16-bit masked load in AVX2
    alignas(16) std::uint16_t tail[8] = {};
    for (Index i = 0; i < std::max<Index>(0, count); ++i) tail[i] = p[i];
    bits = _mm_load_si128(reinterpret_cast<const __m128i*>(tail));
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// r[i] = k^T row d0 + i over keys j0 .. j0 + 7: their elements d0 .. d0 + 7 (0 past head_dim, and
// for keys from n on), loaded and transposed in registers.
template <class E>
GPT2_KERNEL_AVX2 inline void load_keys_t8(const E* const* rows, Index n, Index j0, Index d0,
                                          Index head_dim, __m256 (&r)[8]) {
  const __m256i dm = lanes(head_dim - d0);
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    r[i] = j0 + i < n ? load8(rows[j0 + i] + d0, dm, head_dim - d0) : _mm256_setzero_ps();
  transpose8(r);
}

// kt[d][j] = rows[j][d] for j < n, 0 for n <= j < kKeyBlock; d < head_dim (rows of float32 or of
// bf16 bits, E).
template <class E>
GPT2_KERNEL_AVX2 inline void pack_keys_t(const E* const* rows, Index n, Index head_dim, float* kt) {
  __m256 r[8];
  for (Index j0 = 0; j0 < kKeyBlock; j0 += 8) {
    for (Index d0 = 0; d0 < head_dim; d0 += 8) {
      load_keys_t8(rows, n, j0, d0, head_dim, r);
      const Index dn = std::min<Index>(8, head_dim - d0);
      for (Index i = 0; i < dn; ++i) _mm256_store_ps(kt + (d0 + i) * kKeyBlock + j0, r[i]);
    }
  }
}

// vb[j][0 .. hdp) = rows[j][0 .. head_dim) and zeros, j < n (the block's values, aligned and
// contiguous: read by every row group of the tile; float32 or bf16 bits, E).
template <class E>
GPT2_KERNEL_AVX2 inline void pack_values(const E* const* rows, Index n, Index head_dim, float* vb) {
  const Index hdp = padded_head_dim(head_dim);
  for (Index j = 0; j < n; ++j)
    for (Index d0 = 0; d0 < hdp; d0 += 8)
      _mm256_store_ps(vb + j * hdp + d0, load8(rows[j] + d0, lanes(head_dim - d0), head_dim - d0));
}

// kexp2 of 8 lanes (kernels/attention_tile.hpp's base-2 exponential; avx512's bits): NaN stays
// NaN, x < -126 gives 0, otherwise y * 2^n with n = nearbyint(x) (x capped at 127), f = x - n and
// y = 1 + f (c1 + f (c2 + ... + f c6)).
GPT2_KERNEL_AVX2 inline __m256 kexp2_8(__m256 x) {
  const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
  const __m256 xc = _mm256_min_ps(x, _mm256_set1_ps(127.0f));
  const __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(xc, n);
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
#pragma GCC unroll 5
  for (int k = 1; k < 6; ++k) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[k]));
  return exp_result8(x, _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f)), n, below);
}

// kexp2 of one float: lane 0 of kexp2_8 (the same bits).
GPT2_KERNEL_AVX2 inline float kexp2(float x) {
  return _mm_cvtss_f32(_mm256_castps256_ps128(kexp2_8(_mm256_set1_ps(x))));
}

// kexpe (kernels/attention_tile.hpp: e^x as 2^(x L)) of 8 lanes: x L rounded on its own, then
// kexp2_8 (a plain product, as at avx512: its one use is kexp2_8's minimum, no sum to fuse it
// into; test_attention_core checks the bits against the emulation).
GPT2_KERNEL_AVX2 inline __m256 kexpe8(__m256 x) {
  return kexp2_8(_mm256_mul_ps(x, _mm256_set1_ps(kLog2eF)));
}

// kexpe of one float: lane 0 of kexpe8 (the same bits).
GPT2_KERNEL_AVX2 inline float kexpe(float x) {
  return _mm_cvtss_f32(_mm256_castps256_ps128(kexpe8(_mm256_set1_ps(x))));
}

// Row r's block statistics from its 64 stored scores (n visible): p stored over them, then the
// merge factors and the running m, z, l (attention_tile.hpp's steps; avx512's bits).
GPT2_KERNEL_AVX2 inline void block_stats(Index n, float* p, float* stats) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  __m256 live[8], x[8];
  __m256 mx = _mm256_set1_ps(minus_inf), nan = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int v = 0; v < 8; ++v) {
    live[v] = _mm256_castsi256_ps(lanes(n - 8 * v));
    x[v] = _mm256_load_ps(p + 8 * v);
    nan = _mm256_or_ps(nan, _mm256_and_ps(_mm256_cmp_ps(x[v], x[v], _CMP_UNORD_Q), live[v]));
    mx = _mm256_blendv_ps(mx, _mm256_max_ps(mx, x[v]), live[v]);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float mb = _mm256_movemask_ps(nan) != 0 ? std::numeric_limits<float>::quiet_NaN()
                                                 : _mm_cvtss_f32(m4);
  const float zb = mb == minus_inf ? 0.0f : mb;
  const __m256 z = _mm256_set1_ps(zb);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();  // lanes 0-7 and 8-15 of 16
#pragma GCC unroll 8
  for (int v = 0; v < 8; ++v) {
    const __m256 e = _mm256_and_ps(kexpe8(_mm256_sub_ps(x[v], z)), live[v]);
    _mm256_store_ps(p + 8 * v, e);
    if (v % 2 == 0)
      s0 = _mm256_add_ps(s0, e);
    else
      s1 = _mm256_add_ps(s1, e);
  }
  const __m256 u = _mm256_add_ps(s0, s1);
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
  const __m128 w = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  stats[0] = mb;
  stats[1] = zb;
  stats[2] = _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

// Row r's running m, z, l merged with a block's statistics; the merge's a and c kept for its o.
GPT2_KERNEL_AVX2 inline void merge_stats(Index r, float mb, float zb, float lb,
                                         TileScratch<float>& ts) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const float m_old = ts.m[r];
  const float m_new = (m_old != m_old || mb != mb) ? std::numeric_limits<float>::quiet_NaN()
                                                   : std::max(m_old, mb);
  const float z_new = m_new == minus_inf ? 0.0f : m_new;
  const float a = m_old == minus_inf ? 0.0f : kexpe(ts.z[r] - z_new);
  const float c = mb == minus_inf ? 0.0f : kexpe(zb - z_new);
  ts.l[r] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(lb), _mm_set_ss(c),
                                       _mm_mul_ss(_mm_set_ss(ts.l[r]), _mm_set_ss(a))));
  ts.m[r] = m_new;
  ts.z[r] = z_new;
  ts.a[r] = a;
  ts.c[r] = c;
}

GPT2_KERNEL_AVX2 inline void block_softmax(Index n, Index r, TileScratch<float>& ts) {
  float stats[3];
  block_stats(n, ts.p + r * kKeyBlock, stats);
  merge_stats(r, stats[0], stats[1], stats[2], ts);
}

// Scores of rows r .. r + R - 1 against keys j0 .. j0 + 31 of the packed block, stored raw in p.
template <int R>
GPT2_KERNEL_AVX2 inline void score_rows(Index r, Index j0, const AttentionTile<float>& t,
                                        TileScratch<float>& ts) {
  const Index hdp = padded_head_dim(t.head_dim);
  __m256 acc[R][4];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[i][v] = _mm256_setzero_ps();
  const float* q = ts.qs + r * hdp;
  for (Index d = 0; d < t.head_dim; ++d) {
    const float* kd = ts.kt + d * kKeyBlock + j0;
    const __m256 k0 = _mm256_load_ps(kd), k1 = _mm256_load_ps(kd + 8);
    const __m256 k2 = _mm256_load_ps(kd + 16), k3 = _mm256_load_ps(kd + 24);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const __m256 qd = _mm256_broadcast_ss(q + i * hdp + d);
      acc[i][0] = _mm256_fmadd_ps(qd, k0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(qd, k1, acc[i][1]);
      acc[i][2] = _mm256_fmadd_ps(qd, k2, acc[i][2]);
      acc[i][3] = _mm256_fmadd_ps(qd, k3, acc[i][3]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v)
      _mm256_store_ps(ts.p + (r + i) * kKeyBlock + j0 + 8 * v, acc[i][v]);
}

template <int R>
GPT2_KERNEL_AVX2 inline void score_and_softmax_rows(Index r, Index b0, const AttentionTile<float>& t,
                                                    TileScratch<float>& ts) {
  score_rows<R>(r, 0, t, ts);
  score_rows<R>(r, 32, t, ts);
  for (int i = 0; i < R; ++i) block_softmax(visible_in_block(t.first_pos + r + i, b0), r + i, ts);
}

// o[r + i][d0 .. d0 + 8 V) = fma(o_b, c, o * a), o_b = sum_j p_j v_j over row r + i's keys n[i]
// (not decreasing with i).
template <int R, int V>
GPT2_KERNEL_AVX2 inline void value_rows(Index r, Index d0, const Index (&n)[kValueRows],
                                        const AttentionTile<float>& t, TileScratch<float>& ts,
                                        float* ob = nullptr) {
  const Index hdp = padded_head_dim(t.head_dim);
  const float* vb = ts.vb + d0;
  __m256 acc[R][V];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[i][v] = _mm256_setzero_ps();
  const float* p = ts.p + r * kKeyBlock;
  for (Index j = 0; j < n[0]; ++j) {
    __m256 vv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) vv[v] = _mm256_load_ps(vb + j * hdp + 8 * v);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const __m256 pj = _mm256_broadcast_ss(p + i * kKeyBlock + j);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm256_fmadd_ps(pj, vv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 4
  for (int i = 1; i < R; ++i) {
    for (Index jj = n[0]; jj < n[i]; ++jj) {
      const __m256 pj = _mm256_broadcast_ss(p + i * kKeyBlock + jj);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[i][v] = _mm256_fmadd_ps(pj, _mm256_load_ps(vb + jj * hdp + 8 * v), acc[i][v]);
    }
  }
  if (ob != nullptr) {  // a partial (R = 1): o_b itself
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm256_store_ps(ob + d0 + 8 * v, acc[0][v]);
    return;
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    const __m256 a = _mm256_set1_ps(ts.a[r + i]), c = _mm256_set1_ps(ts.c[r + i]);
    float* o = ts.o + (r + i) * hdp + d0;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      _mm256_store_ps(o + 8 * v,
                      _mm256_fmadd_ps(acc[i][v], c, _mm256_mul_ps(_mm256_load_ps(o + 8 * v), a)));
  }
}

template <int R>
GPT2_KERNEL_AVX2 inline void value_rows_all(Index r, Index b0, const AttentionTile<float>& t,
                                            TileScratch<float>& ts, float* ob = nullptr) {
  Index n[kValueRows] = {};
  for (int i = 0; i < R; ++i) n[i] = visible_in_block(t.first_pos + r + i, b0);
  Index d0 = 0;
  for (; d0 + 32 <= t.head_dim; d0 += 32) value_rows<R, 4>(r, d0, n, t, ts, ob);
  const Index rest = t.head_dim - d0;
  if (rest > 24)
    value_rows<R, 4>(r, d0, n, t, ts, ob);
  else if (rest > 16)
    value_rows<R, 3>(r, d0, n, t, ts, ob);
  else if (rest > 8)
    value_rows<R, 2>(r, d0, n, t, ts, ob);
  else if (rest > 0)
    value_rows<R, 1>(r, d0, n, t, ts, ob);
}

// The tile's q rows scaled into qs (each product stored, then read back: rounded on its own,
// never fused into a later operation), their o zeroed, their state at the start. The rows are
// fetched all at once first, then read with plain loads where all 8 lanes lie within head_dim
// (they are a tile's first reads).
GPT2_KERNEL_AVX2 inline void init_rows(const AttentionTile<float>& t, TileScratch<float>& ts) {
  const Index hd = t.head_dim, hdp = padded_head_dim(hd);
  const __m256 scale = _mm256_set1_ps(t.scale);
  for (Index r = 0; r < t.rows; ++r) prefetch_span(t.q + r * t.ldq, hd * sizeof(float));
  for (Index r = 0; r < t.rows; ++r) {
    const float* q = t.q + r * t.ldq;
    for (Index d0 = 0; d0 < hdp; d0 += 8) {
      const __m256 qd = d0 + 8 <= hd ? _mm256_loadu_ps(q + d0) : _mm256_maskload_ps(q + d0, lanes(hd - d0));
      _mm256_store_ps(ts.qs + r * hdp + d0, _mm256_mul_ps(qd, scale));
      _mm256_store_ps(ts.o + r * hdp + d0, _mm256_setzero_ps());
    }
    ts.m[r] = -std::numeric_limits<float>::infinity();
    ts.z[r] = 0.0f;
    ts.l[r] = 0.0f;
  }
}

// p[0 .. kKeyBlock) = the scores of one query row (qs, scaled) against a key block's rows (n of
// them; 0 for the others): each one fused multiply-add chain over d = 0, 1, .. from +0, as
// score_rows computes them from the block's k^T. Here each 8 x 8 transpose of the keys is consumed
// from the registers, with no k^T written (a decode step's one row would read it once).
template <class E>
GPT2_KERNEL_AVX2 inline void row_scores(const E* const* rows, Index n, Index head_dim,
                                        const float* qs, float* p) {
  __m256 r[8];
  for (Index j0 = 0; j0 < kKeyBlock; j0 += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (Index d0 = 0; d0 < head_dim; d0 += 8) {
      load_keys_t8(rows, n, j0, d0, head_dim, r);
      if (d0 + 8 <= head_dim) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) acc = _mm256_fmadd_ps(_mm256_broadcast_ss(qs + d0 + i), r[i], acc);
      } else {
        for (Index i = 0; i < head_dim - d0; ++i)
          acc = _mm256_fmadd_ps(_mm256_broadcast_ss(qs + d0 + i), r[i], acc);
      }
    }
    _mm256_store_ps(p + j0, acc);
  }
}

// row_scores' scores from the block's transposed keys (kt [head_dim][kKeyBlock]; AttentionTile::
// keys_t): the same chains (over d from +0, a lane per key), the block's 8 chains interleaved and
// its keys streamed as they lie. Lanes of keys the row does not see hold whatever the block holds
// there (block_stats masks them).
template <class E>
GPT2_KERNEL_AVX2 inline void row_scores_t(const E* kt, Index head_dim, const float* qs, float* p) {
  constexpr int G = kKeyBlock / 8;
  const __m256i all = lanes(8);
  __m256 acc[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
  for (Index d = 0; d < head_dim; ++d) {
    const __m256 qd = _mm256_broadcast_ss(qs + d);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g)
      acc[g] = _mm256_fmadd_ps(qd, load8(kt + d * kKeyBlock + 8 * g, all, 8), acc[g]);
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) _mm256_store_ps(p + 8 * g, acc[g]);
}

// The partial of the tile's one row (its qs in ts) over key block b, into part (partial_stride
// scalars): keys and values in the given pages (float32, or bf16 bits: the same arithmetic on the
// widened values), the keys from their transposed blocks when t has them. The next block's rows
// before key_end are fetched into cache meanwhile. Uses ts.qs, ts.p and ts.vb only.
template <class E>
GPT2_KERNEL_AVX2 inline void block_partial(const AttentionTile<float>& t, const E* const* key_pages,
                                           const E* const* value_pages, Index b, Index key_end,
                                           TileScratch<float>& ts, float* part) {
  const Index hd = t.head_dim;
  const E* krow[kKeyBlock];
  const E* vrow[kKeyBlock];
  const Index b0 = b * kKeyBlock, n = visible_in_block(t.first_pos, b0);
  page_rows_of<E>(value_pages, t.page_rows, t.value_stride, b0, n, vrow);
  prefetch_keys_and_values(t, key_pages, value_pages, b0 + kKeyBlock, kKeyBlock, key_end);
  if (const E* kt = transposed_keys_of<E>(t)) {
    row_scores_t(kt + b * hd * kKeyBlock, hd, ts.qs, ts.p);
  } else {
    page_rows_of<E>(key_pages, t.page_rows, t.key_stride, b0, n, krow);
    row_scores(krow, n, hd, ts.qs, ts.p);
  }
  pack_values(vrow, n, hd, ts.vb);
  block_stats(n, ts.p, part);
  value_rows_all<1>(0, b0, t, ts, part + kPartialHeader);
}

// The partials of the tile's one row (t.rows == 1) over key blocks [block_begin, block_end)
// (block_partial's, partial_stride(head_dim) apart).
template <class E>
GPT2_KERNEL_AVX2 inline void row_partials_of(const AttentionTile<float>& t,
                                             const E* const* key_pages,
                                             const E* const* value_pages, Index block_begin,
                                             Index block_end, float* parts) {
  const Index stride = partial_stride(t.head_dim);
  TileScratch<float> ts(t.scratch, t.head_dim);
  init_rows(t, ts);
  for (Index b = block_begin; b < block_end; ++b)
    block_partial(t, key_pages, value_pages, b, block_end * kKeyBlock, ts,
                  parts + (b - block_begin) * stride);
}

// The partials of the tile's one row (t.rows == 1) over key blocks [block_begin, block_end), from
// its float32 or bf16 pages (the same bits on the widened values).
GPT2_KERNEL_AVX2 inline void row_partials(const AttentionTile<float>& t, Index block_begin,
                                          Index block_end, float* parts) {
  if (t.key_pages_bf16 != nullptr)
    row_partials_of(t, t.key_pages_bf16, t.value_pages_bf16, block_begin, block_end, parts);
  else
    row_partials_of(t, t.key_pages, t.value_pages, block_begin, block_end, parts);
}

// Row 0's running state merged with a partial.
GPT2_KERNEL_AVX2 inline void fold_partial(const float* part, Index head_dim,
                                          TileScratch<float>& ts) {
  merge_stats(0, part[0], part[1], part[2], ts);
  const __m256 a = _mm256_set1_ps(ts.a[0]), c = _mm256_set1_ps(ts.c[0]);
  const float* ob = part + kPartialHeader;
  for (Index d0 = 0; d0 < head_dim; d0 += 8)
    _mm256_store_ps(ts.o + d0, _mm256_fmadd_ps(_mm256_load_ps(ob + d0), c,
                                               _mm256_mul_ps(_mm256_load_ps(ts.o + d0), a)));
}

// The tile's one row from its n_blocks partials (merged in block order): t.out.
// The tile's one row out: t.out = o / l (row 0's running state).
GPT2_KERNEL_AVX2 inline void write_row(const AttentionTile<float>& t, TileScratch<float>& ts) {
  const __m256 l = _mm256_set1_ps(ts.l[0]);
  for (Index d0 = 0; d0 < t.head_dim; d0 += 8)
    _mm256_maskstore_ps(t.out + d0, lanes(t.head_dim - d0),
                        _mm256_div_ps(_mm256_load_ps(ts.o + d0), l));
}
GPT2_KERNEL_AVX2 inline void merge_row_partials(const AttentionTile<float>& t, Index n_blocks,
                                                const float* parts) {
  TileScratch<float> ts(t.scratch, t.head_dim);
  for (Index d0 = 0; d0 < padded_head_dim(t.head_dim); d0 += 8) _mm256_store_ps(ts.o + d0, _mm256_setzero_ps());
  ts.m[0] = -std::numeric_limits<float>::infinity();
  ts.z[0] = 0.0f;
  ts.l[0] = 0.0f;
  for (Index b = 0; b < n_blocks; ++b) fold_partial(parts + b * partial_stride(t.head_dim), t.head_dim, ts);
  write_row(t, ts);
}

// The tile (attention_tile.hpp's interface and arithmetic).
GPT2_KERNEL_AVX2 inline void attention_tile(const AttentionTile<float>& t) {
  const Index hd = t.head_dim, hdp = padded_head_dim(hd), nb = t.rows;
  TileScratch<float> ts(t.scratch, hd);
  init_rows(t, ts);
  if (nb == 1 && (t.keys_t != nullptr || t.key_pages_bf16 != nullptr)) {
    // a decode step over a cache's transposed key blocks or bf16 pages: each block a partial
    // (row_partials'), merged in order: the tile's bits
    float* part = ts.kt;  // (the one-row path packs no k^T)
    for (Index b = 0; b <= t.first_pos / kKeyBlock; ++b) {
      if (t.key_pages_bf16 != nullptr)
        block_partial(t, t.key_pages_bf16, t.value_pages_bf16, b, t.first_pos + 1, ts, part);
      else
        block_partial(t, t.key_pages, t.value_pages, b, t.first_pos + 1, ts, part);
      fold_partial(part, hd, ts);
    }
    write_row(t, ts);
    return;
  }
  const Index last = t.first_pos + nb - 1;
  const float* krow[kKeyBlock];
  const float* vrow[kKeyBlock];
  const Index n_blocks = last / kKeyBlock + 1;
  for (Index b0 = 0; b0 <= last; b0 += kKeyBlock) {
    const Index n_blk = std::min(kKeyBlock, last + 1 - b0);
    prefetch_next_queries(t, b0 / kKeyBlock, n_blocks);
    block_rows<float>(t, b0, n_blk, krow, vrow, ts.kw, ts.vw);
    pack_keys_t(krow, n_blk, hd, ts.kt);
    pack_values(vrow, n_blk, hd, ts.vb);
    const Index r_begin = std::max<Index>(0, b0 - t.first_pos);
    Index r = r_begin;
    for (; r + kScoreRows <= nb; r += kScoreRows) score_and_softmax_rows<kScoreRows>(r, b0, t, ts);
    if (nb - r == 2) score_and_softmax_rows<2>(r, b0, t, ts);
    if (nb - r == 1) score_and_softmax_rows<1>(r, b0, t, ts);
    r = r_begin;
    for (; r + kValueRows <= nb; r += kValueRows) value_rows_all<kValueRows>(r, b0, t, ts);
    if (nb - r == 2) value_rows_all<2>(r, b0, t, ts);
    if (nb - r == 1) value_rows_all<1>(r, b0, t, ts);
  }
  for (Index r = 0; r < nb; ++r) {
    const __m256 l = _mm256_set1_ps(ts.l[r]);
    for (Index d0 = 0; d0 < hd; d0 += 8) {
      const __m256 y = _mm256_div_ps(_mm256_load_ps(ts.o + r * hdp + d0), l);
      if (d0 + 8 <= hd)
        _mm256_storeu_ps(t.out + r * t.ldo + d0, y);
      else
        _mm256_maskstore_ps(t.out + r * t.ldo + d0, lanes(hd - d0), y);
    }
  }
}

}  // namespace gpt2::kernels::avx2
#endif
