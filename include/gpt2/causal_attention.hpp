// Step 3 of the sublayer: causal attention of one head.
//
//   att = softmax(q k^T / sqrt(head_dim), causal) ; y = att v
//
// q [T, head_dim] are the queries of the last T positions of a sequence whose first n_past
// positions come before them; k, v [n_past + T, head_dim] hold all its keys and values. Query row i
// (position n_past + i) sees keys 0 .. n_past + i (bottom-right-aligned causal mask, as Hugging Face
// applies it with past_key_values). With n_past = 0 this is the plain causal mask.
//
// Without probabilities the rows run through the fused core (kernels/attention_tile.hpp): tiles of
// kAttentionRowBlock query rows walk 64-key blocks with an online softmax, skipping the blocks past
// the diagonal; the scratch is O(tile x head_dim) whatever the number of keys, and every row's
// arithmetic depends only on its position and data, so a row gives the same bits in any tile, chunk
// (prefill or decode step), batch or thread count. Keys and values may sit in pages (HeadPages).
// With probabilities, the output still comes from the fused core (asking for them never changes
// it); the probabilities come from a [tile, n_keys] score tile, row by row (rows exact too).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

#include "gpt2/error.hpp"
#include "gpt2/gemm.hpp"
#include "gpt2/kernels/amx_attention_size.hpp"
#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/dispatch.hpp"
#include "gpt2/kernels/generic.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

inline constexpr Index kAttentionRowBlock = kernels::kTileMaxRows;  // 64

// One head's keys and values held in pages of page_rows positions: key row j (0 <= j < n_keys) is
//   key_pages[j / page_rows] + (j % page_rows) * row_stride   (head_dim contiguous scalars),
// value row j likewise in value_pages. page_rows is a multiple of 16, or >= n_keys (one page).
template <class T>
struct HeadPages {
  const T* const* key_pages = nullptr;
  const T* const* value_pages = nullptr;
  Index page_rows = 0;
  Index row_stride = 0;
  Index n_keys = 0;
  Index head_dim = 0;
  // Optional: the keys transposed in 64-key blocks (kernels::AttentionTile::keys_t; a KV cache's
  // transposed_key_blocks(h)), read by the vector levels' decode steps. Null: none.
  const T* keys_t = nullptr;
};

// The score tile's rows start on 64-byte boundaries (its column count is rounded up to a multiple
// of kScoreRowAlign scalars), so every row has the alignment of the first: the vectorized exp and
// sum of the softmax then split a row at the same places whatever the tile's width, and a result
// does not depend on how much room the scratch happens to have.
template <class T>
constexpr Index kScoreRowAlign = 64 / static_cast<Index>(sizeof(T));

// Scratch of causal attention on one thread: the fused core's tile buffer
// (kernels::attention_scratch_size(head_dim) scalars: independent of the number of keys), and, only
// once probabilities are asked for, their [kAttentionRowBlock, n_keys] score tile. Grows on demand; reserve() (and reserve_probabilities()) up front for
// allocation-free calls. Not thread-safe: one per thread.
template <class T>
class AttentionScratch {
 public:
  // Empty: grows on the first call. The second form allocates the fused core's buffer for
  // head_dim up front (max_keys does not change its size).
  AttentionScratch() = default;
  AttentionScratch(Index max_keys, Index head_dim) { reserve(max_keys, head_dim); }

  // Room for attention over up to max_keys keys of width head_dim without probabilities: the
  // fused core's tile buffer (its size does not depend on max_keys). If an allocation throws, the
  // scratch stays usable (it grows again on demand).
  void reserve(Index max_keys, Index head_dim) {
    (void)max_keys;
    reserve_tile(head_dim);
  }

  // Room for the probabilities of up to max_keys keys too.
  void reserve_probabilities(Index max_keys, Index head_dim) {
    reserve_tile(head_dim);
    if (scores.cols() < max_keys) {
      const Index cols = (max_keys + kScoreRowAlign<T> - 1) / kScoreRowAlign<T> * kScoreRowAlign<T>;
      RowMatrix<T> grown(kAttentionRowBlock, cols);  // allocate first: scores stays valid
      scores.swap(grown);
    }
  }

