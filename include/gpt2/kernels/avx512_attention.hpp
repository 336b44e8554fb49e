// The fused attention core at the avx512 level: kernels/attention_tile.hpp's arithmetic, key blocks
// of 64 (four 16-float vectors), rows in registers.
//
// Per key block: k^T of the block is packed once (16 x 16 transposes in registers) and read by
// every row of the tile; the scores of up to 6 rows (24 accumulators) are computed and stored, and
// each row's block softmax runs on them; the block's values are copied once into
// aligned rows; then p v runs for up to 6 rows at a time (24 accumulators for head_dim 64) and is
// merged into the running o.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

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
inline constexpr int kValueRows = 6;  // rows of one p v group: 24 accumulators (head_dim 64)

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

// The 16 elements at p (lanes in m; the others 0) as floats: float32 as they are, bf16 bits widened
// (exact). The float core reads float32 keys and values; a bf16 KV cache's decode steps read bf16.
GPT2_KERNEL_AVX512 inline __m512 load16(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
GPT2_KERNEL_AVX512 inline __m512 load16(const std::uint16_t* p, __mmask16 m) {
  const __m256i bits = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
// The same for all 16 lanes, with a plain load: where a stream is read from memory, masked loads
// slow it down (bench/results/history-speed.md).
GPT2_KERNEL_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
GPT2_KERNEL_AVX512 inline __m512 load16(const std::uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
// load16(p, m), or load16(p) when Full (m is all lanes).
template <bool Full, class E>
GPT2_KERNEL_AVX512 inline __m512 load16(const E* p, __mmask16 m) {
  if constexpr (Full)
    return load16(p);
  else
    return load16(p, m);
}

// r[i] = k^T row d0 + i over keys j0 .. j0 + 15: their elements d0 .. d0 + 15 (0 past head_dim,
// and for keys from n on), loaded and transposed in registers.
template <class E>
GPT2_KERNEL_AVX512 inline void load_keys_t16(const E* const* rows, Index n, Index j0, Index d0,
                                             Index head_dim, __m512 (&r)[16]) {
  const __mmask16 dm = lanes(d0, head_dim);
  if (d0 + 16 <= head_dim) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      r[i] = j0 + i < n ? load16(rows[j0 + i] + d0) : _mm512_setzero_ps();
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      r[i] = j0 + i < n ? load16(rows[j0 + i] + d0, dm) : _mm512_setzero_ps();
  }
  transpose16(r);
}

// kt[d][j] = rows[j][d] for j < n, 0 for n <= j < kKeyBlock; d < head_dim (rows of float32 or of
// bf16 bits, E).
template <class E>
GPT2_KERNEL_AVX512 inline void pack_keys_t(const E* const* rows, Index n, Index head_dim,
                                           float* kt) {
  __m512 r[16];
  for (Index j0 = 0; j0 < kKeyBlock; j0 += 16) {
    for (Index d0 = 0; d0 < head_dim; d0 += 16) {
      load_keys_t16(rows, n, j0, d0, head_dim, r);
      const Index dn = std::min<Index>(16, head_dim - d0);
      for (Index i = 0; i < dn; ++i) _mm512_store_ps(kt + (d0 + i) * kKeyBlock + j0, r[i]);
    }
  }
}

// vb[j][0 .. hdp) = rows[j][0 .. head_dim) and zeros, j < n (the block's values, aligned and
// contiguous: read by every row group of the tile).
GPT2_KERNEL_AVX512 inline void pack_values(const float* const* rows, Index n, Index head_dim,
                                           float* vb) {
  const Index hdp = padded_head_dim(head_dim);
  const Index full = head_dim / 16 * 16;  // lanes [0, full) read with plain loads
  for (Index j = 0; j < n; ++j) {
    for (Index d0 = 0; d0 < full; d0 += 16) _mm512_store_ps(vb + j * hdp + d0, load16(rows[j] + d0));
    if (full < hdp)
      _mm512_store_ps(vb + j * hdp + full, load16(rows[j] + full, lanes(full, head_dim)));
  }
}

// The sum of 16 lanes by halves: s_t + s_{t+8}, then + 4, + 2, + 1.
GPT2_KERNEL_AVX512 inline float sum_by_halves(__m512 sum) {
  const __m256 u = _mm256_add_ps(_mm512_castps512_ps256(sum), _mm512_extractf32x8_ps(sum, 1));
  const __m128 v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
  const __m128 w = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

// 2^x = y * 2^n before the scaling (kexp2 of kernels/attention_tile.hpp, the second step of the
// fused core's kexpe): n = nearbyint(x), f = x - n (exact), y = 1 + f (c1 + f (c2 + ... + f c6)).
GPT2_KERNEL_AVX512 inline ExpParts kexp2_parts(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
#pragma GCC unroll 5
  for (int k = 1; k < 6; ++k) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[k]));
  return {_mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f)), n};
}

// kexp2 of 16 floats: 2^x within 1 ulp on [-126, 127]; 0 below -126; x capped at 127; NaN stays
// NaN.
GPT2_KERNEL_AVX512 inline __m512 kexp2(__m512 x) {
  const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
  return exp_result(x, kexp2_parts(_mm512_min_ps(x, _mm512_set1_ps(127.0f))), under);
}

// kexp2(x) for x in [-inf, 0] (never NaN): the same bits without the steps that only values
// outside that range need (the cap at 127, NaN passed through).
GPT2_KERNEL_AVX512 inline __m512 kexp2_nonpositive(__m512 x) {
  const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
  const ExpParts e = kexp2_parts(x);
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~under), e.y, e.n);
}

// x L rounded on its own (L = log2 e as a float: kexpe's first step). A plain product: its uses
// (a minimum, or a rounding and a subtraction) leave no sum for a compiler to fuse it into alone;
// test_attention_core checks the bits against the emulation.
GPT2_KERNEL_AVX512 inline __m512 times_log2e(__m512 x) {
  return _mm512_mul_ps(x, _mm512_set1_ps(kLog2eF));
}

