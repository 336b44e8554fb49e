// kernels/avx2.hpp and kernels/avx512.hpp: every kernel of each vector level (the test suite runs
// once per level; skipped with a message where the CPU lacks it) bit for bit against the scalar
// emulation of the documented orders (kernel_emulation.hpp) over many shapes (tails of every
// remainder of the vector, tile and block sizes, strided rows, sentinels around the outputs);
// gemm == gemm_packed == the row products for one row, and a row alone == the same row inside a
// larger product; kexp against double exp, kexp2 against double exp2; softmax_row against the
// emulation and a double reference; and the two levels against each other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpt2/kernels/avx2.hpp"
#include "gpt2/kernels/avx2_attention.hpp"
#include "gpt2/kernels/avx512.hpp"
#include "gpt2/kernels/avx512_attention.hpp"
#include "gpt2/kernels/dispatch.hpp"
#include "kernel_emulation.hpp"

namespace {

using gpt2::Index;
namespace emu = gpt2::test::emulation;

#if GPT2_KERNELS_HAVE_AVX2 && GPT2_KERNELS_HAVE_AVX512
using gpt2::Isa;
// The vector levels' primitives under test (the avx512_bf16 and amx levels run avx512's).
struct Table {
  void (*gemm)(Index, Index, Index, const float*, Index, const float*, Index, float*, Index, float*);
  void (*gemm_packed)(Index, Index, Index, const float*, Index, const float*, float*, Index);
  void (*row_times_matrix)(Index, Index, const float*, const float*, Index, float*);
  void (*row_times_packed)(Index, Index, const float*, const float*, float*);
  void (*row_times_transposed)(Index, Index, const float*, const float*, Index, float*);
  void (*softmax_row)(float*, Index, Index, float);
};
const Table& level_table(Isa isa) {
  namespace k2 = gpt2::kernels::avx2;
  namespace k5 = gpt2::kernels::avx512;
  static const Table avx2{k2::gemm, k2::gemm_packed, k2::row_times_matrix, k2::row_times_packed,
                          k2::row_times_transposed, k2::softmax_row};
  static const Table avx512{k5::gemm, k5::gemm_packed, k5::row_times_matrix, k5::row_times_packed,
                            k5::row_times_transposed, k5::softmax_row};
  return isa == Isa::avx2 ? avx2 : avx512;
}

// kexp of one float at a level.
GPT2_KERNEL_AVX512 float avx512_kexp(float x) {
  return _mm512_cvtss_f32(gpt2::kernels::avx512::kexp(_mm512_set1_ps(x)));
}
float level_kexp(Isa isa, float x) {
  return isa == Isa::avx512 ? avx512_kexp(x) : gpt2::kernels::avx2::kexp(x);
}

// kexp2 and kexpe (the fused core's 2^x and e^x = 2^(x log2 e), kernels/attention_tile.hpp) of
// one float at a level, and avx512's forms for arguments in [-inf, 0].
GPT2_KERNEL_AVX512 float avx512_kexp2(float x) {
  return _mm512_cvtss_f32(gpt2::kernels::avx512::kexp2(_mm512_set1_ps(x)));
}
GPT2_KERNEL_AVX512 float avx512_kexp2_nonpositive(float x) {
  return _mm512_cvtss_f32(gpt2::kernels::avx512::kexp2_nonpositive(_mm512_set1_ps(x)));
}
GPT2_KERNEL_AVX512 float avx512_kexpe(float x) {
  return _mm512_cvtss_f32(gpt2::kernels::avx512::kexpe(_mm512_set1_ps(x)));
}
GPT2_KERNEL_AVX512 float avx512_kexpe_nonpositive(float x) {
  return _mm512_cvtss_f32(gpt2::kernels::avx512::kexpe_nonpositive(_mm512_set1_ps(x)));
}
float level_kexp2(Isa isa, float x) {
  return isa == Isa::avx512 ? avx512_kexp2(x) : gpt2::kernels::avx2::kexp2(x);
}
float level_kexpe(Isa isa, float x) {
  return isa == Isa::avx512 ? avx512_kexpe(x) : gpt2::kernels::avx2::kexpe(x);
}

// Every test runs at each vector level; skipped with a message where the CPU lacks it.
class Kernels : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!gpt2::isa_supported(GetParam()))
      GTEST_SKIP() << "skipped: the CPU has no " << gpt2::isa_name(GetParam());
  }
  const Table& k() const { return level_table(GetParam()); }
  float kexp(float x) const { return level_kexp(GetParam(), x); }
  float kexp2(float x) const { return level_kexp2(GetParam(), x); }
  float kexpe(float x) const { return level_kexpe(GetParam(), x); }
};

