// KVCache and the forward through it (kv_cache.hpp, sublayer.hpp): the cache's own contract
// (layout, room, truncate, copies, moves), and that any split of a sequence into chunks gives the
// whole-sequence forward. The PyTorch past_key_values cases are in test_reference_incremental.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <type_traits>

#include <numeric>
#include <vector>

#include "gpt2/attention.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/models.hpp"
#include "support/thread_count.hpp"

namespace {

using gpt2::Index;
using gpt2::KVCache;
using gpt2::RowMatrix;
using gpt2::test::Contains;
using gpt2::test::error_of;
using gpt2::test::Model;
using gpt2::test::near;
using gpt2::test::random_input;
using gpt2::test::random_model;

// Chunked and whole forwards are bitwise equal where the projections are row-exact (the float
// vector levels; the attention core's rows are exact at every level). At the generic level and
// in double the projections run Eigen's kernels (one row takes its GEMV, several its GEMM, whose
// blocking depends on the row count), so they differ by rounding there. Measured worst case over
// these tests: see ChunkedEqualsWhole's output. Bound: relative to max |expected|.
template <class T>
constexpr double kChunkTolerance = sizeof(T) == 4 ? 4e-6 : 1e-14;

// Caches are megabytes: copies are explicit (copy(), copy_from()), moves never throw. The same
// for the bf16 cache (both are KVCache<S>).
static_assert(!std::is_copy_constructible<KVCache<float>>::value &&
                  !std::is_copy_assignable<KVCache<double>>::value,
              "a KVCache is copied only explicitly");
static_assert(std::is_nothrow_move_constructible<KVCache<float>>::value &&
                  std::is_nothrow_move_assignable<KVCache<double>>::value,
              "moving a KVCache cannot throw");
static_assert(!std::is_copy_constructible<gpt2::KVCacheBF16>::value &&
                  !std::is_copy_assignable<gpt2::KVCacheBF16>::value &&
                  std::is_nothrow_move_constructible<gpt2::KVCacheBF16>::value &&
                  std::is_nothrow_move_assignable<gpt2::KVCacheBF16>::value,
              "KVCacheBF16: explicit copies, moves that cannot throw");

template <class T>
class KVCacheTest : public ::testing::Test {};
TYPED_TEST_SUITE(KVCacheTest, gpt2::test::Scalars);

// Runs x [T, C] through a fresh cache in chunks of the given sizes; returns out [T, C] and, if
// probs is non-null, fills it [n_head * T, T] from the chunks' probabilities.
template <class T>
RowMatrix<T> run_chunked(const gpt2::AttentionWeights<T>& w, const RowMatrix<T>& x,
                         const std::vector<Index>& chunks, RowMatrix<T>* probs = nullptr) {
  const Index T_ = x.rows(), C = x.cols(), H = w.n_head();
  KVCache<T> cache(w.config(), T_);
  gpt2::Workspace<T> ws(w.config());
  RowMatrix<T> out(T_, C);
  if (probs) probs->setConstant(T_ * H, T_, T(-1));
  Index pos = 0;
  for (const Index n : chunks) {
    if (probs) {
      RowMatrix<T> p(H * n, pos + n);
      gpt2::attention_forward<T>(w, x.middleRows(pos, n), cache, ws, out.middleRows(pos, n), p);
      for (Index h = 0; h < H; ++h) {
        probs->block(h * T_ + pos, 0, n, pos + n) = p.middleRows(h * n, n);
        probs->block(h * T_ + pos, pos + n, n, T_ - pos - n).setZero();
      }
    } else {
      gpt2::attention_forward<T>(w, x.middleRows(pos, n), cache, ws, out.middleRows(pos, n));
    }
    pos += n;
    EXPECT_EQ(cache.n_past(), pos);
  }
  EXPECT_EQ(pos, T_) << "chunks must cover the sequence";
  return out;
}

TYPED_TEST(KVCacheTest, StartsEmptyWithTheRequestedRoom) {
  using T = TypeParam;
  const gpt2::AttentionConfig config{64, 4};
  const KVCache<T> cache(config, 100);
  EXPECT_EQ(cache.capacity(), 100);
  EXPECT_EQ(cache.n_past(), 0);
  EXPECT_EQ(cache.remaining(), 100);
  EXPECT_EQ(cache.keys(3).rows(), 0);
  EXPECT_EQ(cache.keys(3).cols(), 16);
  EXPECT_EQ(cache.key_storage().rows(), 4 * 100);
  EXPECT_TRUE(Contains(error_of<gpt2::Error>([&] { KVCache<T>(config, -1); }), "max_tokens"));
  EXPECT_TRUE(Contains(error_of<gpt2::Error>([&] { KVCache<T>({64, 5}, 8); }), "n_head"));
  EXPECT_TRUE(Contains(error_of<gpt2::Error>([&] { (void)cache.keys(4); }), "expected an index in [0, 4)"));
}

// append takes k and v in the qkv layout (heads side by side) and stores head by head.
TYPED_TEST(KVCacheTest, AppendStoresEachHeadContiguously) {
  using T = TypeParam;
  const gpt2::AttentionConfig config{8, 2};
  KVCache<T> cache(config, 5);
  const RowMatrix<T> k = random_input<T>(3, 8, 1), v = random_input<T>(3, 8, 2);
  cache.append(k, v);
  const RowMatrix<T> k2 = random_input<T>(2, 8, 3), v2 = random_input<T>(2, 8, 4);
  cache.append(k2, v2);
  ASSERT_EQ(cache.n_past(), 5);
  for (Index h = 0; h < 2; ++h) {
    RowMatrix<T> expected_k(5, 4), expected_v(5, 4);
    expected_k << k.middleCols(h * 4, 4), k2.middleCols(h * 4, 4);
    expected_v << v.middleCols(h * 4, 4), v2.middleCols(h * 4, 4);
    EXPECT_TRUE(cache.keys(h) == expected_k) << "head " << h;
    EXPECT_TRUE(cache.values(h) == expected_v) << "head " << h;
    // contiguous: head h's rows are one block of the storage
    EXPECT_EQ(cache.keys(h).data(), cache.key_storage().data() + h * 5 * 4);
    EXPECT_EQ(cache.keys(h).outerStride(), 4);
  }
}

// A cache filled from Hugging Face's past_key_values layout ([n_head, n, head_dim] per sequence)
// continues exactly like the cache that computed those keys and values.
TYPED_TEST(KVCacheTest, AppendPastTakesHuggingFaceLayout) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(16, 2, 21);
  const gpt2::AttentionWeights<T> w = m.weights();
  const RowMatrix<T> x = random_input<T>(9, 16, 22);
  KVCache<T> computed(m.config, 9), imported(m.config, 9);
  gpt2::Workspace<T> ws(m.config);
  RowMatrix<T> out(9, 16), a(3, 16), b(3, 16);
  gpt2::attention_forward<T>(w, x.topRows(6), computed, ws, out.topRows(6));
  RowMatrix<T> past_k(2 * 6, 8), past_v(2 * 6, 8);  // [n_head, n_past, head_dim]
  for (Index h = 0; h < 2; ++h) {
    past_k.middleRows(h * 6, 6) = computed.keys(h);
    past_v.middleRows(h * 6, 6) = computed.values(h);
  }
  imported.append_past(past_k.topRows(2 * 4), past_v.topRows(2 * 4));  // wrong n: heads mixed
  EXPECT_FALSE(imported.keys(1) == computed.keys(1).topRows(4));
  imported.reset();
  imported.append_past(past_k, past_v);
  ASSERT_EQ(imported.n_past(), 6);
  gpt2::attention_forward<T>(w, x.bottomRows(3), computed, ws, a);
  gpt2::attention_forward<T>(w, x.bottomRows(3), imported, ws, b);
  EXPECT_TRUE(a == b);
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { imported.append_past(past_k.topRows(5), past_v.topRows(5)); }),
            "k: expected shape [n_head * n, 8] with n_head 2, got [5, 8]");
  EXPECT_THROW(imported.append_past(past_k.topRows(2), past_v.topRows(2)), gpt2::CapacityError);
  EXPECT_EQ(imported.n_past(), 9);
}

