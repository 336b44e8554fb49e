// KVCacheInt8 = KVCache<int8> and the forwards through it (kv_cache.hpp, sublayer.hpp, batch.hpp,
// paged_kv_cache.hpp): the cache's own contract (quantization per (position, head) row, room,
// truncate, copies, moves, bytes), and that a forward through it is bitwise the forward over keys
// and values quantized and dequantized (float(q) * scale), built here from the public steps
// (qkv_projection, causal_attention_head, output_projection) on dequantized copies, whatever the
// chunking; paged int8 sequences (a shared prefix) and batches bitwise as the contiguous cache;
// the accuracy against a float32 cache. Run at every kernel level (the ctest entries
// test_kv_cache_int8@generic, @avx2, @avx512).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/kernels/int8_dequant.hpp"
#include "gpt2/paged_kv_cache.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/models.hpp"
#include "support/thread_count.hpp"

namespace {

using gpt2::Index;
using gpt2::KVCacheInt8;
using gpt2::RowMatrix;
using gpt2::test::Contains;
using gpt2::test::error_of;
using gpt2::test::near;
using gpt2::test::random_input;
using gpt2::test::random_model;

// m [n, n_head * head_dim] with each head's row quantized as one block and dequantized: what the
// int8 cache's forwards read, written independently of the library's kernels.
RowMatrix<float> dequantized(const RowMatrix<float>& m, Index head_dim) {
  RowMatrix<float> r(m.rows(), m.cols());
  std::vector<std::int8_t> q(static_cast<std::size_t>(head_dim));
  for (Index i = 0; i < m.rows(); ++i)
    for (Index c = 0; c < m.cols(); c += head_dim) {
      const float scale = gpt2::kernels::quantize_block(&m(i, c), head_dim, q.data());
      for (Index d = 0; d < head_dim; ++d)
        r(i, c + d) = static_cast<float>(q[static_cast<std::size_t>(d)]) * scale;
    }
  return r;
}

// The forward of all of x [N, C] with its keys and values dequantized, from the public steps:
// out [N, C] and (if probs is non-null) probs [n_head * N, N].
RowMatrix<float> dequantized_kv_reference(const gpt2::AttentionWeights<float>& w,
                                          const RowMatrix<float>& x, RowMatrix<float>* probs) {
  const gpt2::AttentionConfig& config = w.config();
  const Index N = x.rows(), C = config.n_embd, hd = config.head_dim();
  RowMatrix<float> qkv(N, 3 * C);
  gpt2::qkv_projection<float>(w, x, qkv);
  const RowMatrix<float> k = dequantized(qkv.middleCols(C, C), hd);
  const RowMatrix<float> v = dequantized(qkv.middleCols(2 * C, C), hd);
  RowMatrix<float> merged(N, C);
  if (probs) probs->resize(config.n_head * N, N);
  gpt2::AttentionScratch<float> scratch;
  scratch.set_bf16_products(w.weight_dtype() != gpt2::WeightDtype::float32 &&
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

// Runs x through a fresh cache of storage S in chunks of the given sizes (one workspace).
template <class S = gpt2::int8>
RowMatrix<float> run_chunked(const gpt2::AttentionWeights<float>& w, const RowMatrix<float>& x,
                             const std::vector<Index>& chunks, RowMatrix<float>* probs = nullptr,
                             gpt2::KVCache<S>* cache_out = nullptr) {
  const Index N = x.rows(), C = x.cols(), H = w.n_head();
  gpt2::KVCache<S> cache(w.config(), N);
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
  if (cache_out) *cache_out = std::move(cache);
  return out;
}

// Bitwise where the projections are row-exact (the vector levels); at the generic level (Eigen's
// GEMV for one row, its GEMM for several) a key that rounding moves across a quantization step
// moves by up to one step (1/127 of its row's largest magnitude): hence the bound.
bool projections_row_exact() { return gpt2::active_isa() != gpt2::Isa::generic; }

::testing::AssertionResult same(const RowMatrix<float>& actual, const RowMatrix<float>& expected) {
  if (projections_row_exact()) {
    if (actual.rows() == expected.rows() && actual.cols() == expected.cols() &&
        (actual.array() == expected.array()).all())
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "not bitwise equal: " << near(actual, expected, 0);
  }
  return near(actual, expected, 2e-2);
}

bool bitwise(const RowMatrix<float>& a, const RowMatrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && (a.array() == b.array()).all();
}

std::vector<std::vector<Index>> chunkings(Index N, Index prefill, unsigned seed) {
  std::vector<std::vector<Index>> all;
  all.push_back({N});
  std::vector<Index> decode{prefill};
  for (Index i = prefill; i < N; ++i) decode.push_back(1);
  all.push_back(decode);
  std::mt19937 gen(seed);
  for (int r = 0; r < 2; ++r) {
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

// ---- the cache ------------------------------------------------------------------------------

TEST(KVCacheInt8, QuantizesEachHeadRowAsOneBlock) {
  const gpt2::AttentionConfig config{96, 3};  // head_dim 32
  KVCacheInt8 cache(config, 10);
  gpt2::KVCache<float> float_cache(config, 10);
  // both keep their keys twice (rows and transposed blocks of 64 positions); int8 a quarter of the
  // bytes plus a scale per (position, head) for keys and values (to the end of the key block)
  EXPECT_EQ(float_cache.bytes(), (2 * 3 * 10 * 32 + 3 * 64 * 32) * 4);
  EXPECT_EQ(cache.bytes(), float_cache.bytes() / 4 + 2 * 3 * 64 * 4);
  RowMatrix<float> k = random_input<float>(4, 96, 1) * 3.0f, v = random_input<float>(4, 96, 2);
  k.block(1, 32, 1, 32).setZero();  // an all-zero row: scale 0, q 0
  cache.append(k, v);
  ASSERT_EQ(cache.n_past(), 4);
  const RowMatrix<float> kd = dequantized(k, 32), vd = dequantized(v, 32);
  for (Index h = 0; h < 3; ++h) {
    EXPECT_TRUE(bitwise(cache.widened_keys(h), kd.middleCols(h * 32, 32))) << h;
    EXPECT_TRUE(bitwise(cache.widened_values(h), vd.middleCols(h * 32, 32))) << h;
    for (Index i = 0; i < 4; ++i) {
      const float amax = k.block(i, h * 32, 1, 32).cwiseAbs().maxCoeff();
      EXPECT_EQ(cache.key_scales(h)[i], amax == 0.0f ? 0.0f : amax / 127.0f);
      EXPECT_EQ(cache.keys(h).row(i).cwiseAbs().cast<int>().maxCoeff(), amax == 0.0f ? 0 : 127);
    }
  }
  EXPECT_EQ(cache.key_scales(1)[1], 0.0f);
  EXPECT_TRUE((cache.widened_keys(1).row(1).array() == 0.0f).all());
  // append_past: head-major rows, quantized the same way
  KVCacheInt8 past(config, 10);
  RowMatrix<float> kp(3 * 4, 32), vp(3 * 4, 32);
  for (Index h = 0; h < 3; ++h) {
    kp.middleRows(h * 4, 4) = k.middleCols(h * 32, 32);
    vp.middleRows(h * 4, 4) = v.middleCols(h * 32, 32);
  }
  past.append_past(kp, vp);
  for (Index h = 0; h < 3; ++h) {
    EXPECT_TRUE(past.keys(h) == cache.keys(h));
    EXPECT_TRUE(past.values(h) == cache.values(h));
    EXPECT_TRUE(past.key_scales(h) == cache.key_scales(h));
    EXPECT_TRUE(past.value_scales(h) == cache.value_scales(h));
  }
}

// The dequantization kernel: the same bits at every level the CPU has (one multiply per value),
// row tails of every length, zeros past head_dim whatever the scale.
TEST(KVCacheInt8, DequantizationIsBitwiseTheSameAtEveryLevel) {
  for (const Index hd : {Index{7}, Index{16}, Index{20}, Index{64}, Index{80}}) {
    const Index ld = gpt2::kernels::padded_head_dim(hd), n = 37;
    std::vector<std::int8_t> q(static_cast<std::size_t>(n * hd));
    std::vector<float> scales(static_cast<std::size_t>(n));
    std::mt19937 gen(static_cast<unsigned>(hd));
    for (std::int8_t& x : q) x = static_cast<std::int8_t>(std::uniform_int_distribution<int>(-127, 127)(gen));
    for (float& s : scales) s = std::uniform_real_distribution<float>(1e-4f, 1.0f)(gen);
    scales[3] = std::numeric_limits<float>::infinity();
    const std::int8_t* pages[] = {q.data()};
    const float* scale_pages[] = {scales.data()};
    std::vector<float> want(static_cast<std::size_t>(n * ld), -1.0f);
    gpt2::kernels::dequantize_rows(gpt2::Isa::generic, pages, scale_pages, n, hd, 0, n, hd,
                                   want.data(), ld);
    for (Index i = 0; i < n; ++i)
      for (Index d = 0; d < ld; ++d) {
        const float w = want[static_cast<std::size_t>(i * ld + d)];
        const float e = d < hd ? static_cast<float>(q[static_cast<std::size_t>(i * hd + d)]) *
                                     scales[static_cast<std::size_t>(i)]
                               : 0.0f;
        ASSERT_TRUE(w == e || (std::isnan(w) && std::isnan(e))) << i << " " << d;
      }
    for (const gpt2::Isa isa : gpt2::available_isas()) {
      std::vector<float> got(static_cast<std::size_t>(n * ld), -1.0f);
      gpt2::kernels::dequantize_rows(isa, pages, scale_pages, n, hd, 0, n, hd, got.data(), ld);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
          << gpt2::isa_name(isa) << ", head_dim " << hd;
    }
  }
}

TEST(KVCacheInt8, RoomTruncateCopiesAndMoves) {
  const gpt2::AttentionConfig config{64, 2};
  KVCacheInt8 cache(config, 5);
  const RowMatrix<float> k = random_input<float>(3, 64, 3), v = random_input<float>(3, 64, 4);
  cache.append(k, v);
  EXPECT_THROW(cache.append(k, v), gpt2::CapacityError);
  EXPECT_EQ(cache.n_past(), 3);  // unchanged
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { cache.append(k.leftCols(10), v); }),
                       "k: expected shape [3, 64], got [3, 10]"));
  EXPECT_THROW(cache.truncate(4), gpt2::ShapeError);
  KVCacheInt8 copy = cache.copy();
  cache.truncate(1);
  EXPECT_EQ(copy.n_past(), 3);
  EXPECT_TRUE(copy.keys(1).topRows(1) == cache.keys(1));
  EXPECT_TRUE(copy.key_scales(1).head(1) == cache.key_scales(1));
  EXPECT_TRUE(bitwise(copy.widened_values(0).topRows(1), cache.widened_values(0)));
  KVCacheInt8 target(config, 4);
  target.copy_from(copy);
  for (Index h = 0; h < 2; ++h) {
    EXPECT_TRUE(bitwise(target.widened_keys(h), copy.widened_keys(h)));
    EXPECT_TRUE(bitwise(target.widened_values(h), copy.widened_values(h)));
  }
  KVCacheInt8 small(config, 2);
  EXPECT_THROW(small.copy_from(copy), gpt2::CapacityError);
  KVCacheInt8 other({96, 3}, 5);
  EXPECT_THROW(other.copy_from(copy), gpt2::ConfigError);
  KVCacheInt8 moved(std::move(copy));
  EXPECT_EQ(moved.n_past(), 3);
  EXPECT_EQ(copy.capacity(), 0);  // NOLINT(bugprone-use-after-move): the documented state
  EXPECT_EQ(copy.keys(0).rows(), 0);
  EXPECT_THROW(moved.keys(2), gpt2::ShapeError);
  EXPECT_THROW(moved.key_scales(2), gpt2::ShapeError);
  EXPECT_THROW(KVCacheInt8(config, -1), gpt2::ShapeError);
}

TEST(KVCacheInt8, ForwardRejectsBadInputWithTheCacheUnchanged) {
  const auto model = random_model<float>(64, 2, 5);
  const gpt2::AttentionWeights<float> w = model.weights();
  KVCacheInt8 cache(w.config(), 4);
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
  KVCacheInt8 other({96, 3}, 4);
  EXPECT_TRUE(Contains(error_of<gpt2::ConfigError>([&] {
                         gpt2::attention_forward<float>(w, x.topRows(1), other, ws, out.topRows(1));
                       }),
                       "cache: expected n_embd 64, n_head 2 (the weights'), got n_embd 96, n_head 3"));
  EXPECT_EQ(cache.n_past(), 3);
}

// ---- forwards: bitwise the dequantized-KV forward -------------------------------------------

struct Case {
  const char* name;
  Index C, n_head, N, prefill;
};
const Case kCases[] = {
    {"gpt2_heads_past_two_chunks", 256, 4, 600, 300},  // head_dim 64; several dequantized chunks
    {"head_dim_32_odd_lengths", 96, 3, 203, 77},
    {"head_dim_80", 160, 2, 150, 64},
    {"one_head_split_over_threads", 64, 1, 600, 100},  // fewer heads than threads: key runs split
    {"head_dim_20_row_tails", 60, 3, 140, 70},  // rows end mid-vector
};

class KVCacheInt8Forward : public ::testing::TestWithParam<Case> {};

// Prefill, prefill + decode steps, random chunks: each the dequantized-KV forward (bitwise at the
// vector levels), so decode == prefill; and the caches of every chunking hold the same bits.
TEST_P(KVCacheInt8Forward, EveryChunkingIsTheDequantizedKVForward) {
  const Case& c = GetParam();
  const auto model = random_model<float>(c.C, c.n_head, 7);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights());
  const RowMatrix<float> x = random_input<float>(c.N, c.C, 8);
  const RowMatrix<float> expected = dequantized_kv_reference(w, x, nullptr);
  KVCacheInt8 first(w.config(), 0);
  RowMatrix<float> first_out;
  for (const std::vector<Index>& chunks : chunkings(c.N, c.prefill, 9)) {
    SCOPED_TRACE(::testing::Message() << chunks.size() << " chunks, first " << chunks[0]);
    KVCacheInt8 cache(w.config(), 0);
    const RowMatrix<float> out = run_chunked(w, x, chunks, nullptr, &cache);
    EXPECT_TRUE(same(out, expected));
    if (first.n_past() == 0) {
      first = std::move(cache);
      first_out = out;
      continue;
    }
    if (!projections_row_exact()) continue;
    EXPECT_TRUE(bitwise(out, first_out)) << "decode != prefill";
    const Index n = (c.N + 63) / 64 * 64 * (c.C / c.n_head);
    for (Index h = 0; h < c.n_head; ++h) {
      EXPECT_TRUE(std::equal(cache.transposed_key_blocks(h), cache.transposed_key_blocks(h) + n,
                             first.transposed_key_blocks(h)))
          << "head " << h;
      EXPECT_TRUE(cache.keys(h) == first.keys(h)) << "head " << h;
      EXPECT_TRUE(cache.key_scales(h) == first.key_scales(h)) << "head " << h;
      EXPECT_TRUE(cache.values(h) == first.values(h)) << "head " << h;
    }
  }
}

TEST_P(KVCacheInt8Forward, ProbabilitiesAreTheDequantizedKVOnes) {
  const Case& c = GetParam();
  const auto model = random_model<float>(c.C, c.n_head, 10);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights());
  const Index N = std::min<Index>(c.N, 200);
  const RowMatrix<float> x = random_input<float>(N, c.C, 11);
  RowMatrix<float> expected_probs;
  const RowMatrix<float> expected = dequantized_kv_reference(w, x, &expected_probs);
  RowMatrix<float> probs;
  const RowMatrix<float> out = run_chunked(w, x, {N / 2, 1, N - N / 2 - 1}, &probs);
  EXPECT_TRUE(same(out, expected));
  EXPECT_TRUE(same(probs, expected_probs));
}