constexpr float kSentinel = -12345.5f;

// n floats whose first is 64-byte aligned (plus `offset` floats), the rest of the storage filled
// with the sentinel.
class Buffer {
 public:
  explicit Buffer(Index n, Index offset = 0) : store_(static_cast<std::size_t>(n + offset + 32), kSentinel) {
    const auto address = reinterpret_cast<std::uintptr_t>(store_.data());
    data_ = store_.data() + ((64 - address % 64) % 64) / sizeof(float) + offset;
    n_ = n;
  }
  float* data() { return data_; }
  const float* data() const { return data_; }
  // The sentinels outside [data, data + n) are intact.
  bool guards_intact() const {
    for (const float* p = store_.data(); p < data_; ++p)
      if (std::memcmp(p, &kSentinel, sizeof(float)) != 0) return false;
    for (const float* p = data_ + n_; p < store_.data() + store_.size(); ++p)
      if (std::memcmp(p, &kSentinel, sizeof(float)) != 0) return false;
    return true;
  }

 private:
  std::vector<float> store_;
  float* data_ = nullptr;
  Index n_ = 0;
};

void fill_random(float* p, Index n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (Index i = 0; i < n; ++i) p[i] = u(rng);
}

std::uint32_t bits(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Equal bits (or both NaN). Reports the first difference.
::testing::AssertionResult same_bits(const float* got, const float* want, Index n) {
  for (Index i = 0; i < n; ++i) {
    if (bits(got[i]) == bits(want[i]) || (std::isnan(got[i]) && std::isnan(want[i]))) continue;
    return ::testing::AssertionFailure() << "element " << i << " of " << n << ": got " << got[i]
                                         << " (0x" << std::hex << bits(got[i]) << "), expected "
                                         << std::dec << want[i] << " (0x" << std::hex
                                         << bits(want[i]) << ")";
  }
  return ::testing::AssertionSuccess();
}

// C[M, N] (row stride ldc) of `c` equals `want` (row stride ldc) and the gaps between C's rows
// hold the sentinel.
::testing::AssertionResult same_matrix(const float* c, const float* want, Index M, Index N,
                                       Index ldc) {
  for (Index i = 0; i < M; ++i) {
    ::testing::AssertionResult row = same_bits(c + i * ldc, want + i * ldc, N);
    if (!row) return row << " (row " << i << ")";
    for (Index j = N; j < ldc && i + 1 < M; ++j)
      if (bits(c[i * ldc + j]) != bits(kSentinel))
        return ::testing::AssertionFailure() << "row " << i << ": column " << j << " written";
  }
  return ::testing::AssertionSuccess();
}

// One product's operands, strided (lda = K + 3, ldb = N + 5, ldc = N + 7), C random with
// sentinels in the gaps and around it.
struct Problem {
  Index M, N, K, lda, ldb, ldc;
  Buffer A, B, C, want;
  Buffer Bp;  // B in the panel layout, 64-byte aligned as the interface requires
  Problem(Index m, Index n, Index k, std::uint32_t seed)
      : M(m), N(n), K(k), lda(k + 3), ldb(n + 5), ldc(n + 7),
        A(std::max<Index>(1, m * (k + 3))), B(std::max<Index>(1, k * (n + 5))),
        C(std::max<Index>(1, m * (n + 7))), want(std::max<Index>(1, m * (n + 7))),
        Bp(std::max<Index>(1, (n + 31) / 32 * 32 * k)) {
    std::mt19937 rng(seed);
    for (Index i = 0; i < M; ++i) fill_random(A.data() + i * lda, K, rng);
    for (Index k2 = 0; k2 < K; ++k2) fill_random(B.data() + k2 * ldb, N, rng);
    for (Index i = 0; i < M; ++i) fill_random(C.data() + i * ldc, N, rng);
    std::memcpy(want.data(), C.data(), sizeof(float) * static_cast<std::size_t>(std::max<Index>(1, M * ldc)));
    const std::vector<float> packed = emu::pack_panels_reference(K, N, B.data(), ldb);
    if (!packed.empty()) std::memcpy(Bp.data(), packed.data(), sizeof(float) * packed.size());
    emu::gemm(M, N, K, A.data(), lda, B.data(), ldb, want.data(), ldc);
  }
  void reset_c(const Problem& fresh) {
    std::memcpy(C.data(), fresh.C.data(), sizeof(float) * static_cast<std::size_t>(std::max<Index>(1, M * ldc)));
  }
};

std::string shape(Index M, Index N, Index K) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

// Shapes: every remainder of 8 (a vector), 16 (a tile's width), 32 (a panel), the 6-row tiles,
// the 48-row blocks, the 128 / 256-column blocks and 256-deep blocks, and 0 / 1.
const std::vector<Index> kRows = {0, 1, 2, 3, 4, 5, 6, 7, 11, 13, 47, 49};
const std::vector<Index> kCols = {0, 1, 2, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 40,
                                  47, 48, 63, 64, 65, 95, 96, 97, 127, 129};
const std::vector<Index> kDepths = {0, 1, 2, 3, 8, 17, 64};

struct Shape {
  Index M, N, K;
};
std::vector<Shape> gemm_shapes() {
  std::vector<Shape> shapes;
  for (Index M : kRows)
    for (Index N : kCols)
      for (Index K : kDepths) shapes.push_back({M, N, K});
  // the block boundaries: rows 48 / 96, columns 128 / 256, depths 256 / 512
  for (const Shape& s : {Shape{97, 300, 513}, Shape{48, 256, 256}, Shape{49, 257, 257},
                         Shape{96, 128, 512}, Shape{13, 385, 300}, Shape{2, 260, 700},
                         Shape{1, 2304, 768}, Shape{7, 131, 255}})
    shapes.push_back(s);
  return shapes;
}

TEST_P(Kernels, GemmMatchesEmulation) {
  Buffer pack(gpt2::kernels::kPackFloats);
  std::uint32_t seed = 1;
  for (const Shape& s : gemm_shapes()) {
    Problem p(s.M, s.N, s.K, seed++);
    k().gemm(p.M, p.N, p.K, p.A.data(), p.lda, p.B.data(), p.ldb, p.C.data(), p.ldc, pack.data());
    ASSERT_TRUE(same_matrix(p.C.data(), p.want.data(), p.M, p.N, p.ldc)) << shape(s.M, s.N, s.K);
    ASSERT_TRUE(p.C.guards_intact()) << shape(s.M, s.N, s.K) << ": wrote outside C";
    ASSERT_TRUE(p.A.guards_intact() && p.B.guards_intact()) << shape(s.M, s.N, s.K);
  }
}

TEST_P(Kernels, GemmPackedMatchesEmulation) {
  std::uint32_t seed = 1000;
  for (const Shape& s : gemm_shapes()) {
    Problem p(s.M, s.N, s.K, seed++);
    k().gemm_packed(p.M, p.N, p.K, p.A.data(), p.lda, p.Bp.data(), p.C.data(), p.ldc);
    ASSERT_TRUE(same_matrix(p.C.data(), p.want.data(), p.M, p.N, p.ldc)) << shape(s.M, s.N, s.K);
    ASSERT_TRUE(p.C.guards_intact()) << shape(s.M, s.N, s.K) << ": wrote outside C";
  }
}

TEST_P(Kernels, PanelLayoutOfTheReferencePacker) {
  // element (k, j) at [(j / 32) * K * 32 + k * 32 + j % 32], zeros past N
  const Index K = 3, N = 33, ldb = 40;
  std::vector<float> B(K * ldb);
  for (Index k = 0; k < K; ++k)
    for (Index j = 0; j < ldb; ++j) B[k * ldb + j] = float(100 * k + j);
  const std::vector<float> Bp = emu::pack_panels_reference(K, N, B.data(), ldb);
  ASSERT_EQ(Bp.size(), std::size_t(2 * K * 32));
  EXPECT_EQ(Bp[1 * 32 + 5], 105.0f);
  EXPECT_EQ(Bp[K * 32 + 2 * 32 + 0], 232.0f);
  EXPECT_EQ(Bp[K * 32 + 2 * 32 + 1], 0.0f);
}

TEST_P(Kernels, OneRowGemmEqualsTheRowProducts) {
  Buffer pack(gpt2::kernels::kPackFloats);
  std::uint32_t seed = 2000;
  for (Index N : kCols)
    for (Index K : {0, 1, 5, 16, 33, 64, 257, 768}) {
      Problem p(1, N, K, seed++);
      const Problem fresh(1, N, K, seed - 1);
      k().gemm(1, N, K, p.A.data(), p.lda, p.B.data(), p.ldb, p.C.data(), p.ldc, pack.data());
      ASSERT_TRUE(same_bits(p.C.data(), p.want.data(), N)) << "gemm " << shape(1, N, K);
      p.reset_c(fresh);
      k().gemm_packed(1, N, K, p.A.data(), p.lda, p.Bp.data(), p.C.data(), p.ldc);
      ASSERT_TRUE(same_bits(p.C.data(), p.want.data(), N)) << "gemm_packed " << shape(1, N, K);
      p.reset_c(fresh);
      k().row_times_matrix(N, K, p.A.data(), p.B.data(), p.ldb, p.C.data());
      ASSERT_TRUE(same_bits(p.C.data(), p.want.data(), N)) << "row_times_matrix " << shape(1, N, K);
      p.reset_c(fresh);
      k().row_times_packed(N, K, p.A.data(), p.Bp.data(), p.C.data());
      ASSERT_TRUE(same_bits(p.C.data(), p.want.data(), N)) << "row_times_packed " << shape(1, N, K);
      ASSERT_TRUE(p.C.guards_intact()) << shape(1, N, K);
    }
}

// Row-exact: a row computed alone (M = 1, any kernel) or among a few rows gives the bits it gets
// inside a product of many rows.
TEST_P(Kernels, ARowAloneEqualsTheRowInsideALargerProduct) {
  Buffer pack(gpt2::kernels::kPackFloats);
  for (const Shape& s : {Shape{53, 300, 513}, Shape{61, 97, 64}, Shape{100, 768, 768}}) {
    const Problem fresh(s.M, s.N, s.K, 77);
    Problem all(s.M, s.N, s.K, 77), some(s.M, s.N, s.K, 77);
    k().gemm_packed(s.M, s.N, s.K, all.A.data(), all.lda, all.Bp.data(), all.C.data(), all.ldc);
    ASSERT_TRUE(same_matrix(all.C.data(), all.want.data(), s.M, s.N, all.ldc)) << shape(s.M, s.N, s.K);
    for (Index i = 0; i < s.M; i += 7) {
      const Index rows = std::min<Index>(5, s.M - i);  // rows i .. i + rows, at another tile offset
      some.reset_c(fresh);
      k().gemm(rows, s.N, s.K, some.A.data() + i * some.lda, some.lda, some.B.data(), some.ldb,
                 some.C.data() + i * some.ldc, some.ldc, pack.data());
      ASSERT_TRUE(same_matrix(some.C.data() + i * some.ldc, all.C.data() + i * all.ldc, rows, s.N,
                              some.ldc))
          << "gemm of rows " << i << ".." << i + rows << " in " << shape(s.M, s.N, s.K);
      some.reset_c(fresh);
      k().row_times_packed(s.N, s.K, some.A.data() + i * some.lda, some.Bp.data(),
                             some.C.data() + i * some.ldc);
      ASSERT_TRUE(same_bits(some.C.data() + i * some.ldc, all.C.data() + i * all.ldc, s.N))
          << "row " << i << " alone in " << shape(s.M, s.N, s.K);
    }
  }
}

TEST_P(Kernels, RowTimesTransposedMatchesEmulation) {
  std::mt19937 rng(5);
  for (Index N : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 33, 100})
    for (Index K : {0, 1, 2, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 100, 128, 200}) {
      const Index ldb = K + 3;
      Buffer a(std::max<Index>(1, K)), B(std::max<Index>(1, N * ldb)), c(std::max<Index>(1, N));
      std::vector<float> want(static_cast<std::size_t>(std::max<Index>(1, N)));
      fill_random(a.data(), K, rng);
      for (Index j = 0; j < N; ++j) fill_random(B.data() + j * ldb, K, rng);
      emu::row_times_transposed(N, K, a.data(), B.data(), ldb, want.data());
      k().row_times_transposed(N, K, a.data(), B.data(), ldb, c.data());
      ASSERT_TRUE(same_bits(c.data(), want.data(), N)) << "N=" << N << " K=" << K;
      ASSERT_TRUE(c.guards_intact()) << "N=" << N << " K=" << K << ": wrote outside c";
    }
}

