// Padded batches (batch.hpp): BatchLayout's checks; padding never reaches a real row (NaN
// included) and padded output rows are exactly zero; the batched forward equals per-sequence
// forwards; batched decode through one cache per sequence equals per-sequence decode; errors leave
// every cache unchanged. The PyTorch attention_mask cases are in test_reference_incremental.cpp.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/models.hpp"

namespace {

using gpt2::BatchLayout;
using gpt2::Index;
using gpt2::KVCache;
using gpt2::RowMatrix;
using gpt2::test::Contains;
using gpt2::test::error_of;
using gpt2::test::Model;
using gpt2::test::near;
using gpt2::test::random_input;
using gpt2::test::random_model;

constexpr Index kC = 32, kHeads = 4;

template <class T>
constexpr double kChunkTolerance = sizeof(T) == 4 ? 4e-6 : 1e-14;  // as in test_kv_cache.cpp

TEST(BatchLayout, FactoriesGiveTheRealRows) {
  const BatchLayout full = BatchLayout::full(2, 5);
  EXPECT_EQ(full.batch(), 2);
  EXPECT_EQ(full.tokens(), 5);
  EXPECT_EQ(full.rows(), 10);
  EXPECT_EQ(full.start(1), 0);
  EXPECT_EQ(full.length(1), 5);

  const BatchLayout right = BatchLayout::right_padded(5, {5, 2, 0});
  EXPECT_EQ(right.start(1), 0);
  EXPECT_EQ(right.length(1), 2);
  EXPECT_EQ(right.first_row(2), 10);
  EXPECT_EQ(right.max_length(), 5);

  const BatchLayout left = BatchLayout::left_padded(5, {5, 2, 0});
  EXPECT_EQ(left.start(1), 3);
  EXPECT_EQ(left.first_row(1), 8);
  EXPECT_EQ(left.start(2), 5);

  BatchLayout general(6, {1, 0}, {3, 6});
  EXPECT_EQ(general.first_row(0), 1);
  general.set(0, 2, 4);
  EXPECT_EQ(general.start(0), 2);
  EXPECT_EQ(general.length(0), 4);
}

TEST(BatchLayout, RejectsRowsOutsideTheSequence) {
  auto message = [](auto f) { return error_of<gpt2::ShapeError>(f); };
  EXPECT_EQ(message([] { BatchLayout::right_padded(4, {4, 5}); }),
            "batch sequence 1: expected 0 <= start, 0 <= length and start + length <= 4 (the "
            "padded length), got start 0, length 5");
  EXPECT_TRUE(Contains(message([] { BatchLayout(4, {-1}, {2}); }), "got start -1, length 2"));
  EXPECT_TRUE(Contains(message([] { BatchLayout(4, {3}, {2}); }), "got start 3, length 2"));
  EXPECT_TRUE(Contains(message([] { BatchLayout::right_padded(4, {-2}); }), "length -2"));
  EXPECT_EQ(message([] { BatchLayout::left_padded(3, {2, 5}); }),
            "batch sequence 1: expected a length in [0, 3] (the padded length), got 5");
  EXPECT_TRUE(Contains(message([] { BatchLayout(4, {0, 0}, {1}); }),
                       "expected one start per length (1), got 2"));
  EXPECT_TRUE(Contains(message([] { BatchLayout::full(-1, 4); }), "batch size, got -1"));
  EXPECT_TRUE(Contains(message([] { BatchLayout::full(1, 4).start(1); }),
                       "expected a sequence index in [0, 1), got 1"));
  BatchLayout layout = BatchLayout::full(1, 4);
  EXPECT_THROW(layout.set(0, 2, 3), gpt2::ShapeError);
  EXPECT_EQ(layout.length(0), 4) << "a rejected set changes nothing";
}

template <class T>
class BatchTest : public ::testing::Test {
 protected:
  BatchTest() : m(random_model<T>(kC, kHeads, 11)), w(m.weights()) {}
  Model<T> m;
  gpt2::AttentionWeights<T> w;

