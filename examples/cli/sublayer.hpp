// The sublayer run computes with, behind one interface: the whole model's AttentionWeights<T>, or
// one rank's TensorParallelAttention<T> shard. run's forward paths (prefill_run.hpp, batch_run.hpp,
// shared_prefix_run.hpp, run_forwards.hpp) are written over RunSublayer<T> and compiled once per
// precision; each kind of sublayer adds only its forwards (SublayerOf<T, W>), which are the
// library's: the compiled library holds the AttentionWeights ones, tensor_parallel_run.cpp the
// shard's checks and all-reduce.
#pragma once

#include <type_traits>
#include <vector>

#include "args.hpp"  // UsageError
#include "gpt2/attention.hpp"
#include "gpt2/paged_kv_cache.hpp"

// 1 when the CLI is built with gpt2::mpi (examples/CMakeLists.txt): run --tensor-parallel.
#ifndef GPT2_CLI_TENSOR_PARALLEL
#define GPT2_CLI_TENSOR_PARALLEL 0
#endif

namespace gpt2::cli {

// What run's forwards need from a sublayer: its widths, its caches and workspaces (over the heads
// it computes), and the library's forwards over every cache run uses. probs (or null): as
// attention_forward's, over heads_here() heads. The bf16 and int8 caches hold float forwards only:
// with T = double they throw UsageError (run refuses --kv-cache bf16 with --dtype f64 before).
template <class T>
class RunSublayer {
 public:
  virtual ~RunSublayer() = default;

  virtual Index n_embd() const = 0;
  // The model's heads (every rank's, for a shard).
  virtual Index n_head() const = 0;
  // The config of the heads it computes (its caches' and workspaces').
  virtual const AttentionConfig& heads_config() const = 0;
  // The heads whose probabilities a forward writes: all of them, or a shard's own.
  virtual Index heads_here() const = 0;
  virtual Workspace<T> workspace(Index max_tokens, Index max_keys = -1) const = 0;
  KVCache<T> cache(Index max_tokens) const { return KVCache<T>(heads_config(), max_tokens); }

  // One sequence x [T, C] -> out [T, C], without a cache or through one.
  virtual void forward(const ConstMatrixRef<T>& x, Workspace<T>& ws, MatrixRef<T> out,
                       MatrixRef<T>* probs) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, KVCache<T>& cache, Workspace<T>& ws,
                       MatrixRef<T> out, MatrixRef<T>* probs) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, KVCache<bfloat16>& cache, Workspace<T>& ws,
                       MatrixRef<T> out, MatrixRef<T>* probs) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, KVCache<int8>& cache, Workspace<T>& ws,
                       MatrixRef<T> out, MatrixRef<T>* probs) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, PagedSequence<T>& seq, Workspace<T>& ws,
                       MatrixRef<T> out) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, PagedSequence<bfloat16>& seq,
                       Workspace<T>& ws, MatrixRef<T> out) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, PagedSequence<int8>& seq, Workspace<T>& ws,
                       MatrixRef<T> out) const = 0;

  // A padded batch x [B * T, C] -> out [B * T, C], without caches or through one per sequence.
  virtual void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch, Workspace<T>& ws,
                       MatrixRef<T> out) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
                       std::vector<KVCache<T>>& caches, Workspace<T>& ws,
                       MatrixRef<T> out) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
                       std::vector<KVCache<bfloat16>>& caches, Workspace<T>& ws,
                       MatrixRef<T> out) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
                       std::vector<KVCache<int8>>& caches, Workspace<T>& ws,
                       MatrixRef<T> out) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
                       const std::vector<PagedSequence<T>*>& seqs, Workspace<T>& ws,
                       MatrixRef<T> out) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
                       const std::vector<PagedSequence<bfloat16>*>& seqs, Workspace<T>& ws,
                       MatrixRef<T> out) const = 0;
  virtual void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
                       const std::vector<PagedSequence<int8>*>& seqs, Workspace<T>& ws,
                       MatrixRef<T> out) const = 0;
};

// RunSublayer<T> over w (AttentionWeights<T> or TensorParallelAttention<T>), which must outlive
// it. Its forwards are attention_forward's.
template <class T, class W>
class SublayerOf final : public RunSublayer<T> {
 public:
  explicit SublayerOf(const W& w) : w_(w) {}

  Index n_embd() const override { return w_.n_embd(); }
  Index n_head() const override { return w_.n_head(); }
  const AttentionConfig& heads_config() const override { return config_of(w_); }
  Index heads_here() const override { return config_of(w_).n_head; }
  Workspace<T> workspace(Index max_tokens, Index max_keys) const override {
    return workspace_of(w_, max_tokens, max_keys);
  }

