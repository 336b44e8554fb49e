// causal_attention_head and causal_softmax_row against the naive double reference
// (tests/support/reference.hpp), for float and double, with and without a past (n_past).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "gpt2/causal_attention.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::test::error_of;
using gpt2::test::near;
using gpt2::test::Tolerance;

template <class T>
RowMatrix<T> random_matrix(Index rows, Index cols, unsigned seed, double scale = 1.0) {
  std::srand(seed);
  RowMatrix<double> m = RowMatrix<double>::Random(rows, cols) * scale;
  return m.cast<T>();
}

template <class T>
class CausalAttentionTest : public ::testing::Test {};
TYPED_TEST_SUITE(CausalAttentionTest, gpt2::test::Scalars);

struct Case {
  Index T, n_past, head_dim;
};

TYPED_TEST(CausalAttentionTest, MatchesNaiveReferenceForManyShapes) {
  using T = TypeParam;
  // T = 1, odd, exactly one row tile, one more than a tile, several tiles; with and without past.
  for (const Case c : {Case{1, 0, 64}, Case{7, 0, 64}, Case{64, 0, 64}, Case{65, 0, 64},
                       Case{130, 0, 64}, Case{1, 9, 64}, Case{5, 100, 64}, Case{70, 3, 64},
                       Case{9, 0, 4}, Case{33, 2, 16}}) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " n_past=" + std::to_string(c.n_past) +
                 " head_dim=" + std::to_string(c.head_dim));
    const Index S = c.n_past + c.T;
    const RowMatrix<T> q = random_matrix<T>(c.T, c.head_dim, 1, 2.0);
    const RowMatrix<T> k = random_matrix<T>(S, c.head_dim, 2, 2.0);
    const RowMatrix<T> v = random_matrix<T>(S, c.head_dim, 3);
    RowMatrix<double> ref_probs;
    const RowMatrix<double> ref = gpt2::test::naive_head(q, k, v, &ref_probs);

    gpt2::AttentionScratch<T> scratch;
    RowMatrix<T> y(c.T, c.head_dim), probs(c.T, S);
    gpt2::causal_attention_head<T>(q, k, v, y, probs, scratch);
    EXPECT_TRUE(near(y, ref, Tolerance<T>::rel, Tolerance<T>::abs));
    EXPECT_TRUE(near(probs, ref_probs, Tolerance<T>::rel, Tolerance<T>::abs));

    RowMatrix<T> y_no_probs(c.T, c.head_dim);
    gpt2::causal_attention_head<T>(q, k, v, y_no_probs, scratch);
    EXPECT_TRUE(y_no_probs == y) << "the probabilities request must not change the output";
  }
}

TYPED_TEST(CausalAttentionTest, ProbabilitiesAreCausalAndNormalised) {
  using T = TypeParam;
  const Index T_ = 97, n_past = 4, hd = 64, S = n_past + T_;
  const RowMatrix<T> q = random_matrix<T>(T_, hd, 4, 3.0);
  const RowMatrix<T> k = random_matrix<T>(S, hd, 5, 3.0);
  const RowMatrix<T> v = random_matrix<T>(S, hd, 6);
  gpt2::AttentionScratch<T> scratch;
  RowMatrix<T> y(T_, hd), probs = RowMatrix<T>::Constant(T_, S, T(7));  // garbage to overwrite
  gpt2::causal_attention_head<T>(q, k, v, y, probs, scratch);
  for (Index i = 0; i < T_; ++i) {
    const Index visible = n_past + i + 1;
    EXPECT_NEAR(static_cast<double>(probs.row(i).head(visible).sum()), 1.0,
                16 * std::numeric_limits<T>::epsilon())
        << "row " << i;
    EXPECT_TRUE((probs.row(i).head(visible).array() >= T(0)).all()) << "row " << i;
    for (Index s = visible; s < S; ++s)
      ASSERT_EQ(probs(i, s), T(0)) << "row " << i << " key " << s << " is in the future";
  }
}

TYPED_TEST(CausalAttentionTest, LogitsInTheThousandsDoNotOverflow) {
  using T = TypeParam;
  // |q . k| / 8 reaches ~ 10^4: exp would overflow without subtracting the running max.
  const Index T_ = 40, hd = 64;
  const RowMatrix<T> q = random_matrix<T>(T_, hd, 7, 40.0);
  const RowMatrix<T> k = random_matrix<T>(T_, hd, 8, 40.0);
  const RowMatrix<T> v = random_matrix<T>(T_, hd, 9);
  const double max_logit =
      (q.template cast<double>() * k.template cast<double>().transpose()).cwiseAbs().maxCoeff() / 8;
  ASSERT_GT(max_logit, 1000.0);
  RowMatrix<double> ref_probs;
  const RowMatrix<double> ref = gpt2::test::naive_head(q, k, v, &ref_probs);
  gpt2::AttentionScratch<T> scratch;
  RowMatrix<T> y(T_, hd), probs(T_, T_);
  gpt2::causal_attention_head<T>(q, k, v, y, probs, scratch);
  ASSERT_TRUE(y.allFinite());
  // Logits this large carry an absolute rounding error of ~|logit| * eps, which the softmax turns
  // into a relative error of the same size: the tolerance scales with the logits.
  const double tol = max_logit * 8 * std::numeric_limits<T>::epsilon();
  EXPECT_TRUE(near(y, ref, tol, tol));
  EXPECT_TRUE(near(probs, ref_probs, tol, tol));
}