  // x [B * T, C] with real rows from the generator and every padded row set to `pad`.
  RowMatrix<T> batch_input(const BatchLayout& layout, T pad, unsigned seed) const {
    RowMatrix<T> x = random_input<T>(layout.rows(), kC, seed);
    for (Index b = 0; b < layout.batch(); ++b)
      for (Index t = 0; t < layout.tokens(); ++t)
        if (t < layout.start(b) || t >= layout.start(b) + layout.length(b))
          x.row(b * layout.tokens() + t).setConstant(pad);
    return x;
  }
  // Sequence b's real rows, run alone.
  RowMatrix<T> alone(const RowMatrix<T>& x, const BatchLayout& layout, Index b) const {
    const RowMatrix<T> rows = x.middleRows(layout.first_row(b), layout.length(b));
    RowMatrix<T> out(rows.rows(), kC);
    gpt2::Workspace<T> ws(m.config);
    gpt2::attention_forward<T>(w, rows, ws, out);
    return out;
  }
  void expect_padding_zero(const RowMatrix<T>& out, const BatchLayout& layout) const {
    for (Index b = 0; b < layout.batch(); ++b)
      for (Index t = 0; t < layout.tokens(); ++t)
        if (t < layout.start(b) || t >= layout.start(b) + layout.length(b)) {
          EXPECT_TRUE((out.row(b * layout.tokens() + t).array() == T(0)).all())
              << "padded row " << t << " of sequence " << b;
        }
  }
};
TYPED_TEST_SUITE(BatchTest, gpt2::test::Scalars);

TYPED_TEST(BatchTest, EachSequenceGetsWhatItGetsAloneAndPaddingIsZero) {
  using T = TypeParam;
  for (const BatchLayout& layout :
       {BatchLayout::full(2, 7), BatchLayout::right_padded(7, {7, 4, 1}),
        BatchLayout::left_padded(7, {4, 7, 1}), BatchLayout(6, {1, 0, 2, 3}, {3, 0, 4, 1})}) {
    const RowMatrix<T> x = this->batch_input(layout, T(3), 5);
    RowMatrix<T> out(layout.rows(), kC);
    gpt2::Workspace<T> ws(this->m.config);
    gpt2::attention_forward<T>(this->w, x, layout, ws, out);
    for (Index b = 0; b < layout.batch(); ++b)
      EXPECT_TRUE(out.middleRows(layout.first_row(b), layout.length(b)) == this->alone(x, layout, b))
          << "sequence " << b;
    this->expect_padding_zero(out, layout);
  }
}

// Whatever the padded rows hold (huge values, infinities, NaN), real rows are bit-identical and
// nothing non-finite appears.
TYPED_TEST(BatchTest, GarbageInPaddedRowsNeverReachesRealRows) {
  using T = TypeParam;
  const BatchLayout layout(8, {2, 0, 5}, {5, 3, 3});
  gpt2::Workspace<T> ws(this->m.config);
  RowMatrix<T> reference(layout.rows(), kC);
  gpt2::attention_forward<T>(this->w, this->batch_input(layout, T(0), 6), layout, ws, reference);
  for (const T pad : {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                      -std::numeric_limits<T>::max(), T(1e4)}) {
    const RowMatrix<T> x = this->batch_input(layout, pad, 6);
    RowMatrix<T> out(layout.rows(), kC);
    gpt2::attention_forward<T>(this->w, x, layout, ws, out);
    EXPECT_TRUE(out == reference) << "pad " << pad;
    EXPECT_TRUE(out.allFinite()) << "pad " << pad;
  }
}

TYPED_TEST(BatchTest, OutMayBeTheInputAndEmptySequencesGiveZeros) {
  using T = TypeParam;
  const BatchLayout layout = BatchLayout::right_padded(5, {0, 5, 0});
  RowMatrix<T> x = this->batch_input(layout, std::numeric_limits<T>::quiet_NaN(), 7);
  RowMatrix<T> expected(layout.rows(), kC);
  gpt2::Workspace<T> ws(this->m.config);
  gpt2::attention_forward<T>(this->w, x, layout, ws, expected);
  gpt2::attention_forward<T>(this->w, x, layout, ws, x);  // in place
  EXPECT_TRUE(x == expected);
  EXPECT_TRUE((x.topRows(5).array() == T(0)).all());
  EXPECT_TRUE((x.bottomRows(5).array() == T(0)).all());

  const BatchLayout empty = BatchLayout::full(0, 4);
  RowMatrix<T> none(0, kC);
  gpt2::attention_forward<T>(this->w, none, empty, ws, none);
}

// out may be x itself, but not a shifted view of the same storage: sequence b's output would
// overwrite a later sequence's input.
TYPED_TEST(BatchTest, OutPartlyOverlappingXIsAnError) {
  using T = TypeParam;
  const BatchLayout layout = BatchLayout::full(2, 3);
  RowMatrix<T> buffer = random_input<T>(9, kC, 12);
  const RowMatrix<T> before = buffer;
  gpt2::Workspace<T> ws(this->m.config);
  std::vector<KVCache<T>> caches;
  caches.emplace_back(this->m.config, 8);
  caches.emplace_back(this->m.config, 8);
  const std::string expected = "out: must be either the same storage as x or not overlap it";
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] {
              gpt2::attention_forward<T>(this->w, buffer.topRows(6), layout, ws, buffer.bottomRows(6));
            }),
            expected);
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] {
              gpt2::attention_forward<T>(this->w, buffer.topRows(6), layout, caches, ws, buffer.bottomRows(6));
            }),
            expected);
  EXPECT_TRUE(buffer == before);
  EXPECT_EQ(caches[0].n_past(), 0);
}

