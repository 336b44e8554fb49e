// bfloat16 weights (kernels/layout.hpp, pack.hpp, the bf16 products of every level):
// - round_to_bf16 against the definition (nearest, ties to even, NaN kept, the range of float32);
// - the bf16 panel layout, element by element, with zeros in its padding;
// - each level's product over many shapes (tails of the vector, tile, panel, block and depth
//   sizes, one row, odd K): the widening levels (avx2, avx512) bit for bit against a scalar chain
//   of fused multiply-adds on the widened weight, avx512_bf16 bit for bit against the documented
//   VDPBF16PS order, amx against a double reference within float32 accumulation error, generic
//   within the same bound; a row alone == the same row inside a larger product (bitwise) at every
//   vector level (generic: within rounding, its one-row product is Eigen's GEMV); sentinels around C stay untouched.
// The test runs each level that the machine has; the others are skipped with "skipped: the CPU has
// no ...".
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/gemm.hpp"
#include "gpt2/kernels/dispatch.hpp"
#include "gpt2/kernels/pack.hpp"
#include "support/compare.hpp"

namespace {

using gpt2::Index;
using gpt2::Isa;
using gpt2::PackedMatrix;
using gpt2::WeightDtype;
using gpt2::kernels::bf16_to_float;
using gpt2::kernels::round_to_bf16;

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

TEST(Bf16Rounding, NearestTiesToEven) {
  EXPECT_EQ(round_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(round_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(round_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(round_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(round_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // just above the tie
  EXPECT_EQ(round_to_bf16(from_bits(0x3f807fffu)), 0x3f80);  // just below
  EXPECT_EQ(round_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(round_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(round_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_EQ(round_to_bf16(from_bits(0x00010000u)), 0x0001);             // a subnormal stays
  const std::uint16_t nan = round_to_bf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(bf16_to_float(nan)));
  const std::uint16_t low_nan = round_to_bf16(from_bits(0x7f800001u));  // payload only in the low bits
  EXPECT_TRUE(std::isnan(bf16_to_float(low_nan))) << std::hex << low_nan;
  EXPECT_TRUE(std::isnan(bf16_to_float(round_to_bf16(from_bits(0xffffffffu)))));
}

TEST(Bf16Rounding, WideningIsExactAndRoundingIsNearest) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(bits(rng));
    if (!std::isfinite(x)) continue;
    const std::uint16_t b = round_to_bf16(x);
    const float r = bf16_to_float(b);
    if (std::isinf(r)) continue;  // past the largest bf16
    // The neighbours of r: no bf16 is closer to x than r (ties to the even one).
    const float up = bf16_to_float(static_cast<std::uint16_t>(b + 1));
    const float down = bf16_to_float(static_cast<std::uint16_t>(b - 1));
    const double d = std::fabs(double(x) - double(r));
    if (std::isfinite(up)) {
      ASSERT_LE(d, std::fabs(double(x) - double(up))) << x;
    }
    if (std::isfinite(down) && (b & 0x7fff) != 0) {
      ASSERT_LE(d, std::fabs(double(x) - double(down))) << x;
    }
    if (d == std::fabs(double(x) - double(up)) || d == std::fabs(double(x) - double(down))) {
      ASSERT_EQ(b & 1u, 0u) << "a tie must go to the even bf16: " << x;
    }
    ASSERT_EQ(round_to_bf16(r), b);  // bf16 values round to themselves
  }
}

// B [K, N] with values of several magnitudes (and exact bf16 values every third).
gpt2::RowMatrix<float> random_matrix(Index rows, Index cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  gpt2::RowMatrix<float> m(rows, cols);
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j) {
      const float x = u(rng) * (j % 5 == 0 ? 8.0f : 1.0f);
      m(i, j) = (i + j) % 3 == 0 ? bf16_to_float(round_to_bf16(x)) : x;
    }
  return m;
}

TEST(Bf16Packing, LayoutPaddingAndBytes) {
  for (const Index K : {1, 2, 31, 32, 33, 64, 100}) {
    for (const Index N : {1, 16, 31, 32, 33, 70}) {
      const gpt2::RowMatrix<float> B = random_matrix(K, N, static_cast<unsigned>(K * 100 + N));
      const PackedMatrix p(B, WeightDtype::bf16);
      ASSERT_EQ(p.dtype(), WeightDtype::bf16);
      ASSERT_EQ(p.rows(), K);
      ASSERT_EQ(p.cols(), N);
      const Index Kp = (K + 31) / 32 * 32, panels = (N + 31) / 32;
      ASSERT_EQ(p.depth(), Kp);
      ASSERT_EQ(p.bytes(), panels * Kp * 32 * 2);
      const std::uint16_t* d = p.bf16_panels_from(0);
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(d) % 64, 0u);
      for (Index k = 0; k < Kp; ++k)
        for (Index j = 0; j < panels * 32; ++j) {
          // (k, j) at panel j / 32, pair row k / 2, lane 2 (j % 32) + k % 2
          const std::uint16_t got = d[(j / 32) * Kp * 32 + (k / 2) * 64 + (j % 32) * 2 + k % 2];
          const std::uint16_t want = k < K && j < N ? round_to_bf16(B(k, j)) : std::uint16_t(0);
          ASSERT_EQ(got, want) << "K " << K << " N " << N << " at (" << k << ", " << j << ")";
        }
      if (N > 32) {
        EXPECT_EQ(p.bf16_panels_from(32), d + Kp * 32);
      }
      EXPECT_THROW(p.bf16_panels_from(16), gpt2::ShapeError);
      EXPECT_THROW(p.panels_from(0), gpt2::ShapeError);
    }
  }
  const PackedMatrix f(random_matrix(4, 4, 1), WeightDtype::float32);
  EXPECT_EQ(f.dtype(), WeightDtype::float32);
  EXPECT_THROW(f.bf16_panels_from(0), gpt2::ShapeError);
}

// ---- The products --------------------------------------------------------------------------

class Bf16Gemm : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!gpt2::isa_supported(GetParam()))
      GTEST_SKIP() << "skipped: the CPU has no " << gpt2::isa_missing(GetParam());
    gpt2::set_isa(GetParam());
  }
  void TearDown() override { gpt2::reset_isa(); }
};

constexpr float kSentinel = -777.25f;

// C [M, N] (inside a wider, sentinel-filled buffer of row stride N + 7) += A B_bf16 through
// gemm_accumulate_columns (the library's entry point) at the active level.
struct Product {
  std::vector<float> store;
  Index ldc;
  Index M, N;
  float at(Index i, Index j) const { return store[static_cast<std::size_t>(i * ldc + j)]; }
};

Product run_product(const gpt2::RowMatrix<float>& A, const gpt2::RowMatrix<float>& B,
                    const PackedMatrix& packed, const gpt2::RowMatrix<float>& C0) {
  Product p;
  p.M = A.rows();
  p.N = B.cols();
  p.ldc = p.N + 7;
  p.store.assign(static_cast<std::size_t>((p.M + 1) * p.ldc), kSentinel);
  for (Index i = 0; i < p.M; ++i)
    for (Index j = 0; j < p.N; ++j) p.store[static_cast<std::size_t>(i * p.ldc + j)] = C0(i, j);
  Eigen::Map<gpt2::RowMatrix<float>, 0, Eigen::OuterStride<>> c(p.store.data(), p.M, p.N,
                                                               Eigen::OuterStride<>(p.ldc));
  gpt2::GemmScratch<float> scratch;
  gpt2::gemm_accumulate_columns<float>(A, B, &packed, 0, p.N, c, scratch);
  return p;
}

// The widening levels' arithmetic: one fused multiply-add chain per element, k in order, from C0,
// on the widened weight.
float widened_chain(const gpt2::RowMatrix<float>& A, const gpt2::RowMatrix<float>& B,
                    const gpt2::RowMatrix<float>& C0, Index i, Index j) {
  float c = C0(i, j);
  for (Index k = 0; k < A.cols(); ++k)
    c = std::fma(A(i, k), bf16_to_float(round_to_bf16(B(k, j))), c);
  return c;
}

// A bf16 value as the bf16 instructions read it (subnormals as zero).
float daz(std::uint16_t b) { return (b & 0x7f80u) == 0 ? (b & 0x8000u ? -0.0f : 0.0f) : bf16_to_float(b); }

// VDPBF16PS, per the instruction's definition: for each pair, c += a[2p+1] b[2p+1], then
// c += a[2p] b[2p] (each product exact in float32, each sum rounded to nearest).
float dot_pairs(const gpt2::RowMatrix<float>& A, const gpt2::RowMatrix<float>& B,
                const gpt2::RowMatrix<float>& C0, Index i, Index j) {
  float c = C0(i, j);
  const Index K = A.cols();
  for (Index k = 0; k < K; k += 2) {
    if (k + 1 < K)
      c = std::fma(daz(round_to_bf16(A(i, k + 1))), daz(round_to_bf16(B(k + 1, j))), c);
    c = std::fma(daz(round_to_bf16(A(i, k))), daz(round_to_bf16(B(k, j))), c);
  }
  return c;
}

// Exact (double) C0 + A' B' with A' = A (widening) or bf16(A) (bf16 instructions), and the bound
// of float32 accumulation: K * 2^-23 * (|C0| + sum |a' b'|).
struct Reference {
  double value, bound;
};
Reference exact(const gpt2::RowMatrix<float>& A, const gpt2::RowMatrix<float>& B,
                const gpt2::RowMatrix<float>& C0, Index i, Index j, bool round_a) {
  double s = C0(i, j), mag = std::fabs(C0(i, j));
  for (Index k = 0; k < A.cols(); ++k) {
    const double a = round_a ? bf16_to_float(round_to_bf16(A(i, k))) : A(i, k);
    const double b = bf16_to_float(round_to_bf16(B(k, j)));
    s += a * b;
    mag += std::fabs(a * b);
  }
  return {s, (static_cast<double>(A.cols()) + 2) * 0x1p-23 * mag + 1e-30};
}

TEST_P(Bf16Gemm, EveryShapeAgainstItsArithmetic) {
  const Isa isa = GetParam();
  const bool widening = isa == Isa::avx2 || isa == Isa::avx512;
  const bool round_a = isa == Isa::avx512_bf16 || isa == Isa::amx;
  for (const Index K : {1, 2, 7, 32, 33, 64, 95, 768, 1100, 2100}) {
    for (const Index N : {1, 16, 33, 64, 96, 290}) {
      for (const Index M : {1, 3, 12, 13, 31, 33, 50}) {
        if (K * N * M > 4'000'000) continue;
        const unsigned seed = static_cast<unsigned>(K * 7919 + N * 104729 + M);
        const gpt2::RowMatrix<float> A = random_matrix(M, K, seed);
        const gpt2::RowMatrix<float> B = random_matrix(K, N, seed + 1);
        const gpt2::RowMatrix<float> C0 = random_matrix(M, N, seed + 2);
        const PackedMatrix packed(B, WeightDtype::bf16);
        const Product got = run_product(A, B, packed, C0);
        SCOPED_TRACE("M " + std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K));
        for (Index i = 0; i < M; ++i) {
          for (Index j = 0; j < N; ++j) {
            const float c = got.at(i, j);
            if (widening) {
              ASSERT_EQ(c, widened_chain(A, B, C0, i, j)) << "at (" << i << ", " << j << ")";
            } else if (isa == Isa::avx512_bf16) {
              ASSERT_EQ(c, dot_pairs(A, B, C0, i, j)) << "at (" << i << ", " << j << ")";

            } else {
              const Reference r = exact(A, B, C0, i, j, round_a);
              ASSERT_LE(std::fabs(c - r.value), r.bound) << "at (" << i << ", " << j << ")";
            }
          }
          for (Index j = N; j < got.ldc; ++j) ASSERT_EQ(got.at(i, j), kSentinel) << "past row " << i;
        }
        for (Index j = 0; j < got.ldc; ++j) ASSERT_EQ(got.at(M, j), kSentinel) << "past the last row";
      }
    }
  }
}

