// qkv_projection and the head views: offsets of q | k | v (three contiguous C-blocks), zero-copy,
// and the errors. Per-head checks against PyTorch's own split are in test_reference.cpp.
#include <gtest/gtest.h>

#include <cstdlib>

#include "gpt2/qkv.hpp"
#include "support/compare.hpp"
#include "support/models.hpp"
#include "support/errors.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::RowVector;
using gpt2::test::error_of;

template <class T>
class QkvTest : public ::testing::Test {};
TYPED_TEST_SUITE(QkvTest, gpt2::test::Scalars);

TYPED_TEST(QkvTest, ProjectionIsXTimesWeightPlusBiasWithoutTranspose) {
  using T = TypeParam;
  const gpt2::test::Model<T> m = gpt2::test::random_model<T>(12, 3, 1);
  const RowMatrix<T> x = gpt2::test::random_input<T>(5, 12, 2);
  const RowMatrix<T>& c_attn_w = m.c_attn_w;
  const RowVector<T>& c_attn_b = m.c_attn_b;
  const gpt2::AttentionWeights<T> w = m.weights();
  RowMatrix<T> qkv(5, 36);
  gpt2::qkv_projection<T>(w, x, qkv);
  RowMatrix<double> expected(5, 36);
  for (Index t = 0; t < 5; ++t)
    for (Index j = 0; j < 36; ++j) {
      double s = static_cast<double>(c_attn_b(j));
      for (Index c = 0; c < 12; ++c) s += double(x(t, c)) * double(c_attn_w(c, j));  // x @ W
      expected(t, j) = s;
    }
  EXPECT_TRUE(gpt2::test::near(qkv, expected, gpt2::test::Tolerance<T>::rel,
                               gpt2::test::Tolerance<T>::abs));
}

TYPED_TEST(QkvTest, HeadViewsAreZeroCopySlicesOfTheThreeBlocks) {
  using T = TypeParam;
  const gpt2::AttentionConfig config{768, 12};
  const Index C = 768, hd = 64, T_ = 3;
  RowMatrix<T> qkv(T_, 3 * C);
  for (Index t = 0; t < T_; ++t)
    for (Index j = 0; j < 3 * C; ++j) qkv(t, j) = T(t * 10000 + j);  // value = column index
  for (Index h = 0; h < 12; ++h) {
    const gpt2::ConstMatrixRef<T> q = gpt2::q_view(qkv, config, h);
    const gpt2::ConstMatrixRef<T> k = gpt2::k_view(qkv, config, h);
    const gpt2::ConstMatrixRef<T> v = gpt2::v_view(qkv, config, h);
    // zero-copy: the views point into qkv, at the documented offsets
    EXPECT_EQ(q.data(), qkv.data() + h * hd);
    EXPECT_EQ(k.data(), qkv.data() + C + h * hd);
    EXPECT_EQ(v.data(), qkv.data() + 2 * C + h * hd);
    EXPECT_EQ(q.outerStride(), 3 * C);
    ASSERT_EQ(q.rows(), T_);
    ASSERT_EQ(q.cols(), hd);
    for (Index t = 0; t < T_; ++t)
      for (Index d = 0; d < hd; ++d) {
        ASSERT_EQ(q(t, d), T(t * 10000 + h * hd + d));
        ASSERT_EQ(k(t, d), T(t * 10000 + C + h * hd + d));
        ASSERT_EQ(v(t, d), T(t * 10000 + 2 * C + h * hd + d));
      }
  }
}

TEST(QkvErrors, WrongShapesAndHeadsAreNamed) {
  const gpt2::test::Model<float> m = gpt2::test::zero_model<float>(8, 2);
  const gpt2::AttentionConfig& config = m.config;
  const gpt2::AttentionWeights<float> w = m.weights();
  const RowMatrix<float> x_bad = RowMatrix<float>::Zero(3, 7), x = RowMatrix<float>::Zero(3, 8);
  RowMatrix<float> qkv(3, 24), qkv_bad(3, 23);
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::qkv_projection<float>(w, x_bad, qkv); }),
            "x: expected shape [3, 8], got [3, 7]");
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { gpt2::qkv_projection<float>(w, x, qkv_bad); }),
            "qkv: expected shape [3, 24], got [3, 23]");
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { (void)gpt2::q_view(qkv, config, 2); }),
            "head: expected an index in [0, 2), got 2");
  EXPECT_EQ(error_of<gpt2::ShapeError>([&] { (void)gpt2::k_view(qkv_bad, config, 0); }),
            "qkv: expected shape [3, 24], got [3, 23]");
}

}  // namespace