// kexpe (kernels/attention_tile.hpp: e^x as 2^(x L)) of 16 floats: the core's exponential.
GPT2_KERNEL_AVX512 inline __m512 kexpe(__m512 x) { return kexp2(times_log2e(x)); }

// kexpe(x) for x in [-inf, 0] (never NaN): the same bits (x L lies in [-inf, 0] too).
GPT2_KERNEL_AVX512 inline __m512 kexpe_nonpositive(__m512 x) {
  return kexp2_nonpositive(times_log2e(x));
}

// kexpe of one float: lane 0 of kexpe (the same bits).
GPT2_KERNEL_AVX512 inline float kexpe1(float x) {
  return _mm_cvtss_f32(_mm512_castps512_ps128(kexpe(_mm512_set1_ps(x))));
}

// Row r's block statistics from its 64 scores stored in p (n of them visible): p replaced by the
// probabilities, then the merge factors a and c, and the running m, z, l updated
// (attention_tile.hpp's steps). Not inlined: its constants would take registers from the score
// loop (an accumulator spilled there).
GPT2_KERNEL_AVX512 __attribute__((noinline)) inline void block_stats(Index n, float* p,
                                                                     float* stats) {
  const float minus_inf = -__builtin_inff();
  __mmask16 live[4], nan = 0;
  __m512 s[4];
  __m512 mx = _mm512_set1_ps(minus_inf);
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    live[v] = lanes(16 * v, n);
    s[v] = _mm512_load_ps(p + 16 * v);
    nan |= _mm512_mask_cmp_ps_mask(live[v], s[v], s[v], _CMP_UNORD_Q);
    mx = _mm512_mask_max_ps(mx, live[v], mx, s[v]);
  }
  const float mb = nan ? __builtin_nanf("") : _mm512_reduce_max_ps(mx);
  const float zb = mb == minus_inf ? 0.0f : mb;
  const __m512 z = _mm512_set1_ps(zb);
  __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    const __m512 e = _mm512_maskz_mov_ps(live[v], kexpe(_mm512_sub_ps(s[v], z)));
    _mm512_store_ps(p + 16 * v, e);
    sum = _mm512_add_ps(sum, e);
  }
  stats[0] = mb;
  stats[1] = zb;
  stats[2] = sum_by_halves(sum);
}

// Row r's running m, z, l merged with a block's statistics (m_b, z_b, l_b); the factors a and c of
// the merge kept in ts.a[r], ts.c[r] for its o.
GPT2_KERNEL_AVX512 inline void merge_stats(Index r, float mb, float zb, float lb,
                                           TileScratch<float>& ts) {
  const float minus_inf = -__builtin_inff();
  const float m_old = ts.m[r];
  const float m_new = (m_old != m_old || mb != mb) ? __builtin_nanf("") : std::max(m_old, mb);
  const float z_new = m_new == minus_inf ? 0.0f : m_new;
  const float a = m_old == minus_inf ? 0.0f : kexpe1(ts.z[r] - z_new);
  const float c = mb == minus_inf ? 0.0f : kexpe1(zb - z_new);
  ts.l[r] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(lb), _mm_set_ss(c),
                                       _mm_mul_ss(_mm_set_ss(ts.l[r]), _mm_set_ss(a))));
  ts.m[r] = m_new;
  ts.z[r] = z_new;
  ts.a[r] = a;
  ts.c[r] = c;
}

GPT2_KERNEL_AVX512 inline void block_softmax(Index n, Index r, TileScratch<float>& ts) {
  float stats[3];
  block_stats(n, ts.p + r * kKeyBlock, stats);
  merge_stats(r, stats[0], stats[1], stats[2], ts);
}

// Row 0's running state merged with a partial (attention_tile.hpp's layout).
GPT2_KERNEL_AVX512 inline void fold_partial(const float* part, Index head_dim,
                                            TileScratch<float>& ts) {
  merge_stats(0, part[0], part[1], part[2], ts);
  const __m512 a = _mm512_set1_ps(ts.a[0]), c = _mm512_set1_ps(ts.c[0]);
  const float* ob = part + kPartialHeader;
  for (Index d0 = 0; d0 < head_dim; d0 += 16)
    _mm512_store_ps(ts.o + d0, _mm512_fmadd_ps(_mm512_load_ps(ob + d0), c,
                                               _mm512_mul_ps(_mm512_load_ps(ts.o + d0), a)));
}

// Scores of rows r .. r + R - 1 against the packed block (kt), stored raw in p, then each row's
// block softmax.
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
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) _mm512_store_ps(ts.p + (r + i) * kKeyBlock + 16 * v, acc[i][v]);
  for (int i = 0; i < R; ++i) block_softmax(visible_in_block(t.first_pos + r + i, b0), r + i, ts);
}

// o[r + i][d0 .. d0 + 16 V) = fma(acc[i], c, o * a) for R rows: a block's o_b merged into their
// running o with the factors of merge_stats.
template <int R, int V>
GPT2_KERNEL_AVX512 __attribute__((always_inline)) inline void merge_values(
    Index r, Index d0, Index hdp, const __m512 (&acc)[R][V], TileScratch<float>& ts) {
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    const __m512 a = _mm512_set1_ps(ts.a[r + i]), c = _mm512_set1_ps(ts.c[r + i]);
    float* o = ts.o + (r + i) * hdp + d0;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      _mm512_store_ps(o + 16 * v,
                      _mm512_fmadd_ps(acc[i][v], c, _mm512_mul_ps(_mm512_load_ps(o + 16 * v), a)));
  }
}