TEST_P(Bf16Gemm, ARowAloneHasTheBitsItHasInsideAProduct) {
  const Index K = 768, N = 2304;
  const gpt2::RowMatrix<float> A = random_matrix(37, K, 11);
  const gpt2::RowMatrix<float> B = random_matrix(K, N, 12);
  const gpt2::RowMatrix<float> C0 = random_matrix(37, N, 13);
  const PackedMatrix packed(B, WeightDtype::bf16);
  const Product all = run_product(A, B, packed, C0);
  for (const Index i : {0, 1, 16, 31, 32, 36}) {
    const Product one = run_product(A.middleRows(i, 1), B, packed, C0.middleRows(i, 1));
    for (Index j = 0; j < N; ++j) {
      if (GetParam() == Isa::generic)  // Eigen's GEMV for one row, its GEMM for more: rounding apart
        ASSERT_LE(std::fabs(one.at(0, j) - all.at(i, j)), 2 * exact(A, B, C0, i, j, false).bound);
      else
        ASSERT_EQ(one.at(0, j), all.at(i, j)) << "row " << i << " column " << j;
    }
  }
  // Columns from a later panel (a thread's part): the same bits.
  Product part;
  part.M = 37;
  part.N = 384;
  part.ldc = 384;
  part.store.assign(37 * 384, 0.0f);
  Eigen::Map<gpt2::RowMatrix<float>> c(part.store.data(), 37, 384);
  c = C0.middleCols(576, 384);
  gpt2::GemmScratch<float> scratch;
  gpt2::gemm_accumulate_columns<float>(A, B, &packed, 576, 384, c, scratch);
  for (Index i = 0; i < 37; ++i)
    for (Index j = 0; j < 384; ++j) ASSERT_EQ(c(i, j), all.at(i, 576 + j)) << i << ", " << j;
}