TEST_P(Kernels, RowTimesTransposedIsExactForExactSums) {
  // small integers: every order gives the exact dot product, so the emulation itself is checked
  const Index N = 21, K = 77;
  std::vector<float> a(K), B(N * K), c(N);
  for (Index d = 0; d < K; ++d) a[d] = float(d % 5) - 2.0f;
  for (Index j = 0; j < N; ++j)
    for (Index d = 0; d < K; ++d) B[j * K + d] = float((j + 3 * d) % 7) - 3.0f;
  k().row_times_transposed(N, K, a.data(), B.data(), K, c.data());
  for (Index j = 0; j < N; ++j) {
    double dot = 0;
    for (Index d = 0; d < K; ++d) dot += double(a[d]) * double(B[j * K + d]);
    EXPECT_EQ(c[j], float(dot)) << "row " << j;
  }
}

// Lanes past K add nothing, not fma(0, 0, lane): a lane whose products all round to -0 stays -0,
// so a row of tiny negative products sums to -0 as in the emulation. (Today's avx512 kernel
// multiplies zeros into those lanes and gives +0 here: not compared.)
TEST_P(Kernels, RowTimesTransposedLanesPastKAddNothing) {
  for (Index K : {16, 17, 20, 31, 33, 70}) {  // every lane has products (K >= 16), then a tail
    const Index N = 6;
    std::vector<float> a(K, -1e-30f), B(N * K, 1e-30f), c(N), want(N);
    emu::row_times_transposed(N, K, a.data(), B.data(), K, want.data());
    k().row_times_transposed(N, K, a.data(), B.data(), K, c.data());
    ASSERT_EQ(bits(want[0]), bits(-0.0f)) << "K=" << K;
    ASSERT_TRUE(same_bits(c.data(), want.data(), N)) << "K=" << K;
  }
}

