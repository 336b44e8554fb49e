// The sublayer over new tokens of a sequence whose earlier positions are in a KVCache: a prefill
// chunk, or one decode step.
//
//   x [T_new, C] are positions n_past .. n_past + T_new - 1; their keys and values are appended
//   to the cache, and new row i attends to cached keys 0 .. n_past + i (bottom-right-aligned
//   causal mask, as Hugging Face applies it with past_key_values).
//
// Splitting a sequence into chunks in any way gives the result of one forward over the whole
// sequence: bitwise in float at the avx2 and avx512 levels (row-exact projections and attention
// core), up to rounding at the generic level and in double (docs/accuracy.md: "KV cache chunks").
#pragma once

#include <string>

#include "gpt2/error.hpp"
#include "gpt2/forward.hpp"
#include "gpt2/kv_cache.hpp"
#include "gpt2/qkv.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"
#include "gpt2/workspace.hpp"

namespace gpt2 {

namespace detail {

// Cache: a KVCache<T>, or a KVCacheBF16 (float; incremental_bf16.hpp): the same checks.
template <class T, class Cache>
void check_cache(const AttentionWeights<T>& w, const Cache& cache) {
  const AttentionConfig& a = w.config();
  const AttentionConfig& b = cache.config();
  if (a.n_embd != b.n_embd || a.n_head != b.n_head)
    throw ConfigError("cache: expected n_embd " + std::to_string(a.n_embd) + ", n_head " +
                      std::to_string(a.n_head) + " (the weights'), got n_embd " +
                      std::to_string(b.n_embd) + ", n_head " + std::to_string(b.n_head));
}

// Everything about the call that can be checked before the workspace grows: shapes, configs,
// room in the cache, and that out and probs do not overlap the cache.
//   x [T_new, C], out [T_new, C], probs (or null) [n_head * T_new, n_past + T_new]
template <class T, class Cache>
void check_cached_forward(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                          const Cache& cache, const Workspace<T>& ws, const MatrixRef<T>& out,
                          const MatrixRef<T>* probs) {
  const Index T_new = x.rows(), C = w.n_embd(), n_keys = cache.n_past() + T_new;
  check_shape("x", {T_new, C}, {x.rows(), x.cols()});
  check_shape("out", {T_new, C}, {out.rows(), out.cols()});
  if (probs)
    check_shape("probs", {w.n_head() * T_new, n_keys}, {probs->rows(), probs->cols()});
  check_workspace(w, ws);
  check_cache(w, cache);
  cache.check_room(T_new);
  const bool out_in_cache =
      overlaps(out, cache.key_storage()) || overlaps(out, cache.value_storage());
  if (out_in_cache) throw ShapeError("out: must not overlap the KV cache");
  if (probs && (overlaps(*probs, cache.key_storage()) || overlaps(*probs, cache.value_storage())))
    throw ShapeError("probs: must not overlap the KV cache");
}

// What a forward through a KVCache needs beyond Workspace::reserve: nothing (KVCacheBF16's
// overload grows widening buffers).
template <class T>
void reserve_cache_scratch(Workspace<T>&, const KVCache<T>&, Index, bool) {}

// Heads of the new rows (qkv [T_new, 3C]) over the cache, which holds their keys and values by
// then: merged [T_new, C] (and probs).
template <class T>
void attend_cached(const AttentionConfig& config, const ConstMatrixRef<T>& qkv,
                   const KVCache<T>& cache, Workspace<T>& ws, MatrixRef<T>& merged,
                   MatrixRef<T>* probs, int n_threads) {
  attend_heads<T>(
      config, qkv, [&](Index h) { return cache.keys(h); },
      [&](Index h) { return cache.values(h); }, ws, merged, probs, n_threads,
      [&](Index h) { return cache.transposed_key_blocks(h); });
}

// Whether a decode step's heads split into `parts` contiguous ranges (column_part over the heads)
// whose q, k and v columns start and end on multiples of kProjectionColumnAlign: then each column
// is computed by the same kernel path as in the qkv product's own column parts (same bits), and
// one thread can compute a range's columns and attend its heads with no barrier in between.
inline bool decode_heads_split_aligned(const AttentionConfig& config, Index parts) {
  for (Index part = 1; part < parts; ++part)
    if (column_part(config.n_head, part, parts, 1).begin * config.head_dim() %
            kProjectionColumnAlign != 0)
      return false;
  return true;
}

// A decode step's one parallel region (x [1, C]) on n_threads threads, then the output
// projection's column parts (out [1, C]) after a barrier. Before it, ws.qkv's first row [1, 3C]
// = x @ c_attn.weight + c_attn.bias, and head_step(h, thread) for every head (it must leave head
// h's slot of ws.merged's first row, [1, C], written): where the heads split evenly on aligned
// columns (decode_heads_split_aligned), a task per range of heads computes those heads' q, k and v
// columns and then runs their head steps, with no barrier between the two (a head needs only its
// own columns); otherwise the qkv product's column parts, a barrier, then the heads. Every column
// is one projection_columns call's over whole aligned blocks either way: the same bits. The qkv
// and projection parts are projection_parallel's.
template <class T, class HeadStep>
void decode_step_region(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                        Workspace<T>& ws, MatrixRef<T>& out, int n_threads,
                        const HeadStep& head_step) {
  MatrixRef<T> qkv = ws.qkv.topRows(1);
  const ConstMatrixRef<T> merged = ws.merged.topRows(1);
  use_weight_dtype(ws, w.weight_dtype());
  const AttentionConfig& config = w.config();
  const Index parts = projection_parts(ws, n_threads), C = config.n_embd, hd = config.head_dim();
  const bool by_heads = decode_heads_split_aligned(config, parts);
  parallel_steps(n_threads, [&](const Team& team) {
    if (by_heads) {
      team.tasks(parts, [&](Index part, int thread) {  // heads [begin, end): q, k, v, then heads
        const ColumnRange heads = column_part(config.n_head, part, parts, 1);
        GemmScratch<T>& gemm = ws.threads[static_cast<std::size_t>(thread)].gemm;
        for (Index block = 0; block < 3; ++block) {  // q | k | v
          const Index j0 = block * C + heads.begin * hd, n = heads.size() * hd;
          projection_columns<T>(x, w.c_attn_weight(), w.packed_c_attn_weight(), w.c_attn_bias(),
                                j0, n, qkv.middleCols(j0, n), gemm);
        }
        for (Index h = heads.begin; h < heads.end; ++h) head_step(h, thread);
      });
    } else {
      team.tasks(parts, [&](Index part, int thread) {  // qkv = x @ c_attn.weight + c_attn.bias
        projection_part<T>(x, w.c_attn_weight(), w.packed_c_attn_weight(), w.c_attn_bias(), qkv,
                           ws, part, parts, thread);
      });
      team.tasks(w.n_head(), head_step);
    }
    team.tasks(parts, [&](Index part, int thread) {  // out = merged @ c_proj.weight + c_proj.bias
      projection_part<T>(merged, w.c_proj_weight(), w.packed_c_proj_weight(), w.c_proj_bias(), out,
                         ws, part, parts, thread);
    });
  });
}

// A decode step (x [1, C] at position n_past; no probabilities) on n_threads >= 2 threads in one
// parallel region (decode_step_region) whose steps are the three regions of the general path: the
// qkv product's column parts; the heads, each one's key and value rows written into the cache
// (grown by one position first) by the thread that then attends that head; the output
// projection's column parts. The same parts, kernels and order as the general path, so the same
// bits; the step pays for one region's start and end and two barriers instead of three regions
// and a serial append. Returns false, with nothing done, when the step is not one (a step with
// fewer heads than threads splits its keys over the threads instead: split_decode_step). Shapes
// checked and the workspace grown before; if anything throws, the cache is rolled back to n_past
// positions.
template <class T>
bool decode_step_in_one_region(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                               KVCache<T>& cache, Workspace<T>& ws, MatrixRef<T>& out,
                               int n_threads) {
  const AttentionConfig& config = w.config();
  const Index C = config.n_embd, n_head = config.n_head, p = cache.n_past();  // p: x's position
  if (x.rows() != 1 || n_threads < 2 || n_head < n_threads) return false;
  const ConstMatrixRef<T> qkv = ws.qkv.topRows(1);
  MatrixRef<T> merged = ws.merged.topRows(1);
  KVCacheAccess::grow(cache, 1);  // keys(h), values(h): p + 1 rows, row p written below
  try {
    for (Index h = 0; h < n_head; ++h)  // every check before any thread starts
      check_attention_head<T>(q_view(qkv, config, h), cache.keys(h), cache.values(h),
                              head_slot(merged, config, h), nullptr);
    decode_step_region<T>(w, x, ws, out, n_threads, [&](Index h, int thread) {
      // head h: its cache row p, then its slot of merged
      KVCacheAccess::put_head_rows<T>(cache, h, p, qkv.middleCols(C, C), qkv.middleCols(2 * C, C));
      MatrixRef<T> y = head_slot(merged, config, h);
      attention_row_tile<T>(q_view(qkv, config, h), cache.keys(h), cache.values(h), 0, 1, y,
                            nullptr, ws.threads[static_cast<std::size_t>(thread)].attention,
                            cache.transposed_key_blocks(h));
    });
  } catch (...) {
    cache.truncate(p);
    throw;
  }
  return true;
}

// The cached forward, after both checks with a workspace grown to T_new tokens and
// cache.capacity() keys. Appends T_new positions to the cache. Every check has passed by then, so
// nothing is expected to throw; if anything does, the cache is rolled back to n_past positions.
template <class T>
void run_cached_forward(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                        KVCache<T>& cache, Workspace<T>& ws, MatrixRef<T>& out,
                        MatrixRef<T>* probs) {
  const Index T_new = x.rows(), C = w.n_embd(), n_past = cache.n_past();
  if (T_new == 0) return;
  MatrixRef<T> qkv = ws.qkv.topRows(T_new);
  MatrixRef<T> merged = ws.merged.topRows(T_new);
  const int n_threads = forward_threads(ws);
  // x is fully read by the first step (here or in the one-region step): out may alias x
  if (!probs && decode_step_in_one_region<T>(w, x, cache, ws, out, n_threads)) return;
  qkv_parallel<T>(w, x, qkv, ws, n_threads);
  cache.append(qkv.middleCols(C, C), qkv.middleCols(2 * C, C));
  try {
    const ConstMatrixRef<T> qkv_read = qkv;
    const KVCache<T>& cached = cache;
    attend_and_project<T>(
        w, qkv_read, [&](Index h) { return cached.keys(h); },
        [&](Index h) { return cached.values(h); }, ws, merged, out, probs, n_threads,
        [&](Index h) { return cached.transposed_key_blocks(h); });
  } catch (...) {
    cache.truncate(n_past);
    throw;
  }
}

template <class T>
void attention_forward_cached(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                              KVCache<T>& cache, Workspace<T>& ws, MatrixRef<T>& out,
                              MatrixRef<T>* probs) {
  check_cached_forward<T>(w, x, cache, ws, out, probs);
  ws.reserve(x.rows(), cache.capacity());  // the first call sizes it for the whole cache
  check_workspace_overlap<T>(ws, x.rows(), out, probs);
  run_cached_forward<T>(w, x, cache, ws, out, probs);
}

}  // namespace detail

// out = GPT-2 attention sublayer over new tokens, through a KV cache.
//   x [T_new, C] (read; positions n_past .. n_past + T_new - 1 of the sequence in `cache`)
//   cache: holds n_past positions; gains T_new (CapacityError, cache unchanged, if they do not fit)
//   ws: scratch; grown on the first call to T_new tokens and cache.capacity() keys, so later calls
//       with at most as many new tokens allocate nothing (a decode step never does)
//   out [T_new, C] (written; may be the same storage as x, must not overlap the cache)
// PyTorch (HF): GPT2Attention(x, layer_past=past, use_cache=True) -> (out, present)
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       KVCache<T>& cache, Workspace<T>& ws, MatrixRef<T> out) {
  detail::attention_forward_cached<T>(w, detail::as_view<T>(x), cache, ws, out, nullptr);
}

// Same, also writing the probabilities of every head over every position it can see.
//   probs [n_head * T_new, n_past + T_new] (written): rows h*T_new .. are head h's; row i holds
//   the weights of keys 0 .. n_past + i and exact zeros after them.
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       KVCache<T>& cache, Workspace<T>& ws, MatrixRef<T> out, MatrixRef<T> probs) {
  detail::attention_forward_cached<T>(w, detail::as_view<T>(x), cache, ws, out, &probs);
}

}  // namespace gpt2