TYPED_TEST(KVCacheTest, OverflowIsACapacityErrorAndChangesNothing) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(16, 2, 1);
  const gpt2::AttentionWeights<T> w = m.weights();
  KVCache<T> cache(m.config, 10);
  gpt2::Workspace<T> ws(m.config);
  const RowMatrix<T> x = random_input<T>(12, 16, 2);
  RowMatrix<T> out(12, 16);
  gpt2::attention_forward<T>(w, x.topRows(8), cache, ws, out.topRows(8));
  const RowMatrix<T> keys_before = cache.key_storage(), values_before = cache.value_storage();

  out.setConstant(T(7));
  const std::string message = error_of<gpt2::CapacityError>(
      [&] { gpt2::attention_forward<T>(w, x.middleRows(8, 3), cache, ws, out.topRows(3)); });
  EXPECT_EQ(message, "KV cache: 8 cached + 3 new tokens exceed its capacity of 10 tokens");
  EXPECT_EQ(cache.n_past(), 8);
  EXPECT_TRUE(cache.key_storage() == keys_before);
  EXPECT_TRUE(cache.value_storage() == values_before);
  EXPECT_TRUE((out.array() == T(7)).all()) << "out must be untouched";
  EXPECT_THROW(cache.append(x.topRows(3), x.topRows(3)), gpt2::CapacityError);
  EXPECT_EQ(cache.n_past(), 8);

  // exactly filling it is fine
  gpt2::attention_forward<T>(w, x.middleRows(8, 2), cache, ws, out.topRows(2));
  EXPECT_EQ(cache.remaining(), 0);
}