// o[r + i][d0 .. d0 + 16 V) = fma(o_b, c, o * a) with o_b = sum_j p_j v_j over the keys row r + i
// sees, for R rows (their key counts n[i] do not decrease with i).
template <int R, int V, bool Full>
GPT2_KERNEL_AVX512 inline void value_rows(Index r, Index d0, const Index (&n)[kValueRows],
                                          const float* const* vrow, const AttentionTile<float>& t,
                                          TileScratch<float>& ts, Index prs, Index pks) {
  const Index hdp = padded_head_dim(t.head_dim);
  __mmask16 dm[V];
  __m512 acc[R][V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) dm[v] = lanes(d0 + 16 * v, t.head_dim);
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  const float* p = ts.p + r * prs;
  Index j = 0;
  for (; j < n[0]; ++j) {  // keys every row of the group sees
    __m512 vv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) vv[v] = load16<Full>(vrow[j] + d0 + 16 * v, dm[v]);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 pj = _mm512_set1_ps(p[i * prs + j * pks]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(pj, vv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 1; i < R; ++i) {  // the later rows' own last keys (the diagonal block)
    for (Index jj = n[0]; jj < n[i]; ++jj) {
      const __m512 pj = _mm512_set1_ps(p[i * prs + jj * pks]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[i][v] = _mm512_fmadd_ps(pj, load16<Full>(vrow[jj] + d0 + 16 * v, dm[v]),
                                    acc[i][v]);
    }
  }
  merge_values<R, V>(r, d0, hdp, acc, ts);
}

// p of row i, key j at ts.p[i * prs + j * pks] (the per-row layout: prs = kKeyBlock, pks = 1;
// the row-vector one: prs = 1, pks = kTileMaxRows).
template <int R>
GPT2_KERNEL_AVX512 inline void value_rows_all(Index r, Index b0, const float* const* vrow,
                                              const AttentionTile<float>& t,
                                              TileScratch<float>& ts, Index prs, Index pks) {
  Index n[kValueRows] = {};
  for (int i = 0; i < R; ++i) n[i] = visible_in_block(t.first_pos + r + i, b0);
  Index d0 = 0;
  for (; d0 + 64 <= t.head_dim; d0 += 64) value_rows<R, 4, true>(r, d0, n, vrow, t, ts, prs, pks);
  const Index rest = t.head_dim - d0;
  if (rest > 48)
    value_rows<R, 4, false>(r, d0, n, vrow, t, ts, prs, pks);
  else if (rest > 32)
    value_rows<R, 3, false>(r, d0, n, vrow, t, ts, prs, pks);
  else if (rest > 16)
    value_rows<R, 2, false>(r, d0, n, vrow, t, ts, prs, pks);
  else if (rest > 0)
    value_rows<R, 1, false>(r, d0, n, vrow, t, ts, prs, pks);
}

// ---- one query row (a decode step): one key block at a time -------------------------------
// A decode step reads every cached key and value once, at the rate memory delivers them. With the
// keys in transposed blocks (a KV cache's) a head is two plain streams, each block's k^T rows and
// then its value rows, read with unmasked loads and each fetched kStreamAhead bytes ahead of the
// read: the hardware's prefetchers stop at 4 KB pages and, on some CPUs, do not follow masked
// loads (bench/results/history-speed.md measures both). Keys read from rows (the paged pool) are fetched a block
// ahead instead, in one burst (prefetch_keys_and_values). One block's chains are 64 fused
// multiply-adds deep, four of them at a time: short beside the block's 32 KB from memory.

// Bytes ahead of its read position that a decode step prefetches each stream.
inline constexpr std::uintptr_t kStreamAhead = 4096;

// The `bytes` at p + kStreamAhead fetched into cache (past the end of a head's stream: the next
// head's, or bytes no one reads; a prefetch never faults).
template <class E>
inline void prefetch_stream(const E* p, std::uintptr_t bytes) {
  prefetch_span(reinterpret_cast<const char*>(p) + kStreamAhead, bytes);
}

// o_b[d0 .. d0 + 16 V) of one block's partial = sum_j p_j v_j over its n keys (values vrow[j],
// float32 or bf16 bits, E), into part; each value row fetched kStreamAhead bytes ahead when
// `ahead`. Full: all 16 V lanes are within head_dim (plain loads).
template <int V, bool Full, class E>
GPT2_KERNEL_AVX512 inline void decode_values(Index d0, Index n, const E* const* vrow, bool ahead,
                                             const AttentionTile<float>& t,
                                             const TileScratch<float>& ts, float* part) {
  __mmask16 dm[V];
  __m512 acc[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) {
    dm[v] = lanes(d0 + 16 * v, t.head_dim);
    acc[v] = _mm512_setzero_ps();
  }
  const std::uintptr_t row_bytes = static_cast<std::uintptr_t>(t.head_dim) * sizeof(E);
  for (Index j = 0; j < n; ++j) {
    if (ahead) prefetch_stream(vrow[j], row_bytes);
    const __m512 pj = _mm512_set1_ps(ts.p[j]);
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      acc[v] = _mm512_fmadd_ps(pj, load16<Full>(vrow[j] + d0 + 16 * v, dm[v]), acc[v]);
  }
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) _mm512_store_ps(part + kPartialHeader + d0 + 16 * v, acc[v]);
}

// p[0 .. kKeyBlock) = the scores of one query row (qs, scaled) against a key block's rows (n of
// them; 0 for the others): each one fused multiply-add chain over d = 0, 1, .. from +0, as the
// tiles compute them from the block's k^T. Here each 16 x 16 transpose of the keys is consumed
// from the registers, with no k^T written (a decode step's one row would read it once).
template <class E>
GPT2_KERNEL_AVX512 inline void row_scores(const E* const* rows, Index n, Index head_dim,
                                          const float* qs, float* p) {
  // d0 outer: the four key groups' chains are independent and interleave (one chain alone would
  // be bound by its FMA latency).
  constexpr int G = kKeyBlock / 16;
  __m512 acc[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  for (Index d0 = 0; d0 < head_dim; d0 += 16) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      __m512 r[16];
      load_keys_t16(rows, n, 16 * g, d0, head_dim, r);
      if (d0 + 16 <= head_dim) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i)
          acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(qs[d0 + i]), r[i], acc[g]);
      } else {
        for (Index i = 0; i < head_dim - d0; ++i)
          acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(qs[d0 + i]), r[i], acc[g]);
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) _mm512_store_ps(p + 16 * g, acc[g]);
}