  // The fused core's buffer for head_dim (allocated when it is smaller; 64-byte aligned).
  void reserve_tile(Index head_dim) {
    Index want = kernels::attention_scratch_size<T>(head_dim);
#if GPT2_KERNELS_HAVE_AMX
    if (bf16_products_) want = std::max(want, kernels::amx::attention_floats(head_dim));
#endif
    if (tile_size_ >= want) return;
    const std::size_t bytes = static_cast<std::size_t>(want) * sizeof(T);
    std::unique_ptr<T, AlignedDelete> grown(
        static_cast<T*>(::operator new(bytes, std::align_val_t(64))));
    tile_.swap(grown);
    tile_size_ = want;
  }
  T* tile() { return tile_.get(); }

  // Whether the fused core's two products run in bf16 (the weights' precision: set by the forward,
  // see detail::use_weight_dtype). Only the amx level has a bf16 core (kernels/amx_attention.hpp);
  // elsewhere the float32 core runs either way. With it the tile buffer grows, once, to the AMX
  // core's (tiles of up to 256 rows: 212 KiB at head_dim 64).
  bool bf16_products() const { return bf16_products_; }
  void set_bf16_products(bool on) { bf16_products_ = on; }

  // Bytes of the buffers held.
  Index bytes() const {
    return (tile_size_ + scores.size()) * static_cast<Index>(sizeof(T));
  }

  // The probabilities' path's score tile (empty until probabilities are requested):
  RowMatrix<T> scores;  // [kAttentionRowBlock, max_keys rounded up to kScoreRowAlign<T>]

 private:
  bool bf16_products_ = false;
  struct AlignedDelete {
    void operator()(T* p) const { ::operator delete(p, std::align_val_t(64)); }
  };
  std::unique_ptr<T, AlignedDelete> tile_;
  Index tile_size_ = 0;
};

// max(-inf, row[0], ..., row[n-1]); NaN if any entry is NaN.
using kernels::generic::running_max;

// In place: row[0 .. n) = softmax(row[0 .. n)), row[n .. row.size()) = 0.
//   row [n_keys], 1 <= n <= n_keys
// The running max starts at minus infinity (never a finite sentinel), so logits of any size work.
// (Eigen's exp: the generic level's softmax, and double's.)
template <class T>
void causal_softmax_row(T* row, Index n, Index n_keys) {
  kernels::generic::softmax_row<T>(row, n, n_keys);
}

