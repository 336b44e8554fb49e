// gpt2-attention run --prefill N on one sequence: the forward through a KV cache, as a decoder
// runs it: the first N tokens as one chunk (the prompt), then every later token on its own.
//
//   x [T, C] -> out [T, C] (and probs [n_head * T, T] = [n_head, T, T]), the same as one forward
//   over x: bitwise in float at the avx2 and avx512 levels (and when N >= T: one chunk), up to
//   rounding at the generic level and in double.
//
// Chunk c covers positions n_past .. n_past + T_c - 1 and gives probs [n_head * T_c, n_past + T_c]
// (row i: keys 0 .. n_past + i, exact zeros after them); head h's rows belong at rows
// h*T + n_past .. of the full map, whose other entries are 0. Every chunk's map is written into
// the full map itself, never into a second buffer:
//   - the first chunk (n_past = 0, T_c = min(N, T)) into the full map's tail, then moved to its
//     place (head_maps.hpp); with N >= T it fills the map and is written in place;
//   - a one-token chunk's n_head rows are rows h*T + n_past of the full map: evenly spaced
//     (T * T apart), so they are one strided view of it.
#pragma once

#include <algorithm>
#include <string>

#include "gpt2/attention.hpp"
#include "head_maps.hpp"
#include "sublayer.hpp"

namespace gpt2::cli {

// Runs x through one KV cache of capacity T, chunks of prefill tokens then 1, 1, ...; writes every
// row of out, and every value of probs when it is not null. probs must already be [n_head * T, T]
// (the caller allocates it before anything is computed). The cache and the workspace are
// allocated once, before the first chunk. w: the whole model, or a TensorParallelAttention<T>
// shard, whose probs are its own heads' (n_head: w.heads_here(), sublayer.hpp).
// Cache: KVCache<T> (w.cache), or KVCache<bfloat16> or KVCache<int8> for float (run --kv-cache
// bf16|int8), of capacity T, empty.
template <class T, class Cache>
void prefill_forward_through(const RunSublayer<T>& w, const ConstMatrixRef<T>& x, Index prefill,
                             MatrixRef<T> out, RowMatrix<T>* probs, Cache& cache) {
  const Index T_ = x.rows(), n_head = w.heads_here();
  if (probs && (probs->rows() != n_head * T_ || probs->cols() != T_))
    throw ShapeError("prefill_forward: expected probs [" + std::to_string(n_head * T_) + ", " +
                     std::to_string(T_) + "], got [" + std::to_string(probs->rows()) + ", " +
                     std::to_string(probs->cols()) + "]");
  const Index first = std::min(prefill, T_);
  const Index max_chunk = std::max(first, std::min<Index>(T_, 1));
  Workspace<T> ws = w.workspace(max_chunk, T_);

  Index n_past = 0;
  if (first > 0) {
    MatrixRef<T> out_c = out.topRows(first);
    if (probs) {
      MatrixRef<T> maps = maps_in_tail(probs->data(), n_head, T_, first);
      w.forward(x.topRows(first), cache, ws, out_c, &maps);
    } else {
      w.forward(x.topRows(first), cache, ws, out_c, nullptr);
    }
    n_past = first;
  }
  if (probs) spread_maps(probs->data(), n_head, T_, 0, first);  // with first = 0: all zeros
  for (; n_past < T_; ++n_past) {
    MatrixRef<T> out_c = out.middleRows(n_past, 1);
    if (probs) {
      // Rows h*T + n_past, h = 0 .. n_head - 1, keys 0 .. n_past: the later keys stay 0.
      Eigen::Map<RowMatrix<T>, 0, Eigen::OuterStride<>> p(probs->data() + n_past * T_, n_head,
                                                           n_past + 1,
                                                           Eigen::OuterStride<>(T_ * T_));
      MatrixRef<T> p_ref = p;
      w.forward(x.middleRows(n_past, 1), cache, ws, out_c, &p_ref);
    } else {
      w.forward(x.middleRows(n_past, 1), cache, ws, out_c, nullptr);
    }
  }
}

// The same through a KVCache<T> (w.cache(T)).
template <class T>
void prefill_forward(const RunSublayer<T>& w, const ConstMatrixRef<T>& x, Index prefill,
                     MatrixRef<T> out, RowMatrix<T>* probs) {
  KVCache<T> cache = w.cache(x.rows());
  prefill_forward_through<T>(w, x, prefill, out, probs, cache);
}

}  // namespace gpt2::cli
