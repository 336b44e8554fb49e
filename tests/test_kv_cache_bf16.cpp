// KVCacheBF16 = KVCache<bfloat16> and the forward through it (kv_cache.hpp, sublayer.hpp): the cache's
// own contract (rounding, room, truncate, copies, moves, bytes), and that a forward through it is
// bitwise the forward over keys and values rounded to bf16, built here from the public steps
// (qkv_projection, causal_attention_head, output_projection) on rounded copies, whatever the
// chunking (one prefill, prefill plus decode steps, random splits), with probabilities too, for
// float32 and bf16 weights. Accuracy against PyTorch is in test_reference_bf16.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "gpt2/attention.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/models.hpp"
#include "support/thread_count.hpp"

namespace {

using gpt2::Index;
using gpt2::KVCacheBF16;
using gpt2::RowMatrix;
using gpt2::test::Contains;
using gpt2::test::error_of;
using gpt2::test::near;
using gpt2::test::random_input;
using gpt2::test::random_model;

RowMatrix<float> rounded(const RowMatrix<float>& m) {
  RowMatrix<float> r(m.rows(), m.cols());
  for (Index i = 0; i < m.rows(); ++i)
    for (Index j = 0; j < m.cols(); ++j)
      r(i, j) = gpt2::kernels::bf16_to_float(gpt2::kernels::round_to_bf16(m(i, j)));
  return r;
}

// The forward of all of x [N, C] with its keys and values rounded to bf16, from the public steps:
// out [N, C] and (if probs is non-null) probs [n_head * N, N].
RowMatrix<float> rounded_kv_reference(const gpt2::AttentionWeights<float>& w,
                                      const RowMatrix<float>& x, RowMatrix<float>* probs) {
  const gpt2::AttentionConfig& config = w.config();
  const Index N = x.rows(), C = config.n_embd;
  RowMatrix<float> qkv(N, 3 * C);
  gpt2::qkv_projection<float>(w, x, qkv);
  const RowMatrix<float> k = rounded(qkv.middleCols(C, C)), v = rounded(qkv.middleCols(2 * C, C));
  RowMatrix<float> merged(N, C);
  const Index hd = config.head_dim();
  if (probs) probs->resize(config.n_head * N, N);
  gpt2::AttentionScratch<float> scratch;
  // bf16 weights' tiles: the level's bf16 core (at avx512_bf16 both products in bf16 pairs before
  // a row's own block), but not at amx, whose AMX core takes only tiles of 16 rows or more (the
  // decode rows checked bitwise there run the float32 core)
  scratch.set_bf16_products(w.weight_dtype() == gpt2::WeightDtype::bf16 &&
                            gpt2::active_isa() != gpt2::Isa::amx);
  for (Index h = 0; h < config.n_head; ++h) {
    const RowMatrix<float> kh = k.middleCols(h * hd, hd), vh = v.middleCols(h * hd, hd);
    if (probs)
      gpt2::causal_attention_head<float>(gpt2::q_view(qkv, config, h), kh, vh,
                                         gpt2::head_slot(merged, config, h),
                                         probs->middleRows(h * N, N), scratch);
    else
      gpt2::causal_attention_head<float>(gpt2::q_view(qkv, config, h), kh, vh,
                                         gpt2::head_slot(merged, config, h), scratch);
  }
  RowMatrix<float> out(N, C);
  gpt2::output_projection<float>(w, merged, out);
  return out;
}

// Runs x through a fresh KVCacheBF16 in chunks of the given sizes (one workspace for all of them).
RowMatrix<float> run_chunked(const gpt2::AttentionWeights<float>& w, const RowMatrix<float>& x,
                             const std::vector<Index>& chunks, RowMatrix<float>* probs = nullptr,
                             KVCacheBF16* cache_out = nullptr) {
  const Index N = x.rows(), C = x.cols(), H = w.n_head();
  KVCacheBF16 cache(w.config(), N);
  gpt2::Workspace<float> ws(w.config());
  RowMatrix<float> out(N, C);
  if (probs) probs->setConstant(H * N, N, -1.0f);
  Index pos = 0;
  for (const Index n : chunks) {
    if (probs) {
      RowMatrix<float> p(H * n, pos + n);
      gpt2::attention_forward<float>(w, x.middleRows(pos, n), cache, ws, out.middleRows(pos, n), p);
      for (Index h = 0; h < H; ++h) {
        probs->block(h * N + pos, 0, n, pos + n) = p.middleRows(h * n, n);
        probs->block(h * N + pos, pos + n, n, N - pos - n).setZero();
      }
    } else {
      gpt2::attention_forward<float>(w, x.middleRows(pos, n), cache, ws, out.middleRows(pos, n));
    }
    pos += n;
  }
  EXPECT_EQ(pos, N);
  EXPECT_EQ(cache.n_past(), N);
  if (cache_out) *cache_out = std::move(cache);
  return out;
}

// Where the projections are row-exact (the float vector levels), a chunked forward and the
// whole-sequence reference are bitwise equal; at the generic level the projections run Eigen's
// GEMV for one row and its GEMM for several, so they differ by rounding, and a key that rounding
// moves across a bf16 rounding boundary moves by a bf16 step (2^-8 relative): hence the bound.
bool projections_row_exact() { return gpt2::active_isa() != gpt2::Isa::generic; }

::testing::AssertionResult same(const RowMatrix<float>& actual, const RowMatrix<float>& expected) {
  if (projections_row_exact()) {
    if (actual.rows() == expected.rows() && actual.cols() == expected.cols() &&
        (actual.array() == expected.array()).all())
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "not bitwise equal: " << near(actual, expected, 0);
  }
  return near(actual, expected, 5e-3);
}

// Chunkings of N positions: whole, prefill + decode steps, one token at a time, random splits.
std::vector<std::vector<Index>> chunkings(Index N, Index prefill, unsigned seed) {
  std::vector<std::vector<Index>> all;
  all.push_back({N});
  std::vector<Index> decode{prefill};
  for (Index i = prefill; i < N; ++i) decode.push_back(1);
  all.push_back(decode);
  std::mt19937 gen(seed);
  for (int r = 0; r < 3; ++r) {
    std::vector<Index> split;
    for (Index left = N; left > 0;) {
      const Index n = std::min<Index>(left, std::uniform_int_distribution<Index>(1, 90)(gen));
      split.push_back(n);
      left -= n;
    }
    all.push_back(split);
  }
  return all;
}

TEST(KVCacheBF16, RoundsWhatItAppendsAndHoldsHalfTheBytes) {
  const gpt2::AttentionConfig config{96, 3};
  KVCacheBF16 cache(config, 10);
  gpt2::KVCache<float> float_cache(config, 10);
  EXPECT_EQ(cache.bytes() * 2, float_cache.bytes());
  RowMatrix<float> k = random_input<float>(4, 96, 1) * 3.0f, v = random_input<float>(4, 96, 2);
  k(0, 0) = std::numeric_limits<float>::quiet_NaN();
  k(1, 1) = std::numeric_limits<float>::infinity();
  k(2, 2) = 1.0f + 3 * std::ldexp(1.0f, -8);  // a tie: rounds to even (1 + 2^-6; truncation: 1 + 2^-7)
  cache.append(k, v);
  ASSERT_EQ(cache.n_past(), 4);
  const RowMatrix<float> kr = rounded(k), vr = rounded(v);
  for (Index h = 0; h < 3; ++h) {
    const RowMatrix<float> keys = cache.widened_keys(h), values = cache.widened_values(h);
    for (Index i = 0; i < 4; ++i)
      for (Index d = 0; d < 32; ++d) {
        const float want = kr(i, h * 32 + d), got = keys(i, d);
        EXPECT_TRUE(std::isnan(want) ? std::isnan(got) : want == got) << h << " " << i << " " << d;
        EXPECT_EQ(values(i, d), vr(i, h * 32 + d));
      }
  }
  EXPECT_EQ(cache.widened_keys(0)(2, 2), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isinf(cache.widened_keys(0)(1, 1)));
  // append_past: head-major rows, rounded the same way
  KVCacheBF16 past(config, 10);
  RowMatrix<float> kp(3 * 4, 32), vp(3 * 4, 32);
  for (Index h = 0; h < 3; ++h) {
    kp.middleRows(h * 4, 4) = k.middleCols(h * 32, 32);
    vp.middleRows(h * 4, 4) = v.middleCols(h * 32, 32);
  }
  past.append_past(kp, vp);
  for (Index h = 0; h < 3; ++h) {
    EXPECT_TRUE((past.keys(h).array() == cache.keys(h).array()).all());
    EXPECT_TRUE((past.values(h).array() == cache.values(h).array()).all());
  }
}

TEST(KVCacheBF16, RoomTruncateCopiesAndMoves) {
  const gpt2::AttentionConfig config{64, 2};
  KVCacheBF16 cache(config, 5);
  const RowMatrix<float> k = random_input<float>(3, 64, 3), v = random_input<float>(3, 64, 4);
  cache.append(k, v);
  EXPECT_THROW(cache.append(k, v), gpt2::CapacityError);
  EXPECT_EQ(cache.n_past(), 3);  // unchanged
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { cache.append(k.leftCols(10), v); }),
                       "k: expected shape [3, 64], got [3, 10]"));
  EXPECT_THROW(cache.truncate(4), gpt2::ShapeError);
  KVCacheBF16 copy = cache.copy();
  cache.truncate(1);
  EXPECT_EQ(copy.n_past(), 3);
  EXPECT_TRUE((copy.keys(1).topRows(1).array() == cache.keys(1).array()).all());
  KVCacheBF16 small(config, 2);
  EXPECT_THROW(small.copy_from(copy), gpt2::CapacityError);
  KVCacheBF16 other({96, 3}, 5);
  EXPECT_THROW(other.copy_from(copy), gpt2::ConfigError);
  KVCacheBF16 moved(std::move(copy));
  EXPECT_EQ(moved.n_past(), 3);
  EXPECT_EQ(copy.capacity(), 0);  // NOLINT(bugprone-use-after-move): the documented state
  EXPECT_EQ(copy.keys(0).rows(), 0);
  EXPECT_THROW(moved.keys(2), gpt2::ShapeError);
  EXPECT_THROW(KVCacheBF16(config, -1), gpt2::ShapeError);
}

