// Batches: B sequences of up to T tokens each, padded to a common length T, in one call, without
// caches or through one KV cache per sequence (any model of kv_cache.hpp's concept).
//
//   x [B * T, C]: the row-major [B, T, C] tensor; sequence b owns rows b*T .. b*T + T - 1, and its
//   real tokens are rows start(b) .. start(b) + length(b) - 1 of them (right padding: start 0;
//   left padding: start T - length). The other rows are padding.
//
// Padding never reaches a real token, whatever it holds (NaN included): padded rows are never
// read. Padded output rows are exactly zero. Each sequence's real rows get exactly what a forward
// over those rows alone gives: where a product's rows are exact (the vector levels), the real rows
// of up to kBatchGroupRows rows of consecutive sequences go through each projection together, so a
// batched decode step reads the weights once for up to 256 sequences.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt2/detail/compiled_mode.hpp"
#include "gpt2/detail/pipeline.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/levels.hpp"
#include "gpt2/kv_cache.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"
#include "gpt2/workspace.hpp"

namespace gpt2 {

// Which rows of a padded [B, T, C] batch hold real tokens. Cheap to copy; set() changes one
// sequence without allocating (reuse one layout across decode steps).
class BatchLayout {
 public:
  // An empty batch (B = 0, T = 0).
  BatchLayout() = default;

  // Sequence b's real tokens are its rows starts[b] .. starts[b] + lengths[b] - 1.
  // ShapeError naming the sequence unless 0 <= starts[b], 0 <= lengths[b] and
  // starts[b] + lengths[b] <= tokens.
  BatchLayout(Index tokens, std::vector<Index> starts, std::vector<Index> lengths)
      : tokens_(tokens), starts_(std::move(starts)), lengths_(std::move(lengths)) {
    if (tokens_ < 0)
      throw ShapeError("batch: expected a non-negative token count, got " + std::to_string(tokens_));
    if (starts_.size() != lengths_.size())
      throw ShapeError("batch: expected one start per length (" + std::to_string(lengths_.size()) +
                       "), got " + std::to_string(starts_.size()));
    for (Index b = 0; b < batch(); ++b) set(b, starts_[b], lengths_[b]);
  }

  // Every row of every sequence is real.
  static BatchLayout full(Index batch, Index tokens) {
    if (batch < 0)
      throw ShapeError("batch: expected a non-negative batch size, got " + std::to_string(batch));
    return BatchLayout(tokens, std::vector<Index>(batch, 0), std::vector<Index>(batch, tokens));
  }
  // Sequence b's tokens are its first lengths[b] rows; padding after them.
  static BatchLayout right_padded(Index tokens, const std::vector<Index>& lengths) {
    return BatchLayout(tokens, std::vector<Index>(lengths.size(), 0), lengths);
  }
  // Sequence b's tokens are its last lengths[b] rows; padding before them.
  static BatchLayout left_padded(Index tokens, const std::vector<Index>& lengths) {
    std::vector<Index> starts(lengths.size());
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      if (lengths[b] < 0 || lengths[b] > tokens)
        throw ShapeError("batch sequence " + std::to_string(b) + ": expected a length in [0, " +
                         std::to_string(tokens) + "] (the padded length), got " +
                         std::to_string(lengths[b]));
      starts[b] = tokens - lengths[b];
    }
    return BatchLayout(tokens, std::move(starts), lengths);
  }

  Index batch() const { return static_cast<Index>(lengths_.size()); }  // B
  Index tokens() const { return tokens_; }                               // T
  Index rows() const { return batch() * tokens_; }                       // B * T
  // Sequence b's real rows are rows start(b) .. start(b) + length(b) - 1 of its [T, C] block, i.e.
  // rows first_row(b) .. of x [B * T, C]. b outside [0, B) is a ShapeError naming b and B.
  Index start(Index b) const { return starts_[check(b)]; }
  Index length(Index b) const { return lengths_[check(b)]; }
  Index first_row(Index b) const { return b * tokens_ + start(b); }  // in x [B * T, C]
  // The longest sequence's length (0 for an empty batch): what a workspace needs room for.
  Index max_length() const {
    Index m = 0;
    for (Index n : lengths_) m = std::max(m, n);
    return m;
  }
  // The real rows of all sequences: the sum of the lengths.
  Index real_rows() const {
    Index sum = 0;
    for (Index n : lengths_) sum += n;
    return sum;
  }

