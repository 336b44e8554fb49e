// Assertion helpers for comparing matrices: report the largest difference, where it is, and the
// scale it is measured against, so a failing test says what is wrong.
#pragma once

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <limits>
#include <sstream>

namespace gpt2::test {

// The scalar types every typed test suite runs with: TYPED_TEST_SUITE(X, gpt2::test::Scalars).
using Scalars = ::testing::Types<float, double>;

// Largest |actual - expected| and its position; NaN anywhere counts as an infinite difference.
struct MaxDiff {
  double value = 0;
  Eigen::Index row = -1, col = -1;
  double expected_max_abs = 0;
  double relative() const { return expected_max_abs > 0 ? value / expected_max_abs : value; }
};

template <class A, class B>
MaxDiff max_diff(const Eigen::MatrixBase<A>& actual, const Eigen::MatrixBase<B>& expected) {
  MaxDiff d;
  for (Eigen::Index r = 0; r < expected.rows(); ++r)
    for (Eigen::Index c = 0; c < expected.cols(); ++c) {
      const double e = static_cast<double>(expected(r, c));
      const double a = static_cast<double>(actual(r, c));
      d.expected_max_abs = std::max(d.expected_max_abs, std::abs(e));
      double diff = std::abs(a - e);
      if (std::isnan(diff)) diff = std::numeric_limits<double>::infinity();
      if (diff > d.value || d.row < 0) d = MaxDiff{diff, r, c, d.expected_max_abs};
    }
  return d;
}

// Passes when max|actual - expected| <= rel_tol * max|expected| + abs_floor (shapes must match).
template <class A, class B>
::testing::AssertionResult near(const Eigen::MatrixBase<A>& actual,
                                const Eigen::MatrixBase<B>& expected, double rel_tol,
                                double abs_floor = 0) {
  if (actual.rows() != expected.rows() || actual.cols() != expected.cols())
    return ::testing::AssertionFailure()
           << "shape mismatch: actual [" << actual.rows() << ", " << actual.cols()
           << "], expected [" << expected.rows() << ", " << expected.cols() << "]";
  const MaxDiff d = max_diff(actual, expected);
  const double bound = rel_tol * d.expected_max_abs + abs_floor;
  std::ostringstream msg;
  msg << "max |diff| = " << d.value << " at (" << d.row << ", " << d.col << ") [actual "
      << (d.row >= 0 ? static_cast<double>(actual(d.row, d.col)) : 0.0) << ", expected "
      << (d.row >= 0 ? static_cast<double>(expected(d.row, d.col)) : 0.0)
      << "], relative to max |expected| = " << d.expected_max_abs << ": " << d.relative()
      << " (bound " << bound << ")";
  if (d.value <= bound) return ::testing::AssertionSuccess() << msg.str();
  return ::testing::AssertionFailure() << msg.str();
}

// Per-type tolerance for comparisons against a simple double-precision reference computed in the
// test: relative to the largest expected value, plus an absolute floor.
template <class T>
struct Tolerance;
template <>
struct Tolerance<float> {
  static constexpr double rel = 2e-5;
  static constexpr double abs = 1e-6;
};
template <>
struct Tolerance<double> {
  static constexpr double rel = 1e-12;
  static constexpr double abs = 1e-14;
};

}  // namespace gpt2::test
