// Attention over block tables: the incremental and the batched cached forwards on paged sequences
// (paged_kv_cache.hpp). Every cached key and value is read in place in the pool's blocks, page by
// page (HeadPages, causal_attention.hpp): nothing is gathered into a contiguous copy. The result is
// bitwise what the contiguous KVCache forwards (incremental.hpp, batch.hpp) give for the same
// positions at the same kernel level.
//
//   x [T_new, C] are the last T_new positions of the sequence; their keys and values are written to
//   its blocks and new row i attends to keys 0 .. n_past + i (n_past = the positions before them).
//
// One layer (a pool of one layer), as with a KVCache:
//   attention_forward(w, x, seq, ws, out)          grows seq by T_new, then runs it
//   attention_forward(w, x, batch, seqs, ws, out)  grows every sequence b by batch.length(b)
// A model of L layers on one block table per sequence:
//   seq.grow(T_new);                               once per step: room in every layer
//   attention_forward(w[l], x_l, seq, l, ws, out_l)  for each layer l (the last T_new positions)
//   (batched: pool.grow_each(...) or seq.grow per sequence, then
//    attention_forward(w[l], x_l, batch, seqs, l, ws, out_l))
//
// The paged forwards give no probabilities (the fused core over pages computes none): for the
// attention maps, run the contiguous forward.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "gpt2/batch.hpp"
#include "gpt2/causal_attention.hpp"
#include "gpt2/error.hpp"
#include "gpt2/forward.hpp"
#include "gpt2/paged_kv_cache.hpp"
#include "gpt2/projection.hpp"
#include "gpt2/qkv.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"
#include "gpt2/workspace.hpp"