// p[0 .. kKeyBlock) = row_scores' scores against one key block read from its transposed block
// (kt: [head_dim][kKeyBlock], AttentionTile::keys_t): the same chains (over d = 0, 1, .. from +0,
// a lane per key) with the keys streamed as they lie, kStreamAhead bytes ahead. Lanes of keys the
// row does not see hold whatever the block holds there (block_stats masks them).
template <class E>
GPT2_KERNEL_AVX512 inline void row_scores_t(const E* kt, Index head_dim, const float* qs,
                                            float* p) {
  constexpr int G = kKeyBlock / 16;
  __m512 acc[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  for (Index d = 0; d < head_dim; ++d) {
    const E* row = kt + d * kKeyBlock;
    prefetch_stream(row, kKeyBlock * sizeof(E));
    const __m512 qd = _mm512_set1_ps(qs[d]);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(qd, load16(row + 16 * g), acc[g]);
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) _mm512_store_ps(p + 16 * g, acc[g]);
}

// The partial of the tile's one row (position t.first_pos) over the key block from b0, into part.
// Keys and values from key_pages, value_pages (t's page_rows and strides): float32, or bf16 bits
// (E = std::uint16_t: the same arithmetic on the widened values). Keys from rows: the next
// block's rows before key_end are fetched into cache meanwhile.
template <class E>
GPT2_KERNEL_AVX512 inline void decode_block(Index b0, Index key_end, const AttentionTile<float>& t,
                                            const E* const* key_pages,
                                            const E* const* value_pages, TileScratch<float>& ts,
                                            float* part) {
  const Index hd = t.head_dim, n = visible_in_block(t.first_pos, b0);
  const E* row[kKeyBlock];
  const E* kt = transposed_keys_of<E>(t);
  if (kt != nullptr) {
    row_scores_t(kt + (b0 / kKeyBlock) * hd * kKeyBlock, hd, ts.qs, ts.p);
  } else {
    prefetch_keys_and_values(t, key_pages, value_pages, b0 + kKeyBlock, kKeyBlock, key_end);
    page_rows_of<E>(key_pages, t.page_rows, t.key_stride, b0, n, row);
    row_scores(row, n, hd, ts.qs, ts.p);
  }
  page_rows_of<E>(value_pages, t.page_rows, t.value_stride, b0, n, row);
  block_stats(n, ts.p, part);
  // the value rows are prefetched (whole) by the first chunk only
  const bool streams = kt != nullptr;
  Index d0 = 0;
  for (; d0 + 64 <= hd; d0 += 64) decode_values<4, true>(d0, n, row, streams && d0 == 0, t, ts, part);
  const Index rest = hd - d0;
  const bool ahead = streams && d0 == 0;
  if (rest > 48)
    decode_values<4, false>(d0, n, row, ahead, t, ts, part);
  else if (rest > 32)
    decode_values<3, false>(d0, n, row, ahead, t, ts, part);
  else if (rest > 16)
    decode_values<2, false>(d0, n, row, ahead, t, ts, part);
  else if (rest > 0)
    decode_values<1, false>(d0, n, row, ahead, t, ts, part);
  // (the stores cover o_b's padded width: its lanes past head_dim hold zeros, the values' masked
  // lanes)
}

// The start of a decode step's reads from key block `block` on fetched into cache: keys from rows
// the whole block (prefetch_keys_and_values), streams their first kStreamAhead bytes (decode_block
// fetches the rest as it goes).
template <class E>
GPT2_KERNEL_AVX512 inline void prefetch_decode_start(const AttentionTile<float>& t,
                                                     const E* const* key_pages,
                                                     const E* const* value_pages, Index block,
                                                     Index key_end) {
  const Index hd = t.head_dim, j0 = block * kKeyBlock;
  if (const E* kt = transposed_keys_of<E>(t)) {
    if (j0 >= key_end || j0 > t.first_pos) return;
    prefetch_span(kt + block * hd * kKeyBlock, kStreamAhead);
    const E* first_value;
    page_rows_of<E>(value_pages, t.page_rows, t.value_stride, j0, 1, &first_value);
    prefetch_span(first_value, kStreamAhead);
  } else {
    prefetch_keys_and_values(t, key_pages, value_pages, j0, kKeyBlock, key_end);
  }
}

// The tile's q rows scaled into qs (each product rounded on its own), their o zeroed, their state
// at the start. The rows are fetched all at once first, then read with plain loads where all 16
// lanes lie within head_dim: they are a tile's first reads, which masked loads slow down from
// memory (bench/results/history-speed.md).
GPT2_KERNEL_AVX512 inline void init_rows(const AttentionTile<float>& t, TileScratch<float>& ts) {
  const Index hd = t.head_dim, hdp = padded_head_dim(hd);
  const __m512 scale = _mm512_set1_ps(t.scale);
  for (Index r = 0; r < t.rows; ++r) prefetch_span(t.q + r * t.ldq, hd * sizeof(float));
  for (Index r = 0; r < t.rows; ++r) {
    const float* q = t.q + r * t.ldq;
    for (Index d0 = 0; d0 < hdp; d0 += 16) {
      const __mmask16 dm = lanes(d0, hd);
      const __m512 qd = d0 + 16 <= hd ? load16(q + d0) : load16(q + d0, dm);
      // an explicit-rounding intrinsic: never fused into a later operation
      _mm512_store_ps(ts.qs + r * hdp + d0,
                      _mm512_maskz_mul_round_ps(dm, qd, scale,
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      _mm512_store_ps(ts.o + r * hdp + d0, _mm512_setzero_ps());
    }
    ts.m[r] = -__builtin_inff();
    ts.z[r] = 0.0f;
    ts.l[r] = 0.0f;
  }
}

// The partials of the tile's one row (t.rows == 1) over key blocks [block_begin, block_end), keys
// and values in the given pages (float32 or bf16 bits).
template <class E>
GPT2_KERNEL_AVX512 inline void row_partials_of(const AttentionTile<float>& t,
                                               const E* const* key_pages,
                                               const E* const* value_pages, Index block_begin,
                                               Index block_end, float* parts) {
  TileScratch<float> ts(t.scratch, t.head_dim);
  const Index key_end = block_end * kKeyBlock, stride = partial_stride(t.head_dim);
  prefetch_decode_start(t, key_pages, value_pages, block_begin, key_end);
  init_rows(t, ts);
  for (Index b = block_begin; b < block_end; ++b)
    decode_block(b * kKeyBlock, key_end, t, key_pages, value_pages, ts,
                 parts + (b - block_begin) * stride);
}

// The partials of the tile's one row (t.rows == 1) over key blocks [block_begin, block_end), from
// its float32 or bf16 pages (the same bits on the widened values).
GPT2_KERNEL_AVX512 inline void row_partials(const AttentionTile<float>& t, Index block_begin,
                                            Index block_end, float* parts) {
  if (t.key_pages_bf16 != nullptr)
    row_partials_of(t, t.key_pages_bf16, t.value_pages_bf16, block_begin, block_end, parts);
  else
    row_partials_of(t, t.key_pages, t.value_pages, block_begin, block_end, parts);
}

// out[0 .. head_dim) = o / l (plain stores where all 16 lanes lie within head_dim).
GPT2_KERNEL_AVX512 inline void store_row(const float* o, float l, Index head_dim, float* out) {
  const __m512 lv = _mm512_set1_ps(l);
  Index d0 = 0;
  for (; d0 + 16 <= head_dim; d0 += 16)
    _mm512_storeu_ps(out + d0, _mm512_div_ps(_mm512_load_ps(o + d0), lv));
  if (d0 < head_dim)
    _mm512_mask_storeu_ps(out + d0, lanes(d0, head_dim), _mm512_div_ps(_mm512_load_ps(o + d0), lv));
}

// The tile's one row out: t.out = o / l (row 0's running state).
GPT2_KERNEL_AVX512 inline void write_row(const AttentionTile<float>& t, TileScratch<float>& ts) {
  store_row(ts.o, ts.l[0], t.head_dim, t.out);
}

// The tile's one row from its n_blocks partials (blocks 0 .., merged in order): t.out.
GPT2_KERNEL_AVX512 inline void merge_row_partials(const AttentionTile<float>& t, Index n_blocks,
                                                  const float* parts) {
  TileScratch<float> ts(t.scratch, t.head_dim);
  for (Index d0 = 0; d0 < padded_head_dim(t.head_dim); d0 += 16) _mm512_store_ps(ts.o + d0, _mm512_setzero_ps());
  ts.m[0] = -std::numeric_limits<float>::infinity();
  ts.z[0] = 0.0f;
  ts.l[0] = 0.0f;
  for (Index b = 0; b < n_blocks; ++b) fold_partial(parts + b * partial_stride(t.head_dim), t.head_dim, ts);
  write_row(t, ts);
}

// ---- the row-vector path: 16 rows in the lanes ----------------------------------------------
// For a block that at least 16 rows of the tile see: the scores come out transposed (st[j][row],
// from qs^T and broadcast keys), and each block softmax runs on 16 rows at once. Every row's
// arithmetic is the per-row path's (the same chains, maxima, exps, sums and merges, lane by lane),
// so both give the same bits; only the work is laid out differently.

// The block's running maxima of its visible scores, per row vector (16 rows), and whether one of
// them is NaN: gathered while the scores come out of the registers.
struct BlockMax {
  __m512 mx[kTileMaxRows / 16];
  __mmask16 nan[kTileMaxRows / 16];
};

// Rows [ra, nb) of row vector g (rows 16 g ..) as a lane mask.
GPT2_KERNEL_AVX512 inline __mmask16 active_rows(Index g, Index ra, Index nb) {
  return static_cast<__mmask16>(lanes(16 * g, nb) & ~lanes(16 * g, ra));
}

// Row r - 16 g minus b0 plus the position of row 16 g, lane by lane: lane r sees key b0 + j iff
// its value is >= j.
GPT2_KERNEL_AVX512 inline __m512i relative_positions(Index g, Index b0,
                                                      const AttentionTile<float>& t) {
  return _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(t.first_pos + 16 * g - b0)),
                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// Whether every lane of row vector g takes part (active: rows [ra, nb)) and sees keys b0 ..
// b0 + j: its first row, whose relative position is the least, sees b0 + j.
GPT2_KERNEL_AVX512 inline bool all_lanes_see(__mmask16 active, Index g, Index b0, Index j,
                                             const AttentionTile<float>& t) {
  return active == 0xFFFF && t.first_pos + 16 * g - b0 >= j;
}

// st[j0 + jj][row0 .. row0 + 16 G) = acc[jj] (jj < J): a key group's transposed scores stored.
template <int J, int G>
GPT2_KERNEL_AVX512 __attribute__((always_inline)) inline void store_scores_t(
    const __m512 (&acc)[J][G], Index row0, Index j0, const TileScratch<float>& ts) {
#pragma GCC unroll 8
  for (int jj = 0; jj < J; ++jj)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
      _mm512_store_ps(ts.p + (j0 + jj) * kTileMaxRows + row0 + 16 * g, acc[jj][g]);
}

// Row vector gg's block maximum and NaN flag updated with the scores acc[jj][g], jj < J, of the
// lanes in `seen` (rows that see all J keys).
template <int J, int G>
GPT2_KERNEL_AVX512 __attribute__((always_inline)) inline void gather_max(
    const __m512 (&acc)[J][G], int g, Index gg, __mmask16 seen, BlockMax& bm) {
  __m512 mx = bm.mx[gg];
  __mmask16 nan = bm.nan[gg];
#pragma GCC unroll 8
  for (int jj = 0; jj < J; ++jj) {
    nan |= _mm512_mask_cmp_ps_mask(seen, acc[jj][g], acc[jj][g], _CMP_UNORD_Q);
    mx = _mm512_mask_max_ps(mx, seen, mx, acc[jj][g]);
  }
  bm.mx[gg] = mx;
  bm.nan[gg] = nan;
}

// st[j][row0 .. row0 + 16 G) = the scores of key j0 + jj (jj < J) against rows row0 .. row0 +
// 16 G - 1 (qs^T in qt), and their visible ones (rows in [ra, nb)) into bm.
template <int J, int G>
GPT2_KERNEL_AVX512 inline void scores_t(Index row0, Index j0, Index b0, Index ra, Index nb,
                                        const float* const* krow, const AttentionTile<float>& t,
                                        TileScratch<float>& ts, BlockMax& bm) {
  __m512 acc[J][G];
#pragma GCC unroll 8
  for (int jj = 0; jj < J; ++jj)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[jj][g] = _mm512_setzero_ps();
  const float* k[J];
#pragma GCC unroll 8
  for (int jj = 0; jj < J; ++jj) k[jj] = krow[j0 + jj];
  for (Index d = 0; d < t.head_dim; ++d) {
    __m512 qv[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) qv[g] = _mm512_load_ps(ts.qt + d * kTileMaxRows + row0 + 16 * g);
#pragma GCC unroll 8
    for (int jj = 0; jj < J; ++jj) {
      const __m512 kd = _mm512_set1_ps(k[jj][d]);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[jj][g] = _mm512_fmadd_ps(qv[g], kd, acc[jj][g]);
    }
  }
  store_scores_t<J, G>(acc, row0, j0, ts);
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const Index gg = row0 / 16 + g;
    const __mmask16 active = active_rows(gg, ra, nb);
    if (all_lanes_see(active, gg, b0, j0 + J - 1, t)) {  // the same maxima, no masks to build
      gather_max<J, G>(acc, g, gg, active, bm);
      continue;
    }
    const __m512i rel = relative_positions(gg, b0, t);
    __m512 mx = bm.mx[gg];
    __mmask16 nan = bm.nan[gg];
#pragma GCC unroll 8
    for (int jj = 0; jj < J; ++jj) {
      const __mmask16 vis =
          active & _mm512_cmp_epi32_mask(rel, _mm512_set1_epi32(static_cast<int>(j0 + jj)),
                                         _MM_CMPINT_NLT);
      nan |= _mm512_mask_cmp_ps_mask(vis, acc[jj][g], acc[jj][g], _CMP_UNORD_Q);
      mx = _mm512_mask_max_ps(mx, vis, mx, acc[jj][g]);
    }
    bm.mx[gg] = mx;
    bm.nan[gg] = nan;
  }
}

template <int J>
GPT2_KERNEL_AVX512 inline void scores_t_rows(int g, Index row0, Index j0, Index b0, Index ra,
                                             Index nb, const float* const* krow,
                                             const AttentionTile<float>& t,
                                             TileScratch<float>& ts, BlockMax& bm) {
  switch (g) {
    case 4: scores_t<J, 4>(row0, j0, b0, ra, nb, krow, t, ts, bm); break;
    case 3: scores_t<J, 3>(row0, j0, b0, ra, nb, krow, t, ts, bm); break;
    case 2: scores_t<J, 2>(row0, j0, b0, ra, nb, krow, t, ts, bm); break;
    case 1: scores_t<J, 1>(row0, j0, b0, ra, nb, krow, t, ts, bm); break;
    default: break;
  }
}

// The block's transposed scores for row vectors 0 .. groups - 1, key groups of 6; a row vector
// none of whose rows sees any key of a group (past the diagonal) is skipped: its scores there are
// never read.
GPT2_KERNEL_AVX512 inline void scores_t_block(Index groups, Index b0, Index n_blk, Index ra,
                                              Index nb, const float* const* krow,
                                              const AttentionTile<float>& t,
                                              TileScratch<float>& ts, BlockMax& bm) {
  for (Index g = 0; g < groups; ++g) {
    bm.mx[g] = _mm512_set1_ps(-__builtin_inff());
    bm.nan[g] = 0;
  }
  for (Index j = 0; j < n_blk; j += 6) {
    // row r sees key b0 + j iff first_pos + r >= b0 + j: row vectors from g_lo on have such rows
    const Index first_row = std::max<Index>(0, b0 + j - t.first_pos);
    const Index g_lo = std::min(groups, first_row / 16);
    const int g = static_cast<int>(groups - g_lo);
    switch (std::min<Index>(6, n_blk - j)) {
      case 6: scores_t_rows<6>(g, 16 * g_lo, j, b0, ra, nb, krow, t, ts, bm); break;
      case 5: scores_t_rows<5>(g, 16 * g_lo, j, b0, ra, nb, krow, t, ts, bm); break;
      case 4: scores_t_rows<4>(g, 16 * g_lo, j, b0, ra, nb, krow, t, ts, bm); break;
      case 3: scores_t_rows<3>(g, 16 * g_lo, j, b0, ra, nb, krow, t, ts, bm); break;
      case 2: scores_t_rows<2>(g, 16 * g_lo, j, b0, ra, nb, krow, t, ts, bm); break;
      default: scores_t_rows<1>(g, 16 * g_lo, j, b0, ra, nb, krow, t, ts, bm); break;
    }
  }
}

// The block softmax of rows 16 g .. 16 g + 15 (those in [ra, nb) take part) on their transposed
// scores: p replaces them, and the rows' m, z, l, a, c are updated (block_softmax's steps).
GPT2_KERNEL_AVX512 __attribute__((noinline)) inline void block_softmax16(
    Index g, Index b0, Index n_blk, Index ra, Index nb, const BlockMax& bm,
    const AttentionTile<float>& t, TileScratch<float>& ts) {
  const __m512 minus_inf = _mm512_set1_ps(-__builtin_inff()), zero = _mm512_setzero_ps();
  const __m512 nan_v = _mm512_set1_ps(__builtin_nanf(""));
  const __mmask16 active = active_rows(g, ra, nb);
  const __m512i rel = relative_positions(g, b0, t);  // lane r sees key b0 + j iff rel >= j
  float* st = ts.p + 16 * g;
  const __m512 mb = _mm512_mask_mov_ps(bm.mx[g], bm.nan[g], nan_v);
  const __m512 zb = _mm512_mask_mov_ps(mb, _mm512_cmp_ps_mask(mb, minus_inf, _CMP_EQ_OQ), zero);
  __m512 lane_sum[16];
#pragma GCC unroll 16
  for (int u = 0; u < 16; ++u) lane_sum[u] = zero;
  // A full block all 16 rows see whole (below the diagonal) with no NaN or +inf maximum: every
  // s - z_b lies in [-inf, 0], so the visibility masks and kexpe's range steps change nothing there.
  const bool whole = n_blk == kKeyBlock && all_lanes_see(active, g, b0, n_blk - 1, t) &&
                     bm.nan[g] == 0 &&
                     _mm512_cmp_ps_mask(mb, _mm512_set1_ps(__builtin_inff()), _CMP_EQ_OQ) == 0;
  if (whole) {
    for (Index j0 = 0; j0 < kKeyBlock; j0 += 16) {
#pragma GCC unroll 16
      for (int u = 0; u < 16; ++u) {
        float* sj = st + (j0 + u) * kTileMaxRows;
        const __m512 e = kexpe_nonpositive(_mm512_sub_ps(_mm512_load_ps(sj), zb));
        _mm512_store_ps(sj, e);
        lane_sum[u] = _mm512_add_ps(lane_sum[u], e);
      }
    }
  } else {
    for (Index j0 = 0; j0 < n_blk; j0 += 16) {
#pragma GCC unroll 16
      for (int u = 0; u < 16; ++u) {
        const Index j = j0 + u;
        if (j >= n_blk) break;
        const __mmask16 vis =
            active & _mm512_cmp_epi32_mask(rel, _mm512_set1_epi32(static_cast<int>(j)),
                                           _MM_CMPINT_NLT);
        float* sj = st + j * kTileMaxRows;
        const __m512 e = _mm512_maskz_mov_ps(vis, kexpe(_mm512_sub_ps(_mm512_load_ps(sj), zb)));
        _mm512_store_ps(sj, e);
        lane_sum[u] = _mm512_add_ps(lane_sum[u], e);
      }
    }
  }
#pragma GCC unroll 8
  for (int u = 0; u < 8; ++u) lane_sum[u] = _mm512_add_ps(lane_sum[u], lane_sum[u + 8]);
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u) lane_sum[u] = _mm512_add_ps(lane_sum[u], lane_sum[u + 4]);
#pragma GCC unroll 2
  for (int u = 0; u < 2; ++u) lane_sum[u] = _mm512_add_ps(lane_sum[u], lane_sum[u + 2]);
  const __m512 lb = _mm512_add_ps(lane_sum[0], lane_sum[1]);
  const __m512 m_old = _mm512_load_ps(ts.m + 16 * g), z_old = _mm512_load_ps(ts.z + 16 * g);
  const __m512 l_old = _mm512_load_ps(ts.l + 16 * g);
  const __mmask16 either_nan =
      _mm512_cmp_ps_mask(m_old, m_old, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(mb, mb, _CMP_UNORD_Q);
  const __m512 m_new = _mm512_mask_mov_ps(_mm512_max_ps(m_old, mb), either_nan, nan_v);
  const __m512 z_new =
      _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, minus_inf, _CMP_EQ_OQ), zero);
  const __m512 a = _mm512_mask_mov_ps(kexpe(_mm512_sub_ps(z_old, z_new)),
                                      _mm512_cmp_ps_mask(m_old, minus_inf, _CMP_EQ_OQ), zero);
  const __m512 c = _mm512_mask_mov_ps(kexpe(_mm512_sub_ps(zb, z_new)),
                                      _mm512_cmp_ps_mask(mb, minus_inf, _CMP_EQ_OQ), zero);
  _mm512_mask_store_ps(ts.l + 16 * g, active, _mm512_fmadd_ps(lb, c, _mm512_mul_ps(l_old, a)));
  _mm512_mask_store_ps(ts.m + 16 * g, active, m_new);
  _mm512_mask_store_ps(ts.z + 16 * g, active, z_new);
  _mm512_mask_store_ps(ts.a + 16 * g, active, a);
  _mm512_mask_store_ps(ts.c + 16 * g, active, c);
}