TEST(KVCacheBF16, ForwardRejectsBadInputWithTheCacheUnchanged) {
  const auto model = random_model<float>(64, 2, 5);
  const gpt2::AttentionWeights<float> w = model.weights();
  KVCacheBF16 cache(w.config(), 4);
  gpt2::Workspace<float> ws(w.config());
  const RowMatrix<float> x = random_input<float>(3, 64, 6);
  RowMatrix<float> out(3, 64);
  gpt2::attention_forward<float>(w, x, cache, ws, out);
  EXPECT_TRUE(Contains(
      error_of<gpt2::CapacityError>([&] { gpt2::attention_forward<float>(w, x, cache, ws, out); }),
      "KV cache: 3 cached + 3 new tokens exceed its capacity of 4 tokens"));
  EXPECT_EQ(cache.n_past(), 3);
  RowMatrix<float> bad(1, 60);
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] {
                         gpt2::attention_forward<float>(w, x.topRows(1), cache, ws, bad);
                       }),
                       "out: expected shape [1, 64], got [1, 60]"));
  KVCacheBF16 other({96, 3}, 4);
  EXPECT_TRUE(Contains(error_of<gpt2::ConfigError>([&] {
                         gpt2::attention_forward<float>(w, x.topRows(1), other, ws, out.topRows(1));
                       }),
                       "cache: expected n_embd 64, n_head 2 (the weights'), got n_embd 96, n_head 3"));
  EXPECT_EQ(cache.n_past(), 3);
}