double ulps_from_exp(float got, float x) {
  const double want = std::exp(double(x));
  const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);  // of a float near want
  return std::fabs(double(got) - want) / ulp;
}

TEST_P(Kernels, KexpWithinTwoUlpOfExpAndEqualToTheEmulation) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-87.0f, 0.0f);
  double worst = 0;
  float worst_x = 0;
  std::vector<float> xs;
  for (int i = 0; i < 200000; ++i) xs.push_back(u(rng));
  // a stride over the bit patterns of [-87, 0): small magnitudes too
  for (std::uint32_t b = 0x80000000u; b <= 0xC2AE0000u; b += 4099u) {
    float x;
    std::memcpy(&x, &b, sizeof x);
    xs.push_back(x);
  }
  for (float x : {-87.0f, -1.0f, -0.5f, -1e-8f, -0.0f, 0.0f, -0.34657359f, -0.6931472f})
    xs.push_back(x);
  for (float x : xs) {
    const float got = kexp(x);
    ASSERT_EQ(bits(got), bits(emu::kexp(x))) << "x=" << x;
    const double err = ulps_from_exp(got, x);
    if (err > worst) worst = err, worst_x = x;
  }
  EXPECT_LE(worst, 2.0) << "worst at x=" << worst_x;
  RecordProperty("kexp_worst_ulp", std::to_string(worst));
}