TYPED_TEST(KVCacheTest, ShapeAndConfigErrorsNameTheTensorAndLeaveTheCacheAlone) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(16, 2, 1);
  const gpt2::AttentionWeights<T> w = m.weights();
  KVCache<T> cache(m.config, 10), other_heads({16, 4}, 10);
  gpt2::Workspace<T> ws(m.config);
  const RowMatrix<T> x = random_input<T>(4, 16, 2);
  RowMatrix<T> out(4, 16), wide(4, 17), probs(2 * 4, 5);
  EXPECT_EQ(error_of<gpt2::Error>([&] { gpt2::attention_forward<T>(w, x, cache, ws, wide); }),
            "out: expected shape [4, 16], got [4, 17]");
  EXPECT_EQ(error_of<gpt2::Error>([&] { gpt2::attention_forward<T>(w, x, cache, ws, out, probs); }),
            "probs: expected shape [8, 4], got [8, 5]");
  EXPECT_TRUE(Contains(error_of<gpt2::ConfigError>([&] { gpt2::attention_forward<T>(w, x, other_heads, ws, out); }), "cache: expected n_embd 16, n_head 2"));
  EXPECT_EQ(cache.n_past(), 0);
  // out inside the cache
  Eigen::Map<RowMatrix<T>> inside(const_cast<T*>(cache.key_storage().data()), 1, 16);
  EXPECT_TRUE(Contains(error_of<gpt2::Error>([&] { gpt2::attention_forward<T>(w, x.topRows(1), cache, ws, inside); }), "out: must not overlap the KV cache"));
  EXPECT_EQ(cache.n_past(), 0);
}