  void forward(const ConstMatrixRef<T>& x, Workspace<T>& ws, MatrixRef<T> out,
               MatrixRef<T>* probs) const override {
    if (probs)
      attention_forward<T>(w_, x, ws, out, *probs);
    else
      attention_forward<T>(w_, x, ws, out);
  }
  void forward(const ConstMatrixRef<T>& x, KVCache<T>& cache, Workspace<T>& ws, MatrixRef<T> out,
               MatrixRef<T>* probs) const override {
    cached(x, cache, ws, out, probs);
  }
  void forward(const ConstMatrixRef<T>& x, KVCache<bfloat16>& cache, Workspace<T>& ws,
               MatrixRef<T> out, MatrixRef<T>* probs) const override {
    if constexpr (kFloat) cached(x, cache, ws, out, probs);
    else no_bf16_cache();
  }
  void forward(const ConstMatrixRef<T>& x, KVCache<int8>& cache, Workspace<T>& ws,
               MatrixRef<T> out, MatrixRef<T>* probs) const override {
    if constexpr (kFloat) cached(x, cache, ws, out, probs);
    else no_int8_cache();
  }
  void forward(const ConstMatrixRef<T>& x, PagedSequence<T>& seq, Workspace<T>& ws,
               MatrixRef<T> out) const override {
    attention_forward<T>(w_, x, seq, ws, out);
  }
  void forward(const ConstMatrixRef<T>& x, PagedSequence<bfloat16>& seq, Workspace<T>& ws,
               MatrixRef<T> out) const override {
    if constexpr (kFloat) attention_forward<T>(w_, x, seq, ws, out);
    else no_bf16_cache();
  }
  void forward(const ConstMatrixRef<T>& x, PagedSequence<int8>& seq, Workspace<T>& ws,
               MatrixRef<T> out) const override {
    if constexpr (kFloat) attention_forward<T>(w_, x, seq, ws, out);
    else no_int8_cache();
  }

  void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch, Workspace<T>& ws,
               MatrixRef<T> out) const override {
    attention_forward<T>(w_, x, batch, ws, out);
  }
  void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
               std::vector<KVCache<T>>& caches, Workspace<T>& ws,
               MatrixRef<T> out) const override {
    attention_forward<T>(w_, x, batch, caches, ws, out);
  }
  void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
               std::vector<KVCache<bfloat16>>& caches, Workspace<T>& ws,
               MatrixRef<T> out) const override {
    if constexpr (kFloat) attention_forward<T>(w_, x, batch, caches, ws, out);
    else no_bf16_cache();
  }
  void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
               std::vector<KVCache<int8>>& caches, Workspace<T>& ws,
               MatrixRef<T> out) const override {
    if constexpr (kFloat) attention_forward<T>(w_, x, batch, caches, ws, out);
    else no_int8_cache();
  }
  void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
               const std::vector<PagedSequence<T>*>& seqs, Workspace<T>& ws,
               MatrixRef<T> out) const override {
    attention_forward<T>(w_, x, batch, seqs, ws, out);
  }
  void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
               const std::vector<PagedSequence<bfloat16>*>& seqs, Workspace<T>& ws,
               MatrixRef<T> out) const override {
    if constexpr (kFloat) attention_forward<T>(w_, x, batch, seqs, ws, out);
    else no_bf16_cache();
  }
  void forward(const ConstMatrixRef<T>& x, const BatchLayout& batch,
               const std::vector<PagedSequence<int8>*>& seqs, Workspace<T>& ws,
               MatrixRef<T> out) const override {
    if constexpr (kFloat) attention_forward<T>(w_, x, batch, seqs, ws, out);
    else no_int8_cache();
  }

 private:
  static constexpr bool kFloat = std::is_same<T, float>::value;

  template <class Cache>
  void cached(const ConstMatrixRef<T>& x, Cache& cache, Workspace<T>& ws, MatrixRef<T> out,
              MatrixRef<T>* probs) const {
    if (probs)
      attention_forward<T>(w_, x, cache, ws, out, *probs);
    else
      attention_forward<T>(w_, x, cache, ws, out);
  }
  [[noreturn]] static void no_bf16_cache() {
    throw UsageError("--kv-cache bf16: needs --dtype f32 or bf16");
  }
  [[noreturn]] static void no_int8_cache() {
    throw UsageError("--kv-cache int8: needs --dtype f32 or bf16");
  }

  // The whole model's heads, or (TensorParallelAttention, tensor_parallel_run.hpp) a shard's.
  static const AttentionConfig& config_of(const AttentionWeights<T>& w) { return w.config(); }
  static Workspace<T> workspace_of(const AttentionWeights<T>& w, Index max_tokens,
                                   Index max_keys) {
    return Workspace<T>(w.config(), max_tokens, max_keys);
  }
  template <class Shard>
  static const AttentionConfig& config_of(const Shard& tp) {
    return tp.shard_config();
  }
  template <class Shard>
  static Workspace<T> workspace_of(const Shard& tp, Index max_tokens, Index max_keys) {
    return tp.workspace(max_tokens, max_keys);
  }

  const W& w_;
};

}  // namespace gpt2::cli