TEST_P(Kernels, KexpSpecialCases) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(kexp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(kexp(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(bits(kexp(-inf)), bits(0.0f));
  EXPECT_EQ(bits(kexp(-87.34f)), bits(0.0f));
  EXPECT_EQ(bits(kexp(-100.0f)), bits(0.0f));
  EXPECT_EQ(bits(kexp(-1e30f)), bits(0.0f));
  EXPECT_EQ(kexp(0.0f), 1.0f);
  EXPECT_EQ(kexp(-0.0f), 1.0f);
  // just above the flush: a normal float near FLT_MIN, within 2 ulp of exp
  const float edge = -87.33654f;
  EXPECT_GE(kexp(edge), std::numeric_limits<float>::min() * 0.999f);
  EXPECT_LE(ulps_from_exp(kexp(edge), edge), 2.0);
  EXPECT_LT(kexp(std::nextafter(edge, -inf)), std::numeric_limits<float>::min());
  // positive arguments (not used by the softmax): capped at 88, finite, as the emulation
  for (float x : {1.0f, 10.0f, 88.0f, 89.0f, 1e30f, inf}) {
    EXPECT_EQ(bits(kexp(x)), bits(emu::kexp(x))) << "x=" << x;
    EXPECT_TRUE(std::isfinite(kexp(x))) << "x=" << x;
  }
  EXPECT_LE(ulps_from_exp(kexp(1.0f), 1.0f), 2.0);
}

// |got - 2^x| in units of the last place of a float near 2^x (subnormals: 2^-149).
double ulps_from_exp2(float got, float x) {
  const double want = std::exp2(double(x));
  const double ulp = std::ldexp(1.0, std::max(std::ilogb(want), -126) - 23);
  return std::fabs(double(got) - want) / ulp;
}

TEST_P(Kernels, Kexp2WithinOneUlpOfExp2AndEqualToTheEmulation) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-126.0f, 0.0f);
  std::vector<float> xs;
  for (int i = 0; i < 200000; ++i) xs.push_back(u(rng));
  // a stride over the bit patterns of [-126, 0): small magnitudes too
  for (std::uint32_t b = 0x80000000u; b <= 0xC2FC0000u; b += 4099u) {
    float x;
    std::memcpy(&x, &b, sizeof x);
    xs.push_back(x);
  }
  // the points where nearbyint changes (ties to even), and the least results (2^-126 and just
  // above: -125.5 rounds to the even -126)
  for (float x : {-0.5f, -1.5f, -2.5f, -125.5f, -125.75f, -126.0f, -1e-8f, -0.0f, 0.0f})
    xs.push_back(x);
  double worst = 0;
  float worst_x = 0;
  for (float x : xs) {
    const float got = kexp2(x);
    ASSERT_EQ(bits(got), bits(emu::kexp2(x))) << "x=" << x;
    if (GetParam() == Isa::avx512) {
      ASSERT_EQ(bits(avx512_kexp2_nonpositive(x)), bits(got)) << "x=" << x;
    }
    const double err = ulps_from_exp2(got, x);
    if (err > worst) worst = err, worst_x = x;
  }
  EXPECT_LE(worst, 1.0) << "worst at x=" << worst_x;
  RecordProperty("kexp2_worst_ulp", std::to_string(worst));
}