namespace detail {

inline void check_attention_shapes(Index n_query, Index n_keys, Index head_dim, Index k_rows,
                                   Index k_cols, Index v_rows, Index v_cols, Index out_rows,
                                   Index out_cols) {
  check_shape("k", {n_keys, head_dim}, {k_rows, k_cols});
  check_shape("v", {n_keys, head_dim}, {v_rows, v_cols});
  check_shape("out", {n_query, head_dim}, {out_rows, out_cols});
  if (n_keys < n_query)
    throw ShapeError("k: expected at least as many rows as q (" + std::to_string(n_query) +
                     "), got " + std::to_string(n_keys));
}

// a . b over n scalars in four partial sums (d mod 4, in order) added as (s0 + s1) + (s2 + s3):
// the generic level's score of the probabilities' path (one fixed order for every row).
template <class T>
T dot4(const T* a, const T* b, Index n) {
  T s[4] = {T(0), T(0), T(0), T(0)};
  Index d = 0;
  for (; d + 4 <= n; d += 4)
    for (int l = 0; l < 4; ++l) s[l] += a[d + l] * b[d + l];
  for (int l = 0; d < n; ++d, ++l) s[l] += a[d] * b[d];
  return (s[0] + s[1]) + (s[2] + s[3]);
}


// The fused core's arguments for query rows r0 .. r0 + nb - 1 of q [T, head_dim] attending over
// n_keys keys (q row i is position n_keys - T + i), writing out's rows r0 ..; the keys and values
// (pages and strides) are the caller's to fill in. Reserves the scratch's tile buffer (allocates
// only when it was never reserved).
template <class T>
kernels::AttentionTile<T> tile_of(const ConstMatrixRef<T>& q, Index n_keys, Index r0, Index nb,
                                  MatrixRef<T>& out, AttentionScratch<T>& scratch) {
  scratch.reserve_tile(q.cols());
  kernels::AttentionTile<T> t;
  t.rows = nb;
  t.first_pos = n_keys - q.rows() + r0;
  t.head_dim = q.cols();
  t.q = q.data() + r0 * q.outerStride();
  t.ldq = q.outerStride();
  // attend_heads runs a head's tiles from the last rows back: the rows before r0 come next
  t.next_rows = std::min(nb, r0);
  t.next_q = t.next_rows > 0 ? q.data() + (r0 - t.next_rows) * q.outerStride() : nullptr;
  t.scale = T(1) / std::sqrt(T(q.cols()));
  t.out = out.data() + r0 * out.outerStride();
  t.ldo = out.outerStride();
  t.scratch = scratch.tile();
  t.bf16 = scratch.bf16_products();
  return t;
}

// Runs a tile at the active level (generic: the plain C++ core; float and double). A bf16 tile
// (bf16 weights) of at least kAmxMinRows rows runs the AMX core at the amx level, when the head
// size fits it; shorter tiles (decode steps) run the float32 core, which is faster there (the AMX
// core packs every key block for its 16-row tiles).
template <class T>
void run_tile(const kernels::AttentionTile<T>& t) {
  if constexpr (std::is_same<T, float>::value) {
#if GPT2_KERNELS_HAVE_AMX  // as reserve_tile, which sizes the scratch for the AMX core by it
    if (t.bf16 && t.rows >= kernels::amx::kAmxMinRows && kernels::amx::attention_fits(t.head_dim)) {
      if (const kernels::Bf16AttentionTile core = kernels::bf16_attention_tile(active_isa())) {
        core(t);
        return;
      }
    }
#endif
    if (const kernels::FloatKernels* kern = vector_kernels<T>()) {
      kern->attention_tile(t);
      return;
    }
  }
  kernels::generic::attention_tile<T>(t);
}

// Query rows r0 .. r0 + nb - 1 (nb <= kAttentionRowBlock) of q [T, head_dim] (q row i is position
// kv.n_keys - T + i and sees keys 0 .. kv.n_keys - T + i) attend over kv through the fused core of
// the active level; writes out's rows r0 .. r0 + nb - 1. Shapes already checked. A row's bits
// depend only on its position and data (not on r0, nb or how the keys are paged).
template <class T>
void attention_rows(const ConstMatrixRef<T>& q, const HeadPages<T>& kv, Index r0, Index nb,
                    MatrixRef<T>& out, AttentionScratch<T>& scratch) {
  if (nb <= 0) return;
  kernels::AttentionTile<T> t = tile_of<T>(q, kv.n_keys, r0, nb, out, scratch);
  t.key_pages = kv.key_pages;
  t.value_pages = kv.value_pages;
  t.page_rows = kv.page_rows;
  t.key_stride = kv.row_stride;
  t.value_stride = kv.row_stride;
  t.keys_t = kv.keys_t;
  run_tile<T>(t);
}

// A decode step's row split over threads: the partials of q's one row (position kv.n_keys - 1)
// over key blocks [block_begin, block_end) (kernels::partial_stride(head_dim) scalars each, from
// parts), and the row from all of them; merged in block order they give attention_rows' bits.
template <class T>
void attention_row_partials(const ConstMatrixRef<T>& q, const HeadPages<T>& kv, Index block_begin,
                            Index block_end, T* parts, AttentionScratch<T>& scratch) {
  scratch.reserve_tile(q.cols());
  kernels::AttentionTile<T> t;
  t.rows = 1;
  t.first_pos = kv.n_keys - 1;
  t.head_dim = q.cols();
  t.q = q.data() + (q.rows() - 1) * q.outerStride();
  t.ldq = q.outerStride();
  t.scale = T(1) / std::sqrt(T(q.cols()));
  t.scratch = scratch.tile();
  t.bf16 = scratch.bf16_products();
  t.key_pages = kv.key_pages;
  t.value_pages = kv.value_pages;
  t.page_rows = kv.page_rows;
  t.key_stride = kv.row_stride;
  t.value_stride = kv.row_stride;
  t.keys_t = kv.keys_t;
  if constexpr (std::is_same<T, float>::value) {
    if (const kernels::FloatKernels* kern = vector_kernels<T>()) {
      kern->row_partials(t, block_begin, block_end, parts);
      return;
    }
  }
  kernels::generic::row_partials<T>(t, block_begin, block_end, parts);
}

template <class T>
void merge_row_partials(Index head_dim, Index n_keys, const T* parts, T* out,
                        AttentionScratch<T>& scratch) {
  scratch.reserve_tile(head_dim);
  kernels::AttentionTile<T> t;
  t.rows = 1;
  t.first_pos = n_keys - 1;
  t.head_dim = head_dim;
  t.out = out;
  t.ldo = head_dim;
  t.scratch = scratch.tile();
  const Index n_blocks = (n_keys + kernels::kKeyBlock - 1) / kernels::kKeyBlock;
  if constexpr (std::is_same<T, float>::value) {
    if (const kernels::FloatKernels* kern = vector_kernels<T>()) {
      kern->merge_row_partials(t, n_blocks, parts);
      return;
    }
  }
  kernels::generic::merge_row_partials<T>(t, n_blocks, parts);
}

// The same over contiguous k, v [n_keys, head_dim] (one page each; their strides may differ), and
// optionally the keys' transposed blocks (HeadPages::keys_t).
template <class T>
void attention_rows(const ConstMatrixRef<T>& q, const ConstMatrixRef<T>& k,
                    const ConstMatrixRef<T>& v, Index r0, Index nb, MatrixRef<T>& out,
                    AttentionScratch<T>& scratch, const T* keys_t = nullptr) {
  if (nb <= 0) return;
  const T* key_page = k.data();
  const T* value_page = v.data();
  kernels::AttentionTile<T> t = tile_of<T>(q, k.rows(), r0, nb, out, scratch);
  t.key_pages = &key_page;
  t.value_pages = &value_page;
  t.page_rows = k.rows();  // one page: every key row j < n_keys is in page 0
  t.key_stride = k.outerStride();
  t.value_stride = v.outerStride();
  t.keys_t = keys_t;
  run_tile<T>(t);
}

// The probabilities of rows [r0, r0 + nb) of one head (nb <= kAttentionRowBlock): the row tile's
// scores cover only the keys its last row can see, then each row's softmax. Shapes as in
// causal_attention_head, already checked; scratch has room (reserve_probabilities) for k.rows()
// keys. Writes probs' rows r0 .. r0 + nb - 1 (the output comes from the fused core either way, so
// asking for the probabilities never changes it).
template <class T>
void probability_rows(const ConstMatrixRef<T>& q, const ConstMatrixRef<T>& k, Index r0, Index nb,
                      MatrixRef<T>& probs, AttentionScratch<T>& scratch) {
  const Index T_ = q.rows(), head_dim = q.cols(), n_keys = k.rows(), n_past = n_keys - T_;
  const Index n_visible = n_past + r0 + nb;  // keys seen by the tile's last row
  const T scale = T(1) / std::sqrt(T(head_dim));
  MatrixRef<T> att = scratch.scores.topLeftCorner(nb, n_visible);

  // att = softmax(q_tile k_visible^T / sqrt(head_dim)), row i seeing keys 0 .. n_past + r0 + i,
  // one row at a time (so that a row's probabilities do not depend on its tile either)
  if (const kernels::FloatKernels* kern = vector_kernels<T>()) {
    if constexpr (std::is_same<T, float>::value) {
      for (Index i = 0; i < nb; ++i) {
        kern->row_times_transposed(n_visible, head_dim, q.data() + (r0 + i) * q.outerStride(),
                                   k.data(), k.outerStride(), &att(i, 0));
        kern->softmax_row(&att(i, 0), n_past + r0 + i + 1, n_visible, scale);
      }
    }
  } else {
    for (Index i = 0; i < nb; ++i) {
      const T* qi = q.data() + (r0 + i) * q.outerStride();
      for (Index j = 0; j < n_visible; ++j)
        att(i, j) = scale * dot4<T>(qi, k.data() + j * k.outerStride(), head_dim);
      causal_softmax_row<T>(&att(i, 0), n_past + r0 + i + 1, n_visible);
    }
  }
  probs.middleRows(r0, nb).leftCols(n_visible) = att;
  probs.middleRows(r0, nb).rightCols(n_keys - n_visible).setZero();
}

// Rows [r0, r0 + nb) of one head: the fused core, and the probabilities when probs is not null
// (keys_t: optional, as attention_rows').
template <class T>
void attention_row_tile(const ConstMatrixRef<T>& q, const ConstMatrixRef<T>& k,
                        const ConstMatrixRef<T>& v, Index r0, Index nb, MatrixRef<T>& out,
                        MatrixRef<T>* probs, AttentionScratch<T>& scratch,
                        const T* keys_t = nullptr) {
  attention_rows<T>(q, k, v, r0, nb, out, scratch, keys_t);
  if (probs) probability_rows<T>(q, k, r0, nb, *probs, scratch);
}

// Row tiles of a head with n_query query rows (of row_block rows each).
inline Index attention_row_tiles(Index n_query, Index row_block = kAttentionRowBlock) {
  return (n_query + row_block - 1) / row_block;
}

// Query rows per tile for a head's rows of width head_dim: the AMX core's 256 for bf16 products at
// the amx level without probabilities (each key block packed once for 4 row groups), else
// kAttentionRowBlock.
template <class T>
Index attention_row_block(const AttentionScratch<T>& scratch, Index head_dim, bool with_probs) {
#if GPT2_KERNELS_HAVE_AMX
  if constexpr (std::is_same<T, float>::value) {
    if (!with_probs && scratch.bf16_products() && active_isa() == Isa::amx &&
        kernels::amx::attention_fits(head_dim))
      return kernels::amx::kAmxTileMaxRows;
  }
#endif
  (void)scratch;
  (void)head_dim;
  (void)with_probs;
  return kAttentionRowBlock;
}

// Every check of one head's call: shapes and overlaps. probs is null when not requested.
template <class T>
void check_attention_head(const ConstMatrixRef<T>& q, const ConstMatrixRef<T>& k,
                          const ConstMatrixRef<T>& v, const MatrixRef<T>& out,
                          const MatrixRef<T>* probs) {
  const Index T_ = q.rows(), head_dim = q.cols(), n_keys = k.rows();
  check_attention_shapes(T_, n_keys, head_dim, k.rows(), k.cols(), v.rows(), v.cols(),
                         out.rows(), out.cols());
  if (probs) check_shape("probs", {T_, n_keys}, {probs->rows(), probs->cols()});
  if (overlaps(out, q) || overlaps(out, k) || overlaps(out, v))
    throw ShapeError("out: must not overlap q, k or v");
  if (probs && (overlaps(*probs, q) || overlaps(*probs, k) || overlaps(*probs, v) ||
                overlaps(*probs, out)))
    throw ShapeError("probs: must not overlap q, k, v or out");
}

// Shared body of the two public overloads; `probs` is null when not requested.
template <class T>
void causal_attention_head(const ConstMatrixRef<T>& q, const ConstMatrixRef<T>& k,
                           const ConstMatrixRef<T>& v, MatrixRef<T>& out, MatrixRef<T>* probs,
                           AttentionScratch<T>& scratch) {
  check_attention_head<T>(q, k, v, out, probs);
  const Index T_ = q.rows();
  if (T_ == 0) return;
  if (probs)
    scratch.reserve_probabilities(k.rows(), q.cols());
  else
    scratch.reserve(k.rows(), q.cols());
  for (Index r0 = 0; r0 < T_; r0 += kAttentionRowBlock)
    attention_row_tile<T>(q, k, v, r0, std::min(kAttentionRowBlock, T_ - r0), out, probs, scratch);
}

}  // namespace detail