// bf16 or int8 weights: the attention's products in bf16 where the level has them (at
// avx512_bf16 a decode step reads the int8 blocks before its row's own in place, or dequantized
// to bf16): still the dequantized-KV forward, decode steps included.
TEST_P(KVCacheInt8Forward, DecodeWithBF16OrInt8WeightsIsTheDequantizedKVForward) {
  const Case& c = GetParam();
  const auto model = random_model<float>(c.C, c.n_head, 12);
  for (const gpt2::WeightDtype dtype : {gpt2::WeightDtype::bf16, gpt2::WeightDtype::int8}) {
    SCOPED_TRACE(dtype == gpt2::WeightDtype::bf16 ? "bf16 weights" : "int8 weights");
    const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights(), dtype);
    const RowMatrix<float> x = random_input<float>(c.N, c.C, 13);
    const RowMatrix<float> expected = dequantized_kv_reference(w, x, nullptr);
    std::vector<Index> chunks{c.prefill};
    for (Index i = c.prefill; i < c.N; ++i) chunks.push_back(1);
    const RowMatrix<float> out = run_chunked(w, x, chunks);
    const Index D = c.N - c.prefill;
    EXPECT_TRUE(same(out.bottomRows(D), expected.bottomRows(D)));
    // amx: its AMX core runs the tiles of 16 rows or more and the float32 core the shorter ones,
    // so a row's bits depend on its tile there (as with a float cache: docs/bf16.md); the bf16
    // products' rounding (8 bits) then bounds the difference (the largest seen on emulated tiles:
    // 1.1e-3 relative)
    if (gpt2::active_isa() == gpt2::Isa::amx)
      EXPECT_TRUE(near(out.topRows(c.prefill), expected.topRows(c.prefill), 2e-3));
    else
      EXPECT_TRUE(same(out.topRows(c.prefill), expected.topRows(c.prefill)));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, KVCacheInt8Forward, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Decode steps on 1 to 4 threads (one parallel region when there are at least as many heads as
// threads), float32 and bf16 weights (bf16 products: a split key range's blocks before the own
// block read in bf16): the same bits, and the same cache bits.
TEST(KVCacheInt8, DecodeStepsAreBitwiseOnAnyThreadCount) {
  if (!gpt2::kHasOpenMP) GTEST_SKIP() << "skipped: built without OpenMP (one thread only)";
  const gpt2::test::ThreadCount restore;
  for (const gpt2::WeightDtype dtype : {gpt2::WeightDtype::float32, gpt2::WeightDtype::bf16})
  for (const Index n_head : {Index{1}, Index{4}, Index{6}}) {
    const Index C = 64 * n_head;
    const auto model = random_model<float>(C, n_head, 24);
    const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights(), dtype);
    const RowMatrix<float> x = random_input<float>(330, C, 25);
    const RowMatrix<float> expected = dequantized_kv_reference(w, x, nullptr);
    std::vector<Index> chunks{250};
    chunks.resize(81, 1);
    for (const int threads : {1, 2, 3, 4}) {
      SCOPED_TRACE(::testing::Message() << n_head << " heads, " << threads << " threads, "
                                        << (dtype == gpt2::WeightDtype::bf16 ? "bf16" : "float32")
                                        << " weights");
      ASSERT_EQ(gpt2::set_num_threads(threads), threads);
      const RowMatrix<float> out = run_chunked(w, x, chunks);
      EXPECT_TRUE(same(out.bottomRows(80), expected.bottomRows(80)));
    }
  }
}

// The int8 cache against a float32 cache: the only difference is the quantization of k and v
// (each value within half a step, 1/254 of its row's largest magnitude), which moves the output
// by under 1e-2 of its largest magnitude (7.5e-3 for this model, at one of the first positions,
// where a few keys decide a row).
TEST(KVCacheInt8, CloseToTheFloatCache) {
  const auto model = random_model<float>(256, 4, 14);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights());
  const RowMatrix<float> x = random_input<float>(300, 256, 15);
  const RowMatrix<float> out = run_chunked(w, x, {299, 1});
  const RowMatrix<float> expected = run_chunked<float>(w, x, {299, 1});
  EXPECT_TRUE(near(out, expected, 1e-2));
  EXPECT_FALSE(bitwise(out, expected));  // the quantization is really there
}

