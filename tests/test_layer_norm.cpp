// layer_norm against a direct double computation (biased variance, eps inside the sqrt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "gpt2/layer_norm.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::RowVector;

template <class T>
class LayerNormTest : public ::testing::Test {};
TYPED_TEST_SUITE(LayerNormTest, gpt2::test::Scalars);

TYPED_TEST(LayerNormTest, MatchesDefinition) {
  using T = TypeParam;
  std::srand(3);
  const Index T_ = 5, C = 48;
  const RowMatrix<T> x = (RowMatrix<double>::Random(T_, C) * 3.0).array().template cast<T>() + T(100);
  const RowVector<T> w = RowVector<T>::Random(C), b = RowVector<T>::Random(C);
  RowMatrix<T> y(T_, C);
  gpt2::layer_norm<T>(x, gpt2::view(w), gpt2::view(b), T(1e-5), y);
  RowMatrix<double> expected(T_, C);
  for (Index t = 0; t < T_; ++t) {
    double mean = 0, var = 0;
    for (Index c = 0; c < C; ++c) mean += double(x(t, c)) / C;
    for (Index c = 0; c < C; ++c) var += (double(x(t, c)) - mean) * (double(x(t, c)) - mean) / C;
    for (Index c = 0; c < C; ++c)
      expected(t, c) = (double(x(t, c)) - mean) / std::sqrt(var + 1e-5) * double(w(c)) + double(b(c));
  }
  EXPECT_TRUE(gpt2::test::near(y, expected, gpt2::test::Tolerance<T>::rel * 4, gpt2::test::Tolerance<T>::abs));
  gpt2::layer_norm<T>(y, gpt2::view(w), gpt2::view(b), T(1e-5), y);  // in place works
  EXPECT_TRUE(y.allFinite());
}

TEST(LayerNormErrors, ShapesAreNamed) {
  const RowMatrix<float> x = RowMatrix<float>::Zero(2, 8);
  const RowVector<float> w = RowVector<float>::Zero(7), b = RowVector<float>::Zero(8);
  RowMatrix<float> y(2, 8);
  EXPECT_EQ(gpt2::test::error_of<gpt2::ShapeError>(
                [&] { gpt2::layer_norm<float>(x, gpt2::view(w), gpt2::view(b), 1e-5f, y); }),
            "ln.weight: expected shape [8], got [7]");
}

}  // namespace
