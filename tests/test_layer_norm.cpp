// layer_norm against a direct double computation (biased variance, eps inside the sqrt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

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

// The weight and bias bind any Eigen vector of T, as the other inputs of the API bind Eigen
// matrices: the results are bit for bit those of the ConstVectorMap views.
TYPED_TEST(LayerNormTest, WeightAndBiasTakeAnyEigenVector) {
  using T = TypeParam;
  using ColVector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  std::srand(5);
  const Index T_ = 3, C = 40;
  const RowMatrix<T> x = RowMatrix<T>::Random(T_, C);
  const RowVector<T> w = RowVector<T>::Random(C), b = RowVector<T>::Random(C);
  RowMatrix<T> expected(T_, C);
  gpt2::layer_norm<T>(x, gpt2::view(w), gpt2::view(b), T(1e-5), expected);

  RowMatrix<T> y(T_, C);
  gpt2::layer_norm(x, w, b, T(1e-5), y);  // RowVector, T deduced from the input
  EXPECT_EQ(y, expected);

  const ColVector w_col = w.transpose(), b_col = b.transpose();  // column vectors
  y.setZero();
  gpt2::layer_norm<T>(x, w_col, b_col, T(1e-5), y);
  EXPECT_EQ(y, expected);

  // Rows and columns of other matrices (a column of a row-major matrix is strided).
  RowMatrix<T> table(3, C);
  table.row(1) = w;
  table.row(2) = b;
  const RowMatrix<T> table_t = table.transpose();
  y.setZero();
  gpt2::layer_norm<T>(x, table.row(1), table_t.col(2), T(1e-5), y);
  EXPECT_EQ(y, expected);

  // Expressions: a cheap coefficient-wise one and a product (evaluated once).
  const RowVector<T> half_w = w / T(2);
  y.setZero();
  gpt2::layer_norm<T>(x, half_w * T(2), b + RowVector<T>::Zero(C), T(1e-5), y);
  EXPECT_EQ(y, expected);
  const RowMatrix<T> identity = RowMatrix<T>::Identity(C, C);
  y.setZero();
  gpt2::layer_norm<T>(x, w * identity, b, T(1e-5), y);
  EXPECT_TRUE(gpt2::test::near(y, expected, gpt2::test::Tolerance<T>::rel, gpt2::test::Tolerance<T>::abs));

  // A Map over a plain buffer.
  const std::vector<T> w_buf(w.data(), w.data() + C);
  y.setZero();
  gpt2::layer_norm<T>(x, Eigen::Map<const ColVector>(w_buf.data(), C), b, T(1e-5), y);
  EXPECT_EQ(y, expected);
}

// T comes from the data, not from eps: float data with a double (or integer) eps compiles and
// computes in float, eps converted to float first, so 1e-5 gives the result of 1e-5f bit for bit.
TEST(LayerNormEps, AnyArithmeticEpsIsConvertedToTheInputsType) {
  std::srand(7);
  const Index T_ = 4, C = 32;
  const RowMatrix<float> x = RowMatrix<float>::Random(T_, C);
  const RowVector<float> w = RowVector<float>::Random(C), b = RowVector<float>::Random(C);
  RowMatrix<float> with_float(T_, C), with_double(T_, C), with_int(T_, C), explicit_t(T_, C);
  gpt2::layer_norm(x, w, b, 1e-5f, with_float);
  gpt2::layer_norm(x, w, b, 1e-5, with_double);  // a double literal: T is still float
  EXPECT_EQ(with_double, with_float);
  gpt2::layer_norm<float>(x, w, b, 1e-5, explicit_t);  // T given: the same
  EXPECT_EQ(explicit_t, with_float);
  gpt2::layer_norm(x, w, b, 1, with_int);  // any arithmetic type
  EXPECT_TRUE(with_int.allFinite());
  EXPECT_NE(with_int, with_float);
  // double data with a float eps: computed in double.
  const RowMatrix<double> xd = x.cast<double>();
  RowMatrix<double> yd(T_, C);
  gpt2::layer_norm(xd, RowVector<double>(w.cast<double>()), RowVector<double>(b.cast<double>()), 1e-5f, yd);
  EXPECT_TRUE(gpt2::test::near(yd, with_float.cast<double>().eval(), 1e-5, 1e-5));
}

TEST(LayerNormErrors, ShapesAreNamed) {
  const RowMatrix<float> x = RowMatrix<float>::Zero(2, 8);
  const RowVector<float> w = RowVector<float>::Zero(7), b = RowVector<float>::Zero(8);
  RowMatrix<float> y(2, 8);
  EXPECT_EQ(gpt2::test::error_of<gpt2::ShapeError>(
                [&] { gpt2::layer_norm<float>(x, gpt2::view(w), gpt2::view(b), 1e-5f, y); }),
            "ln.weight: expected shape [8], got [7]");
  // A matrix that is not a vector is named with its two dimensions.
  const RowMatrix<float> two_rows = RowMatrix<float>::Zero(2, 8);
  EXPECT_EQ(gpt2::test::error_of<gpt2::ShapeError>(
                [&] { gpt2::layer_norm<float>(x, gpt2::view(b), two_rows, 1e-5f, y); }),
            "ln.bias: expected shape [8], got [2, 8]");
}

}  // namespace