// ---- paged, batched --------------------------------------------------------------------------

// A prompt prefilled once in a paged int8 sequence, two forks decoding their own tokens (the first
// step of each copies the shared, partly filled block): each bitwise a contiguous int8 cache fed
// the same tokens, cached rows and scales included; float32 and bf16 weights (bf16 products: the
// paged steps read key rows, the contiguous ones transposed key blocks).
class KVCacheInt8Paged : public ::testing::TestWithParam<gpt2::WeightDtype> {};

TEST_P(KVCacheInt8Paged, SharedPrefixForksAreTheContiguousCache) {
  const auto model = random_model<float>(256, 4, 40);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights(), GetParam());
  const Index prompt = 150, steps = 40, cap = prompt + steps;
  const RowMatrix<float> x = random_input<float>(prompt, 256, 41);
  gpt2::KVBlockPool<gpt2::int8> pool(w.config(), 3 * (cap / 16 + 1));
  gpt2::PagedSequence<gpt2::int8> root(pool);
  KVCacheInt8 root_cache(w.config(), cap);
  gpt2::Workspace<float> ws(w.config()), ws_paged(w.config());
  RowMatrix<float> y(prompt, 256), y_paged(prompt, 256);
  gpt2::attention_forward<float>(w, x, root_cache, ws, y);
  gpt2::attention_forward<float>(w, x, root, ws_paged, y_paged);
  ASSERT_TRUE(bitwise(y_paged, y));
  std::vector<gpt2::PagedSequence<gpt2::int8>> forks;
  std::vector<KVCacheInt8> caches;
  for (int i = 0; i < 2; ++i) {
    forks.push_back(root.fork());
    caches.push_back(root_cache.copy());
  }
  for (std::size_t i = 0; i < 2; ++i)
    for (Index t = 0; t < steps; ++t) {
      const Index n = t % 7 == 3 ? 3 : 1;
      if (forks[i].length() + n > cap) break;
      const RowMatrix<float> xt = random_input<float>(n, 256, static_cast<unsigned>(100 * i + t));
      RowMatrix<float> a(n, 256), b(n, 256);
      gpt2::attention_forward<float>(w, xt, caches[i], ws, a);
      gpt2::attention_forward<float>(w, xt, forks[i], ws_paged, b);
      ASSERT_TRUE(bitwise(b, a)) << "fork " << i << " at " << forks[i].length();
    }
  for (std::size_t i = 0; i < 2; ++i)
    for (Index h = 0; h < 4; ++h) {
      ASSERT_TRUE(forks[i].copy_keys(0, h) == RowMatrix<std::int8_t>(caches[i].keys(h)));
      ASSERT_TRUE(forks[i].copy_values(0, h) == RowMatrix<std::int8_t>(caches[i].values(h)));
      for (Index p = 0; p < forks[i].length(); ++p) {
        ASSERT_EQ(forks[i].key_scale(0, h, p), caches[i].key_scales(h)[p]);
        ASSERT_EQ(forks[i].value_scale(0, h, p), caches[i].value_scales(h)[p]);
      }
    }
  EXPECT_EQ(pool.references(root.table()[0]), 3);  // the prompt's full blocks stay shared
  EXPECT_EQ(pool.block_bytes(), 2 * 16 * 256 + 2 * 16 * 4 * 4);
}