// projection_columns (C = bias + A B, the bias inside the bf16 kernels): the bits of writing the
// bias into C and accumulating, C never read (it starts as NaN here), for any column part.
TEST_P(Bf16Gemm, TheBiasInTheKernelGivesTheBitsOfBiasThenAccumulate) {
  for (const Index M : {1, 7, 40}) {
    const Index K = 200, N = 416;
    const gpt2::RowMatrix<float> A = random_matrix(M, K, 41);
    const gpt2::RowMatrix<float> B = random_matrix(K, N, 42);
    const gpt2::RowMatrix<float> bias_row = random_matrix(1, N, 43);
    const gpt2::RowVector<float> bias = bias_row.row(0);
    const PackedMatrix packed(B, WeightDtype::bf16);
    gpt2::GemmScratch<float> scratch;
    gpt2::RowMatrix<float> want(M, N);
    want.rowwise() = bias;
    gpt2::gemm_accumulate_columns<float>(A, B, &packed, 0, N, want, scratch);
    for (const Index j0 : {Index{0}, Index{32}, Index{192}}) {
      const Index n = N - j0 - (j0 == 32 ? 40 : 0);
      gpt2::RowMatrix<float> got =
          gpt2::RowMatrix<float>::Constant(M, n, std::numeric_limits<float>::quiet_NaN());
      gpt2::projection_columns<float>(A, B, &packed, gpt2::view(bias), j0, n, got, scratch);
      for (Index i = 0; i < M; ++i)
        for (Index j = 0; j < n; ++j) {
          if (GetParam() == Isa::generic)  // Eigen orders a panel's sums by its column count
            ASSERT_NEAR(got(i, j), want(i, j0 + j), 1e-4 * (1 + std::fabs(want(i, j0 + j))));
          else
            ASSERT_EQ(got(i, j), want(i, j0 + j)) << "M " << M << " j0 " << j0 << " at (" << i << ", " << j << ")";
        }
    }
  }
}