// The cases: float32 weights (bitwise at the vector levels whatever the chunking) and bf16
// weights (bitwise too away from the amx level's AMX core, which runs prefill tiles of 16 rows or
// more: there the decode rows are checked, and the prefill rows to the AMX core's rounding).
struct Case {
  const char* name;
  Index C, n_head, N, prefill;
};
const Case kCases[] = {
    {"gpt2_heads_past_two_widen_pages", 256, 4, 600, 300},  // head_dim 64; keys past 2 x 256
    {"head_dim_32_odd_lengths", 96, 3, 203, 77},
    {"head_dim_80", 160, 2, 150, 64},
    {"one_head_split_over_threads", 64, 1, 600, 100},  // fewer heads than threads: key runs split
    {"head_dim_20_row_tails", 60, 3, 140, 70},  // rows end mid-vector (avx2's 8, avx512's 16)
};

class KVCacheBF16Forward : public ::testing::TestWithParam<Case> {};

TEST_P(KVCacheBF16Forward, EveryChunkingIsTheRoundedKVForward) {
  const Case& c = GetParam();
  const auto model = random_model<float>(c.C, c.n_head, 7);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights());
  const RowMatrix<float> x = random_input<float>(c.N, c.C, 8);
  const RowMatrix<float> expected = rounded_kv_reference(w, x, nullptr);
  for (const std::vector<Index>& chunks : chunkings(c.N, c.prefill, 9)) {
    SCOPED_TRACE(::testing::Message() << chunks.size() << " chunks, first " << chunks[0]);
    KVCacheBF16 cache(w.config(), 0);
    const RowMatrix<float> out = run_chunked(w, x, chunks, nullptr, &cache);
    EXPECT_TRUE(same(out, expected));
  }
}

