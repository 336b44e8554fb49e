// head_slot, merge_heads and output_projection (projection.hpp) against direct computations.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "gpt2/projection.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/models.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::RowVector;
using gpt2::test::error_of;

template <class T>
class ProjectionTest : public ::testing::Test {};
TYPED_TEST_SUITE(ProjectionTest, gpt2::test::Scalars);

TYPED_TEST(ProjectionTest, HeadSlotIsAZeroCopyViewAtHeadTimesHeadDim) {
  using T = TypeParam;
  const gpt2::AttentionConfig config{48, 3};  // head_dim 16
  RowMatrix<T> merged = RowMatrix<T>::Zero(5, 48);
  for (Index h = 0; h < 3; ++h) {
    gpt2::MatrixRef<T> slot = gpt2::head_slot(merged, config, h);
    EXPECT_EQ(slot.data(), merged.data() + h * 16);
    EXPECT_EQ(slot.outerStride(), 48);
    EXPECT_EQ(slot.rows(), 5);
    EXPECT_EQ(slot.cols(), 16);
    slot.setConstant(T(h + 1));  // writes land in merged
  }
  for (Index c = 0; c < 48; ++c) EXPECT_EQ(merged(4, c), T(c / 16 + 1)) << "column " << c;
  // A view passed as a temporary (the forward's `ws.merged.topRows(T)`) works too.
  gpt2::head_slot(merged.topRows(2), config, 2).setZero();
  EXPECT_EQ(merged(1, 40), T(0));
  EXPECT_EQ(merged(2, 40), T(3));
}

TYPED_TEST(ProjectionTest, MergeHeadsConcatenatesInHeadOrder) {
  using T = TypeParam;
  const gpt2::AttentionConfig config{12, 3};  // head_dim 4
  std::srand(1);
  std::vector<RowMatrix<T>> heads;
  for (Index h = 0; h < 3; ++h) heads.push_back(RowMatrix<T>::Random(6, 4));
  RowMatrix<T> merged(6, 12);
  gpt2::merge_heads<T>(heads, config, merged);
  for (Index t = 0; t < 6; ++t)
    for (Index c = 0; c < 12; ++c) ASSERT_EQ(merged(t, c), heads[c / 4](t, c % 4)) << t << ", " << c;
}

TYPED_TEST(ProjectionTest, OutputProjectionIsMergedTimesWeightPlusBias) {
  using T = TypeParam;
  const gpt2::test::Model<T> m = gpt2::test::random_model<T>(32, 2, 2);
  const RowMatrix<T>& c_proj_w = m.c_proj_w;
  const RowVector<T>& c_proj_b = m.c_proj_b;
  const gpt2::AttentionWeights<T> w = m.weights();
  const RowMatrix<T> merged = RowMatrix<T>::Random(7, 32);
  RowMatrix<T> out(7, 32);
  gpt2::output_projection<T>(w, merged, out);
  RowMatrix<double> expected(7, 32);
  for (Index t = 0; t < 7; ++t)
    for (Index j = 0; j < 32; ++j) {
      double s = double(c_proj_b(j));
      for (Index c = 0; c < 32; ++c) s += double(merged(t, c)) * double(c_proj_w(c, j));  // no transpose
      expected(t, j) = s;
    }
  EXPECT_TRUE(gpt2::test::near(out, expected, gpt2::test::Tolerance<T>::rel,
                               gpt2::test::Tolerance<T>::abs));
  // A strided view of a wider matrix works as input (no copy needed).
  RowMatrix<T> wide = RowMatrix<T>::Zero(7, 40);
  wide.leftCols(32) = merged;
  RowMatrix<T> out2(7, 32);
  gpt2::output_projection<T>(w, wide.leftCols(32), out2);
  EXPECT_TRUE(out2 == out);
}

TEST(ProjectionErrors, ShapesHeadsAndAliasingAreNamed) {
  const gpt2::test::Model<float> m = gpt2::test::zero_model<float>(12, 3);
  const gpt2::AttentionConfig& config = m.config;
  const gpt2::AttentionWeights<float> w = m.weights();
  RowMatrix<float> merged = RowMatrix<float>::Zero(4, 12), out(4, 12), out_bad(3, 12), merged_bad(4, 11);
  std::vector<RowMatrix<float>> two_heads(2, RowMatrix<float>::Zero(4, 4));
  std::vector<RowMatrix<float>> bad_head(3, RowMatrix<float>::Zero(4, 4));
  bad_head[1] = RowMatrix<float>::Zero(4, 5);

  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::merge_heads<float>(two_heads, config, merged); }),
            "heads: expected 3 head outputs, got 2");
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::merge_heads<float>(bad_head, config, merged); }),
            "heads[1]: expected shape [4, 4], got [4, 5]");
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::output_projection<float>(w, merged, out_bad); }),
            "out: expected shape [4, 12], got [3, 12]");
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::output_projection<float>(w, merged_bad, out); }),
            "merged: expected shape [4, 12], got [4, 11]");
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::output_projection<float>(w, merged, merged); }),
            "out: must not overlap merged");
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { (void)gpt2::head_slot(merged, config, 3); }),
            "head: expected an index in [0, 3), got 3");
  EXPECT_EQ(error_of<gpt2::ConfigError>([&] { (void)gpt2::head_slot(merged, gpt2::AttentionConfig{12, 5}, 0); }),
            "n_head: expected a divisor of n_embd = 12, got 5");
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { (void)gpt2::head_slot(merged_bad, config, 0); }),
            "merged: expected shape [4, 12], got [4, 11]");
}

}  // namespace