TEST_P(Bf16Gemm, NanAndInfinityStayInTheirRows) {
  const Index K = 64, N = 48;
  gpt2::RowMatrix<float> A = random_matrix(20, K, 21);
  A(3, 5) = std::numeric_limits<float>::quiet_NaN();
  A(7, 9) = std::numeric_limits<float>::infinity();
  const gpt2::RowMatrix<float> B = random_matrix(K, N, 22);
  const gpt2::RowMatrix<float> C0 = gpt2::RowMatrix<float>::Zero(20, N);
  const Product got = run_product(A, B, PackedMatrix(B, WeightDtype::bf16), C0);
  for (Index i = 0; i < 20; ++i)
    for (Index j = 0; j < N; ++j) {
      if (i == 3 || i == 7)
        ASSERT_FALSE(std::isfinite(got.at(i, j))) << i << ", " << j;
      else
        ASSERT_TRUE(std::isfinite(got.at(i, j))) << i << ", " << j;
    }
}

INSTANTIATE_TEST_SUITE_P(Levels, Bf16Gemm,
                         ::testing::Values(Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512_bf16,
                                           Isa::amx),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(gpt2::isa_name(info.param));
                         });

// ---- The sublayer with bf16 weights ----------------------------------------------------------

namespace forward {

using gpt2::RowMatrix;

struct Model {
  RowMatrix<float> c_attn_w, c_proj_w;
  gpt2::RowVector<float> c_attn_b, c_proj_b;
  gpt2::AttentionConfig config{768, 12};
  Model() {
    c_attn_w = random_matrix(768, 3 * 768, 31) * 0.05f;
    c_proj_w = random_matrix(768, 768, 32) * 0.05f;
    c_attn_b = random_matrix(1, 3 * 768, 33).row(0) * 0.1f;
    c_proj_b = random_matrix(1, 768, 34).row(0) * 0.1f;
  }
  gpt2::AttentionWeights<float> weights() const {
    return {config, gpt2::view(c_attn_w), gpt2::view(c_attn_b), gpt2::view(c_proj_w), gpt2::view(c_proj_b)};
  }
};

class Bf16Forward : public Bf16Gemm {};

// Through a KVCache in chunks of 16 rows or more (prefill-sized: the AMX core at amx, the float32
// core elsewhere) a sequence gets bitwise the rows of one forward, at every vector level; chunks
// of single rows (decode steps) too, except at amx, where they run the float32 core (within 5e-4
// of the AMX core's rows) and at generic (Eigen's one-row products: within rounding).
TEST_P(Bf16Forward, ChunksGiveTheRowsOfOneForward) {
  const Model m;
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(m.weights(), WeightDtype::bf16);
  const Index T = 200;
  const RowMatrix<float> x = random_matrix(T, 768, 35);
  RowMatrix<float> whole(T, 768);
  gpt2::Workspace<float> ws(w.config(), T);
  gpt2::attention_forward<float>(w, x, ws, whole);
  ASSERT_TRUE(whole.allFinite());
  for (const std::vector<Index>& chunks : std::vector<std::vector<Index>>{{100, 100}, {17, 64, 119}, {150}}) {
    gpt2::KVCache<float> cache(w.config(), T);
    RowMatrix<float> out(T, 768);
    Index pos = 0;
    for (const Index n : chunks) {
      if (n == 150) {  // then 50 single-row steps
        gpt2::attention_forward<float>(w, x.topRows(n), cache, ws, out.topRows(n));
        for (pos = n; pos < T; ++pos)
          gpt2::attention_forward<float>(w, x.middleRows(pos, 1), cache, ws, out.middleRows(pos, 1));
        break;
      }
      gpt2::attention_forward<float>(w, x.middleRows(pos, n), cache, ws, out.middleRows(pos, n));
      pos += n;
    }
    const bool single_rows = chunks.size() == 1;
    const double err = gpt2::test::max_diff(out, whole).relative();
    if (GetParam() == Isa::generic) {
      EXPECT_LE(err, 1e-5);
    } else if (GetParam() == Isa::amx && single_rows) {
      EXPECT_LE(err, 5e-4);
      EXPECT_TRUE(out.topRows(150) == whole.topRows(150)) << "the prefill rows (one AMX tile each way)";
    } else {
      EXPECT_TRUE(out == whole) << "max relative difference " << err;
    }
  }
}

// A NaN in one input row stays in that row's output (rows after it attend to its key: NaN there
// too, as in float32); rows before it stay finite.
TEST_P(Bf16Forward, ANanStaysInItsRowAndTheRowsAfterIt) {
  const Model m;
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(m.weights(), WeightDtype::bf16);
  const Index T = 80;
  RowMatrix<float> x = random_matrix(T, 768, 36);
  x(50, 7) = std::numeric_limits<float>::quiet_NaN();
  RowMatrix<float> out(T, 768);
  gpt2::Workspace<float> ws(w.config(), T);
  gpt2::attention_forward<float>(w, x, ws, out);
  EXPECT_TRUE(out.topRows(50).allFinite());
  for (Index t = 50; t < T; ++t) EXPECT_TRUE(out.row(t).array().isNaN().any()) << "row " << t;
}

// The AMX attention core at head sizes 32, 64, 96 and 128 (and the float32 core at 48, which the
// AMX core does not take) against the float32 core on the same projections: the same level, the
// same input fed through a KVCache in chunks of 7 rows, which run the float32 core (tiles of fewer
// than 16 rows), with the projections' bits unchanged (a row's product does not depend on the
// rows with it). Within 2e-3 (up to 6.6e-4 where the AMX core runs, on emulated tiles), for
// lengths around the tile and block sizes. (The reference used to be the avx512_bf16 level, whose
// core has run its earlier key blocks in bf16 since c865492: up to 3.7e-2 away at T = 300. The
// emulated tiles of tests/support/amx_emulation.hpp showed it: this test had not run since.)
class Bf16AmxCore : public Bf16Gemm {};  // runs at amx only (its ctest entry: test_bf16@amx)

TEST_P(Bf16AmxCore, HeadSizesAgainstTheFloat32Core) {
  for (const auto& [C, n_head] : std::vector<std::pair<Index, Index>>{{256, 8}, {256, 4}, {384, 4}, {256, 2}, {192, 4}}) {
    const gpt2::AttentionConfig config{C, n_head};
    const RowMatrix<float> c_attn_w = random_matrix(C, 3 * C, 51) * 0.1f, c_proj_w = random_matrix(C, C, 52) * 0.1f;
    const gpt2::RowVector<float> c_attn_b = random_matrix(1, 3 * C, 53).row(0) * 0.1f;
    const gpt2::RowVector<float> c_proj_b = random_matrix(1, C, 54).row(0) * 0.1f;
    const gpt2::AttentionWeights<float> views(config, gpt2::view(c_attn_w), gpt2::view(c_attn_b),
                                              gpt2::view(c_proj_w), gpt2::view(c_proj_b));
    const gpt2::AttentionWeights<float> w = gpt2::pack_weights(views, WeightDtype::bf16);
    for (const Index T : {Index{16}, Index{63}, Index{65}, Index{300}}) {
      SCOPED_TRACE("C " + std::to_string(C) + " n_head " + std::to_string(n_head) + " T " + std::to_string(T));
      const RowMatrix<float> x = random_matrix(T, C, static_cast<unsigned>(55 + T));
      RowMatrix<float> amx(T, C), ref(T, C);
      gpt2::Workspace<float> ws(config, T);
      gpt2::attention_forward<float>(w, x, ws, amx);
      gpt2::KVCache<float> cache(config, T);
      for (Index pos = 0; pos < T; pos += 7) {
        const Index n = std::min<Index>(7, T - pos);
        gpt2::attention_forward<float>(w, x.middleRows(pos, n), cache, ws, ref.middleRows(pos, n));
      }
      ASSERT_TRUE(amx.allFinite());
      const double err = gpt2::test::max_diff(amx, ref).relative();
      EXPECT_LE(err, 2e-3);
      if (C / n_head % 32 != 0) {
        EXPECT_TRUE(amx == ref) << "head size " << C / n_head << ": the float32 core both ways";
      } else {
        EXPECT_GT(err, 0) << "the AMX core's rows equal the float32 core's: it did not run";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, Bf16AmxCore, ::testing::Values(Isa::amx),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(gpt2::isa_name(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(Levels, Bf16Forward,
                         ::testing::Values(Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512_bf16,
                                           Isa::amx),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(gpt2::isa_name(info.param));
                         });

}  // namespace forward

}  // namespace