// qt[d][row] = qs[row][d] for rows 0 .. 16 G - 1 (rows past nb zero), d < head_dim.
GPT2_KERNEL_AVX512 inline void transpose_queries(Index nb, const AttentionTile<float>& t,
                                                 TileScratch<float>& ts) {
  const Index hdp = padded_head_dim(t.head_dim);
  __m512 r[16];
  for (Index r0 = 0; r0 < nb; r0 += 16)
    for (Index d0 = 0; d0 < hdp; d0 += 16) {
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = r0 + i < nb ? _mm512_load_ps(ts.qs + (r0 + i) * hdp + d0) : _mm512_setzero_ps();
      transpose16(r);
      for (Index i = 0; i < 16; ++i) _mm512_store_ps(ts.qt + (d0 + i) * kTileMaxRows + r0, r[i]);
    }
}

// One key block (from b0, n_blk keys) of a tile of nb >= 2 rows: the rows that see it (from
// r_begin on) get its scores, block softmax and p v merged into their running state; rows in lanes
// when row_vectors (qs^T in ts.qt) and 16 rows or more see the block, else row by row.
GPT2_KERNEL_AVX512 inline void tile_block(Index b0, bool row_vectors,
                                          const AttentionTile<float>& t, TileScratch<float>& ts) {
  const Index hd = t.head_dim, hdp = padded_head_dim(hd), nb = t.rows;
  const Index n_blk = std::min(kKeyBlock, t.first_pos + nb - b0);
  const float* krow[kKeyBlock];
  const float* vrow[kKeyBlock];
  block_rows<float>(t, b0, n_blk, krow, vrow, ts.kw, ts.vw);
  const Index r_begin = std::max<Index>(0, b0 - t.first_pos);
  Index r = r_begin;
  if (row_vectors && nb - r_begin >= 16) {  // 16 rows or more see this block: rows in lanes
    // p v reads the value rows in place when they are aligned (a workspace's or a cache's),
    // else an aligned copy
    const float* const* vsrc = vrow;
    const float* vpacked[kKeyBlock];
    if (!rows_aligned(vrow, n_blk)) {
      pack_values(vrow, n_blk, hd, ts.vb);
      for (Index j = 0; j < n_blk; ++j) vpacked[j] = ts.vb + j * hdp;
      vsrc = vpacked;
    }
    const Index groups = (nb + 15) / 16;
    BlockMax bm;
    scores_t_block(groups, b0, n_blk, r_begin, nb, krow, t, ts, bm);
    for (Index g = r_begin / 16; g < groups; ++g)
      block_softmax16(g, b0, n_blk, r_begin, nb, bm, t, ts);
    for (; r + kValueRows <= nb; r += kValueRows)
      value_rows_all<kValueRows>(r, b0, vsrc, t, ts, 1, kTileMaxRows);
    switch (nb - r) {
      case 5: value_rows_all<5>(r, b0, vsrc, t, ts, 1, kTileMaxRows); break;
      case 4: value_rows_all<4>(r, b0, vsrc, t, ts, 1, kTileMaxRows); break;
      case 3: value_rows_all<3>(r, b0, vsrc, t, ts, 1, kTileMaxRows); break;
      case 2: value_rows_all<2>(r, b0, vsrc, t, ts, 1, kTileMaxRows); break;
      case 1: value_rows_all<1>(r, b0, vsrc, t, ts, 1, kTileMaxRows); break;
      default: break;
    }
    return;
  }
  pack_keys_t(krow, n_blk, hd, ts.kt);
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
  for (; r + kValueRows <= nb; r += kValueRows)
    value_rows_all<kValueRows>(r, b0, vrow, t, ts, kKeyBlock, 1);
  switch (nb - r) {
    case 5: value_rows_all<5>(r, b0, vrow, t, ts, kKeyBlock, 1); break;
    case 4: value_rows_all<4>(r, b0, vrow, t, ts, kKeyBlock, 1); break;
    case 3: value_rows_all<3>(r, b0, vrow, t, ts, kKeyBlock, 1); break;
    case 2: value_rows_all<2>(r, b0, vrow, t, ts, kKeyBlock, 1); break;
    case 1: value_rows_all<1>(r, b0, vrow, t, ts, kKeyBlock, 1); break;
    default: break;
  }
}