namespace gpt2 {

namespace detail {

template <class T>
void check_paged(const AttentionWeights<T>& w, const PagedSequence<T>& seq, Index layer) {
  const AttentionConfig& a = w.config();
  const AttentionConfig& b = seq.config();
  if (a.n_embd != b.n_embd || a.n_head != b.n_head)
    throw ConfigError("sequence: expected n_embd " + std::to_string(a.n_embd) + ", n_head " +
                      std::to_string(a.n_head) + " (the weights'), got n_embd " +
                      std::to_string(b.n_embd) + ", n_head " + std::to_string(b.n_head));
  if (layer < 0 || layer >= seq.pool().n_layers())
    throw ShapeError("layer: expected an index in [0, " + std::to_string(seq.pool().n_layers()) +
                     ") (the pool's layers), got " + std::to_string(layer));
}

// Every check of a paged forward that can run before the workspace grows:
//   x [T_new, C], out [T_new, C]; `grows`: the forward grows seq by T_new itself (else its last
//   T_new positions are the new tokens: T_new <= seq.length()). out must not overlap the layer's
//   storage in the pool.
template <class T>
void check_paged_forward(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                         const PagedSequence<T>& seq, Index layer, bool grows,
                         const Workspace<T>& ws, const MatrixRef<T>& out) {
  const Index T_new = x.rows(), C = w.n_embd();
  check_shape("x", {T_new, C}, {x.rows(), x.cols()});
  check_shape("out", {T_new, C}, {out.rows(), out.cols()});
  check_workspace(w, ws);
  check_paged(w, seq, layer);
  if (!grows && T_new > seq.length())
    throw ShapeError("x: expected at most " + std::to_string(seq.length()) +
                     " rows (the sequence's positions: grow() it first), got " +
                     std::to_string(T_new));
  if (!grows) seq.check_last_writable(T_new);  // (after its own grow, a sequence's rows are)
  const KVBlockPool<T>& pool = seq.pool();
  if (overlaps(out, pool.key_storage(layer)) || overlaps(out, pool.value_storage(layer)))
    throw ShapeError("out: must not overlap the KV block pool");
}

// Head h's keys and values in seq's blocks, as its last fill_pages() listed them.
template <class T>
HeadPages<T> head_pages(const PagedSequence<T>& seq, Index h) {
  const Index n = static_cast<Index>(seq.table().size()), hd = seq.config().head_dim();
  const T* const* pages = seq.pages().data();
  HeadPages<T> kv;
  kv.key_pages = pages + 2 * h * n;
  kv.value_pages = pages + (2 * h + 1) * n;
  kv.page_rows = seq.pool().block_rows();
  kv.row_stride = hd;
  kv.n_keys = seq.length();
  kv.head_dim = hd;
  return kv;
}

// Steps 3 and 4 over pages, as attend_heads runs them over contiguous keys: the T new tokens'
// projections in qkv [T, 3C] (the last T positions of seq, whose keys and values are in its
// blocks and listed by fill_pages), head h writing its slot of merged [T, C]; the (head, row
// tile) pairs in parallel on n_threads threads, each head's costliest tiles first.
template <class T>
void attend_heads_paged(const AttentionConfig& config, const ConstMatrixRef<T>& qkv,
                        const PagedSequence<T>& seq, Workspace<T>& ws, MatrixRef<T>& merged,
                        int n_threads) {
  const Index row_block = ws.threads.empty() ? kAttentionRowBlock
                                             : attention_row_block(ws.threads[0].attention,
                                                                   config.head_dim(), false);
  const Index T_ = qkv.rows(), tiles = attention_row_tiles(T_, row_block);
  parallel_tasks(config.n_head * tiles, n_threads, [&](Index task, int thread) {
    const Index h = task / tiles, tile = tiles - 1 - task % tiles;
    const Index r0 = tile * row_block, nb = std::min(row_block, T_ - r0);
    MatrixRef<T> y = head_slot(merged, config, h);
    AttentionScratch<T>& scratch = ws.threads[static_cast<std::size_t>(thread)].attention;
    attention_rows<T>(q_view(qkv, config, h), head_pages(seq, h), r0, nb, y, scratch);
  });
}

// The forward of layer `layer` after every check, with the workspace grown to T_new tokens and
// seq.length() keys: the new keys and values written into seq's blocks, then attention over them.
template <class T>
void run_paged_forward(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                       PagedSequence<T>& seq, Index layer, Workspace<T>& ws, MatrixRef<T>& out) {
  const Index T_new = x.rows(), C = w.n_embd();
  if (T_new == 0) return;
  MatrixRef<T> qkv = ws.qkv.topRows(T_new);
  MatrixRef<T> merged = ws.merged.topRows(T_new);
  const int n_threads = forward_threads(ws);
  qkv_parallel<T>(w, x, qkv, ws, n_threads);  // x is fully read here: out may alias x
  const ConstMatrixRef<T> qkv_read = qkv;
  seq.write_last(layer, qkv_read.middleCols(C, C), qkv_read.middleCols(2 * C, C));
  seq.fill_pages(layer);
  attend_heads_paged<T>(w.config(), qkv_read, seq, ws, merged, n_threads);
  const ConstMatrixRef<T> merged_read = merged;
  proj_parallel<T>(w, merged_read, out, ws, n_threads);
}

template <class T>
void paged_forward(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x, PagedSequence<T>& seq,
                   Index layer, bool grows, Workspace<T>& ws, MatrixRef<T>& out) {
  check_paged_forward<T>(w, x, seq, layer, grows, ws, out);
  if (grows && seq.pool().n_layers() != 1)
    throw ConfigError("sequence: expected a one-layer pool, got " +
                      std::to_string(seq.pool().n_layers()) +
                      " layers (grow() the sequence once per step, then run each layer with "
                      "attention_forward(w, x, seq, layer, ws, out))");
  const Index n_past = grows ? seq.length() : seq.length() - x.rows();
  ws.reserve(x.rows(), n_past + x.rows());
  check_workspace_overlap<T>(ws, x.rows(), out, nullptr);
  if (!grows) return run_paged_forward<T>(w, x, seq, layer, ws, out);
  seq.grow(x.rows());  // CapacityError: nothing changed
  try {
    run_paged_forward<T>(w, x, seq, layer, ws, out);
  } catch (...) {  // not expected after the checks
    seq.truncate(n_past);
    throw;
  }
}

// Sequences [b0, b1) of a paged batch through batch.hpp's run_group (the KVCache forward's
// gathering and groups: the same bits), their new keys and values written to layer `layer` of
// their blocks and attended over in place.
template <class T, class SeqAt>
void run_paged_group(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                     const BatchLayout& batch, const SeqAt& seqs, Index layer, Index b0, Index b1,
                     Index rows, Workspace<T>& ws, MatrixRef<T>& out) {
  const Index C = w.n_embd();
  run_group<T>(w, x, batch, b0, b1, rows, ws, out,
               [&](Index b, const ConstMatrixRef<T>& qkv_b, MatrixRef<T>& merged_b, int n_threads) {
                 PagedSequence<T>& seq = seqs(b);
                 seq.write_last(layer, qkv_b.middleCols(C, C), qkv_b.middleCols(2 * C, C));
                 seq.fill_pages(layer);
                 attend_heads_paged<T>(w.config(), qkv_b, seq, ws, merged_b, n_threads);
               });
}

// The batched paged forward; seqs(b) is sequence b's PagedSequence<T>& (B distinct ones).
// grows: every sequence b grows by batch.length(b) first, all or nothing (one-layer pools, one
// pool for the batch); else each one's last batch.length(b) positions are its new tokens. Every
// check, for every sequence, runs before any block changes.
template <class T, class SeqAt>
void batch_forward_paged(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                         const BatchLayout& batch, const SeqAt& seqs, Index layer, bool grows,
                         Workspace<T>& ws, MatrixRef<T>& out) {
  const Index B = batch.batch();
  check_batch_io<T>(batch, w.n_embd(), x, out);
  check_workspace(w, ws);
  Index max_keys = 0;
  for (Index b = 0; b < B; ++b) {
    PagedSequence<T>& seq = seqs(b);
    for (Index a = 0; a < b; ++a)
      if (&seqs(a) == &seq)
        throw ShapeError("sequences: entries " + std::to_string(a) + " and " + std::to_string(b) +
                         " are the same paged sequence");
    const ConstMatrixRef<T> x_b = x.middleRows(batch.first_row(b), batch.length(b));
    MatrixRef<T> out_b = out.middleRows(batch.first_row(b), batch.length(b));
    try {
      check_paged_forward<T>(w, x_b, seq, layer, grows, ws, out_b);
      if (grows && seq.pool().n_layers() != 1)
        throw ConfigError("sequence: expected a one-layer pool, got " +
                          std::to_string(seq.pool().n_layers()) +
                          " layers (grow the sequences once per step, then run each layer with "
                          "attention_forward(w, x, batch, seqs, layer, ws, out))");
      if (grows && &seq.pool() != &seqs(0).pool())
        throw ConfigError("sequence: expected the pool of sequence 0 (one pool per batch)");
    } catch (...) {
      rethrow_for_sequence(b);
    }
    max_keys = std::max(max_keys, seq.length() + (grows ? batch.length(b) : 0));
  }
  const Index group_rows = batch_workspace_rows<T>(batch);
  ws.reserve(group_rows, std::max(max_keys, group_rows));
  const bool grouped = row_exact_projections<T>();
  for (Index b = 0; b < B; ++b) {  // as batch_forward_cached: x and out must stay out of ws
    MatrixRef<T> out_b = grouped ? out.middleRows(b * batch.tokens(), batch.tokens())
                                 : out.middleRows(batch.first_row(b), batch.length(b));
    const Index used_rows = grouped ? group_rows : batch.length(b);
    try {
      check_workspace_overlap<T>(ws, used_rows, out_b, nullptr);
      check_input_outside_workspace<T>(ws, used_rows,
                                       x.middleRows(batch.first_row(b), batch.length(b)));
    } catch (...) {
      rethrow_for_sequence(b);
    }
  }
  if (grows && B > 0)  // CapacityError: no sequence changed
    seqs(0).pool().grow_each(B, seqs, [&](Index b) { return batch.length(b); });
  try {
    Index done = 0;
    while (done < B) {  // the groups of batch_forward_cached
      const Index b0 = done;
      Index b1 = b0, rows = 0;
      while (b1 < B && (b1 == b0 || (grouped && rows + batch.length(b1) <= group_rows)))
        rows += batch.length(b1++);
      run_paged_group<T>(w, x, batch, seqs, layer, b0, b1, rows, ws, out);
      done = b1;
    }
  } catch (...) {  // not expected after the checks
    if (grows)
      for (Index b = 0; b < B; ++b) seqs(b).truncate(seqs(b).length() - batch.length(b));
    throw;
  }
}

}  // namespace detail

// out = GPT-2 attention sublayer over new tokens of a paged sequence of a one-layer pool, as
// attention_forward(w, x, cache, ws, out) with a KVCache (the same bits):
//   x [T_new, C] (positions seq.length() .. seq.length() + T_new - 1)
//   seq: grows by T_new (CapacityError, nothing changed, when the pool is short of blocks)
//   ws: grown to T_new tokens and the sequence's new length in keys if smaller
//   out [T_new, C] (written; may be x, must not overlap the pool)
// PyTorch (HF): GPT2Attention(x, layer_past=past, use_cache=True)[0]
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       PagedSequence<T>& seq, Workspace<T>& ws, MatrixRef<T> out) {
  const ConstMatrixRef<T> x_view = detail::as_view<T>(x);
  detail::paged_forward<T>(w, x_view, seq, 0, true, ws, out);
}