INSTANTIATE_TEST_SUITE_P(Weights, KVCacheInt8Paged,
                         ::testing::Values(gpt2::WeightDtype::float32, gpt2::WeightDtype::bf16),
                         [](const ::testing::TestParamInfo<gpt2::WeightDtype>& info) {
                           return info.param == gpt2::WeightDtype::bf16 ? "bf16_weights"
                                                                        : "float32_weights";
                         });

// A padded batch through one KVCacheInt8 per sequence: each sequence's rows bitwise its forward
// through its own int8 cache alone, caches included; an error in the last one changes no cache.
TEST(KVCacheInt8Batch, EachSequenceIsBitwiseItsForwardAlone) {
  const auto model = random_model<float>(256, 4, 16);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights());
  const Index B = 5, C = 256;
  const std::vector<Index> past = {0, 3, 70, 300, 1};
  std::vector<KVCacheInt8> caches, alone;
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
  const std::vector<gpt2::BatchLayout> steps = {
      gpt2::BatchLayout::left_padded(6, {6, 2, 0, 5, 1}), gpt2::BatchLayout::full(B, 1),
      gpt2::BatchLayout(1, {0, 0, 0, 0, 0}, {1, 0, 1, 1, 1}), gpt2::BatchLayout::full(B, 1)};
  unsigned seed = 30;
  for (const gpt2::BatchLayout& layout : steps) {
    const RowMatrix<float> x = random_input<float>(layout.rows(), C, seed++);
    RowMatrix<float> out = RowMatrix<float>::Constant(layout.rows(), C, -1.0f);
    gpt2::attention_forward<float>(w, x, layout, caches, ws, out);
    for (Index b = 0; b < B; ++b) {
      const Index n = layout.length(b);
      if (n == 0) {
        EXPECT_TRUE((out.middleRows(b * layout.tokens(), layout.tokens()).array() == 0.0f).all());
        continue;
      }
      RowMatrix<float> expected(n, C);
      gpt2::attention_forward<float>(w, x.middleRows(layout.first_row(b), n), alone[b], ws_alone,
                                     expected);
      EXPECT_TRUE(bitwise(out.middleRows(layout.first_row(b), n), expected))
          << "sequence " << b << ": " << near(out.middleRows(layout.first_row(b), n), expected, 0);
      ASSERT_EQ(caches[b].n_past(), alone[b].n_past());
      for (Index h = 0; h < 4; ++h) {
        EXPECT_TRUE(caches[b].keys(h) == alone[b].keys(h));
        EXPECT_TRUE(caches[b].values(h) == alone[b].values(h));
        EXPECT_TRUE(caches[b].key_scales(h) == alone[b].key_scales(h));
      }
    }
  }
  const gpt2::BatchLayout too_long = gpt2::BatchLayout::full(B, 20);
  const RowMatrix<float> x = random_input<float>(too_long.rows(), C, 60);
  RowMatrix<float> out(too_long.rows(), C);
  std::vector<Index> before;
  for (const KVCacheInt8& c : caches) before.push_back(c.n_past());
  EXPECT_THROW(gpt2::attention_forward<float>(w, x, too_long, caches, ws, out), gpt2::CapacityError);
  for (Index b = 0; b < B; ++b) EXPECT_EQ(caches[b].n_past(), before[b]);
}

}  // namespace