// An out that overlaps the workspace is found before any cache changes, whichever sequence it hits.
TYPED_TEST(BatchTest, EveryCheckRunsBeforeAnyCacheChanges) {
  using T = TypeParam;
  const BatchLayout layout = BatchLayout::right_padded(2, {1, 2});
  std::vector<KVCache<T>> caches;
  caches.emplace_back(this->m.config, 8);
  caches.emplace_back(this->m.config, 8);
  gpt2::Workspace<T> ws(this->m.config, 3, 8);  // qkv [3, 3C]
  const RowMatrix<T> x = random_input<T>(4, kC, 13);
  // out [4, C] inside ws.qkv from scalar 3C on: sequence 0's row (out row 0, scalars 3C .. 4C)
  // misses the qkv rows its one token uses (0 .. 3C); sequence 1's rows (5C .. 7C) hit the two
  // rows its two tokens use (0 .. 6C). With row-exact projections the two sequences share one
  // group, which uses 3 rows (0 .. 9C): then sequence 0's row hits them too.
  Eigen::Map<RowMatrix<T>> out(ws.qkv.data() + 3 * kC, 4, kC);
  const std::string hit = gpt2::kernels::table<T>().row_exact ? "0" : "1";
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::attention_forward<T>(this->w, x, layout, caches, ws, out); }),
            "batch sequence " + hit + ": out: must not overlap the workspace");
  EXPECT_EQ(caches[0].n_past(), 0);
  EXPECT_EQ(caches[1].n_past(), 0);
}

TYPED_TEST(BatchTest, ShapeErrorsNameTheTensor) {
  using T = TypeParam;
  const BatchLayout layout = BatchLayout::full(2, 3);
  const RowMatrix<T> x(5, kC);
  RowMatrix<T> out(6, kC);
  gpt2::Workspace<T> ws(this->m.config);
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::attention_forward<T>(this->w, x, layout, ws, out); }),
            "x: expected shape [6, 32], got [5, 32]");
}

