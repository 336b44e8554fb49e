// The fused attention core's interface: one tile of query rows of one head attends causally over
// keys and values held in pages, with an online softmax over fixed key blocks.
//
//   tile.rows query rows (1 .. kTileMaxRows; the amx level's bf16 core takes up to 256); row i is
//   position first_pos + i and sees keys 0 .. first_pos + i. out[i] = sum_j softmax_j(q_i . k_j *
//   scale) v_j. Keys and values are float32 (double for the generic level's double tiles) or bf16
//   bits (a bf16 cache: key_pages_bf16, widened exactly as they are read).
//
// The arithmetic of one row, written here once for every level (so that a row gives the same bits
// whatever tile, chunk, batch or thread count it is computed in: only its own position and data
// enter it):
//   qs = q * scale (rounded once)
//   for each key block b = [64 b, 64 b + 64) the row sees part of (absolute positions):
//     s_j  = q_s . k_j, one fused multiply-add chain over d = 0, 1, ... from +0
//     m_b  = max of the visible s_j (NaN if any is NaN); z_b = m_b, or 0 when m_b = -inf
//     p_j  = kexpe(s_j - z_b) for the visible keys (0 for the others)
//     l_b  = the 16 lane sums of p (lane t: keys 64 b + t, + 16, + 32, + 48, in order) added by
//            halves (t + 8, then + 4, + 2, + 1)
//     o_b  = sum_j p_j v_j, one fused multiply-add chain over the visible keys in order, from +0
//     then merged into the running (m, z, l, o), which start at (-inf, 0, 0, 0):
//       m' = max(m, m_b) (NaN if either is), z' = m', or 0 when m' = -inf
//       a = kexpe(z - z') (0 when m = -inf), c = kexpe(z_b - z') (0 when m_b = -inf)
//       l = fma(l_b, c, l * a), o = fma(o_b, c, o * a) elementwise
//   out = o / l
// kexpe(x) = e^x as 2^(x L): t = x L rounded once (L = log2 e as a float), then kexp2(t): NaN
// stays NaN, 0 below t = -126, t capped at 127; n = nearbyint(t), f = t - n (exact),
// y = 1 + f (c1 + f (c2 + ... + f c6)) by Horner's rule in fused multiply-adds (p = c6,
// p = fma(p, f, c_k) for k = 5 .. 1, y = fma(p, f, 1); kExp2Poly), then y 2^n rounded once.
// The vector levels (avx2, avx512) implement exactly this and give identical bits
// (tests/test_attention_core.cpp checks both against the scalar emulation of
// tests/kernel_emulation.hpp). At avx512_bf16 a bf16 tile (bf16 weights) computes s_j and o_b of
// the blocks before a row's own in bf16 pairs instead (kernels/avx512_bf16_attention.hpp), and at
// amx a bf16 tile of 16 rows or more runs on AMX tiles (kernels/amx_attention.hpp). The generic
// level (float and double) runs the same steps in plain C++ (std::exp2 of x log2 e; products and
// sums as the compiler contracts them), so its rows are exact too, but its bits are its own.
//
// Per-thread scratch: tile_scratch_size(head_dim, bf16) scalars, 64-byte aligned: independent of
// the number of keys.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "gpt2/kernels/amx_attention_size.hpp"
#include "gpt2/kernels/cpu.hpp"
#include "gpt2/kernels/layout.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// One head's keys and values held in pages of page_rows positions, in the element type E the cache
// stores (float, double, std::uint16_t: bf16 bits, or std::int8_t: int8 values with a scale per
// row): key row j (0 <= j < n_keys) is
//   key_pages[j / page_rows] + (j % page_rows) * row_stride   (head_dim contiguous elements),
// value row j likewise in value_pages (value_stride, or row_stride when 0). page_rows is a
// multiple of 16, or >= n_keys (one page). What every KV cache gives the attention core
// (kv_cache.hpp: head_pages(h)).
template <class E>
struct HeadPages {
  const E* const* key_pages = nullptr;
  const E* const* value_pages = nullptr;
  Index page_rows = 0;
  Index row_stride = 0;
  Index n_keys = 0;
  Index head_dim = 0;
  // Optional: the keys transposed in 64-key blocks (a contiguous cache's transposed_key_blocks(h):
  // block b's element (d, j) is key 64 b + j, component d, at keys_t[(b * head_dim + d) * 64 + j]),
  // read by the vector levels' one-row steps instead of the key rows (the same bits). Null: none.
  const E* keys_t = nullptr;
  Index value_stride = 0;  // 0: row_stride
  // int8 pages (E = std::int8_t) only: the float32 scale of key row j at
  // key_scale_pages[j / page_rows][j % page_rows] (the same paging as the rows), of value row j
  // likewise in value_scale_pages; the row stands for float(q) * scale (kernels/int8_dequant.hpp).
  const float* const* key_scale_pages = nullptr;
  const float* const* value_scale_pages = nullptr;
  Index values_stride() const { return value_stride > 0 ? value_stride : row_stride; }
};

}  // namespace gpt2