TEST_P(KVCacheBF16Forward, ProbabilitiesAreTheRoundedKVOnes) {
  const Case& c = GetParam();
  const auto model = random_model<float>(c.C, c.n_head, 10);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights());
  const Index N = std::min<Index>(c.N, 200);
  const RowMatrix<float> x = random_input<float>(N, c.C, 11);
  RowMatrix<float> expected_probs;
  const RowMatrix<float> expected = rounded_kv_reference(w, x, &expected_probs);
  RowMatrix<float> probs;
  const RowMatrix<float> out = run_chunked(w, x, {N / 2, 1, N - N / 2 - 1}, &probs);
  EXPECT_TRUE(same(out, expected));
  EXPECT_TRUE(same(probs, expected_probs));
}

TEST_P(KVCacheBF16Forward, DecodeWithBF16WeightsIsTheRoundedKVForward) {
  const Case& c = GetParam();
  const auto model = random_model<float>(c.C, c.n_head, 12);
  const gpt2::AttentionWeights<float> w =
      gpt2::pack_weights(model.weights(), gpt2::WeightDtype::bf16);
  const RowMatrix<float> x = random_input<float>(c.N, c.C, 13);
  const RowMatrix<float> expected = rounded_kv_reference(w, x, nullptr);
  std::vector<Index> chunks{c.prefill};
  for (Index i = c.prefill; i < c.N; ++i) chunks.push_back(1);
  const RowMatrix<float> out = run_chunked(w, x, chunks);
  // the decode rows: one-row tiles, the float32 core at every level but avx512_bf16 (bf16 pairs
  // before the row's own block, as in the reference's tiles)
  const Index D = c.N - c.prefill;
  EXPECT_TRUE(same(out.bottomRows(D), expected.bottomRows(D)));
  // the prefill rows: bitwise too unless the AMX core ran them (its own rounding of q, k, v, p)
  if (gpt2::active_isa() == gpt2::Isa::amx)
    EXPECT_TRUE(near(out.topRows(c.prefill), expected.topRows(c.prefill), 5e-4));
  else
    EXPECT_TRUE(same(out.topRows(c.prefill), expected.topRows(c.prefill)));
}

