// gpt2-attention run on a batch X [B, T, C] (read as the row-major [B * T, C]) whose real rows a
// BatchLayout gives (run_input.hpp): the batched API, plain or through one KV cache per sequence.
//
//   batch_forward   out [B * T, C]: each sequence's real rows through the batched forward
//   batch_decode    out [B * T, C]: the same through KV caches (--prefill N), as a batched decoder
//                   runs it: a first step of min(N, l_b) tokens per sequence, then one token per
//                   unfinished sequence per step
//   batch_probs     probs [B * n_head * T, T] = [B, n_head, T, T]: each sequence's real rows alone
//                   through the single-sequence forward, without a cache (the batched API gives no
//                   probabilities), its maps written straight into its block (head_maps.hpp)
//
// Padded rows of out, and padded rows and columns of probs, are exactly 0; padded input rows are
// never read (they may hold anything, NaN included).
//
// w: the whole model, or a TensorParallelAttention<T> shard (its caches and workspaces over its
// heads, its probs its own heads': n_head is w.heads_here(), sublayer.hpp).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "head_maps.hpp"
#include "sublayer.hpp"

namespace gpt2::cli {

template <class T>
void batch_forward(const RunSublayer<T>& w, const ConstMatrixRef<T>& x, const BatchLayout& layout,
                   MatrixRef<T> out) {
  Workspace<T> ws = w.workspace(layout.max_length());
  w.forward(x, layout, ws, out);
}

// Step 0 reads x and writes out in place: sequence b's first min(prefill, l_b) real rows, the
// rest of out zeroed by the library. Each later step gathers the next token of every unfinished
// sequence into x_step [B, C] (T_step = 1; a finished sequence has length 0) and scatters out_step
// [B, C] back. Sequence b's cache holds its l_b tokens (capacity l_b, not T); the workspace holds
// the largest step (min(prefill, L) tokens, or 1) attending to up to L keys, L the longest
// sequence. Caches, workspace and step buffers are allocated once, before step 0.
// S: the caches' storage, T (KVCache<T>), or bfloat16 or int8 for float (run --kv-cache
// bf16|int8); sequence b's holds l_b positions.
template <class T, class S>
void batch_decode(const RunSublayer<T>& w, const ConstMatrixRef<T>& x, const BatchLayout& layout,
                  Index prefill, MatrixRef<T> out) {
  const Index B = layout.batch(), C = w.n_embd(), L = layout.max_length();
  std::vector<KVCache<S>> caches;
  caches.reserve(static_cast<std::size_t>(B));
  for (Index b = 0; b < B; ++b) caches.emplace_back(w.heads_config(), layout.length(b));
  Workspace<T> ws = w.workspace(std::max(std::min(prefill, L), std::min<Index>(L, 1)), L);
  RowMatrix<T> x_step = RowMatrix<T>::Zero(B, C), out_step(B, C);
  BatchLayout step = BatchLayout::full(B, 1);

  BatchLayout first = layout;
  for (Index b = 0; b < B; ++b) first.set(b, layout.start(b), std::min(prefill, layout.length(b)));
  w.forward(x, first, caches, ws, out);

  for (;;) {
    bool any = false;
    for (Index b = 0; b < B; ++b) {
      const Index next = caches[static_cast<std::size_t>(b)].n_past();  // tokens done
      const bool unfinished = next < layout.length(b);
      if (unfinished) x_step.row(b) = x.row(layout.first_row(b) + next);
      step.set(b, 0, unfinished ? 1 : 0);
      any = any || unfinished;
    }
    if (!any) return;
    w.forward(x_step, step, caches, ws, out_step);
    for (Index b = 0; b < B; ++b)
      if (step.length(b) == 1)
        out.row(layout.first_row(b) + caches[static_cast<std::size_t>(b)].n_past() - 1) =
            out_step.row(b);
  }
}

// Fills probs, which must already be [B * n_head * T, T] (the caller allocates it before anything
// is computed): sequence b's maps are computed into the tail of its block of n_head * T * T values
// and spread from there; a sequence of all T rows (start 0, length T) is computed in place. No
// second copy of any map: the only scratch is the workspace and one sequence's discarded Y.
template <class T>
void batch_probs(const RunSublayer<T>& w, const ConstMatrixRef<T>& x, const BatchLayout& layout,
                 RowMatrix<T>& probs) {
  const Index B = layout.batch(), T_ = layout.tokens(), n_head = w.heads_here();
  if (probs.rows() != B * n_head * T_ || probs.cols() != T_)
    throw ShapeError("batch_probs: expected probs [" + std::to_string(B * n_head * T_) + ", " +
                     std::to_string(T_) + "], got [" + std::to_string(probs.rows()) + ", " +
                     std::to_string(probs.cols()) + "]");
  const Index max_length = layout.max_length();
  Workspace<T> ws = w.workspace(max_length);
  RowMatrix<T> out_b(max_length, w.n_embd());
  for (Index b = 0; b < B; ++b) {
    const Index l = layout.length(b), s = layout.start(b);
    T* block = probs.data() + b * n_head * T_ * T_;
    MatrixRef<T> maps = maps_in_tail(block, n_head, T_, l);
    w.forward(x.middleRows(layout.first_row(b), l), ws, out_b.topRows(l), &maps);
    spread_maps(block, n_head, T_, s, l);
  }
}

}  // namespace gpt2::cli