namespace gpt2::kernels {

inline constexpr Index kKeyBlock = 64;      // keys per block; blocks start at multiples of it
inline constexpr Index kTileMaxRows = 64;   // query rows per tile at most
inline constexpr Index kPageRowsAlign = 16; // page_rows: a multiple of this (or one page)
inline constexpr Index kDecodeBlocks = 2;   // key blocks a one-row tile may work on at once

// log2 e, and kexp2's polynomial: 2^f = 1 + f (c1 + f (c2 + ... + f c6)) for f in [-1/2, 1/2],
// kExp2Poly = {c6, c5, .., c1} (Horner's order), a minimax fit of the relative error (1.97e-9
// with these coefficients in double; within 0.91 ulp evaluated in float32 with fused
// multiply-adds: tests/test_kernels.cpp).
inline constexpr double kLog2e = 1.44269504088896340735992468100189214;
inline constexpr float kLog2eF = static_cast<float>(kLog2e);
inline constexpr float kExp2Poly[6] = {1.535335905e-4f, 1.339887618e-3f, 9.618436918e-3f,
                                       5.550332367e-2f, 2.402264774e-1f, 6.931471825e-1f};

// One tile's arguments. Key row j (0 <= j < first_pos + rows) is
//   key_pages[j / page_rows] + (j % page_rows) * key_stride    (head_dim contiguous scalars)
// and value row j likewise in value_pages (value_stride). q rows are ldq apart, out rows ldo apart.
template <class T>
struct AttentionTile {
  Index rows = 0;
  Index first_pos = 0;
  Index head_dim = 0;
  const T* q = nullptr;
  Index ldq = 0;
  const T* const* key_pages = nullptr;
  const T* const* value_pages = nullptr;
  Index page_rows = 0;
  Index key_stride = 0;    // scalars between consecutive key rows of a page
  Index value_stride = 0;  // the same for values
  T scale = T(1);
  T* out = nullptr;
  Index ldo = 0;
  T* scratch = nullptr;  // attention_scratch_size<T>(head_dim) scalars, 64-byte aligned
  bool bf16 = false;     // the products in bf16 (bf16 weights): the amx level's AMX core, the
                         // avx512_bf16 level's VDPBF16PS before a row's own block
  // Keys and values as bf16 bits (a bf16 cache), read instead of key_pages and value_pages when
  // set (strides then in bf16 elements): widened exactly, so a tile gives the bits it gives on
  // float32 pages holding the widened values.
  const std::uint16_t* const* key_pages_bf16 = nullptr;
  const std::uint16_t* const* value_pages_bf16 = nullptr;
  // Optional: the same keys transposed in key blocks (a KV cache's transposed_key_blocks): block
  // b's element (d, j) is key 64 b + j, component d, at keys_t[(b * head_dim + d) * kKeyBlock + j]
  // (lanes past the keys a row sees may hold anything). The vector levels' one-row steps read
  // them instead of transposing key rows; the bits are the same. keys_t goes with key_pages,
  // keys_t_bf16 with key_pages_bf16.
  const T* keys_t = nullptr;
  const std::uint16_t* keys_t_bf16 = nullptr;
  // int8 keys and values with a float32 scale per row (an int8 cache), read by
  // Kernels::row_partials_int8 only (key_pages and value_pages unused there): the keys transposed
  // in key blocks (keys_t's layout), key j's scale at key_scales[j]; value row j at
  // value_pages_int8[j / page_rows] + (j % page_rows) * value_stride, its scale at
  // value_scale_pages[j / page_rows][j % page_rows]. A row stands for float(q) * scale.
  const std::int8_t* keys_t_int8 = nullptr;
  const float* key_scales = nullptr;
  const std::int8_t* const* value_pages_int8 = nullptr;
  const float* const* value_scale_pages = nullptr;
  // Optional, a hint: the query rows (stride ldq) the caller expects to run next, fetched into
  // cache while this tile runs (a tile's first loads then find them there).
  const T* next_q = nullptr;
  Index next_rows = 0;
};

// head_dim rounded up to a multiple of 16 (the width of one row of qs and o in the scratch).
inline Index padded_head_dim(Index head_dim) { return (head_dim + 15) / 16 * 16; }

// Scratch of one tile: qs and o [kTileMaxRows, padded], qs^T [padded, kTileMaxRows], k^T of up to
// kDecodeBlocks blocks [padded, kKeyBlock] each, the block's values [kKeyBlock, padded], its p
// [kTileMaxRows, kKeyBlock], five per-row scalars (m, z, l, a, c), rounded up, and a block's keys
// and values widened from bf16 [kKeyBlock, padded] each.
template <class T>
Index attention_scratch_size(Index head_dim) {
  const Index hdp = padded_head_dim(head_dim);
  return 3 * kTileMaxRows * hdp + (kDecodeBlocks + 3) * hdp * kKeyBlock +
         kTileMaxRows * kKeyBlock + 8 * kTileMaxRows;
}

// Scratch of a tile at any level: the float core's, or with bf16 products (bf16 weights) the AMX
// core's where this build has it (the level may change between forwards: set_isa).
template <class T>
Index tile_scratch_size(Index head_dim, bool bf16_products) {
  Index n = attention_scratch_size<T>(head_dim);
#if GPT2_KERNELS_HAVE_AMX
  if (bf16_products) n = std::max(n, amx::attention_floats(head_dim));
#endif
  (void)bf16_products;
  return n;
}

// Where the scratch's parts start (each a multiple of 16 scalars from the base).
template <class T>
struct TileScratch {
  T* qs;     // [kTileMaxRows, hdp]
  T* o;      // [kTileMaxRows, hdp]
  T* qt;     // [hdp, kTileMaxRows] qs transposed (the vector levels' row-vector path)
  T* kt;     // [kDecodeBlocks][hdp, kKeyBlock] (k^T of up to kDecodeBlocks blocks)
  T* vb;     // [kKeyBlock, hdp] the block's values, rows 64-byte aligned
  T* p;      // [kTileMaxRows, kKeyBlock] (or [kKeyBlock, kTileMaxRows]: the row-vector path)
  T* m;      // [kTileMaxRows] running max
  T* z;      // running reference point
  T* l;      // running sum
  T* a;      // this block's factor on the running values
  T* c;      // this block's factor on its own values
  T* kw;     // [kKeyBlock, hdp] a block's keys widened from bf16
  T* vw;     // [kKeyBlock, hdp] its values widened
  TileScratch(T* base, Index head_dim) {
    const Index hdp = padded_head_dim(head_dim);
    qs = base;
    o = qs + kTileMaxRows * hdp;
    qt = o + kTileMaxRows * hdp;
    kt = qt + hdp * kTileMaxRows;
    vb = kt + kDecodeBlocks * hdp * kKeyBlock;
    p = vb + kKeyBlock * hdp;
    m = p + kTileMaxRows * kKeyBlock;
    z = m + kTileMaxRows;
    l = z + kTileMaxRows;
    a = l + kTileMaxRows;
    c = a + kTileMaxRows;
    kw = m + 8 * kTileMaxRows;
    vw = kw + kKeyBlock * hdp;
  }
};

// rows[i] = the address of key (or value) row j0 + i, i < n, in pages of page_rows rows.
template <class T>
inline void page_rows_of(const T* const* pages, Index page_rows, Index row_stride, Index j0,
                         Index n, const T** rows) {
  Index page = j0 / page_rows, in_page = j0 % page_rows;
  for (Index i = 0; i < n; ++i) {
    rows[i] = pages[page] + in_page * row_stride;
    if (++in_page == page_rows) {
      ++page;
      in_page = 0;
    }
  }
}

// Every cache line of the bytes [p, p + bytes) fetched into cache ahead of their use. The prefetch
// is a volatile asm, which no compiler may drop: GCC 12 compiled one wrapper form of a _mm_prefetch
// loop to no instruction at all (objdump). Nothing off x86 or without GCC or clang (no vector level
// runs there).
inline void prefetch_span(const void* p, std::uintptr_t bytes) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
  for (std::uintptr_t line = a & ~std::uintptr_t(63); line < a + bytes; line += 64)
    asm volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(line)));