TEST_P(Kernels, Kexp2SpecialCases) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(kexp2(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(kexp2(-std::numeric_limits<float>::quiet_NaN())));
  // flushed to +0 below -126 (avx512's form for [-inf, 0] too: the whole blocks' exps, where
  // scores far below the block's max are common)
  for (float x : {-inf, std::nextafter(-126.0f, -inf), -126.5f, -127.0f, -200.0f, -1e30f}) {
    EXPECT_EQ(bits(kexp2(x)), bits(0.0f)) << "x=" << x;
    EXPECT_EQ(bits(emu::kexp2(x)), bits(0.0f)) << "x=" << x;
    if (GetParam() == Isa::avx512) {
      EXPECT_EQ(bits(avx512_kexp2_nonpositive(x)), bits(0.0f)) << "x=" << x;
    }
  }
  // whole powers exactly (f = 0: y = 1)
  for (int k = -126; k <= 127; ++k)
    ASSERT_EQ(kexp2(float(k)), std::ldexp(1.0f, k)) << "k=" << k;
  EXPECT_EQ(kexp2(-0.0f), 1.0f);
  // positive arguments (not used by the softmax): capped at 127, finite, as the emulation
  for (float x : {0.5f, 10.25f, 126.7f, 127.0f, 128.0f, 1e30f, inf}) {
    EXPECT_EQ(bits(kexp2(x)), bits(emu::kexp2(x))) << "x=" << x;
    EXPECT_TRUE(std::isfinite(kexp2(x))) << "x=" << x;
  }
  EXPECT_LE(ulps_from_exp2(kexp2(0.5f), 0.5f), 1.0);
}