INSTANTIATE_TEST_SUITE_P(Cases, KVCacheBF16Forward, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Decode steps on 2 or more threads with at least as many heads as threads run in one parallel
// region (qkv; each head's rounded cache rows, partials and merge on one thread; the projection):
// the rounded-KV forward's bits and the same cache bits on 1 to 4 threads, with float32 and bf16
// weights; 6 heads of 64 on 2 threads also where each thread computes its own heads' q, k, v
// columns and attends them with no barrier between (decode_heads_split_aligned). (At generic,
// which widens the cache first, the steps take the general path: the same checks.)
TEST(KVCacheBF16, DecodeStepsInOneRegionAreBitwiseOnAnyThreadCount) {
  if (!gpt2::kHasOpenMP) GTEST_SKIP() << "skipped: built without OpenMP (one thread only)";
  const gpt2::test::ThreadCount restore;
  for (const Index n_head : {Index{4}, Index{6}}) {
    const Index C = 64 * n_head;
    const auto model = random_model<float>(C, n_head, 24);
    for (const gpt2::WeightDtype dtype : {gpt2::WeightDtype::float32, gpt2::WeightDtype::bf16}) {
      const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights(), dtype);
      const RowMatrix<float> x = random_input<float>(230, C, 25);
      const RowMatrix<float> expected = rounded_kv_reference(w, x, nullptr);
      std::vector<Index> chunks{150};
      chunks.resize(81, 1);
      KVCacheBF16 first({C, n_head}, 0);
      for (const int threads : {1, 2, 3, 4}) {
        SCOPED_TRACE(::testing::Message() << n_head << " heads, " << threads
                                          << " threads, bf16 weights "
                                          << (dtype == gpt2::WeightDtype::bf16));
        ASSERT_EQ(gpt2::set_num_threads(threads), threads);
        KVCacheBF16 cache({C, n_head}, 0);
        const RowMatrix<float> out = run_chunked(w, x, chunks, nullptr, &cache);
        EXPECT_TRUE(same(out.bottomRows(80), expected.bottomRows(80)));
        if (threads == 1) {
          first = std::move(cache);
          continue;
        }
        for (Index h = 0; h < n_head; ++h) {
          EXPECT_TRUE(cache.keys(h) == first.keys(h)) << "head " << h;
          EXPECT_TRUE(cache.values(h) == first.values(h)) << "head " << h;
          const Index n = (230 + 63) / 64 * 64 * 64;
          EXPECT_TRUE(std::equal(cache.transposed_key_blocks(h), cache.transposed_key_blocks(h) + n,
                                 first.transposed_key_blocks(h)))
              << "head " << h;
        }
      }
    }
  }
}

// The bf16 cache against a float32 cache: the only difference is the rounding of k and v, so the
// outputs agree to about bf16's precision (2^-8 relative on each key and value).
TEST(KVCacheBF16, CloseToTheFloatCache) {
  const auto model = random_model<float>(256, 4, 14);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights());
  const RowMatrix<float> x = random_input<float>(300, 256, 15);
  const RowMatrix<float> out = run_chunked(w, x, {299, 1});
  gpt2::KVCache<float> cache(w.config(), 300);
  gpt2::Workspace<float> ws(w.config());
  RowMatrix<float> expected(300, 256);
  gpt2::attention_forward<float>(w, x, cache, ws, expected);
  EXPECT_TRUE(near(out, expected, 1e-2));
  EXPECT_FALSE((out.array() == expected.array()).all());  // the rounding is really there
}

// Every level reads the bf16 cache in place (its kernels widen a block at a time in their own
// tile scratch): a workspace that has run decode steps through it holds nothing more than one
// that has run them through a float cache.
TEST(KVCacheBF16, DecodeStepsReadTheCacheInPlaceAtEveryLevel) {
  const auto model = random_model<float>(256, 4, 22);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights());
  const RowMatrix<float> x = random_input<float>(3, 256, 23);
  KVCacheBF16 cache(w.config(), 600);
  gpt2::KVCache<float> float_cache(w.config(), 600);
  gpt2::Workspace<float> ws(w.config()), float_ws(w.config());
  RowMatrix<float> out(1, 256);
  for (Index i = 0; i < 3; ++i) {
    gpt2::attention_forward<float>(w, x.middleRows(i, 1), cache, ws, out);
    gpt2::attention_forward<float>(w, x.middleRows(i, 1), float_cache, float_ws, out);
  }
  EXPECT_EQ(ws.bytes(), float_ws.bytes());
}