#else
  (void)p, (void)bytes;
#endif
}

// Share b of n_shares of the next tile's q rows (t.next_q, when the caller gave them) fetched into
// cache: a tile over n key blocks fetches share b while it works on block b.
template <class T>
inline void prefetch_next_queries(const AttentionTile<T>& t, Index b, Index n_shares) {
  if (t.next_q == nullptr) return;
  const Index i0 = b * t.next_rows / n_shares, i1 = (b + 1) * t.next_rows / n_shares;
  for (Index i = i0; i < i1; ++i)
    prefetch_span(t.next_q + i * t.ldq, static_cast<std::uintptr_t>(t.head_dim) * sizeof(T));
}

// Whether rows[0 .. n) all start on a 64-byte boundary.
template <class E>
inline bool rows_aligned(const E* const* rows, Index n) {
  std::uintptr_t bits = 0;
  for (Index i = 0; i < n; ++i) bits |= reinterpret_cast<std::uintptr_t>(rows[i]);
  return (bits & 63) == 0;
}

// The head_dim elements (float32 or bf16 bits, E) of rows[0 .. n) fetched into cache ahead of their
// use. A decode step over key rows reads each once, in the order of its 16 x 16 transposes (64
// bytes of each of 16 rows at a time, not row after row), which the hardware's prefetchers follow
// poorly (the measurements: CHANGELOG.md, 0.2.0).
template <class E>
inline void prefetch_rows(const E* const* rows, Index n, Index head_dim) {
  const std::uintptr_t bytes = static_cast<std::uintptr_t>(head_dim) * sizeof(E);
  for (Index i = 0; i < n; ++i) prefetch_span(rows[i], bytes);
}

