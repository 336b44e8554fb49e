// gpt2-attention run on a batch X [B, T, C] (read as the row-major [B * T, C]) whose real rows a
// BatchLayout gives (run_input.hpp): the batched API, plain or through one KV cache per sequence.
//
//   batch_forward   out [B * T, C]: each sequence's real rows through the batched forward
//   batch_decode    out [B * T, C]: the same through KV caches (--prefill N), as a batched decoder
//                   runs it: a first step of min(N, l_b) tokens per sequence, then one token per
//                   unfinished sequence per step
//   batch_probs     probs [B * n_head * T, T] = [B, n_head, T, T]: each sequence's real rows alone
//                   through the single-sequence forward (the batched API gives no probabilities)
//
// Padded rows of out, and padded rows and columns of probs, are exactly 0; padded input rows are
// never read (they may hold anything, NaN included).
#pragma once

#include <algorithm>
#include <vector>

#include "gpt2/attention.hpp"

namespace gpt2::cli {

template <class T>
void batch_forward(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                   const BatchLayout& layout, MatrixRef<T> out) {
  Workspace<T> ws(w.config(), layout.max_length());
  attention_forward<T>(w, x, layout, ws, out);
}

// Step 0 reads x and writes out in place: sequence b's first min(prefill, l_b) real rows, the
// rest of out zeroed by the library. Each later step gathers the next token of every unfinished
// sequence into x_step [B, C] (T_step = 1; a finished sequence has length 0) and scatters out_step
// [B, C] back. One cache of capacity T per sequence; caches, workspace and step buffers are
// allocated once, before step 0.
template <class T>
void batch_decode(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                  const BatchLayout& layout, Index prefill, MatrixRef<T> out) {
  const Index B = layout.batch(), T_ = layout.tokens(), C = w.n_embd();
  std::vector<KVCache<T>> caches;
  caches.reserve(static_cast<std::size_t>(B));
  for (Index b = 0; b < B; ++b) caches.emplace_back(w.config(), T_);
  Workspace<T> ws(w.config(), std::max(std::min(prefill, T_), std::min<Index>(T_, 1)), T_);
  RowMatrix<T> x_step = RowMatrix<T>::Zero(B, C), out_step(B, C);
  BatchLayout step = BatchLayout::full(B, 1);

  BatchLayout first = layout;
  for (Index b = 0; b < B; ++b) first.set(b, layout.start(b), std::min(prefill, layout.length(b)));
  attention_forward<T>(w, x, first, caches, ws, out);

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
    attention_forward<T>(w, x_step, step, caches, ws, out_step);
    for (Index b = 0; b < B; ++b)
      if (step.length(b) == 1)
        out.row(layout.first_row(b) + caches[static_cast<std::size_t>(b)].n_past() - 1) =
            out_step.row(b);
  }
}

template <class T>
RowMatrix<T> batch_probs(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                         const BatchLayout& layout) {
  const Index B = layout.batch(), T_ = layout.tokens(), n_head = w.n_head();
  const Index max_length = layout.max_length();
  RowMatrix<T> probs = RowMatrix<T>::Zero(B * n_head * T_, T_);
  Workspace<T> ws(w.config(), max_length);
  RowMatrix<T> out_b(max_length, w.n_embd()), probs_b(n_head * max_length, max_length);
  for (Index b = 0; b < B; ++b) {
    const Index l = layout.length(b), s = layout.start(b);
    Eigen::Map<RowMatrix<T>> p(probs_b.data(), n_head * l, l);  // contiguous [n_head, l, l]
    attention_forward<T>(w, x.middleRows(layout.first_row(b), l), ws, out_b.topRows(l), p);
    for (Index h = 0; h < n_head; ++h)
      probs.block((b * n_head + h) * T_ + s, s, l, l) = p.middleRows(h * l, l);
  }
  return probs;
}

}  // namespace gpt2::cli