// A padded batch through one KVCacheBF16 per sequence: each sequence's rows are bitwise its
// forward through its own bf16 cache alone, caches included (prefill chunks, decode steps,
// sequences sitting a step out, the three ways of passing the caches), with float32 and bf16
// weights; an error in the last sequence changes no cache.
TEST(KVCacheBF16Batch, EachSequenceIsBitwiseItsForwardAlone) {
  const auto model = random_model<float>(256, 4, 16);
  for (const gpt2::WeightDtype dtype : {gpt2::WeightDtype::float32, gpt2::WeightDtype::bf16}) {
    SCOPED_TRACE(gpt2::dtype_name(dtype));
    const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights(), dtype);
    const Index B = 5, C = 256;
    const std::vector<Index> past = {0, 3, 70, 300, 1};
    std::vector<KVCacheBF16> caches, alone;
    gpt2::Workspace<float> ws(w.config()), ws_alone(w.config());
    for (Index b = 0; b < B; ++b) {
      caches.emplace_back(w.config(), past[b] + 20);
      alone.emplace_back(w.config(), past[b] + 20);
      if (past[b] == 0) continue;
      const RowMatrix<float> prompt = random_input<float>(past[b], C, static_cast<unsigned>(17 + b));
      RowMatrix<float> prompt_out(past[b], C);
      gpt2::attention_forward<float>(w, prompt, caches[b], ws_alone, prompt_out);
      gpt2::attention_forward<float>(w, prompt, alone[b], ws_alone, prompt_out);
    }
    // a prefill chunk of up to 6 rows (left padded, one sequence idle), then decode steps
    const std::vector<gpt2::BatchLayout> steps = {
        gpt2::BatchLayout::left_padded(6, {6, 2, 0, 5, 1}), gpt2::BatchLayout::full(B, 1),
        gpt2::BatchLayout(1, {0, 0, 0, 0, 0}, {1, 0, 1, 1, 1}), gpt2::BatchLayout::full(B, 1)};
    unsigned seed = 30;
    int way = 0;
    for (const gpt2::BatchLayout& layout : steps) {
      RowMatrix<float> x = random_input<float>(layout.rows(), C, seed++);
      RowMatrix<float> out = RowMatrix<float>::Constant(layout.rows(), C, -1.0f);
      if (way == 0) {
        gpt2::attention_forward<float>(w, x, layout, caches, ws, out);
      } else if (way == 1) {
        std::vector<KVCacheBF16*> pointers;
        for (KVCacheBF16& c : caches) pointers.push_back(&c);
        gpt2::attention_forward<float>(w, x, layout, pointers, ws, out);
      } else {
        KVCacheBF16* pointers[B] = {&caches[0], &caches[1], &caches[2], &caches[3], &caches[4]};
        gpt2::attention_forward<float>(w, x, layout, pointers, ws, out);
      }
      way = (way + 1) % 3;
      for (Index b = 0; b < B; ++b) {
        const Index n = layout.length(b);
        if (n == 0) {
          EXPECT_TRUE((out.middleRows(b * layout.tokens(), layout.tokens()).array() == 0.0f).all());
          continue;
        }
        RowMatrix<float> expected(n, C);
        gpt2::attention_forward<float>(w, x.middleRows(layout.first_row(b), n), alone[b], ws_alone,
                                       expected);
        EXPECT_TRUE((out.middleRows(layout.first_row(b), n).array() == expected.array()).all())
            << "sequence " << b << ": " << near(out.middleRows(layout.first_row(b), n), expected, 0);
        ASSERT_EQ(caches[b].n_past(), alone[b].n_past());
        for (Index h = 0; h < 4; ++h) {
          EXPECT_TRUE((caches[b].keys(h).array() == alone[b].keys(h).array()).all());
          EXPECT_TRUE((caches[b].values(h).array() == alone[b].values(h).array()).all());
        }
      }
    }
    // the last sequence's cache is full: CapacityError naming it, no cache changed
    const gpt2::BatchLayout too_long = gpt2::BatchLayout::full(B, 20);
    const RowMatrix<float> x = random_input<float>(too_long.rows(), C, 60);
    RowMatrix<float> out(too_long.rows(), C);
    std::vector<Index> before;
    for (const KVCacheBF16& c : caches) before.push_back(c.n_past());
    EXPECT_THROW(gpt2::attention_forward<float>(w, x, too_long, caches, ws, out), gpt2::CapacityError);
    for (Index b = 0; b < B; ++b) EXPECT_EQ(caches[b].n_past(), before[b]);
  }
}

}  // namespace
