// gemm_accumulate (gemm.hpp): C += alpha * A * op(B) on strided views, both ops, accumulation,
// scratch growth and reuse, and its errors; the vector levels' summation orders, bit for bit, at
// every level this machine has (gemm_accumulate runs the active level: set_isa picks it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpt2/gemm.hpp"
#include "gpt2/kernels/dispatch.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;

template <class T>
class GemmTest : public ::testing::Test {};
TYPED_TEST_SUITE(GemmTest, gpt2::test::Scalars);

// Plain triple loop in double.
template <class A, class B>
RowMatrix<double> product(const A& a, const B& b, bool transpose_b) {
  const Index M = a.rows(), K = a.cols(), N = transpose_b ? b.rows() : b.cols();
  RowMatrix<double> c = RowMatrix<double>::Zero(M, N);
  for (Index i = 0; i < M; ++i)
    for (Index j = 0; j < N; ++j)
      for (Index k = 0; k < K; ++k)
        c(i, j) += double(a(i, k)) * double(transpose_b ? b(j, k) : b(k, j));
  return c;
}

TYPED_TEST(GemmTest, BothOpsOnStridedViewsAccumulate) {
  using T = TypeParam;
  std::srand(3);
  // Views into wider matrices: outer stride != cols (as for head slices of qkv).
  const RowMatrix<T> a_store = RowMatrix<T>::Random(70, 90), b_store = RowMatrix<T>::Random(80, 100);
  RowMatrix<T> c_store = RowMatrix<T>::Random(75, 120);
  const RowMatrix<T> c_before = c_store;
  gpt2::GemmScratch<T> scratch;

  // C[67, 53] += 0.5 * A[67, 37] * B[37, 53]
  gpt2::gemm_accumulate<T>(T(0.5), a_store.block(1, 2, 67, 37), b_store.block(3, 4, 37, 53),
                           gpt2::Op::None, c_store.block(2, 5, 67, 53), scratch);
  RowMatrix<double> expected = c_before.block(2, 5, 67, 53).template cast<double>() +
                               0.5 * product(a_store.block(1, 2, 67, 37), b_store.block(3, 4, 37, 53), false);
  EXPECT_TRUE(gpt2::test::near(c_store.block(2, 5, 67, 53), expected, gpt2::test::Tolerance<T>::rel,
                               gpt2::test::Tolerance<T>::abs));
  EXPECT_TRUE(c_store.leftCols(5) == c_before.leftCols(5)) << "columns outside C are untouched";

  // C[67, 61] += A[67, 37] * B[61, 37]^T
  c_store = c_before;
  gpt2::gemm_accumulate<T>(T(1), a_store.block(1, 2, 67, 37), b_store.block(0, 10, 61, 37),
                           gpt2::Op::Transpose, c_store.block(0, 0, 67, 61), scratch);
  expected = c_before.block(0, 0, 67, 61).template cast<double>() +
             product(a_store.block(1, 2, 67, 37), b_store.block(0, 10, 61, 37), true);
  EXPECT_TRUE(gpt2::test::near(c_store.block(0, 0, 67, 61), expected, gpt2::test::Tolerance<T>::rel,
                               gpt2::test::Tolerance<T>::abs));
}