TYPED_TEST(KVCacheTest, TruncateResetCopyAndMove) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(16, 2, 5);
  const gpt2::AttentionWeights<T> w = m.weights();
  const RowMatrix<T> x = random_input<T>(9, 16, 6);
  KVCache<T> cache(m.config, 12);
  gpt2::Workspace<T> ws(m.config);
  RowMatrix<T> out(9, 16);
  gpt2::attention_forward<T>(w, x.topRows(6), cache, ws, out.topRows(6));

  // copy() is deep: the two evolve independently
  KVCache<T> fork = cache.copy();
  EXPECT_EQ(fork.n_past(), 6);
  EXPECT_EQ(fork.capacity(), 12);
  EXPECT_NE(fork.keys(0).data(), cache.keys(0).data());
  RowMatrix<T> a(3, 16), b(3, 16);
  gpt2::attention_forward<T>(w, x.middleRows(6, 3), cache, ws, a);
  gpt2::attention_forward<T>(w, x.middleRows(6, 3), fork, ws, b);
  EXPECT_TRUE(a == b);
  EXPECT_EQ(cache.n_past(), 9);

  // truncate rolls back: recomputing the same tokens gives the same result
  cache.truncate(6);
  gpt2::attention_forward<T>(w, x.middleRows(6, 3), cache, ws, b);
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(Contains(error_of<gpt2::Error>([&] { cache.truncate(10); }), "expected a length in [0, 9]"));
  EXPECT_TRUE(Contains(error_of<gpt2::Error>([&] { cache.truncate(-1); }), "got -1"));

  // copy_from reuses storage; needs room and the same config
  KVCache<T> small(m.config, 4), other({16, 4}, 12);
  EXPECT_THROW(small.copy_from(cache), gpt2::CapacityError);
  EXPECT_THROW(other.copy_from(cache), gpt2::ConfigError);
  const T* storage = fork.key_storage().data();
  fork.reset();
  EXPECT_EQ(fork.n_past(), 0);
  fork.copy_from(cache);
  EXPECT_EQ(fork.key_storage().data(), storage);
  for (Index h = 0; h < 2; ++h) {
    EXPECT_TRUE(fork.keys(h) == cache.keys(h));
    EXPECT_TRUE(fork.values(h) == cache.values(h));
  }

  // moving leaves the source empty, and usable as an empty cache
  KVCache<T> moved = std::move(fork);
  EXPECT_EQ(moved.n_past(), 9);
  for (KVCache<T>* empty : {&fork}) {  // NOLINT(bugprone-use-after-move): documented state
    EXPECT_EQ(empty->capacity(), 0);
    EXPECT_EQ(empty->n_past(), 0);
    EXPECT_EQ(empty->keys(1).rows(), 0);
    EXPECT_EQ(empty->keys(1).cols(), 8);
    EXPECT_EQ(empty->copy().capacity(), 0);
    const RowMatrix<T> none(0, 16);
    empty->append(none, none);
    EXPECT_THROW(empty->append(x.topRows(1), x.topRows(1)), gpt2::CapacityError);
    small.copy_from(*empty);
    EXPECT_EQ(small.n_past(), 0);
  }
  fork = std::move(moved);
  EXPECT_EQ(fork.n_past(), 9);
  EXPECT_EQ(moved.capacity(), 0);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(moved.values(0).cols(), 8);
}

// Moving between caches of different configs: the source is left empty with its own head_dim (the
// moved-from storage is the destination's old one, resized), so it can still be used.
TYPED_TEST(KVCacheTest, MovingAcrossConfigsLeavesTheSourceEmptyInItsOwnShape) {
  using T = TypeParam;
  KVCache<T> big({96, 3}, 5), small({32, 4}, 7);  // head_dim 32 and 8
  const RowMatrix<T> x = random_input<T>(2, 32, 21);
  small.append(x, x);
  big = std::move(small);
  EXPECT_EQ(big.config().head_dim(), 8);
  EXPECT_EQ(big.n_past(), 2);
  EXPECT_EQ(big.keys(3).cols(), 8);
  EXPECT_EQ(small.capacity(), 0);  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_EQ(small.key_storage().rows(), 0);
  EXPECT_EQ(small.key_storage().cols(), 8);
  EXPECT_EQ(small.values(0).cols(), 8);
  KVCache<T> empty({32, 4}, 1);
  small.copy_from(empty);
  EXPECT_EQ(small.n_past(), 0);
  gpt2::KVCacheBF16 big16({96, 3}, 5), small16({32, 4}, 7);
  big16 = std::move(small16);
  EXPECT_EQ(small16.value_storage().cols(), 8);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(small16.keys(1).cols(), 8);
}

TYPED_TEST(KVCacheTest, ACapacityBeyondTheIndexTypeIsAnError) {
  using T = TypeParam;
  EXPECT_TRUE(Contains(error_of<gpt2::CapacityError>([] { KVCache<T>({16, 4}, Index(1) << 62); }),
                       "positions of n_embd 16 overflow the index type"));
}

// The result does not depend on how much room the cache and the workspace have: the score tile's
// rows are aligned alike whatever its width, and the att v product's depth blocking is fixed.
TYPED_TEST(KVCacheTest, ResultsDoNotDependOnCapacity) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(64, 4, 12);
  const gpt2::AttentionWeights<T> w = m.weights();
  for (const Index T_ : {4, 7, 300}) {
    const RowMatrix<T> x = random_input<T>(T_, 64, 13);
    gpt2::Workspace<T> tight(m.config, T_);
    RowMatrix<T> plain(T_, 64);
    gpt2::attention_forward<T>(w, x, tight, plain);
    for (const Index capacity : {T_ + 1, T_ + 3, Index(301), Index(2001)}) {
      gpt2::Workspace<T> roomy(m.config, T_, capacity), ws(m.config);
      RowMatrix<T> out(T_, 64), cached(T_, 64);
      gpt2::attention_forward<T>(w, x, roomy, out);
      EXPECT_TRUE(out == plain) << "T=" << T_ << ", key capacity " << capacity;
      KVCache<T> cache(m.config, capacity);
      gpt2::attention_forward<T>(w, x, cache, ws, cached);
      EXPECT_TRUE(cached == plain) << "T=" << T_ << ", cache capacity " << capacity;
    }
  }
}