  // Makes sequence b's real tokens rows start .. start + length - 1 (no allocation).
  void set(Index b, Index start, Index length) {
    check(b);
    if (start < 0 || length < 0 || start > tokens_ - length)
      throw ShapeError("batch sequence " + std::to_string(b) + ": expected 0 <= start, 0 <= length and start + length <= " +
                       std::to_string(tokens_) + " (the padded length), got start " +
                       std::to_string(start) + ", length " + std::to_string(length));
    starts_[static_cast<std::size_t>(b)] = start;
    lengths_[static_cast<std::size_t>(b)] = length;
  }

 private:
  std::size_t check(Index b) const {
    if (b < 0 || b >= batch())
      throw ShapeError("batch: expected a sequence index in [0, " + std::to_string(batch()) +
                       "), got " + std::to_string(b));
    return static_cast<std::size_t>(b);
  }

  Index tokens_ = 0;
  std::vector<Index> starts_, lengths_;
};


// Real rows that go through the projections together (a group) where their rows are exact: a
// decode step of up to 256 sequences reads the weights once, while the workspace stays at 256
// rows. When a sequence is longer, the workspace has room for it and groups take up to that many.
inline constexpr Index kBatchGroupRows = 256;

template <class S>
class PagedSequence;  // paged_kv_cache.hpp
template <class S>
class PagedLayer;