TYPED_TEST(CausalAttentionTest, SoftmaxRowHandlesLargeNegativeLogits) {
  using T = TypeParam;
  // A finite sentinel such as -10000 as the starting max would give exp(0)=1 for no key here.
  T row[4] = {T(-30000), T(-30000), T(-30002), T(5)};
  gpt2::causal_softmax_row<T>(row, 3, 4);
  EXPECT_NEAR(static_cast<double>(row[0]), 1.0 / (2.0 + std::exp(-2.0)), 1e-6);
  EXPECT_NEAR(static_cast<double>(row[2]), std::exp(-2.0) / (2.0 + std::exp(-2.0)), 1e-6);
  EXPECT_EQ(row[3], T(0)) << "entries past the visible keys must be exactly zero";
}

TYPED_TEST(CausalAttentionTest, RunningMaxStartsAtMinusInfinityAndPropagatesNaN) {
  using T = TypeParam;
  const T inf = std::numeric_limits<T>::infinity();
  std::vector<T> row(19, T(-1e30));
  row[17] = T(-5);  // in the scalar tail, past the 8-wide lanes
  EXPECT_EQ(gpt2::running_max(row.data(), 19), T(-5));
  EXPECT_EQ(gpt2::running_max(row.data(), 3), T(-1e30));
  std::vector<T> all_minus_inf(9, -inf);
  EXPECT_EQ(gpt2::running_max(all_minus_inf.data(), 9), -inf);
  row[4] = std::numeric_limits<T>::quiet_NaN();
  EXPECT_TRUE(std::isnan(gpt2::running_max(row.data(), 19)));
  EXPECT_FALSE(std::isnan(gpt2::running_max(row.data(), 4)));
}

TYPED_TEST(CausalAttentionTest, ScratchIsReusedWithoutGrowing) {
  using T = TypeParam;
  const RowMatrix<T> q = random_matrix<T>(50, 64, 10), k = random_matrix<T>(50, 64, 11),
                     v = random_matrix<T>(50, 64, 12);
  gpt2::AttentionScratch<T> scratch(50, 64);
  const T* tile = scratch.tile();
  const gpt2::Index bytes = scratch.bytes();
  RowMatrix<T> y1(50, 64), y2(50, 64);
  gpt2::causal_attention_head<T>(q, k, v, y1, scratch);
  gpt2::causal_attention_head<T>(q.topRows(20), k.topRows(20), v.topRows(20), y2.topRows(20), scratch);
  EXPECT_EQ(scratch.tile(), tile);
  EXPECT_EQ(scratch.bytes(), bytes);
  // Rows never depend on later rows: bitwise the same (the fused core's rows are exact).
  EXPECT_TRUE(y2.topRows(20) == y1.topRows(20));
  // Without probabilities the scratch does not grow with the keys (O(tile x head_dim)).
  const RowMatrix<T> q2 = random_matrix<T>(1, 64, 13), k2 = random_matrix<T>(3000, 64, 14);
  RowMatrix<T> y3(1, 64);
  gpt2::causal_attention_head<T>(q2, k2, k2, y3, scratch);
  EXPECT_EQ(scratch.bytes(), bytes);
}

TEST(CausalAttentionErrors, ShapesAreNamed) {
  gpt2::AttentionScratch<float> scratch;
  const RowMatrix<float> q = RowMatrix<float>::Zero(4, 8), k = RowMatrix<float>::Zero(4, 8);
  const RowMatrix<float> k_bad = RowMatrix<float>::Zero(4, 7), short_k = RowMatrix<float>::Zero(3, 8);
  RowMatrix<float> y(4, 8), y_bad(3, 8), probs_bad(4, 5);
  EXPECT_EQ(error_of<gpt2::ShapeError>(
                [&] { gpt2::causal_attention_head<float>(q, k_bad, k, y, scratch); }),
            "k: expected shape [4, 8], got [4, 7]");
  EXPECT_EQ(error_of<gpt2::ShapeError>(
                [&] { gpt2::causal_attention_head<float>(q, k, k_bad, y, scratch); }),
            "v: expected shape [4, 8], got [4, 7]");
  EXPECT_EQ(error_of<gpt2::ShapeError>(
                [&] { gpt2::causal_attention_head<float>(q, k, k, y_bad, scratch); }),
            "out: expected shape [4, 8], got [3, 8]");
  EXPECT_EQ(error_of<gpt2::ShapeError>(
                [&] { gpt2::causal_attention_head<float>(q, k, k, y, probs_bad, scratch); }),
            "probs: expected shape [4, 4], got [4, 5]");
  EXPECT_EQ(error_of<gpt2::ShapeError>(
                [&] { gpt2::causal_attention_head<float>(q, short_k, short_k, y, scratch); }),
            "k: expected at least as many rows as q (4), got 3");
  RowMatrix<float> qkv = RowMatrix<float>::Zero(4, 24), probs(4, 4);
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] {
              gpt2::causal_attention_head<float>(qkv.leftCols(8), k, k, qkv.rightCols(8), scratch);
            }),
            "out: must not overlap q, k or v");
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] {
              gpt2::causal_attention_head<float>(qkv.leftCols(8), k, k, y, qkv.leftCols(4), scratch);
            }),
            "probs: must not overlap q, k, v or out");
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] {
              gpt2::causal_attention_head<float>(q, k, k, y, y.leftCols(4), scratch);
            }),
            "probs: must not overlap q, k, v or out");
}

}  // namespace