// Batched decode: sequences with different prompts and lengths, one cache each; sequences that
// are done sit out (length 0). Equals per-sequence whole forwards.
TYPED_TEST(BatchTest, BatchedDecodeEqualsEachSequenceAlone) {
  using T = TypeParam;
  const std::vector<Index> lengths = {9, 4, 6}, prompts = {5, 4, 1};
  const Index B = 3, L = 9;
  const RowMatrix<T> tokens = random_input<T>(B * L, kC, 8);  // sequence b: rows b*L ..
  std::vector<KVCache<T>> caches;
  for (Index b = 0; b < B; ++b) caches.emplace_back(this->m.config, L);
  gpt2::Workspace<T> ws(this->m.config);
  RowMatrix<T> out = RowMatrix<T>::Constant(B * L, kC, T(-1));

  // step 0: the prompts, right-padded to 5 rows (padding is NaN)
  const Index P = 5;
  const BatchLayout prefill = BatchLayout::right_padded(P, prompts);
  RowMatrix<T> x = RowMatrix<T>::Constant(B * P, kC, std::numeric_limits<T>::quiet_NaN());
  for (Index b = 0; b < B; ++b) x.middleRows(b * P, prompts[b]) = tokens.middleRows(b * L, prompts[b]);
  RowMatrix<T> y(B * P, kC);
  gpt2::attention_forward<T>(this->w, x, prefill, caches, ws, y);
  for (Index b = 0; b < B; ++b) {
    out.middleRows(b * L, prompts[b]) = y.middleRows(b * P, prompts[b]);
    EXPECT_EQ(caches[b].n_past(), prompts[b]);
  }
  this->expect_padding_zero(y, prefill);

  // decode steps: one row per sequence, length 0 once a sequence is done
  BatchLayout step = BatchLayout::full(B, 1);
  RowMatrix<T> x_step(B, kC), y_step(B, kC);
  for (Index s = 0;; ++s) {
    bool any = false;
    for (Index b = 0; b < B; ++b) {
      const Index pos = caches[b].n_past();
      const bool more = pos < lengths[b];
      step.set(b, 0, more ? 1 : 0);
      if (more)
        x_step.row(b) = tokens.row(b * L + pos);
      else
        x_step.row(b).setConstant(std::numeric_limits<T>::quiet_NaN());
      any = any || more;
    }
    if (!any) break;
    std::vector<KVCache<T>*> pointers = {&caches[0], &caches[1], &caches[2]};
    gpt2::attention_forward<T>(this->w, x_step, step, pointers, ws, y_step);
    for (Index b = 0; b < B; ++b) {
      if (step.length(b) == 1)
        out.row(b * L + caches[b].n_past() - 1) = y_step.row(b);
      else
        EXPECT_TRUE((y_step.row(b).array() == T(0)).all());
    }
  }
  for (Index b = 0; b < B; ++b) {
    EXPECT_EQ(caches[b].n_past(), lengths[b]);
    const BatchLayout whole = BatchLayout::right_padded(L, {lengths[b]});
    const RowMatrix<T> x_b = tokens.middleRows(b * L, L);
    EXPECT_TRUE(near(out.middleRows(b * L, lengths[b]), this->alone(x_b, whole, 0), kChunkTolerance<T>))
        << "sequence " << b;
  }
}

// Any error, even in the last sequence, leaves every cache as it was.
TYPED_TEST(BatchTest, CachedBatchErrorsChangeNoCache) {
  using T = TypeParam;
  std::vector<KVCache<T>> caches;
  caches.emplace_back(this->m.config, 10);
  caches.emplace_back(this->m.config, 10);
  caches.emplace_back(this->m.config, 4);
  gpt2::Workspace<T> ws(this->m.config);
  const BatchLayout three = BatchLayout::full(3, 3);
  const RowMatrix<T> x = random_input<T>(9, kC, 9);
  RowMatrix<T> out(9, kC);
  gpt2::attention_forward<T>(this->w, x, three, caches, ws, out);  // 3, 3, 3 cached

  EXPECT_EQ(error_of<gpt2::CapacityError>([&] { gpt2::attention_forward<T>(this->w, x, three, caches, ws, out); }),
            "batch sequence 2: KV cache: 3 cached + 3 new tokens exceed its capacity of 4 tokens");
  for (const KVCache<T>& c : caches) EXPECT_EQ(c.n_past(), 3);

  std::vector<KVCache<T>*> shared = {&caches[0], &caches[1], &caches[0]};
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::attention_forward<T>(this->w, x, three, shared, ws, out); }),
            "caches: sequences 0 and 2 share one KV cache");
  std::vector<KVCache<T>*> two = {&caches[0], &caches[1]};
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::attention_forward<T>(this->w, x, three, two, ws, out); }),
            "caches: expected one KV cache per sequence (3), got 2");
  std::vector<KVCache<T>*> null = {&caches[0], nullptr, &caches[2]};
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::attention_forward<T>(this->w, x, three, null, ws, out); }),
            "caches: entry 1 is null");
  KVCache<T> other_heads({kC, 2}, 10);
  std::vector<KVCache<T>*> mixed = {&caches[0], &caches[1], &other_heads};
  EXPECT_TRUE(Contains(error_of<gpt2::ConfigError>([&] { gpt2::attention_forward<T>(this->w, x, three, mixed, ws, out); }),
                       "batch sequence 2: cache: expected n_embd 32, n_head 4"));
  for (const KVCache<T>& c : caches) EXPECT_EQ(c.n_past(), 3);
  EXPECT_EQ(other_heads.n_past(), 0);
}