namespace detail {

// Shapes, and the one way out may share storage with x: being exactly x (each sequence's rows are
// read before they are written). A partial overlap would let sequence b's output overwrite a later
// sequence's input.
template <class T>
void check_batch_io(const BatchLayout& batch, Index C, const ConstMatrixRef<T>& x,
                    const MatrixRef<T>& out) {
  check_shape("x", {batch.rows(), C}, {x.rows(), x.cols()});
  check_shape("out", {batch.rows(), C}, {out.rows(), out.cols()});
  const bool same = out.data() == x.data() && out.outerStride() == x.outerStride();
  if (!same && overlaps(out, x))
    throw ShapeError("out: must be either the same storage as x or not overlap it");
}

// out's padded rows of sequence b = 0.
template <class T>
void zero_padding(const BatchLayout& batch, Index b, MatrixRef<T>& out) {
  const Index T_ = batch.tokens(), start = batch.start(b), end = start + batch.length(b);
  out.middleRows(b * T_, start).setZero();
  out.middleRows(b * T_ + end, T_ - end).setZero();
}

// Rethrows the current gpt2 error with "batch sequence b: " before its message, same type.
[[noreturn]] inline void rethrow_for_sequence(Index b) {
  const std::string prefix = "batch sequence " + std::to_string(b) + ": ";
  try {
    throw;
  } catch (const CapacityError& e) {
    throw CapacityError(prefix + e.what());
  } catch (const ShapeError& e) {
    throw ShapeError(prefix + e.what());
  } catch (const ConfigError& e) {
    throw ConfigError(prefix + e.what());
  }
}

// Optional parts of the cache concept for batches: Cache::check_batch(B, at) and
// Cache::begin_append_all(B, at, count) (a paged pool grows its sequences all or nothing).
template <class C, class = void>
struct AppendsTogether : std::false_type {};
template <class C>
struct AppendsTogether<C, std::void_t<decltype(&C::template check_batch<Index (*)(Index)>)>>
    : std::true_type {};

// Sequences [b0, b1) of the batch (`rows` real rows, room in the workspace), their caches appended
// already: their x rows gathered into ws.merged when there are several (else read in place), one
// qkv projection, each sequence's keys and values stored and heads attended, one output
// projection, the rows scattered to out and the padding zeroed.
template <class T, class CacheAt>
void run_group(const kernels::Kernels<T>& k, const Sublayer<T>& s, const ConstMatrixRef<T>& x,
               const BatchLayout& batch, const CacheAt& cache_at, Index b0, Index b1, Index rows,
               Workspace<T>& ws, MatrixRef<T>& out) {
  if (rows == 0) {  // every sequence sits the step out
    for (Index b = b0; b < b1; ++b) zero_padding<T>(batch, b, out);
    return;
  }
  const Index C = s.n_embd, Ch = s.heads.n_embd;
  const int n_threads = forward_threads(ws);
  const bool gather = b1 - b0 > 1;
  MatrixRef<T> merged = ws.merged.topRows(rows);
  if (gather)
    for (Index b = b0, r = 0; b < b1; r += batch.length(b), ++b)
      merged.middleRows(r, batch.length(b)) = x.middleRows(batch.first_row(b), batch.length(b));
  const ConstMatrixRef<T> xs = gather ? ConstMatrixRef<T>(merged) : x.middleRows(batch.first_row(b0), rows);
  MatrixRef<T> qkv = ws.qkv.topRows(rows);
  project_parallel<T>(k, xs, s.c_attn, 3 * Ch, qkv, ws, n_threads);  // xs is read by then
  const ConstMatrixRef<T> qkv_read = qkv;
  for (Index b = b0, r = 0; b < b1; r += batch.length(b), ++b) {
    const Index n = batch.length(b);
    if (n == 0) continue;
    const ConstMatrixRef<T> qkv_b = qkv_read.middleRows(r, n);
    MatrixRef<T> merged_b = merged.middleRows(r, n);
    auto&& cache = cache_at(b);
    Index p = 0;
    if constexpr (!std::is_same<std::decay_t<decltype(cache)>, NoCache>::value)
      p = cache.head_pages(0).n_keys - n;
    store_rows<T>(cache, s.heads, p, qkv_b);
    attend_sequence<T>(k, s, qkv_b, cache, ws, merged_b, nullptr, n_threads);
  }
  const ConstMatrixRef<T> merged_read = merged;
  if (!gather) {
    MatrixRef<T> out_b = out.middleRows(batch.first_row(b0), rows);
    project_parallel<T>(k, merged_read, s.c_proj, C, out_b, ws, n_threads);
    zero_padding<T>(batch, b0, out);
    return;
  }
  MatrixRef<T> projected = ws.qkv.topLeftCorner(rows, C);  // qkv is read by then
  project_parallel<T>(k, merged_read, s.c_proj, C, projected, ws, n_threads);
  for (Index b = b0, r = 0; b < b1; r += batch.length(b), ++b) {
    out.middleRows(batch.first_row(b), batch.length(b)) = projected.middleRows(r, batch.length(b));
    zero_padding<T>(batch, b, out);
  }
}

// The batched forward over caches cache_at(b) (a model of the cache concept, by reference or a
// view by value; NoCache: none), for any sublayer S. Every check, for every sequence, runs (and,
// for a shard, every rank agrees) before any cache changes; if anything throws after the caches
// grew, they are rolled back.
template <class T, class S, class CacheAt>
void batch_forward(const S& sublayer, const ConstMatrixRef<T>& x, const BatchLayout& batch,
                   const CacheAt& cache_at, Workspace<T>& ws, MatrixRef<T>& out) {
  using Traits = SublayerTraits<S>;
  using Cache = std::decay_t<decltype(cache_at(Index(0)))>;
  constexpr bool cached = !std::is_same<Cache, NoCache>::value;
  const Sublayer<T> s = Traits::of(sublayer);
  const kernels::Kernels<T>& k = kernels::table<T>();
  const Index B = batch.batch(), C = s.n_embd;
  // one projection for several sequences: rows exact, and room in merged for their x rows (not
  // a shard's: its heads are narrower than x; it projects sequence by sequence)
  const bool grouped = k.row_exact && s.heads.n_embd >= C;
  const Index group_rows = grouped ? std::max(batch.max_length(),
                                              std::min(batch.real_rows(), kBatchGroupRows))
                                   : batch.max_length();
  Index appended = 0, past = 0;  // caches 0 .. appended - 1 have grown
  if constexpr (cached)
    for (Index b = 0; b < B; ++b) past += cache_at(b).n_past();
  const auto roll_back = [&] {
    if constexpr (cached)
      for (Index b = 0; b < appended; ++b) {
        auto&& cache = cache_at(b);
        cache.rollback(cache.head_pages(0).n_keys - batch.length(b));
      }
  };
  try {
    Traits::agree(
        sublayer,
        [&] {
          check_batch_io<T>(batch, C, x, out);
          check_heads(s, "workspace", ws.config());
          Index max_keys = 0;
          for (Index b = 0; b < B; ++b) {
            const Index n = batch.length(b);
            try {
              if constexpr (cached) {
                auto&& cache = cache_at(b);
                check_heads(s, Cache::label(), cache.config());
                cache.check_append(n);
                cache.check_disjoint("out", out.middleRows(batch.first_row(b), n));
                max_keys = std::max(max_keys, keys_to_reserve(cache, n, 0));
              }
            } catch (...) {
              rethrow_for_sequence(b);
            }
          }
          if constexpr (AppendsTogether<Cache>::value) Cache::check_batch(B, cache_at);
          reserve_for(s, group_rows, std::max(max_keys, group_rows), ws, StoresInt8<Cache>::value);
          for (Index b = 0; b < B; ++b) {
            // With groups, rows of ws are written while later sequences' x is still to be read, and
            // out's rows (padding included) are written group by group: all of x and out stay out.
            const MatrixRef<T> out_b = grouped ? out.middleRows(b * batch.tokens(), batch.tokens())
                                               : out.middleRows(batch.first_row(b), batch.length(b));
            const Index used = grouped ? group_rows : batch.length(b);
            try {
              check_workspace_overlap<T>(ws, used, out_b, nullptr);
              const ConstMatrixRef<T> x_b = x.middleRows(batch.first_row(b), batch.length(b));
              if (used > 0 && (overlaps(x_b, ws.qkv.topRows(used)) ||
                               overlaps(x_b, ws.merged.topRows(used))))
                throw ShapeError("x: must not overlap the workspace");
            } catch (...) {
              rethrow_for_sequence(b);
            }
          }
          if constexpr (AppendsTogether<Cache>::value) {  // all or nothing
            Cache::begin_append_all(B, cache_at, [&](Index b) { return batch.length(b); });
            appended = B;
          } else if constexpr (cached) {
            for (; appended < B; ++appended) cache_at(appended).begin_append(batch.length(appended));
          }
        },
        CallShape()
            .add("the call", cached ? 4 : 3)
            .add("the batch size (B)", B)
            .add("the padded length (T)", batch.tokens())
            .add("the real rows (sum of lengths)", batch.real_rows())
            .add("the cached positions (sum of n_past)", past));
  } catch (...) {
    roll_back();
    throw;
  }
  try {
    for (Index done = 0; done < B;) {  // groups of consecutive sequences
      const Index b0 = done;
      Index b1 = b0, rows = 0;
      while (b1 < B && (b1 == b0 || (grouped && rows + batch.length(b1) <= group_rows)))
        rows += batch.length(b1++);
      run_group<T>(k, s, x, batch, cache_at, b0, b1, rows, ws, out);
      done = b1;
    }
    Traits::all_reduce(sublayer, out);
  } catch (...) {  // not expected after the checks
    roll_back();
    throw;
  }
}

// The batch's caches as cache_at(b), from a vector of caches, a vector of pointers or an array of B
// pointers (null entries and a cache given twice are errors): cache_list below.
// Errors name the caches as their kind does: KV caches, or paged sequences.
template <class C>
bool paged_kind() {
  return std::string(C::label()) == "sequence";
}
template <class C>
void check_pointers(C* const* caches, Index B) {
  const bool paged = paged_kind<C>();
  for (Index b = 0; b < B; ++b) {
    if (caches[b] == nullptr)
      throw ShapeError(std::string(paged ? "sequences" : "caches") + ": entry " +
                       std::to_string(b) + " is null");
    for (Index a = 0; a < b; ++a)
      if (caches[a] == caches[b])
        throw ShapeError(paged ? "sequences: entries " + std::to_string(a) + " and " +
                                     std::to_string(b) + " are the same paged sequence"
                               : "caches: sequences " + std::to_string(a) + " and " +
                                     std::to_string(b) + " share one KV cache");
  }
}
template <class C>
void check_count(std::size_t n, Index B) {
  if (static_cast<Index>(n) == B) return;
  if (paged_kind<C>())
    throw ShapeError("sequences: expected one paged sequence per sequence of the batch (" +
                     std::to_string(B) + "), got " + std::to_string(n));
  throw ShapeError("caches: expected one KV cache per sequence (" + std::to_string(B) + "), got " +
                   std::to_string(n));
}

// The batch's caches, b -> cache, as types with names (the compiled mode instantiates the batch
// forward over them: detail/compiled_mode.hpp). NoCaches: none.
struct NoCaches {
  NoCache operator()(Index) const { return NoCache(); }
};

// Caches from a contiguous array of them (a std::vector of caches) or an array of B pointers.
template <class C>
struct CacheList {
  C* values = nullptr;           // cache b is values[b] ...
  C* const* pointers = nullptr;  // ... or *pointers[b]
  C& operator()(Index b) const { return values != nullptr ? values[b] : *pointers[b]; }
};

// Layer `layer` of each paged sequence, grown for the step: PagedLayer(sequence b, layer, its
// batch length).
template <class S>
struct PagedLayers {
  CacheList<PagedSequence<S>> seqs;
  Index layer = 0;
  const BatchLayout* batch = nullptr;
  PagedLayer<S> operator()(Index b) const {
    return PagedLayer<S>(seqs(b), layer, batch->length(b));
  }
};

template <class C, class A, std::enable_if_t<IsKVCache<C>::value, int> = 0>
CacheList<C> cache_list(std::vector<C, A>& caches, Index B) {
  check_count<C>(caches.size(), B);
  return {caches.data(), nullptr};
}
template <class C>
CacheList<C> cache_list(C* const* caches, Index B) {
  check_pointers(caches, B);
  return {nullptr, caches};
}
template <class C, class A>
CacheList<C> cache_list(const std::vector<C*, A>& caches, Index B) {
  check_count<C>(caches.size(), B);
  return cache_list<C>(caches.data(), B);
}

}  // namespace detail

