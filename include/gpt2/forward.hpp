// The whole sublayer: qkv projection -> per-head causal attention -> merge -> output projection.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>

#include "gpt2/causal_attention.hpp"
#include "gpt2/config.hpp"
#include "gpt2/error.hpp"
#include "gpt2/parallel.hpp"
#include "gpt2/projection.hpp"
#include "gpt2/qkv.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"
#include "gpt2/workspace.hpp"

namespace gpt2 {

namespace detail {

template <class T>
void check_workspace(const AttentionWeights<T>& w, const Workspace<T>& ws) {
  const AttentionConfig& a = w.config();
  const AttentionConfig& b = ws.config();
  if (a.n_embd != b.n_embd || a.n_head != b.n_head)
    throw ConfigError("workspace: expected n_embd " + std::to_string(a.n_embd) + ", n_head " +
                      std::to_string(a.n_head) + " (the weights'), got n_embd " +
                      std::to_string(b.n_embd) + ", n_head " + std::to_string(b.n_head));
}

// Once the workspace has room for T_new tokens: out and probs must not overlap the workspace's
// buffers (the steps would read what another step has overwritten), nor each other. out and probs
// may alias x: x is fully read by the first step.
template <class T>
void check_workspace_overlap(const Workspace<T>& ws, Index T_new, const MatrixRef<T>& out,
                             const MatrixRef<T>* probs) {
  if (T_new == 0) return;
  const ConstMatrixRef<T> qkv = ws.qkv.topRows(T_new), merged = ws.merged.topRows(T_new);
  if (overlaps(out, qkv) || overlaps(out, merged))
    throw ShapeError("out: must not overlap the workspace");
  if (probs && (overlaps(*probs, out) || overlaps(*probs, qkv) || overlaps(*probs, merged)))
    throw ShapeError("probs: must not overlap out or the workspace");
}

// Columns of a projection are handed to threads in multiples of this many: a multiple of every
// row panel Eigen's GEMM kernel uses (3 packets: 48 floats with AVX-512, 24 with AVX, 12 with
// SSE) and of the vector levels' 32-column panels, so each part is covered by full panels and
// every column of the output is computed by the same kernel path, with the same sums, whatever
// the split.
inline constexpr Index kProjectionColumnAlign = 192;

// Rows of a projection per thread from which the vector levels split the rows, not the columns,
// over threads (each thread then reads all of the weight but only its rows of x and out; measured
// faster on two cores from T = 128 up: qkv at T = 1024 1.08x). Below it (a decode step, short
// prompts), the columns.
inline constexpr Index kProjectionRowSplit = 64;

// out[T, N] = x[T, K] @ weight[K, N] + bias[N] on n_threads threads, part t in ws.threads[t].gemm.
// The parts are row ranges at the vector levels (float; their gemm gives a row the same bits
// whatever rows go with it) when there are at least kProjectionRowSplit rows per thread, else
// column ranges (each column is computed the same way whatever the split): either way the result
// does not depend on n_threads. packed: weight in the panel layout, or null (pack_weights). out
// must not overlap x or weight.
// PyTorch: torch.addmm(bias, x, weight)
// (projection_parts: how many parts, at most n_threads; projection_part: part `part` of them, on
// thread `thread`: what projection_parallel runs on each, and a decode step's region too.)
template <class T>
Index projection_parts(const Workspace<T>& ws, int n_threads) {
  return std::min<Index>(n_threads, ws.thread_capacity());
}
template <class T>
void projection_part(const ConstMatrixRef<T>& x, const ConstMatrixRef<T>& weight,
                     const PackedMatrix* packed, const ConstVectorMap<T>& bias, MatrixRef<T>& out,
                     Workspace<T>& ws, Index part, Index parts, int thread) {
  const Index N = weight.cols(), M = x.rows();
  const bool by_rows = parts > 1 && vector_kernels<T>() != nullptr && M >= kProjectionRowSplit * parts;
  GemmScratch<T>& gemm = ws.threads[static_cast<std::size_t>(thread)].gemm;
  if (by_rows) {
    const ColumnRange rows = column_part(M, part, parts, 1);
    if (rows.size() == 0) return;
    MatrixRef<T> out_part = out.middleRows(rows.begin, rows.size());
    projection_columns<T>(x.middleRows(rows.begin, rows.size()), weight, packed, bias, 0, N,
                          out_part, gemm);
    return;
  }
  const ColumnRange cols = column_part(N, part, parts, kProjectionColumnAlign);
  if (cols.size() == 0) return;
  MatrixRef<T> out_part = out.middleCols(cols.begin, cols.size());
  projection_columns<T>(x, weight, packed, bias, cols.begin, cols.size(), out_part, gemm);
}
template <class T>
void projection_parallel(const ConstMatrixRef<T>& x, const ConstMatrixRef<T>& weight,
                         const PackedMatrix* packed, const ConstVectorMap<T>& bias,
                         MatrixRef<T>& out, Workspace<T>& ws, int n_threads) {
  const Index parts = projection_parts(ws, n_threads);
  parallel_tasks(parts, static_cast<int>(parts), [&](Index part, int thread) {
    projection_part<T>(x, weight, packed, bias, out, ws, part, parts, thread);
  });
}

// Records the weights' precision in ws's per-thread attention scratch: with bf16 weights the
// fused core's products run in bf16 too (at the amx level; kernels/amx_attention.hpp).
// With bf16 it also grows every thread's tile buffer to the AMX core's here, before any thread
// starts (once: the first bf16 forward), so that no later forward allocates, whichever threads
// its tiles land on.
template <class T>
void use_weight_dtype(Workspace<T>& ws, WeightDtype dtype) {
  for (ThreadScratch<T>& t : ws.threads) {
    t.attention.set_bf16_products(dtype == WeightDtype::bf16);
    if (dtype == WeightDtype::bf16) t.attention.reserve_tile(ws.config().head_dim());
  }
}

// qkv [T, 3C] = x @ c_attn.weight + c_attn.bias, and out [T, C] = merged @ c_proj.weight +
// c_proj.bias, on n_threads threads (the packed copies when w has them). qkv_parallel, the first
// step of every forward, also records the weights' precision for the attention (use_weight_dtype).
template <class T>
void qkv_parallel(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x, MatrixRef<T>& qkv,
                  Workspace<T>& ws, int n_threads) {
  use_weight_dtype(ws, w.weight_dtype());
  projection_parallel<T>(x, w.c_attn_weight(), w.packed_c_attn_weight(), w.c_attn_bias(), qkv, ws,
                         n_threads);
}
template <class T>
void proj_parallel(const AttentionWeights<T>& w, const ConstMatrixRef<T>& merged,
                   MatrixRef<T>& out, Workspace<T>& ws, int n_threads) {
  projection_parallel<T>(merged, w.c_proj_weight(), w.packed_c_proj_weight(), w.c_proj_bias(), out,
                         ws, n_threads);
}

// A decode step (one row) with fewer heads than threads: each head's keys split into chunks of
// 64-key blocks over the threads, every block a partial, then each head's partials merged in block
// order, so the step gives the bits of the unsplit one on any thread count. False (nothing done)
// when the step does not call for it. Shapes already checked.
template <class T, class KeysOf, class ValuesOf, class KeyBlocksOf>
bool split_decode_step(const AttentionConfig& config, const ConstMatrixRef<T>& qkv,
                       const KeysOf& keys_of, const ValuesOf& values_of,
                       const KeyBlocksOf& key_blocks_of, Workspace<T>& ws, MatrixRef<T>& merged,
                       int n_threads) {
  const Index n_head = config.n_head, hd = config.head_dim();
  if (qkv.rows() != 1 || n_head >= n_threads) return false;
  const Index n_keys = keys_of(0).rows();
  const Index n_blocks = (n_keys + kernels::kKeyBlock - 1) / kernels::kKeyBlock;
  const Index chunks = std::min<Index>(n_blocks, (n_threads + n_head - 1) / n_head);
  const Index stride = kernels::partial_stride(hd);
  if (chunks < 2 || n_head * n_blocks * stride > ws.partials_size()) return false;
  for (Index h = 0; h < n_head; ++h)
    if (keys_of(h).outerStride() != values_of(h).outerStride()) return false;  // one row stride
  T* parts = ws.partials();
  parallel_tasks(n_head * chunks, n_threads, [&](Index task, int thread) {
    const Index h = task / chunks, c = task % chunks;
    const Index b0 = c * n_blocks / chunks, b1 = (c + 1) * n_blocks / chunks;
    const ConstMatrixRef<T> k = keys_of(h), v = values_of(h);
    const T* key_page = k.data();
    const T* value_page = v.data();
    HeadPages<T> kv;
    kv.key_pages = &key_page;
    kv.value_pages = &value_page;
    kv.page_rows = n_keys;
    kv.row_stride = k.outerStride();
    kv.n_keys = n_keys;
    kv.head_dim = hd;
    kv.keys_t = key_blocks_of(h);
    attention_row_partials<T>(q_view(qkv, config, h), kv, b0, b1,
                              parts + (h * n_blocks + b0) * stride,
                              ws.threads[static_cast<std::size_t>(thread)].attention);
  });
  parallel_tasks(n_head, n_threads, [&](Index h, int thread) {
    merge_row_partials<T>(hd, n_keys, parts + h * n_blocks * stride,
                          head_slot(merged, config, h).data(),
                          ws.threads[static_cast<std::size_t>(thread)].attention);
  });
  return true;
}

// Steps 3 and 4 for the T new tokens whose projections are in qkv [T, 3C]: head h attends with
// q_view(qkv, h) to keys_of(h), values_of(h) [n_keys, head_dim] (n_keys >= T; the last T of them
// belong to the new tokens) and writes its slot of merged [T, C]. probs (or null)
// [n_head * T, n_keys]. The (head, row tile) pairs run in parallel on n_threads threads, head by
// head (the threads share one head's keys and values in cache), each head's costliest tiles (the
// last rows, which see the most keys) first; ws must have room for n_keys keys on n_threads
// threads.
// A decode step with fewer heads than threads is split_decode_step's. key_blocks_of(h): head h's
// keys transposed in 64-key blocks (a KV cache's transposed_key_blocks), or null (NoKeyBlocks).
struct NoKeyBlocks {
  template <class H>
  std::nullptr_t operator()(H) const {
    return nullptr;
  }
};
template <class T, class KeysOf, class ValuesOf, class KeyBlocksOf = NoKeyBlocks>
void attend_heads(const AttentionConfig& config, const ConstMatrixRef<T>& qkv,
                  const KeysOf& keys_of, const ValuesOf& values_of, Workspace<T>& ws,
                  MatrixRef<T>& merged, MatrixRef<T>* probs, int n_threads,
                  const KeyBlocksOf& key_blocks_of = KeyBlocksOf{}) {
  const Index T_ = qkv.rows(), n_head = config.n_head;
  for (Index h = 0; h < n_head; ++h) {  // every check before any thread starts
    MatrixRef<T> y = head_slot(merged, config, h);
    if (probs) {
      MatrixRef<T> p = probs->middleRows(h * T_, T_);
      check_attention_head<T>(q_view(qkv, config, h), keys_of(h), values_of(h), y, &p);
    } else {
      check_attention_head<T>(q_view(qkv, config, h), keys_of(h), values_of(h), y, nullptr);
    }
  }
  const Index row_block = ws.threads.empty() ? kAttentionRowBlock
                                             : attention_row_block(ws.threads[0].attention,
                                                                   config.head_dim(), probs != nullptr);
  const Index tiles = attention_row_tiles(T_, row_block);
  if (!probs &&
      split_decode_step<T>(config, qkv, keys_of, values_of, key_blocks_of, ws, merged, n_threads))
    return;
  if (probs) ws.reserve_probabilities();  // the probabilities' score tiles (the first time)
  parallel_tasks(n_head * tiles, n_threads, [&](Index task, int thread) {
    const Index h = task / tiles, tile = tiles - 1 - task % tiles;
    const Index r0 = tile * row_block, nb = std::min(row_block, T_ - r0);
    MatrixRef<T> y = head_slot(merged, config, h);
    AttentionScratch<T>& scratch = ws.threads[static_cast<std::size_t>(thread)].attention;
    if (probs) {
      MatrixRef<T> p = probs->middleRows(h * T_, T_);
      attention_row_tile<T>(q_view(qkv, config, h), keys_of(h), values_of(h), r0, nb, y, &p,
                            scratch);
    } else {
      attention_row_tile<T>(q_view(qkv, config, h), keys_of(h), values_of(h), r0, nb, y, nullptr,
                            scratch, key_blocks_of(h));
    }
  });
}

// Steps 3 to 5: attend_heads, then out [T, C] = merged @ c_proj.weight + c_proj.bias.
template <class T, class KeysOf, class ValuesOf, class KeyBlocksOf = NoKeyBlocks>
void attend_and_project(const AttentionWeights<T>& w, const ConstMatrixRef<T>& qkv,
                        const KeysOf& keys_of, const ValuesOf& values_of, Workspace<T>& ws,
                        MatrixRef<T>& merged, MatrixRef<T>& out, MatrixRef<T>* probs,
                        int n_threads, const KeyBlocksOf& key_blocks_of = KeyBlocksOf{}) {
  attend_heads<T>(w.config(), qkv, keys_of, values_of, ws, merged, probs, n_threads,
                  key_blocks_of);
  const ConstMatrixRef<T> merged_read = merged;
  proj_parallel<T>(w, merged_read, out, ws, n_threads);
}

// Threads a forward over T tokens uses: num_threads(), capped by the workspace's thread slots.
template <class T>
int forward_threads(const Workspace<T>& ws) {
  return static_cast<int>(std::min<Index>(num_threads(), ws.thread_capacity()));
}

// Body shared by the two overloads; `probs` is null when not requested.
template <class T>
void attention_forward(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x, Workspace<T>& ws,
                       MatrixRef<T>& out, MatrixRef<T>* probs) {
  const AttentionConfig& config = w.config();
  const Index T_ = x.rows(), C = config.n_embd, n_head = config.n_head;
  check_shape("x", {T_, C}, {x.rows(), x.cols()});
  check_shape("out", {T_, C}, {out.rows(), out.cols()});
  if (probs) check_shape("probs", {n_head * T_, T_}, {probs->rows(), probs->cols()});
  check_workspace(w, ws);
  if (T_ == 0) return;
  ws.reserve(T_);

  check_workspace_overlap<T>(ws, T_, out, probs);
  MatrixRef<T> qkv = ws.qkv.topRows(T_);
  MatrixRef<T> merged = ws.merged.topRows(T_);
  const int n_threads = forward_threads(ws);
  // x is fully read here: out may alias x
  qkv_parallel<T>(w, x, qkv, ws, n_threads);
  const ConstMatrixRef<T> qkv_read = qkv;
  attend_and_project<T>(
      w, qkv_read, [&](Index h) { return k_view(qkv_read, config, h); },
      [&](Index h) { return v_view(qkv_read, config, h); }, ws, merged, out, probs, n_threads);
}

}  // namespace detail

// out = GPT-2 attention sublayer(x)
//   x [T, C] (read; a row-major matrix or view, e.g. a Map over your buffer),
//   out [T, C] (written; may be the same storage as x)
//   ws: scratch for at least T tokens (grown if smaller; no allocation when it is big enough)
// PyTorch (HF): GPT2Attention(x)[0] with c_attn, c_proj of `w`
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       Workspace<T>& ws, MatrixRef<T> out) {
  detail::attention_forward<T>(w, detail::as_view<T>(x), ws, out, nullptr);
}

