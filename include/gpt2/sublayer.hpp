// The sublayer's forward over one sequence, without a cache or through any KV cache:
//
//   qkv    = x @ c_attn.weight + c_attn.bias             [T, C] @ [C, 3C]
//   y_h    = softmax(q_h k_h^T / sqrt(head_dim), causal) v_h   for each head h, over the cache's
//            keys and values and the new rows' own
//   merged = [y_0 | y_1 | ...]  ;  out = merged @ c_proj.weight + c_proj.bias
//
// written once (detail/pipeline.hpp) over the sublayer (AttentionWeights<T>, or a
// TensorParallelAttention<T> shard: tensor_parallel.hpp) and over the cache concept (kv_cache.hpp:
// KVCache<float|double|bfloat16|int8>, PagedSequence, PagedLayer). Splitting a sequence into chunks in
// any way gives the result of one forward over the whole sequence: bitwise in float at the vector
// levels, up to rounding at the generic level and in double (docs/accuracy.md).
#pragma once

#include <type_traits>
#include <utility>

#include "gpt2/detail/compiled_mode.hpp"
#include "gpt2/detail/pipeline.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/levels.hpp"
#include "gpt2/kv_cache.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"
#include "gpt2/workspace.hpp"

namespace gpt2 {

template <class S>
class PagedSequence;  // paged_kv_cache.hpp
template <class S>
class PagedLayer;


// out = GPT-2 attention sublayer(x)
//   sublayer: AttentionWeights<T> (or one rank's TensorParallelAttention<T>)
//   x [T, C] (read; a row-major matrix or view, e.g. a Map over your buffer)
//   out [T, C] (written; may be the same storage as x)
//   ws: scratch for at least T tokens (grown if smaller; no allocation when it is big enough)
// PyTorch (HF): GPT2Attention(x)[0] with c_attn, c_proj of the weights
template <class T, template <class> class S, class D,
          std::enable_if_t<detail::SublayerTraits<S<T>>::kIsSublayer, int> = 0>
void attention_forward(const S<T>& sublayer, const Eigen::MatrixBase<D>& x, Workspace<T>& ws,
                       MatrixRef<T> out) {
  detail::NoCache none;
  detail::forward<T>(sublayer, detail::as_view<T>(x), none, ws, out, nullptr);
}

// Same, also writing the attention probabilities of every head.
//   probs [n_head * T, T] (written): rows h*T .. h*T + T - 1 are head h's [T, T] map (the
//   row-major [n_head, T, T] tensor); entries above the diagonal are exactly 0.
template <class T, template <class> class S, class D,
          std::enable_if_t<detail::SublayerTraits<S<T>>::kIsSublayer, int> = 0>
void attention_forward(const S<T>& sublayer, const Eigen::MatrixBase<D>& x, Workspace<T>& ws,
                       MatrixRef<T> out, MatrixRef<T> probs) {
  detail::NoCache none;
  detail::forward<T>(sublayer, detail::as_view<T>(x), none, ws, out, &probs);
}

// out = GPT-2 attention sublayer over new tokens, through a KV cache (any model of the concept).
//   x [T_new, C] (read; positions n_past .. n_past + T_new - 1 of the sequence in `cache`)
//   cache: holds n_past positions; gains T_new (CapacityError, cache unchanged, if they do not
//          fit); a bf16 or int8 cache (KVCache<bfloat16>, KVCache<int8>, PagedSequence<...>) serves
//          float forwards
//   ws: scratch; grown on the first call to T_new tokens and the cache's capacity in keys, so later
//       calls with at most as many new tokens allocate nothing (a decode step never does)
//   out [T_new, C] (written; may be the same storage as x, must not overlap the cache)
// PyTorch (HF): GPT2Attention(x, layer_past=past, use_cache=True) -> (out, present)
template <class T, template <class> class S, class D, class Cache,
          std::enable_if_t<detail::SublayerTraits<S<T>>::kIsSublayer &&
                               detail::IsKVCache<std::decay_t<Cache>>::value,
                           int> = 0>
void attention_forward(const S<T>& sublayer, const Eigen::MatrixBase<D>& x, Cache&& cache,
                       Workspace<T>& ws, MatrixRef<T> out) {
  static_assert(std::is_same<typename std::decay_t<Cache>::Scalar, T>::value,
                "gpt2: the cache serves forwards of another scalar type (a bf16 cache: float)");
  detail::forward<T>(sublayer, detail::as_view<T>(x), cache, ws, out, nullptr);
}

// Same, also writing the probabilities of every head over every position it can see.
//   probs [n_head * T_new, n_past + T_new] (written): rows h*T_new .. are head h's; row i holds
//   the weights of keys 0 .. n_past + i and exact zeros after them.
template <class T, template <class> class S, class D, class Cache,
          std::enable_if_t<detail::SublayerTraits<S<T>>::kIsSublayer &&
                               detail::IsKVCache<std::decay_t<Cache>>::value,
                           int> = 0>
void attention_forward(const S<T>& sublayer, const Eigen::MatrixBase<D>& x, Cache&& cache,
                       Workspace<T>& ws, MatrixRef<T> out, MatrixRef<T> probs) {
  static_assert(std::is_same<typename std::decay_t<Cache>::Scalar, T>::value,
                "gpt2: the cache serves forwards of another scalar type (a bf16 cache: float)");
  detail::forward<T>(sublayer, detail::as_view<T>(x), cache, ws, out, &probs);
}

// Layer `layer` of a model over a paged sequence already grown for this step (seq.grow(T_new)
// once, then each layer): x [T_new, C] are its last T_new positions, whose keys and values go to
// the layer's storage at the sequence's blocks. The cache forward over PagedLayer(seq, layer, T_new).
template <class T, template <class> class S, class D, class Storage,
          std::enable_if_t<detail::SublayerTraits<S<T>>::kIsSublayer, int> = 0>
void attention_forward(const S<T>& sublayer, const Eigen::MatrixBase<D>& x,
                       PagedSequence<Storage>& seq, Index layer, Workspace<T>& ws,
                       MatrixRef<T> out) {
  PagedLayer<Storage> view(seq, layer, x.rows());
  attention_forward<T>(sublayer, x, view, ws, out);
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

// The compiled mode's float and double forwards over the contiguous caches (detail/compiled_mode.hpp;
// paged_kv_cache.hpp declares the paged ones): compiled once in the library, not in every file.
#if GPT2_ATTENTION_EXTERN_FORWARDS
// The generic level's tables too (Eigen's code, which every forward's glue would otherwise compile
// for the table it looks up): the library's copy, as the vector levels'.
GPT2_ATTENTION_EXTERN template const kernels::Kernels<float>& kernels::generic_table<float>();
GPT2_ATTENTION_EXTERN template const kernels::Kernels<double>& kernels::generic_table<double>();
GPT2_ATTENTION_FORWARD(float, detail::NoCache)
GPT2_ATTENTION_FORWARD(float, KVCache<float>)
GPT2_ATTENTION_FORWARD(float, KVCache<bfloat16>)
GPT2_ATTENTION_FORWARD(float, KVCache<int8>)
GPT2_ATTENTION_FORWARD(double, detail::NoCache)
GPT2_ATTENTION_FORWARD(double, KVCache<double>)
#endif

}  // namespace gpt2