// One row (a decode step) takes Eigen's GEMV instead of the GEMM driver: same contract.
TYPED_TEST(GemmTest, OneRowProductsOnStridedViewsAccumulate) {
  using T = TypeParam;
  std::srand(4);
  const RowMatrix<T> a_store = RowMatrix<T>::Random(5, 90), b_store = RowMatrix<T>::Random(80, 100);
  RowMatrix<T> c_store = RowMatrix<T>::Random(6, 120);
  const RowMatrix<T> c_before = c_store;
  gpt2::GemmScratch<T> scratch;

  // C[1, 53] (a row inside a wider matrix) += -0.75 * A[1, 37] * B[37, 53]
  gpt2::gemm_accumulate<T>(T(-0.75), a_store.block(2, 3, 1, 37), b_store.block(3, 4, 37, 53),
                           gpt2::Op::None, c_store.block(4, 5, 1, 53), scratch);
  RowMatrix<double> expected = c_before.block(4, 5, 1, 53).template cast<double>() -
                               0.75 * product(a_store.block(2, 3, 1, 37), b_store.block(3, 4, 37, 53), false);
  EXPECT_TRUE(gpt2::test::near(c_store.block(4, 5, 1, 53), expected, gpt2::test::Tolerance<T>::rel,
                               gpt2::test::Tolerance<T>::abs));
  // C[1, 61] += 2 * A[1, 37] * B[61, 37]^T
  gpt2::gemm_accumulate<T>(T(2), a_store.block(0, 1, 1, 37), b_store.block(5, 10, 61, 37),
                           gpt2::Op::Transpose, c_store.block(1, 0, 1, 61), scratch);
  expected = c_before.block(1, 0, 1, 61).template cast<double>() +
             2 * product(a_store.block(0, 1, 1, 37), b_store.block(5, 10, 61, 37), true);
  EXPECT_TRUE(gpt2::test::near(c_store.block(1, 0, 1, 61), expected, gpt2::test::Tolerance<T>::rel,
                               gpt2::test::Tolerance<T>::abs));
  // everything else untouched
  EXPECT_TRUE(c_store.row(0) == c_before.row(0));
  EXPECT_TRUE(c_store.row(4).head(5) == c_before.row(4).head(5));
  EXPECT_TRUE(c_store.row(4).tail(62) == c_before.row(4).tail(62));
  EXPECT_FALSE(scratch.fits(1, 1, 1)) << "the one-row path needs no packing buffers";
}

TYPED_TEST(GemmTest, ScratchGrowsOnlyWhenNeeded) {
  using T = TypeParam;
  gpt2::GemmScratch<T> scratch(64, 64, 64);
  EXPECT_TRUE(scratch.fits(64, 64, 64));
  EXPECT_TRUE(scratch.fits(1, 10, 64));
  EXPECT_FALSE(scratch.fits(65, 64, 64));
  // Op::Transpose: always Eigen's GEMM, whose packing buffers live in the scratch (the AVX-512
  // float kernel of Op::None needs none).
  const RowMatrix<T> a = RowMatrix<T>::Ones(100, 20), b = RowMatrix<T>::Ones(30, 20);
  RowMatrix<T> c = RowMatrix<T>::Zero(100, 30);
  gpt2::gemm_accumulate<T>(T(1), a, b, gpt2::Op::Transpose, c, scratch);  // grows M to 100
  EXPECT_TRUE(scratch.fits(100, 64, 64));
  EXPECT_TRUE((c.array() == T(20)).all());
}

TYPED_TEST(GemmTest, EmptyProductsAreNoOps) {
  using T = TypeParam;
  gpt2::GemmScratch<T> scratch;
  const RowMatrix<T> a(3, 0), b(0, 4);
  RowMatrix<T> c = RowMatrix<T>::Constant(3, 4, T(2));
  gpt2::gemm_accumulate<T>(T(1), a, b, gpt2::Op::None, c, scratch);
  EXPECT_TRUE((c.array() == T(2)).all());
}

TEST(GemmErrors, ShapesAndAliasing) {
  gpt2::GemmScratch<float> scratch;
  RowMatrix<float> a = RowMatrix<float>::Zero(3, 4), b = RowMatrix<float>::Zero(5, 6), c(3, 6);
  EXPECT_EQ(gpt2::test::error_of<gpt2::ShapeError>([&] {
              gpt2::gemm_accumulate<float>(1.f, a, b, gpt2::Op::None, c, scratch);
            }),
            "gemm: expected [M, K] x [K, N] -> [M, N], got A [3, 4], op(B) [5, 6], C [3, 6]");
  RowMatrix<float> square = RowMatrix<float>::Zero(4, 4);
  EXPECT_EQ(gpt2::test::error_of<gpt2::ShapeError>([&] {
              gpt2::gemm_accumulate<float>(1.f, square, square, gpt2::Op::None, square, scratch);
            }),
            "gemm: the output C overlaps an input");
}

}  // namespace