// The transposed key blocks t carries for keys of element type E (t.keys_t for float32 keys,
// t.keys_t_bf16 for bf16 bits), or null.
template <class E>
inline const E* transposed_keys_of(const AttentionTile<float>& t);
template <>
inline const float* transposed_keys_of<float>(const AttentionTile<float>& t) {
  return t.keys_t;
}
template <>
inline const std::uint16_t* transposed_keys_of<std::uint16_t>(const AttentionTile<float>& t) {
  return t.keys_t_bf16;
}

// A decode step's keys and value rows j0 .. j0 + n - 1 (n <= kDecodeBlocks blocks), of those
// before key_end that its one row sees (to t.first_pos), fetched into cache ahead of their use:
// the keys from their transposed blocks when t has them (the blocks' whole width), else from
// their rows.
template <class E>
inline void prefetch_keys_and_values(const AttentionTile<float>& t, const E* const* key_pages,
                                     const E* const* value_pages, Index j0, Index n,
                                     Index key_end) {
  n = std::min({n, kDecodeBlocks * kKeyBlock, t.first_pos + 1 - j0, key_end - j0});
  if (n <= 0) return;
  const E* rows[kDecodeBlocks * kKeyBlock];
  if (const E* kt = transposed_keys_of<E>(t)) {
    const Index first = j0 / kKeyBlock, blocks = (j0 + n - 1) / kKeyBlock - first + 1;
    prefetch_span(kt + first * t.head_dim * kKeyBlock,
                  static_cast<std::uintptr_t>(blocks * t.head_dim * kKeyBlock) * sizeof(E));
  } else {
    page_rows_of<E>(key_pages, t.page_rows, t.key_stride, j0, n, rows);
    prefetch_rows(rows, n, t.head_dim);
  }
  page_rows_of<E>(value_pages, t.page_rows, t.value_stride, j0, n, rows);
  prefetch_rows(rows, n, t.head_dim);
}