// One chunk through an empty cache is the plain forward, bit for bit: the keys and values are
// the same numbers, only stored elsewhere, and the kernels see the same shapes.
TYPED_TEST(KVCacheTest, OneChunkEqualsThePlainForwardBitForBit) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(64, 4, 7);
  const gpt2::AttentionWeights<T> w = m.weights();
  for (const Index T_ : {1, 5, 64, 130}) {
    const RowMatrix<T> x = random_input<T>(T_, 64, 8);
    RowMatrix<T> plain(T_, 64), plain_probs(4 * T_, T_), probs;
    gpt2::Workspace<T> ws(m.config);
    gpt2::attention_forward<T>(w, x, ws, plain, plain_probs);
    const RowMatrix<T> cached = run_chunked<T>(w, x, {T_}, &probs);
    EXPECT_TRUE(cached == plain) << "T=" << T_;
    EXPECT_TRUE(probs == plain_probs) << "T=" << T_;
  }
}

// Any split of a sequence gives the whole-sequence result (out and probabilities).
TYPED_TEST(KVCacheTest, ChunkedEqualsWhole) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(128, 2, 9);
  const gpt2::AttentionWeights<T> w = m.weights();
  const Index T_ = 150;
  const RowMatrix<T> x = random_input<T>(T_, 128, 10);
  RowMatrix<T> whole(T_, 128), whole_probs(2 * T_, T_);
  gpt2::Workspace<T> ws(m.config);
  gpt2::attention_forward<T>(w, x, ws, whole, whole_probs);

  std::vector<std::vector<Index>> splits = {
      {149, 1}, {70, 1, 79}, {5, 1, 13, 2, 64, 65}, {1, 1, 1, 147}, {64, 64, 22}};
  std::vector<Index> ones(T_, 1), prefill_then_ones(50, 1);
  prefill_then_ones.insert(prefill_then_ones.begin(), 100);
  splits.push_back(ones);
  splits.push_back(prefill_then_ones);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 6; ++trial) {  // random splits
    std::vector<Index> split;
    for (Index left = T_; left > 0;) {
      const Index n = std::min<Index>(left, 1 + static_cast<Index>(rng() % (trial % 2 ? 9 : 80)));
      split.push_back(n);
      left -= n;
    }
    splits.push_back(split);
  }
  const bool exact = gpt2::kernels::table<T>().row_exact;
  double worst_out = 0, worst_probs = 0;
  for (const std::vector<Index>& split : splits) {
    SCOPED_TRACE("split of " + std::to_string(split.size()) + " chunks, first " +
                 std::to_string(split[0]));
    RowMatrix<T> probs;
    const RowMatrix<T> out = run_chunked<T>(w, x, split, &probs);
    if (exact) {  // bitwise: out, the probabilities (and run_chunked's own check of the cache)
      EXPECT_TRUE(out == whole);
      EXPECT_TRUE(probs == whole_probs);
    }
    EXPECT_TRUE(near(out, whole, kChunkTolerance<T>));
    EXPECT_TRUE(near(probs, whole_probs, kChunkTolerance<T>));
    // without probabilities (a decode step's own path: the keys' transposed blocks, the split
    // over threads): the same bits
    const RowMatrix<T> plain_out = run_chunked<T>(w, x, split);
    if (exact) {
      EXPECT_TRUE(plain_out == whole);
    }
    EXPECT_TRUE(near(plain_out, whole, kChunkTolerance<T>));
    // causal zeros stay exact
    for (Index h = 0; h < 2; ++h)
      for (Index t = 0; t + 1 < T_; ++t)
        ASSERT_TRUE((probs.row(h * T_ + t).tail(T_ - t - 1).array() == T(0)).all());
    worst_out = std::max(worst_out, gpt2::test::max_diff(out, whole).relative());
    worst_probs = std::max(worst_probs, gpt2::test::max_diff(probs, whole_probs).relative());
  }
  std::printf("chunked vs whole (%s, %s): worst relative difference out %.2e, probs %.2e\n",
              sizeof(T) == 4 ? "float" : "double", exact ? "row-exact: bitwise" : "Eigen's kernels",
              worst_out, worst_probs);
}