// The vector levels' gemm (kernels/dispatch.hpp) computes every element as one chain of fused
// multiply-adds, k in order, from C's value: exactly this loop, bit for bit.
RowMatrix<float> fma_chain(const RowMatrix<float>& a, const RowMatrix<float>& b,
                           const RowMatrix<float>& c0) {
  RowMatrix<float> c = c0;
  for (Index i = 0; i < a.rows(); ++i)
    for (Index j = 0; j < b.cols(); ++j)
      for (Index k = 0; k < a.cols(); ++k) c(i, j) = std::fma(a(i, k), b(k, j), c(i, j));
  return c;
}

// The vector levels this machine has (each test below runs at every one of them, then restores the
// level); skipped with a message when it has none.
std::vector<gpt2::Isa> vector_levels() {
  std::vector<gpt2::Isa> levels;
  for (const gpt2::Isa isa : gpt2::available_isas())
    if (isa != gpt2::Isa::generic) levels.push_back(isa);
  return levels;
}

struct LevelGuard {
  ~LevelGuard() { gpt2::reset_isa(); }
};

TEST(GemmKernel, EveryElementIsOneFmaChainInKOrderOnStridedViews) {
  if (vector_levels().empty()) GTEST_SKIP() << "skipped: the CPU has no avx2 (Eigen's GEMM runs)";
  const LevelGuard guard;
  for (const gpt2::Isa isa : vector_levels()) {
  gpt2::set_isa(isa);
  SCOPED_TRACE(gpt2::isa_name(isa));
  std::srand(21);
  gpt2::GemmScratch<float> scratch;
  for (const Index M : {1, 2, 11, 12, 13, 47, 48, 49, 100})
    for (const Index N : {1, 15, 16, 17, 33, 64, 300})
      for (const Index K : {1, 5, 127, 128, 129, 300}) {
        SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
        // Views into bigger matrices: strided rows, and sentinels around C that must survive.
        RowMatrix<float> a_store = RowMatrix<float>::Random(M + 2, K + 5);
        RowMatrix<float> b_store = RowMatrix<float>::Random(K + 1, N + 7);
        RowMatrix<float> c_store = RowMatrix<float>::Random(M + 2, N + 9);
        const RowMatrix<float> a = a_store.block(1, 3, M, K), b = b_store.block(1, 2, K, N);
        const RowMatrix<float> c_before = c_store;
        gpt2::gemm_accumulate<float>(1.0f, a_store.block(1, 3, M, K), b_store.block(1, 2, K, N),
                                     gpt2::Op::None, c_store.block(1, 4, M, N), scratch);
        const RowMatrix<float> expected = fma_chain(a, b, c_before.block(1, 4, M, N));
        ASSERT_TRUE(c_store.block(1, 4, M, N) == expected);
        RowMatrix<float> outside = c_store;
        outside.block(1, 4, M, N) = c_before.block(1, 4, M, N);
        ASSERT_TRUE(outside == c_before) << "the kernel wrote outside C";
      }
  }
}

