// gpt2-attention run --prefill N on one sequence: the forward through a KV cache, as a decoder
// runs it: the first N tokens as one chunk (the prompt), then every later token on its own.
//
//   x [T, C] -> out [T, C] (and probs [n_head * T, T] = [n_head, T, T]), the same as one forward
//   over x up to rounding (bitwise when N >= T: one chunk).
//
// Chunk c covers positions n_past .. n_past + T_c - 1 and gives probs [n_head * T_c, n_past + T_c]
// (row i: keys 0 .. n_past + i, exact zeros after them); head h's rows go to rows
// h*T + n_past .. of the full map, whose other entries are 0.
#pragma once

#include <algorithm>

#include "gpt2/attention.hpp"

namespace gpt2::cli {

// Runs x through one KVCache of capacity T, chunks of prefill tokens then 1, 1, ...; writes every
// row of out, and of probs when it is not null (resized to [n_head * T, T]). The cache, the
// workspace and the chunk's probability buffer are allocated once, before the first chunk.
template <class T>
void prefill_forward(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x, Index prefill,
                     MatrixRef<T> out, RowMatrix<T>* probs) {
  const Index T_ = x.rows(), n_head = w.n_head();
  const Index first = std::min(prefill, T_);
  const Index max_chunk = std::max(first, std::min<Index>(T_, 1));
  KVCache<T> cache(w.config(), T_);
  Workspace<T> ws(w.config(), max_chunk, T_);
  RowMatrix<T> chunk_probs;  // [n_head * max_chunk, T]: room for the largest chunk's map
  if (probs) {
    probs->setZero(n_head * T_, T_);
    chunk_probs.resize(n_head * max_chunk, T_);
  }
  for (Index n_past = 0; n_past < T_;) {
    const Index T_c = n_past == 0 && first > 0 ? first : 1, n_keys = n_past + T_c;
    MatrixRef<T> out_c = out.middleRows(n_past, T_c);
    if (!probs) {
      attention_forward<T>(w, x.middleRows(n_past, T_c), cache, ws, out_c);
    } else {
      Eigen::Map<RowMatrix<T>> p(chunk_probs.data(), n_head * T_c, n_keys);  // contiguous
      attention_forward<T>(w, x.middleRows(n_past, T_c), cache, ws, out_c, p);
      for (Index h = 0; h < n_head; ++h)
        probs->block(h * T_ + n_past, 0, T_c, n_keys) = p.middleRows(h * T_c, T_c);
    }
    n_past += T_c;
  }
}

}  // namespace gpt2::cli