// Layer `layer` of a model over a sequence already grown for this step: x [T_new, C] are its
// last T_new positions (T_new <= seq.length()); their keys and values are written to the layer's
// storage at the sequence's blocks.
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       PagedSequence<T>& seq, Index layer, Workspace<T>& ws, MatrixRef<T> out) {
  const ConstMatrixRef<T> x_view = detail::as_view<T>(x);
  detail::paged_forward<T>(w, x_view, seq, layer, false, ws, out);
}

// Batched, as attention_forward(w, x, batch, caches, ws, out) with KVCaches (the same bits):
// sequence b's real rows are its next positions; seqs[b] points at its PagedSequence (B distinct
// ones of one one-layer pool), which grows by batch.length(b) (all or nothing: CapacityError and
// no sequence changed when the pool is short). A decode step: T = 1, lengths 1 (or 0).
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, PagedSequence<T>* const* seqs, Workspace<T>& ws,
                       MatrixRef<T> out) {
  for (Index b = 0; b < batch.batch(); ++b)
    if (seqs[b] == nullptr) throw ShapeError("sequences: entry " + std::to_string(b) + " is null");
  detail::batch_forward_paged<T>(
      w, detail::as_view<T>(x), batch, [&](Index b) -> PagedSequence<T>& { return *seqs[b]; }, 0,
      true, ws, out);
}