// Whether a tile of nb rows runs its blocks with rows in lanes (those 16 rows or more see).
inline bool uses_row_vectors(const AttentionTile<float>& t) {
  return t.rows >= 16 && t.first_pos + t.rows < (Index(1) << 30);
}

// A one-row tile over pages of E (float32, or bf16 bits): block by block, each a partial merged in
// order; t.out.
template <class E>
GPT2_KERNEL_AVX512 inline void decode_row(const AttentionTile<float>& t, const E* const* key_pages,
                                          const E* const* value_pages, TileScratch<float>& ts) {
  const Index key_end = t.first_pos + 1, blocks = t.first_pos / kKeyBlock + 1;
  prefetch_decode_start(t, key_pages, value_pages, 0, key_end);
  float* part = ts.vb;
  for (Index b = 0; b < blocks; ++b) {
    decode_block(b * kKeyBlock, key_end, t, key_pages, value_pages, ts, part);
    fold_partial(part, t.head_dim, ts);
  }
  write_row(t, ts);
}

// The tile (attention_tile.hpp's interface and arithmetic).
GPT2_KERNEL_AVX512 inline void attention_tile(const AttentionTile<float>& t) {
  const Index hd = t.head_dim, hdp = padded_head_dim(hd), nb = t.rows;
  TileScratch<float> ts(t.scratch, hd);
  init_rows(t, ts);
  if (nb == 1) {  // a decode step: block by block, each a partial merged in order
    if (t.key_pages_bf16 != nullptr)
      decode_row(t, t.key_pages_bf16, t.value_pages_bf16, ts);
    else
      decode_row(t, t.key_pages, t.value_pages, ts);
    return;
  }
  const bool row_vectors = uses_row_vectors(t);
  if (row_vectors) transpose_queries(nb, t, ts);
  const Index last = t.first_pos + nb - 1, n_blocks = last / kKeyBlock + 1;
  for (Index b = 0; b < n_blocks; ++b) {
    prefetch_next_queries(t, b, n_blocks);
    tile_block(b * kKeyBlock, row_vectors, t, ts);
  }
  for (Index r = 0; r < nb; ++r) store_row(ts.o + r * hdp, ts.l[r], hd, t.out + r * t.ldo);
}

}  // namespace gpt2::kernels::avx512

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