// out = GPT-2 attention sublayer of each sequence of a padded batch, independently.
//   x [B * T, C] (read; row-major [B, T, C]; padded rows may hold anything, NaN included)
//   batch: B, T and each sequence's real rows
//   ws: scratch (grown if smaller)
//   out [B * T, C] (written; padded rows exactly 0; may be the same storage as x)
// PyTorch (HF): GPT2Attention(x, attention_mask=mask) on the real rows; 0 on the padded ones.
template <class T, template <class> class S, class D,
          std::enable_if_t<detail::SublayerTraits<S<T>>::kIsSublayer, int> = 0>
void attention_forward(const S<T>& sublayer, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, Workspace<T>& ws, MatrixRef<T> out) {
  detail::batch_forward<T>(sublayer, detail::as_view<T>(x), batch, detail::NoCaches(), ws, out);
}

// Batched forward through KV caches: sequence b's real rows are its next positions, appended to
// its cache and attending to everything cached there (each sequence has its own n_past).
//   caches: one per sequence, distinct: a std::vector of caches, or of pointers to them, or an
//   array of B pointers (e.g. one layer's column of a [B][n_layer] table); any cache type
//   (KVCache<float|double|bfloat16|int8>, PagedSequence of a one-layer pool: a paged batch grows all
//   its sequences together, one pool per batch)
// A sequence of length 0 (finished, or waiting) leaves its cache alone. If any sequence's tokens
// do not fit (CapacityError) or anything else is wrong, no cache changes. Batched decode: T = 1,
// every length 1 (or 0). ws needs room for R = max(longest sequence, min(real rows, 256)) tokens
// and the caches' capacities in keys; it grows on the first call if smaller, then allocates
// nothing. x and out (padding included) must not overlap it.
template <class T, template <class> class S, class D, class Caches,
          std::enable_if_t<detail::SublayerTraits<S<T>>::kIsSublayer, int> = 0>
