// gpt2-attention run --share-prefix N on a batch X [B, T, C]: the first N real rows of every
// sequence are the same tokens (checked); they go through the sublayer once, into the blocks of
// one paged sequence (paged_kv_cache.hpp), every sequence forks from it, sharing those blocks,
// and goes on as --prefill P does (P counted from the start of the sequence; without --prefill,
// the rest of each sequence in one step):
//
//   prefix   rows 0 .. N-1 of sequence 0: a chunk of min(P, N) rows, then one row at a time
//   step 0   sequence b's rows N .. min(P, l_b) - 1, batched (none when P <= N)
//   steps    one row of every unfinished sequence, batched, until each has its l_b rows
//
// Y is byte-identical to the same run without --share-prefix when every row's result does not
// depend on the rows computed with it (float at the avx2 and avx512 levels, whose projections and
// fused attention core are row-exact); else the same up to rounding, as --prefill is.
#pragma once

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/paged_kv_cache.hpp"
#include "sublayer.hpp"

namespace gpt2::cli {

// --share-prefix N against the input's shape (before anything is read into a layout): a 3-D
// input, N <= T. ShapeError naming the flag, what was expected and what was got.
inline void check_share_prefix_shape(const std::vector<std::int64_t>& shape, Index n) {
  if (shape.size() != 3)
    throw ShapeError("--share-prefix: expected a 3-D input [B, T, C] (a batch of sequences), got input " +
                     detail::shape_string(shape));
  if (n > shape[1])
    throw ShapeError("--share-prefix: expected at most " + std::to_string(shape[1]) +
                     " rows (T of input " + detail::shape_string(shape) + "), got " +
                     std::to_string(n));
}

// Every sequence has at least n real rows and its first n are byte for byte sequence 0's; else
// an Error naming the sequence and the row.
template <class T>
void check_shared_prefix(const ConstMatrixRef<T>& x, const BatchLayout& layout, Index n) {
  for (Index b = 0; b < layout.batch(); ++b) {
    if (layout.length(b) < n)
      throw ShapeError("--share-prefix " + std::to_string(n) + ": sequence " + std::to_string(b) +
                       " has " + std::to_string(layout.length(b)) +
                       " real rows, fewer than the shared prefix");
    for (Index r = 0; r < n && b > 0; ++r)
      if (std::memcmp(x.row(layout.first_row(b) + r).data(), x.row(layout.first_row(0) + r).data(),
                      static_cast<std::size_t>(x.cols()) * sizeof(T)) != 0)
        throw Error("--share-prefix " + std::to_string(n) + ": sequence " + std::to_string(b) +
                    "'s row " + std::to_string(r) + " differs from sequence 0's (the first " +
                    std::to_string(n) + " real rows of every sequence must be the same tokens)");
  }
}

// Fills out [B * T, C] (padded rows 0) as described above. prefill: --prefill P, or none.
// w: the whole model or a rank's TensorParallelAttention<T> (sublayer.hpp); S: the pool's
// storage, T, bfloat16 or int8 (--kv-cache bf16|int8).
template <class T, class S>
void shared_prefix_decode(const RunSublayer<T>& w, const ConstMatrixRef<T>& x, const BatchLayout& layout,
                          Index n, std::optional<Index> prefill, MatrixRef<T> out) {
  check_shared_prefix<T>(x, layout, n);
  const Index B = layout.batch(), C = w.n_embd(), L = layout.max_length();
  const Index P = prefill ? *prefill : L;  // no --prefill: the rest of a sequence in one step
  // Blocks: the prefix's, and each sequence's own (its copy of a shared partial block included).
  Index blocks = (n + kKVBlockRows - 1) / kKVBlockRows;
  for (Index b = 0; b < B; ++b) blocks += (layout.length(b) + kKVBlockRows - 1) / kKVBlockRows;
  KVBlockPool<S> pool(w.heads_config(), blocks);
  const Index first_chunk = std::min(P, n), step0 = std::max<Index>(std::min(P, L) - n, 0);
  Workspace<T> ws = w.workspace(std::max({first_chunk, step0, std::min<Index>(L, 1)}), L);

  PagedSequence<S> prefix(pool, n);
  RowMatrix<T> prefix_out(n, C);
  const ConstMatrixRef<T> x_prefix = x.middleRows(layout.first_row(0), n);
  if (first_chunk > 0)
    w.forward(x_prefix.topRows(first_chunk), prefix, ws, prefix_out.topRows(first_chunk));
  for (Index r = first_chunk; r < n; ++r)
    w.forward(x_prefix.middleRows(r, 1), prefix, ws, prefix_out.middleRows(r, 1));

  std::vector<PagedSequence<S>> seqs;
  seqs.reserve(static_cast<std::size_t>(B));
  std::vector<PagedSequence<S>*> ptrs;
  for (Index b = 0; b < B; ++b) {
    seqs.push_back(prefix.fork());
    seqs.back().reserve(layout.length(b));
  }
  for (PagedSequence<S>& s : seqs) ptrs.push_back(&s);
  prefix.release();  // the sequences hold its blocks

  BatchLayout first = layout;
  for (Index b = 0; b < B; ++b)
    first.set(b, layout.start(b) + n, std::max<Index>(std::min(P, layout.length(b)) - n, 0));
  w.forward(x, first, ptrs, ws, out);  // also zeroes every row but step 0's

  RowMatrix<T> x_step = RowMatrix<T>::Zero(B, C), out_step(B, C);
  BatchLayout step = BatchLayout::full(B, 1);
  for (;;) {
    bool any = false;
    for (Index b = 0; b < B; ++b) {
      const Index next = seqs[static_cast<std::size_t>(b)].length();  // rows done
      const bool unfinished = next < layout.length(b);
      if (unfinished) x_step.row(b) = x.row(layout.first_row(b) + next);
      step.set(b, 0, unfinished ? 1 : 0);
      any = any || unfinished;
    }
    if (!any) break;
    w.forward(x_step, step, ptrs, ws, out_step);
    for (Index b = 0; b < B; ++b)
      if (step.length(b) == 1)
        out.row(layout.first_row(b) + seqs[static_cast<std::size_t>(b)].length() - 1) = out_step.row(b);
  }
  for (Index b = 0; b < B; ++b) out.middleRows(layout.first_row(b), n) = prefix_out;
}

}  // namespace gpt2::cli