// One head of causal self-attention.
//   q [T, head_dim], k [n_past + T, head_dim], v [n_past + T, head_dim] (read; row-major views,
//   e.g. q_view/k_view/v_view of a qkv matrix)
//   out [T, head_dim] (written; e.g. head h's slot in the merged matrix, see head_slot)
// PyTorch: F.softmax((q @ k.T / sqrt(head_dim)).masked_fill(~causal, -inf), -1) @ v
template <class T, class DQ, class DK, class DV>
void causal_attention_head(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
                           const Eigen::MatrixBase<DV>& v, MatrixRef<T> out,
                           AttentionScratch<T>& scratch) {
  detail::causal_attention_head<T>(detail::as_view<T>(q), detail::as_view<T>(k),
                                   detail::as_view<T>(v), out, nullptr, scratch);
}

// Same, also writing the attention probabilities.
//   probs [T, n_past + T] (written): row i holds softmax weights over keys 0 .. n_past + i and
//   exact zeros after them.
template <class T, class DQ, class DK, class DV>
void causal_attention_head(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
                           const Eigen::MatrixBase<DV>& v, MatrixRef<T> out, MatrixRef<T> probs,
                           AttentionScratch<T>& scratch) {
  detail::causal_attention_head<T>(detail::as_view<T>(q), detail::as_view<T>(k),
                                   detail::as_view<T>(v), out, &probs, scratch);
}