// The keys and values a chunked sequence leaves in its cache are the whole sequence's qkv
// projection's, bitwise where the projections are row-exact.
TYPED_TEST(KVCacheTest, ChunkedKeysAndValuesAreTheWholeOnes) {
  using T = TypeParam;
  if (!gpt2::kernels::table<T>().row_exact)
    GTEST_SKIP() << "skipped: Eigen's projections at this level are not row-exact (rounding only)";
  const Model<T> m = random_model<T>(128, 2, 12);
  const gpt2::AttentionWeights<T> w = m.weights();
  const Index T_ = 97;
  const RowMatrix<T> x = random_input<T>(T_, 128, 13);
  RowMatrix<T> qkv(T_, 3 * 128);
  gpt2::qkv_projection<T>(w, x, qkv);
  KVCache<T> cache(w.config(), T_);
  gpt2::Workspace<T> ws(w.config());
  RowMatrix<T> out(T_, 128);
  Index pos = 0;
  for (const Index n : {Index{40}, Index{1}, Index{1}, Index{30}, Index{25}}) {
    gpt2::attention_forward<T>(w, x.middleRows(pos, n), cache, ws, out.middleRows(pos, n));
    pos += n;
  }
  for (Index h = 0; h < 2; ++h) {
    EXPECT_TRUE(cache.keys(h) == gpt2::k_view(qkv, w.config(), h)) << "head " << h;
    EXPECT_TRUE(cache.values(h) == gpt2::v_view(qkv, w.config(), h)) << "head " << h;
  }
}

// The keys' transposed blocks (transposed_key_blocks, read by the vector levels' decode steps)
// hold the cached keys through appends of both layouts, truncations, copies and moves; a double
// cache keeps none.
template <class Cache>
void expect_blocks_mirror_keys(const Cache& cache) {
  const Index hd = cache.config().head_dim(), B = gpt2::kernels::kKeyBlock;
  for (Index h = 0; h < cache.config().n_head; ++h) {
    const auto* kt = cache.transposed_key_blocks(h);
    ASSERT_NE(kt, nullptr);
    const auto storage = cache.key_storage();  // a view (Ref): kept alive for the block below
    const auto keys = storage.middleRows(h * cache.capacity(), cache.n_past());
    for (Index j = 0; j < cache.n_past(); ++j)
      for (Index d = 0; d < hd; ++d)
        ASSERT_EQ(kt[((j / B) * hd + d) * B + j % B], keys(j, d))
            << "head " << h << ", position " << j << ", component " << d;
  }
}
TEST(KVCacheKeyBlocks, MirrorTheKeys) {
  const Model<float> m = random_model<float>(48, 3, 3);
  const gpt2::AttentionWeights<float> w = m.weights();
  const RowMatrix<float> x = random_input<float>(150, 48, 4);
  KVCache<float> cache(m.config, 200);
  gpt2::KVCacheBF16 bf16(m.config, 200);
  gpt2::Workspace<float> ws(m.config);
  RowMatrix<float> out(150, 48);
  gpt2::attention_forward<float>(w, x.topRows(70), cache, ws, out.topRows(70));
  const RowMatrix<float> half = x * 0.5f;
  bf16.append(x.topRows(70), half.topRows(70));
  expect_blocks_mirror_keys(cache);
  expect_blocks_mirror_keys(bf16);
  cache.truncate(61);
  bf16.truncate(61);
  gpt2::attention_forward<float>(w, x.middleRows(61, 69), cache, ws, out.middleRows(61, 69));
  const RowMatrix<float> past = random_input<float>(3 * 20, 16, 5);  // [n_head * 20, head_dim]
  cache.append_past(past, past);
  bf16.append_past(past, past);
  EXPECT_EQ(cache.n_past(), 150);
  expect_blocks_mirror_keys(cache);
  expect_blocks_mirror_keys(bf16);
  KVCache<float> copy = cache.copy();
  expect_blocks_mirror_keys(copy);
  KVCache<float> moved = std::move(copy);
  expect_blocks_mirror_keys(moved);
  gpt2::KVCacheBF16 bf16_copy(m.config, 150);
  bf16_copy.copy_from(bf16);
  expect_blocks_mirror_keys(bf16_copy);
  // the blocks' bytes are in bytes(): the keys kept twice (capacity rounded up to whole blocks)
  EXPECT_EQ(cache.bytes(), static_cast<Index>(sizeof(float)) * (2 * 200 + 256) * 48);
  EXPECT_EQ(bf16.bytes(), 2 * (2 * 200 + 256) * 48);
  const KVCache<double> none(gpt2::AttentionConfig{48, 3}, 10);
  EXPECT_EQ(none.transposed_key_blocks(0), nullptr);
  EXPECT_EQ(none.bytes(), static_cast<Index>(sizeof(double)) * 2 * 10 * 48);
}