// Same, also writing the attention probabilities of every head.
//   probs [n_head * T, T] (written): rows h*T .. h*T + T - 1 are head h's [T, T] map, i.e. the
//   row-major [n_head, T, T] tensor; entries above the diagonal are exactly 0.
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       Workspace<T>& ws, MatrixRef<T> out, MatrixRef<T> probs) {
  detail::attention_forward<T>(w, detail::as_view<T>(x), ws, out, &probs);
}

// Convenience front door: returns a new [T, C] matrix (allocates its result and a workspace).
//   x: any Eigen expression [T, C] with the weights' scalar type; evaluated once into a row-major
//   copy (the one place where an input is copied: this function allocates anyway).
template <class T, class Derived>
RowMatrix<T> attention(const AttentionWeights<T>& w, const Eigen::MatrixBase<Derived>& x) {
  static_assert(std::is_same<typename Derived::Scalar, T>::value,
                "gpt2::attention: x must have the weights' scalar type (cast it explicitly)");
  const RowMatrix<T> x_eval = x;  // explicit copy: row-major, contiguous
  detail::check_shape("x", {x_eval.rows(), w.n_embd()}, {x_eval.rows(), x_eval.cols()});
  RowMatrix<T> out(x_eval.rows(), w.n_embd());
  Workspace<T> ws(w.config(), x_eval.rows());
  attention_forward<T>(w, x_eval, ws, out);
  return out;
}

// Same, also returning the probabilities: probs is resized to [n_head * T, T].
template <class T, class Derived>
RowMatrix<T> attention(const AttentionWeights<T>& w, const Eigen::MatrixBase<Derived>& x,
                       RowMatrix<T>& probs) {
  static_assert(std::is_same<typename Derived::Scalar, T>::value,
                "gpt2::attention: x must have the weights' scalar type (cast it explicitly)");
  const RowMatrix<T> x_eval = x;
  detail::check_shape("x", {x_eval.rows(), w.n_embd()}, {x_eval.rows(), x_eval.cols()});
  RowMatrix<T> out(x_eval.rows(), w.n_embd());
  probs.resize(w.n_head() * x_eval.rows(), x_eval.rows());
  Workspace<T> ws(w.config(), x_eval.rows());
  attention_forward<T>(w, x_eval, ws, out, probs);
  return out;
}

}  // namespace gpt2