// One head of causal self-attention over keys and values held in pages (no probabilities).
//   q [T, head_dim] (read; positions kv.n_keys - T .. kv.n_keys - 1), kv: kv.n_keys >= T keys and
//   values of width head_dim, out [T, head_dim] (written). Bitwise what the contiguous overload
//   gives for the same keys and values at the same kernel level.
template <class T>
void causal_attention_head(const ConstMatrixRef<T>& q, const HeadPages<T>& kv, MatrixRef<T> out,
                           AttentionScratch<T>& scratch) {
  const Index T_ = q.rows(), head_dim = q.cols();
  detail::check_shape("out", {T_, head_dim}, {out.rows(), out.cols()});
  if (kv.head_dim != head_dim)
    throw ShapeError("kv: expected head_dim " + std::to_string(head_dim) + " (q's), got " +
                     std::to_string(kv.head_dim));
  if (kv.n_keys < T_)
    throw ShapeError("kv: expected at least as many keys as q has rows (" + std::to_string(T_) +
                     "), got " + std::to_string(kv.n_keys));
  if (T_ == 0) return;
  if (kv.key_pages == nullptr || kv.value_pages == nullptr)
    throw ShapeError("kv: the page tables must not be null");
  if (kv.page_rows <= 0 || (kv.page_rows < kv.n_keys && kv.page_rows % kernels::kPageRowsAlign != 0))
    throw ShapeError("kv: expected page_rows a multiple of " +
                     std::to_string(kernels::kPageRowsAlign) + " or at least n_keys (" +
                     std::to_string(kv.n_keys) + "), got " + std::to_string(kv.page_rows));
  if (kv.row_stride < head_dim)
    throw ShapeError("kv: expected row_stride at least head_dim (" + std::to_string(head_dim) +
                     "), got " + std::to_string(kv.row_stride));
  for (Index r0 = 0; r0 < T_; r0 += kAttentionRowBlock)
    detail::attention_rows<T>(q, kv, r0, std::min(kAttentionRowBlock, T_ - r0), out, scratch);
}

}  // namespace gpt2
