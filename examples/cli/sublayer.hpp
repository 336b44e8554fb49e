// What run's forwards (prefill_run.hpp, batch_run.hpp) need from the sublayer they run, for the
// whole model's AttentionWeights and for one rank's TensorParallelAttention shard alike: its KV
// caches and workspaces, and how many heads' probabilities it writes.
#pragma once

#include "gpt2/attention.hpp"

// 1 when the CLI is built with gpt2::mpi (examples/CMakeLists.txt): run --tensor-parallel.
#ifndef GPT2_CLI_TENSOR_PARALLEL
#define GPT2_CLI_TENSOR_PARALLEL 0
#endif
#if GPT2_CLI_TENSOR_PARALLEL
#include "gpt2/tensor_parallel.hpp"
#endif

namespace gpt2::cli {

// The config of the heads the sublayer computes (its caches' and workspaces').
template <class T>
const AttentionConfig& heads_config(const AttentionWeights<T>& w) {
  return w.config();
}
template <class T>
KVCache<T> make_cache(const AttentionWeights<T>& w, Index max_tokens) {
  return KVCache<T>(w.config(), max_tokens);
}
template <class T>
Workspace<T> make_workspace(const AttentionWeights<T>& w, Index max_tokens, Index max_keys = -1) {
  return Workspace<T>(w.config(), max_tokens, max_keys);
}
// The heads whose probabilities a forward writes: all of them.
template <class T>
Index heads_here(const AttentionWeights<T>& w) {
  return w.n_head();
}

#if GPT2_CLI_TENSOR_PARALLEL
// A rank's shard: caches and workspaces over its heads; probabilities of its heads only.
template <class T>
const AttentionConfig& heads_config(const TensorParallelAttention<T>& tp) {
  return tp.shard_config();
}
template <class T>
KVCache<T> make_cache(const TensorParallelAttention<T>& tp, Index max_tokens) {
  return tp.cache(max_tokens);
}
template <class T>
Workspace<T> make_workspace(const TensorParallelAttention<T>& tp, Index max_tokens,
                            Index max_keys = -1) {
  return tp.workspace(max_tokens, max_keys);
}
template <class T>
Index heads_here(const TensorParallelAttention<T>& tp) {
  return tp.heads().count;
}
#endif

}  // namespace gpt2::cli