// One row's share of one key block before merging, the unit a decode step's keys are split into
// over threads: [m_b, z_b, l_b, 13 unused | o_b (padded_head_dim)], 64-byte aligned. Merged in
// block order (the header's merge step), partials give the bits of the tile itself.
inline constexpr Index kPartialHeader = 16;
inline Index partial_stride(Index head_dim) { return kPartialHeader + padded_head_dim(head_dim); }

// Keys of block b0 that row position `pos` sees (0 if none).
inline Index visible_in_block(Index pos, Index b0) {
  return std::max<Index>(0, std::min<Index>(kKeyBlock, pos + 1 - b0));
}

// rows[i] = row i of the n rows at rows_in, widened from bf16 into buf (row stride ld, zeros past
// head_dim), and rows_out[i] points at it.
template <class T>
inline void widen_rows(const std::uint16_t* const* rows_in, Index n, Index head_dim, T* buf,
                       Index ld, const T** rows_out) {
  for (Index i = 0; i < n; ++i) {
    T* dst = buf + i * ld;
    const std::uint16_t* src = rows_in[i];
    for (Index d = 0; d < head_dim; ++d) dst[d] = static_cast<T>(bf16_to_float(src[d]));
    for (Index d = head_dim; d < ld; ++d) dst[d] = T(0);
    rows_out[i] = dst;
  }
}

// The key and value rows j0 .. j0 + n - 1 (n <= kKeyBlock) of tile t as T rows: where they lie in
// t's float pages, or for bf16 pages widened into kbuf and vbuf ([kKeyBlock, padded_head_dim]
// each: TileScratch's kw and vw). The multi-row tiles of every level read their blocks through it.
template <class T>
inline void block_rows(const AttentionTile<T>& t, Index j0, Index n, const T** krow,
                       const T** vrow, T* kbuf, T* vbuf) {
  if (t.key_pages_bf16 == nullptr) {
    page_rows_of<T>(t.key_pages, t.page_rows, t.key_stride, j0, n, krow);
    page_rows_of<T>(t.value_pages, t.page_rows, t.value_stride, j0, n, vrow);
    return;
  }
  const Index hdp = padded_head_dim(t.head_dim);
  const std::uint16_t* rows[kKeyBlock];
  page_rows_of<std::uint16_t>(t.key_pages_bf16, t.page_rows, t.key_stride, j0, n, rows);
  widen_rows<T>(rows, n, t.head_dim, kbuf, hdp, krow);
  page_rows_of<std::uint16_t>(t.value_pages_bf16, t.page_rows, t.value_stride, j0, n, rows);
  widen_rows<T>(rows, n, t.head_dim, vbuf, hdp, vrow);
}

}  // namespace gpt2::kernels