// The cached batched forward against each sequence through its own cache, alone: the same bits in
// the output and in the caches. With the AVX-512 float kernel the real rows of up to
// kBatchGroupRows go through the projections together (here 300 sequences of 0 to 3 new tokens
// after 0 to 6 cached ones, so groups end mid-batch; a sequence longer than kBatchGroupRows, which
// then sets the group size; out being x; and a step where every sequence sits out), elsewhere
// sequence by sequence; either way a row's result must not depend on its neighbours.
TYPED_TEST(BatchTest, CachedBatchIsBitwiseEachSequenceThroughItsOwnCache) {
  using T = TypeParam;
  struct Case {
    Index tokens;
    std::vector<Index> starts, lengths, past;
  };
  std::vector<Case> cases(2);
  for (Index b = 0; b < 300; ++b) {  // many short sequences, left and right padded
    const Index length = b % 4;
    cases[0].starts.push_back(b % 2 == 1 ? 3 - length : 0);
    cases[0].lengths.push_back(length);
    cases[0].past.push_back(b % 7);
  }
  cases[0].tokens = 3;
  const Index longer = gpt2::kBatchGroupRows + 44;  // longer than kBatchGroupRows
  cases[1] = Case{longer, {0, 0, 5}, {longer, 1, 2}, {3, 0, 9}};
  for (const Case& c : cases) {
    const BatchLayout layout(c.tokens, c.starts, c.lengths);
    SCOPED_TRACE("B=" + std::to_string(layout.batch()) + " T=" + std::to_string(c.tokens));
    const RowMatrix<T> x = this->batch_input(layout, std::numeric_limits<T>::quiet_NaN(), 31);
    std::vector<KVCache<T>> caches, alone;
    gpt2::Workspace<T> ws_alone(this->m.config);
    for (Index b = 0; b < layout.batch(); ++b) {
      caches.emplace_back(this->m.config, c.past[b] + c.tokens);
      const RowMatrix<T> prompt = random_input<T>(c.past[b], kC, static_cast<unsigned>(40 + b));
      RowMatrix<T> prompt_out(c.past[b], kC);
      gpt2::attention_forward<T>(this->w, prompt, caches.back(), ws_alone, prompt_out);
      alone.push_back(caches.back().copy());
    }
    std::vector<KVCache<T>> in_place_caches;
    for (const KVCache<T>& cache : caches) in_place_caches.push_back(cache.copy());
    gpt2::Workspace<T> ws(this->m.config);
    RowMatrix<T> out = RowMatrix<T>::Constant(layout.rows(), kC, T(-1));
    gpt2::attention_forward<T>(this->w, x, layout, caches, ws, out);
    this->expect_padding_zero(out, layout);
    RowMatrix<T> in_place = x;  // out being x: the same bits
    gpt2::attention_forward<T>(this->w, in_place, layout, in_place_caches, ws, in_place);
    ASSERT_TRUE(in_place == out);
    for (Index b = 0; b < layout.batch(); ++b) {
      const Index n = layout.length(b);
      RowMatrix<T> expected(n, kC);
      const auto x_b = x.middleRows(layout.first_row(b), n);
      gpt2::attention_forward<T>(this->w, x_b, alone[b], ws_alone, expected);
      ASSERT_TRUE(out.middleRows(layout.first_row(b), n) == expected) << "sequence " << b;
      ASSERT_EQ(caches[b].n_past(), alone[b].n_past()) << "sequence " << b;
      for (Index h = 0; h < kHeads; ++h) {
        ASSERT_TRUE(caches[b].keys(h) == alone[b].keys(h)) << "sequence " << b << " head " << h;
        ASSERT_TRUE(caches[b].values(h) == alone[b].values(h)) << "sequence " << b << " head " << h;
      }
    }
  }
  // A step where every sequence sits out, on a new (empty) workspace: zeros, caches unchanged.
  const BatchLayout idle(2, {0, 0, 0}, {0, 0, 0});
  std::vector<KVCache<T>> caches;
  for (int b = 0; b < 3; ++b) caches.emplace_back(this->m.config, 4);
  gpt2::Workspace<T> empty(this->m.config);
  RowMatrix<T> idle_out = RowMatrix<T>::Constant(idle.rows(), kC, T(-1));
  gpt2::attention_forward<T>(this->w, random_input<T>(idle.rows(), kC, 50), idle, caches, empty,
                             idle_out);
  EXPECT_TRUE((idle_out.array() == T(0)).all());
  for (const KVCache<T>& cache : caches) EXPECT_EQ(cache.n_past(), 0);
}

}  // namespace