// What a rolled-back forward left in the blocks (here NaN keys) never reaches a later step: the
// lanes of positions a row does not see are masked, so decode steps after the truncation give
// the bits of a cache that never held them.
TEST(KVCacheKeyBlocks, RolledBackKeysDoNotReachLaterSteps) {
  const Model<float> m = random_model<float>(128, 2, 7);
  const gpt2::AttentionWeights<float> w = m.weights();
  const RowMatrix<float> x = random_input<float>(100, 128, 8);
  RowMatrix<float> poison = x.middleRows(70, 5);
  poison.setConstant(std::numeric_limits<float>::quiet_NaN());
  KVCache<float> clean(m.config, 100), dirty(m.config, 100);
  gpt2::Workspace<float> ws(m.config);
  RowMatrix<float> a(100, 128), b(100, 128), junk(5, 128);
  gpt2::attention_forward<float>(w, x.topRows(70), clean, ws, a.topRows(70));
  gpt2::attention_forward<float>(w, x.topRows(70), dirty, ws, b.topRows(70));
  gpt2::attention_forward<float>(w, poison, dirty, ws, junk);
  dirty.truncate(70);
  for (Index t = 70; t < 100; ++t) {
    gpt2::attention_forward<float>(w, x.row(t), clean, ws, a.row(t));
    gpt2::attention_forward<float>(w, x.row(t), dirty, ws, b.row(t));
  }
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(a.allFinite());
}

// A decode step with fewer heads than threads splits each head's keys over the threads (every
// thread's run of blocks starting mid-cache, read from the transposed blocks): bitwise the
// one-thread steps and the whole-sequence forward, on 1, 2 and 3 threads, with a last block cut
// short (600 positions) and a head_dim that ends mid-vector (20).
TEST(KVCacheKeyBlocks, SplitDecodeStepsOverThreadsAreBitwise) {
  if (!gpt2::kernels::table<float>().row_exact)
    GTEST_SKIP() << "skipped: Eigen's projections at this level are not row-exact (rounding only)";
  const int threads_before = gpt2::num_threads();
  for (const Index C : {Index{64}, Index{20}}) {
    const Model<float> m = random_model<float>(C, 1, 21);
    const gpt2::AttentionWeights<float> w = m.weights();
    const Index T_ = 600;
    const RowMatrix<float> x = random_input<float>(T_, C, 22);
    RowMatrix<float> whole(T_, C);
    gpt2::Workspace<float> ws(m.config);
    gpt2::attention_forward<float>(w, x, ws, whole);
    for (const int threads : {1, 2, 3}) {
      SCOPED_TRACE("C " + std::to_string(C) + ", " + std::to_string(threads) + " threads");
      gpt2::set_num_threads(threads);
      std::vector<Index> split(T_ - 450, 1);
      split.insert(split.begin(), 450);
      EXPECT_TRUE(run_chunked<float>(w, x, split) == whole);
    }
    gpt2::set_num_threads(threads_before);
  }
}