TEST(GemmKernel, ARowGivesTheSameBitsAloneAsAmongOthers) {
  const LevelGuard guard;
  for (const gpt2::Isa isa : gpt2::available_isas()) {
  gpt2::set_isa(isa);
  SCOPED_TRACE(gpt2::isa_name(isa));
  std::srand(22);
  gpt2::GemmScratch<float> scratch;
  const Index M = 30, N = 2304, K = 768;
  const RowMatrix<float> a = RowMatrix<float>::Random(M, K), b = RowMatrix<float>::Random(K, N);
  RowMatrix<float> together = RowMatrix<float>::Zero(M, N), alone = RowMatrix<float>::Zero(M, N);
  gpt2::gemm_accumulate<float>(1.0f, a, b, gpt2::Op::None, together, scratch);
  for (Index i = 0; i < M; ++i)
    gpt2::gemm_accumulate<float>(1.0f, a.row(i), b, gpt2::Op::None, alone.row(i), scratch);
  if (isa != gpt2::Isa::generic)
    EXPECT_TRUE(together == alone);
  else  // Eigen: GEMV for one row, GEMM for many; the sums are ordered differently
    EXPECT_TRUE(gpt2::test::near(alone, together, 1e-5, 1e-5));
  }
}

// row_times_transposed (q k^T for a decode step) computes c[j] = a . B[j, :] in a
// documented order, emulated here in scalars: lane l (0..15) sums a[d] * B[j, d] over
// d = l, l + 16, ... as a chain of fused multiply-adds from +0 (lanes past K's last chunk add
// 0 * 0), then the 16 lanes are added in groups of four, t_g = (x[4g] + x[4g+2]) + (x[4g+1] +
// x[4g+3]), and c[j] = (t_0 + t_1) + (t_2 + t_3).
float tree_dot(const float* a, const float* r, Index K) {
  float lane[16] = {};
  for (Index d0 = 0; d0 < K; d0 += 16)
    for (Index l = 0; l < 16; ++l) {
      const bool in = d0 + l < K;
      lane[l] = std::fma(in ? a[d0 + l] : 0.f, in ? r[d0 + l] : 0.f, lane[l]);
    }
  float t[4];
  for (int g = 0; g < 4; ++g)
    t[g] = (lane[4 * g] + lane[4 * g + 2]) + (lane[4 * g + 1] + lane[4 * g + 3]);
  return (t[0] + t[1]) + (t[2] + t[3]);
}

TEST(GemvKernel, RowTimesTransposedIsTheDocumentedSumOnStridedRows) {
  if (vector_levels().empty()) GTEST_SKIP() << "skipped: the CPU has no avx2 (Eigen's GEMM runs)";
  for (const gpt2::Isa isa : vector_levels()) {
  SCOPED_TRACE(gpt2::isa_name(isa));
  const gpt2::kernels::Kernels<float>& kern = gpt2::kernels::table<float>(isa);
  std::srand(23);
  for (const Index N : {1, 15, 16, 17, 33, 1023})
    for (const Index K : {1, 15, 16, 17, 63, 64, 65, 100}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " K=" + std::to_string(K));
      const RowMatrix<float> a = RowMatrix<float>::Random(1, K);
      const RowMatrix<float> b_store = RowMatrix<float>::Random(N + 1, K + 3);  // rows K + 3 apart
      RowMatrix<float> c_store = RowMatrix<float>::Random(1, N + 20);
      const RowMatrix<float> c_before = c_store;
      kern.row_times_transposed(N, K, a.data(), &b_store(1, 2), b_store.outerStride(),
                                &c_store(0, 3));
      for (Index j = 0; j < N; ++j) {
        const float expected = tree_dot(a.data(), &b_store(1 + j, 2), K);
        ASSERT_EQ(c_store(0, 3 + j), expected) << "j=" << j;
      }
      EXPECT_TRUE(c_store.leftCols(3) == c_before.leftCols(3)) << "the kernel wrote before c";
      EXPECT_TRUE(c_store.rightCols(17) == c_before.rightCols(17)) << "the kernel wrote past c";
      // And it is the dot product: within K float roundings of the double sum.
      const RowMatrix<double> exact = product(a, b_store.block(1, 2, N, K), true);
      EXPECT_TRUE(gpt2::test::near(c_store.block(0, 3, 1, N), exact, 1e-6 * K, 1e-6 * K));
    }
  }
}