// Layer `layer` of a batched model step, every sequence grown already: sequence b's real rows
// are its last batch.length(b) positions.
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, PagedSequence<T>* const* seqs, Index layer,
                       Workspace<T>& ws, MatrixRef<T> out) {
  for (Index b = 0; b < batch.batch(); ++b)
    if (seqs[b] == nullptr) throw ShapeError("sequences: entry " + std::to_string(b) + " is null");
  detail::batch_forward_paged<T>(
      w, detail::as_view<T>(x), batch, [&](Index b) -> PagedSequence<T>& { return *seqs[b]; },
      layer, false, ws, out);
}

// The two above with a vector of B pointers.
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, const std::vector<PagedSequence<T>*>& seqs,
                       Workspace<T>& ws, MatrixRef<T> out) {
  if (static_cast<Index>(seqs.size()) != batch.batch())
    throw ShapeError("sequences: expected one paged sequence per sequence of the batch (" +
                     std::to_string(batch.batch()) + "), got " + std::to_string(seqs.size()));
  attention_forward<T>(w, x, batch, seqs.data(), ws, out);
}
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, const std::vector<PagedSequence<T>*>& seqs,
                       Index layer, Workspace<T>& ws, MatrixRef<T> out) {
  if (static_cast<Index>(seqs.size()) != batch.batch())
    throw ShapeError("sequences: expected one paged sequence per sequence of the batch (" +
                     std::to_string(batch.batch()) + "), got " + std::to_string(seqs.size()));
  attention_forward<T>(w, x, batch, seqs.data(), layer, ws, out);
}

}  // namespace gpt2