void attention_forward(const S<T>& sublayer, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, Caches&& caches, Workspace<T>& ws,
                       MatrixRef<T> out) {
  detail::batch_forward<T>(sublayer, detail::as_view<T>(x), batch,
                           detail::cache_list(caches, batch.batch()), ws, out);
}

// Layer `layer` of a batched model step, every paged sequence grown already for it: sequence b's
// real rows are its last batch.length(b) positions. seqs: a vector of pointers or an array of B.
template <class T, template <class> class S, class D, class Seqs,
          std::enable_if_t<detail::SublayerTraits<S<T>>::kIsSublayer, int> = 0>
void attention_forward(const S<T>& sublayer, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, Seqs&& seqs, Index layer, Workspace<T>& ws,
                       MatrixRef<T> out) {
  const auto list = detail::cache_list(seqs, batch.batch());
  using Seq = std::remove_reference_t<decltype(list(0))>;
  detail::batch_forward<T>(sublayer, detail::as_view<T>(x), batch,
                           detail::PagedLayers<typename Seq::Storage>{list, layer, &batch}, ws,
                           out);
}

// The compiled mode's batch forwards over the contiguous caches (detail/compiled_mode.hpp;
// paged_kv_cache.hpp declares the paged ones).
#if GPT2_ATTENTION_EXTERN_FORWARDS
GPT2_ATTENTION_BATCH_FORWARD(float, detail::NoCaches)
GPT2_ATTENTION_BATCH_FORWARD(float, detail::CacheList<KVCache<float>>)
GPT2_ATTENTION_BATCH_FORWARD(float, detail::CacheList<KVCache<bfloat16>>)
GPT2_ATTENTION_BATCH_FORWARD(float, detail::CacheList<KVCache<int8>>)
GPT2_ATTENTION_BATCH_FORWARD(double, detail::NoCaches)
GPT2_ATTENTION_BATCH_FORWARD(double, detail::CacheList<KVCache<double>>)
#endif

}  // namespace gpt2