// kexpe(x) = kexp2(x L) with x L rounded: bits equal to the emulation at each level (and avx512's
// form for [-inf, 0] equal to it there); its error against double exp grows with |x|: x L is
// rounded (half an ulp of x L) and L is log2 e rounded to float (1.3e-8 relative), which moves
// 2^(x L) by about |x| 7.3e-8 relative, 1.25 |x| ulp at most; with kexp2's own error, the bound
// checked is 1 + 1.25 |x| ulp (where p matters, |x| < 1: within 2.25 ulp).
TEST_P(Kernels, KexpeIsKexp2OfXLog2eAndEqualToTheEmulation) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-88.0f, 0.0f);
  std::vector<float> xs;
  for (int i = 0; i < 200000; ++i) xs.push_back(u(rng));
  for (std::uint32_t b = 0x80000000u; b <= 0xC2B00000u; b += 4099u) {  // [-88, 0]'s bit patterns
    float x;
    std::memcpy(&x, &b, sizeof x);
    xs.push_back(x);
  }
  for (float x : {-87.33654f, -87.4f, -100.0f, -0.0f, 0.0f, -1e-8f}) xs.push_back(x);
  const float inf = std::numeric_limits<float>::infinity();
  double worst = 0;  // ulp / (1 + 1.25 |x|)
  float worst_x = 0;
  for (float x : xs) {
    const float got = kexpe(x);
    ASSERT_EQ(bits(got), bits(emu::kexpe(x))) << "x=" << x;
    if (GetParam() == Isa::avx512) {
      ASSERT_EQ(bits(avx512_kexpe_nonpositive(x)), bits(got)) << "x=" << x;
    }
    if (got == 0.0f) continue;  // flushed: x L below -126
    const double err = ulps_from_exp(got, x) / (1.0 + 1.25 * std::fabs(double(x)));
    if (err > worst) worst = err, worst_x = x;
  }
  EXPECT_LE(worst, 1.0) << "worst at x=" << worst_x;
  RecordProperty("kexpe_worst_ulp_over_bound", std::to_string(worst));
  EXPECT_EQ(kexpe(0.0f), 1.0f);
  EXPECT_EQ(bits(kexpe(-inf)), bits(0.0f));
  EXPECT_TRUE(std::isnan(kexpe(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(bits(kexpe(-88.0f)), bits(0.0f));  // -88 L < -126
}

// softmax in double of x_j = float(row[j] * scale), the max subtracted first; gap[j] = |x_j - max|
// (float's x_j - max is rounded: an error of up to gap * 2^-24 in the exponent).
std::vector<double> softmax_double(const std::vector<float>& row, Index n, float scale,
                                   std::vector<double>& gap) {
  std::vector<double> x(static_cast<std::size_t>(n)), p(static_cast<std::size_t>(n));
  gap.assign(static_cast<std::size_t>(n), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  bool any_nan = false;
  for (Index j = 0; j < n; ++j) {
    x[j] = double(emu::mul(row[j], scale));
    any_nan = any_nan || std::isnan(x[j]);
    m = std::max(m, x[j]);
  }
  if (any_nan) m = std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (Index j = 0; j < n; ++j) sum += p[j] = std::exp(x[j] - m);
  for (Index j = 0; j < n; ++j) p[j] /= sum, gap[j] = std::fabs(x[j] - m);
  return p;
}

// softmax_row on a copy of `row` placed `offset` floats past a 64-byte boundary: the emulation's
// bits, zeros in [n, n_keys), nothing written past n_keys; and within float accuracy of double.
void check_softmax(const Table& k, const std::vector<float>& row, Index n, Index n_keys, float scale,
                   Index offset) {
  Buffer got(n_keys, offset);
  std::vector<float> want(row);
  std::memcpy(got.data(), row.data(), sizeof(float) * static_cast<std::size_t>(n_keys));
  emu::softmax_row(want.data(), n, n_keys, scale);
  k.softmax_row(got.data(), n, n_keys, scale);
  const std::string where = "n=" + std::to_string(n) + " n_keys=" + std::to_string(n_keys) +
                            " offset=" + std::to_string(offset);
  ASSERT_TRUE(same_bits(got.data(), want.data(), n_keys)) << where;
  ASSERT_TRUE(got.guards_intact()) << where << ": wrote outside the row";
  for (Index j = n; j < n_keys; ++j) ASSERT_EQ(bits(got.data()[j]), bits(0.0f)) << where;
  std::vector<double> gap;
  const std::vector<double> ref = softmax_double(row, n, scale, gap);
  for (Index j = 0; j < n; ++j) {
    if (std::isnan(ref[j])) {
      ASSERT_TRUE(std::isnan(got.data()[j])) << where << " j=" << j;
      continue;
    }
    const double tolerance = ref[j] * (1e-5 + 1.2e-7 * (std::isfinite(gap[j]) ? gap[j] : 0.0)) + 1e-37;
    ASSERT_NEAR(got.data()[j], ref[j], tolerance) << where << " j=" << j;
  }
}

TEST_P(Kernels, SoftmaxRowMatchesEmulationAndDouble) {
  std::mt19937 rng(21);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::vector<Index> sizes;
  for (Index n = 1; n <= 40; ++n) sizes.push_back(n);
  for (Index n : {47, 48, 63, 64, 65, 100, 255, 256, 257, 1000, 1024}) sizes.push_back(n);
  for (Index n : sizes)
    for (Index extra : {0, 1, 17})
      for (float scale : {0.125f, 1.0f, 3.0f, 0.0f, -1.0f}) {  // 0, -1: lanes past n must not count
        const Index n_keys = n + extra;
        std::vector<float> row(static_cast<std::size_t>(n_keys));
        for (float& v : row) v = logit(rng);
        for (Index offset : {0, 3}) check_softmax(k(), row, n, n_keys, scale, offset);
      }
}

TEST_P(Kernels, SoftmaxRowSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 rng(31);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  for (Index n : {1, 5, 8, 16, 17, 40, 100}) {
    for (int kind = 0; kind < 7; ++kind) {
      std::vector<float> row(static_cast<std::size_t>(n + 3));
      for (float& v : row) v = logit(rng);
      const Index at = (n * 5) / 7;
      switch (kind) {
        case 0: row[at] = nan; break;                             // a NaN: the whole row NaN
        case 1: row[at] = inf; break;                             // +inf: inf - inf, NaN
        case 2: row[at] = -inf; break;                            // -inf: that weight 0
        case 3: row[0] = 3e38f, row[at] = -3e38f; break;          // huge logits
        case 4: for (Index j = 0; j < n; j += 2) row[j] = -inf;   // masked keys
                row[n - 1] = 1.0f; break;
        case 5: for (Index j = 0; j < n; ++j) row[j] = -inf; break;  // all masked: NaN
        default: for (Index j = 0; j < n; ++j) row[j] = 1e-30f * float(j); break;  // tiny
      }
      for (Index offset : {0, 5}) check_softmax(k(), row, n, n + 3, 0.125f, offset);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, Kernels, ::testing::Values(Isa::avx2, Isa::avx512),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(gpt2::isa_name(info.param));
                         });

// The two levels give identical bits (both run the documented orders).
TEST(KernelLevels, Avx2AndAvx512GiveTheSameBits) {
  if (!gpt2::isa_supported(Isa::avx512)) GTEST_SKIP() << "skipped: the CPU has no avx512";
  const Table& k2 = level_table(Isa::avx2);
  const Table& k5 = level_table(Isa::avx512);
  Buffer pack2(gpt2::kernels::kPackFloats), pack512(gpt2::kernels::kPackFloats);
  std::uint32_t seed = 3000;
  for (const Shape& s : {Shape{64, 2304, 768}, Shape{37, 768, 768}, Shape{97, 300, 513},
                         Shape{5, 33, 17}, Shape{1, 2304, 768}, Shape{1, 77, 99}, Shape{13, 129, 64}}) {
    Problem a(s.M, s.N, s.K, seed), b(s.M, s.N, s.K, seed);
    ++seed;
    k2.gemm(s.M, s.N, s.K, a.A.data(), a.lda, a.B.data(), a.ldb, a.C.data(), a.ldc, pack2.data());
    k5.gemm(s.M, s.N, s.K, b.A.data(), b.lda, b.B.data(), b.ldb, b.C.data(), b.ldc, pack512.data());
    ASSERT_TRUE(same_matrix(a.C.data(), b.C.data(), s.M, s.N, a.ldc)) << "gemm " << shape(s.M, s.N, s.K);
    const Problem fresh(s.M, s.N, s.K, seed - 1);
    a.reset_c(fresh);
    b.reset_c(fresh);
    k2.gemm_packed(s.M, s.N, s.K, a.A.data(), a.lda, a.Bp.data(), a.C.data(), a.ldc);
    k5.gemm_packed(s.M, s.N, s.K, b.A.data(), b.lda, b.Bp.data(), b.C.data(), b.ldc);
    ASSERT_TRUE(same_matrix(a.C.data(), b.C.data(), s.M, s.N, a.ldc)) << "gemm_packed " << shape(s.M, s.N, s.K);
    a.reset_c(fresh);
    b.reset_c(fresh);
    k2.row_times_matrix(s.N, s.K, a.A.data(), a.B.data(), a.ldb, a.C.data());
    k5.row_times_matrix(s.N, s.K, b.A.data(), b.B.data(), b.ldb, b.C.data());
    ASSERT_TRUE(same_bits(a.C.data(), b.C.data(), s.N)) << "row_times_matrix " << shape(1, s.N, s.K);
  }
  std::mt19937 rng(41);
  for (Index N : {1, 15, 16, 17, 100, 1024})
    for (Index K : {1, 15, 16, 17, 63, 64, 65, 128}) {
      std::vector<float> a(K), B(N * (K + 1)), c2(N), c512(N);
      fill_random(a.data(), K, rng);
      fill_random(B.data(), N * (K + 1), rng);
      k2.row_times_transposed(N, K, a.data(), B.data(), K + 1, c2.data());
      k5.row_times_transposed(N, K, a.data(), B.data(), K + 1, c512.data());
      ASSERT_TRUE(same_bits(c2.data(), c512.data(), N)) << "row_times_transposed N=" << N << " K=" << K;
    }
  std::normal_distribution<float> logit(0.0f, 3.0f);
  for (Index n : {1, 7, 16, 33, 1000}) {
    std::vector<float> r2(static_cast<std::size_t>(n + 5)), r5;
    for (float& v : r2) v = logit(rng);
    r5 = r2;
    k2.softmax_row(r2.data(), n, n + 5, 0.125f);
    k5.softmax_row(r5.data(), n, n + 5, 0.125f);
    ASSERT_TRUE(same_bits(r2.data(), r5.data(), n + 5)) << "softmax_row n=" << n;
  }
}

#else  // no x86 GNU compiler: the vector levels do not exist here

TEST(Kernels, NotCompiled) { GTEST_SKIP() << "skipped: the vector levels are not compiled on this platform"; }

#endif

}  // namespace
