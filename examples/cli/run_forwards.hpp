// The definition of compute_with (run_compute.hpp): every forward path of run, for X [T, C] (one
// forward, or --prefill through a KV cache: prefill_run.hpp) and for a padded batch X [B, T, C]
// (the batched forward, --prefill as a batched decode: batch_run.hpp; --share-prefix over a paged
// KV cache: shared_prefix_run.hpp). Included by run_float.cpp and run_double.cpp only, which
// instantiate it: one translation unit per precision keeps each precision's Eigen products in one.
#pragma once

#include <optional>
#include <type_traits>
#include <vector>

#include "batch_run.hpp"
#include "prefill_run.hpp"
#include "run_compute.hpp"
#include "shared_prefix_run.hpp"
#include "sublayer.hpp"

namespace gpt2::cli {

template <class T>
void compute_with(const RunOptions& o, const RunSublayer<T>& w, const RunInput<T>& input,
                  const std::optional<BatchLayout>& layout, RunResult<T>& r) {
  const Index n_head = w.n_head(), B = input.batch(), T_ = input.tokens();
  r.out_shape = input.shape;
  r.probs_shape = input.batched() ? std::vector<std::int64_t>{B, n_head, T_, T_}
                                  : std::vector<std::int64_t>{n_head, T_, T_};
  r.batched = input.batched();
  if (input.x.rows() == 0) {  // B * T == 0: empty Y and P, nothing to compute
    if (!o.png.empty())
      throw Error("png " + o.png + ": the input " + detail::shape_string(input.shape) +
                  " has no tokens: nothing to draw");
    return;
  }
  if (!o.png.empty())
    for (Index b = 0; b < B; ++b)
      r.spans.push_back(layout ? Span{layout->start(b), layout->length(b)} : Span{0, T_});

  RowMatrix<T>* probs = o.probs.empty() && o.png.empty() ? nullptr : &r.probs;
  if (probs) probs->resize(B * w.heads_here() * T_, T_);  // first: see above
  r.out.resize(input.x.rows(), w.n_embd());
  constexpr bool kFloat = std::is_same<T, float>::value;
  if (o.kv != KvStorage::f32 && !kFloat)
    throw UsageError(std::string("--kv-cache ") + kv_storage_name(o.kv) +
                     ": needs --dtype f32, bf16 or int8");
  if (!input.batched()) {
    if (o.prefill && o.kv == KvStorage::bf16) {
      if constexpr (kFloat) {
        KVCache<bfloat16> cache(w.heads_config(), T_);
        prefill_forward_through<T>(w, input.x, *o.prefill, r.out, probs, cache);
      }
    } else if (o.prefill && o.kv == KvStorage::int8) {
      if constexpr (kFloat) {
        KVCache<int8> cache(w.heads_config(), T_);
        prefill_forward_through<T>(w, input.x, *o.prefill, r.out, probs, cache);
      }
    } else if (o.prefill) {
      prefill_forward<T>(w, input.x, *o.prefill, r.out, probs);
    } else {
      Workspace<T> ws = w.workspace(T_);
      if (probs) {
        MatrixRef<T> probs_ref = *probs;
        w.forward(input.x, ws, r.out, &probs_ref);
      } else {
        w.forward(input.x, ws, r.out, nullptr);
      }
    }
  } else {
    if (o.share_prefix && o.kv == KvStorage::bf16) {
      if constexpr (kFloat)
        shared_prefix_decode<T, bfloat16>(w, input.x, *layout, *o.share_prefix, o.prefill, r.out);
    } else if (o.share_prefix && o.kv == KvStorage::int8) {
      if constexpr (kFloat)
        shared_prefix_decode<T, int8>(w, input.x, *layout, *o.share_prefix, o.prefill, r.out);
    } else if (o.share_prefix) {
      shared_prefix_decode<T, T>(w, input.x, *layout, *o.share_prefix, o.prefill, r.out);
    } else if (o.prefill && o.kv == KvStorage::bf16) {
      if constexpr (kFloat) batch_decode<T, bfloat16>(w, input.x, *layout, *o.prefill, r.out);
    } else if (o.prefill && o.kv == KvStorage::int8) {
      if constexpr (kFloat) batch_decode<T, int8>(w, input.x, *layout, *o.prefill, r.out);
    } else if (o.prefill) {
      batch_decode<T, T>(w, input.x, *layout, *o.prefill, r.out);
    } else {
      batch_forward<T>(w, input.x, *layout, r.out);
    }
    if (probs) batch_probs<T>(w, input.x, *layout, *probs);
  }
}

// compute_with<T>, T = float (run_float.cpp) or double (run_double.cpp).
#define GPT2_CLI_INSTANTIATE_RUN(T)                                                      \
  template void compute_with<T>(const RunOptions&, const RunSublayer<T>&, const RunInput<T>&, \
                                const std::optional<BatchLayout>&, RunResult<T>&);

}  // namespace gpt2::cli