// A decode step on 2 or more threads with at least as many heads as threads runs in one parallel
// region (qkv, then each head's cache rows and attention on one thread, then the projection):
// the bits of the one-thread steps at every level (out and cache), and of the whole-sequence
// forward where the projections are row-exact, on 2 to 4 threads, with out the same storage as x,
// and with a head_dim that ends mid-vector (20). C 384 (6 heads of 64) on 2 threads takes the path
// where each thread computes its own heads' q, k, v columns and attends them with no barrier in
// between (decode_heads_split_aligned); the others, and 3 or 4 threads there, the qkv product's
// own column parts, then the heads.
TYPED_TEST(KVCacheTest, DecodeStepsInOneRegionAreBitwise) {
  using T = TypeParam;
  if (!gpt2::kHasOpenMP) GTEST_SKIP() << "skipped: built without OpenMP (one thread only)";
  const gpt2::test::ThreadCount restore;
  const bool exact = gpt2::kernels::table<T>().row_exact;
  struct Shape {
    Index C, heads;
  };
  for (const Shape shape : {Shape{256, 4}, Shape{80, 4}, Shape{384, 6}}) {
    const Index C = shape.C, n_head = shape.heads;
    const Model<T> m = random_model<T>(C, n_head, 31);
    EXPECT_EQ(gpt2::detail::decode_heads_split_aligned(m.config, 2), n_head == 6) << "C " << C;
    EXPECT_FALSE(gpt2::detail::decode_heads_split_aligned(m.config, 3)) << "C " << C;
    const gpt2::AttentionWeights<T> w = m.weights();
    const Index T_ = 200, prompt = 130, hd = C / n_head;
    const RowMatrix<T> x = random_input<T>(T_, C, 32);
    RowMatrix<T> whole(T_, C);
    gpt2::Workspace<T> whole_ws(m.config);
    gpt2::attention_forward<T>(w, x, whole_ws, whole);
    KVCache<T> one(m.config, T_);  // the one-thread run's cache
    RowMatrix<T> one_out;
    for (const int threads : {1, 2, 3, 4}) {
      SCOPED_TRACE("C " + std::to_string(C) + ", " + std::to_string(threads) + " threads");
      ASSERT_EQ(gpt2::set_num_threads(threads), threads);
      KVCache<T> cache(m.config, T_);
      gpt2::Workspace<T> ws(m.config);
      RowMatrix<T> out = x;  // each step writes its row over its input
      gpt2::attention_forward<T>(w, x.topRows(prompt), cache, ws, out.topRows(prompt));
      for (Index t = prompt; t < T_; ++t)
        gpt2::attention_forward<T>(w, out.row(t), cache, ws, out.row(t));
      ASSERT_EQ(cache.n_past(), T_);
      if (exact) {
        EXPECT_TRUE(out == whole);
      }
      EXPECT_TRUE(near(out, whole, kChunkTolerance<T>));
      if (threads == 1) {
        one.copy_from(cache);
        one_out = out;
        continue;
      }
      EXPECT_TRUE(out == one_out);
      for (Index h = 0; h < n_head; ++h) {
        EXPECT_TRUE(cache.keys(h) == one.keys(h)) << "head " << h;
        EXPECT_TRUE(cache.values(h) == one.values(h)) << "head " << h;
        if (const T* blocks = cache.transposed_key_blocks(h)) {
          const Index n = (T_ + 63) / 64 * 64 * hd;
          EXPECT_TRUE(std::equal(blocks, blocks + n, one.transposed_key_blocks(h))) << "head " << h;
        }
      }
    }
  }
}

// The workspace is sized for the whole cache on the first call and then reused.
TYPED_TEST(KVCacheTest, FirstCallSizesTheWorkspaceForTheWholeCache) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(16, 2, 1);
  KVCache<T> cache(m.config, 300);
  gpt2::Workspace<T> ws(m.config);
  const RowMatrix<T> x = random_input<T>(2, 16, 2);
  RowMatrix<T> out(2, 16);
  gpt2::attention_forward<T>(m.weights(), x, cache, ws, out);
  EXPECT_EQ(ws.capacity(), 2);
  EXPECT_EQ(ws.key_capacity(), 300);
}

TYPED_TEST(KVCacheTest, EmptyChunkIsANoOp) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(16, 2, 1);
  KVCache<T> cache(m.config, 3);
  gpt2::Workspace<T> ws(m.config);
  const RowMatrix<T> x(0, 16);
  RowMatrix<T> out(0, 16);
  gpt2::attention_forward<T>(m.weights(), x, cache, ws, out);
  EXPECT_EQ(cache.n_past(), 0);
}

}  // namespace
