// int8 weights (kernels/int8.hpp, pack.hpp, the int8 products of every level; docs/int8.md):
// - quantize_block against its definition (amax 0, ties to even, the clamp, non-finite blocks);
// - the int8 panel layout, element by element, with its padding (stored 128, scale 0);
// - each level's product over many shapes (tails of the vector, tile, panel, block and chunk
//   sizes, one row, odd K, a column offset, with and without a bias) bit for bit against the
//   scheme's plain C++ (gemm_int8_scalar), and within float32 accumulation error of the same
//   arithmetic in double on the quantized values; a row alone == the same row inside a larger
//   product (bitwise);
// - forwards with int8 weights: decode == prefill bitwise through a KV cache at the vector levels
//   (amx, whose AMX core takes only tiles of 16 rows or more: within 2e-3),
//   and the error against the float64 sublayer on the original weights within the bar
//   (1.5e-2 of the largest output).
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
#include "gpt2/kernels/int8.hpp"
#include "gpt2/kernels/pack.hpp"
#include "support/compare.hpp"
#include "support/models.hpp"
#include "support/reference.hpp"

namespace {

using gpt2::Index;
using gpt2::Isa;
using gpt2::PackedMatrix;
using gpt2::RowMatrix;
using gpt2::RowVector;
using gpt2::WeightDtype;
namespace k = gpt2::kernels;

TEST(Int8Quantize, Definition) {
  std::int8_t q[32];
  const float zeros[4] = {0.0f, -0.0f, 0.0f, 0.0f};
  EXPECT_EQ(k::quantize_block(zeros, 4, q), 0.0f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q[i], 0);
  // amax 127: inv 1, scale 1; 2.5 -> 2 and 3.5 -> 4 (ties to even), -2.5 -> -2
  const float x[5] = {127.0f, 2.5f, 3.5f, -2.5f, -127.0f};
  EXPECT_EQ(k::quantize_block(x, 5, q), 1.0f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 2);
  EXPECT_EQ(q[2], 4);
  EXPECT_EQ(q[3], -2);
  EXPECT_EQ(q[4], -127);
  // every value within half a step of its original
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  float y[32];
  for (float& v : y) v = normal(rng);
  const float s = k::quantize_block(y, 32, q);
  for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(q[i] * double(s) - y[i]), 0.5001 * s) << i;
  // a NaN or an infinity: a non-finite scale
  y[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(k::quantize_block(y, 32, q)));
  y[3] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(k::quantize_block(y, 32, q)));
}

RowMatrix<float> normal_matrix(Index rows, Index cols, unsigned seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  RowMatrix<float> m(rows, cols);
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j) m(i, j) = normal(rng);
  return m;
}

TEST(Int8Pack, Layout) {
  const Index K = 70, N = 45;  // a partial block and a partial panel
  const RowMatrix<float> B = normal_matrix(K, N, 3);
  const PackedMatrix p(B, WeightDtype::int8);
  ASSERT_EQ(p.dtype(), WeightDtype::int8);
  EXPECT_STREQ(gpt2::dtype_name(p.dtype()), "int8");
  const Index nb = p.int8_blocks();
  ASSERT_EQ(nb, 3);
  EXPECT_EQ(p.bytes(), 2 * nb * k::kInt8BlockBytes);
  const std::uint8_t* data = p.int8_panels_from(0);
  for (Index j = 0; j < 64; ++j)
    for (Index b = 0; b < nb; ++b) {
      float scale;
      std::memcpy(&scale, data + k::int8_block_offset(b, j, nb) + k::kInt8WeightBytes + (j % 32) * 4, 4);
      float column[32];
      std::int8_t q[32];
      const Index n = std::min<Index>(32, K - 32 * b);
      if (j < N) {
        for (Index i = 0; i < n; ++i) column[i] = B(32 * b + i, j);
        EXPECT_EQ(scale, k::quantize_block(column, n, q)) << j << " " << b;
      } else {
        EXPECT_EQ(scale, 0.0f);
      }
      for (Index i = 0; i < 32; ++i) {
        const int stored = data[k::int8_weight_offset(32 * b + i, j, nb)];
        if (j < N && i < n)
          EXPECT_EQ(stored - 128, q[i]) << j << " " << 32 * b + i;
        else
          EXPECT_EQ(stored, 128) << "padding " << j << " " << 32 * b + i;
      }
    }
  EXPECT_THROW((void)p.int8_panels_from(16), gpt2::ShapeError);
  EXPECT_THROW((void)p.bf16_panels_from(0), gpt2::ShapeError);
  EXPECT_THROW((void)p.panels_from(0), gpt2::ShapeError);
}

// The scheme's product in double on the quantized values: C = bias + sum sa sw d, and the sum of
// the terms' magnitudes (for the float32 bound).
void int8_reference(const RowMatrix<float>& A, const PackedMatrix& p, Index j0, Index n,
                    const float* bias, RowMatrix<double>& C, RowMatrix<double>& mag) {
  const Index M = A.rows(), K = A.cols(), nb = p.int8_blocks();
  const std::uint8_t* data = p.int8_panels_from(0);
  C.setZero(M, n);
  mag.setZero(M, n);
  for (Index i = 0; i < M; ++i)
    for (Index b = 0; b < nb; ++b) {
      const Index len = std::min<Index>(32, K - 32 * b);
      std::int8_t qa[32];
      const double sa = k::quantize_block(A.data() + i * K + 32 * b, len, qa);
      for (Index j = 0; j < n; ++j) {
        float sw;
        std::memcpy(&sw, data + k::int8_block_offset(b, j0 + j, nb) + k::kInt8WeightBytes + ((j0 + j) % 32) * 4, 4);
        long d = 0;
        for (Index t = 0; t < len; ++t)
          d += qa[t] * (data[k::int8_weight_offset(32 * b + t, j0 + j, nb)] - 128);
        C(i, j) += sa * sw * double(d);
        mag(i, j) += std::fabs(sa * sw * double(d));
      }
    }
  if (bias)
    for (Index i = 0; i < M; ++i)
      for (Index j = 0; j < n; ++j) {
        C(i, j) += bias[j0 + j];
        mag(i, j) += std::fabs(bias[j0 + j]);
      }
}

class Int8Level : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!gpt2::isa_supported(GetParam()))
      GTEST_SKIP() << "skipped: the CPU has no " << gpt2::isa_missing(GetParam());
    gpt2::set_isa(GetParam());
  }
  void TearDown() override { gpt2::reset_isa(); }
};

struct Shape {
  Index M, N, K, j0;
};

TEST_P(Int8Level, ProductIsTheSchemeBitForBit) {
  const std::vector<Shape> shapes = {{1, 32, 32, 0},    {1, 768, 768, 0},  {1, 130, 70, 0},
                                     {2, 100, 31, 0},   {5, 33, 65, 0},    {6, 64, 96, 32},
                                     {7, 200, 768, 64}, {13, 2304, 768, 0}, {97, 96, 33, 0},
                                     {200, 70, 130, 0}, {1, 2304, 768, 1152}};
  gpt2::GemmScratch<float> scratch;
  unsigned seed = 11;
  for (const Shape& s : shapes) {
    const Index Ntot = s.j0 + s.N + 5;
    const RowMatrix<float> A = normal_matrix(s.M, s.K, seed++, 2.0f);
    const RowMatrix<float> B = normal_matrix(s.K, Ntot, seed++, 0.1f);
    const RowVector<float> bias = normal_matrix(1, Ntot, seed++);
    const PackedMatrix p(B, WeightDtype::int8);
    const gpt2::ConstVectorMap<float> bias_map(bias.data(), Ntot);
    RowMatrix<float> C(s.M, s.N), scheme(s.M, s.N);
    gpt2::projection_columns<float>(A, B, &p, bias_map, s.j0, s.N, C, scratch);
    std::vector<std::uint8_t> buf(static_cast<std::size_t>(k::int8_row_bytes(s.K) * k::kInt8ChunkRows));
    k::gemm_int8_scalar(s.M, s.N, s.K, A.data(), s.K, p.int8_panels_from(s.j0), scheme.data(), s.N,
                        bias.data() + s.j0, buf.data());
    const std::string what = "M " + std::to_string(s.M) + " N " + std::to_string(s.N) + " K " +
                             std::to_string(s.K) + " j0 " + std::to_string(s.j0);
    ASSERT_EQ(std::memcmp(C.data(), scheme.data(), sizeof(float) * C.size()), 0)
        << what << ": max diff " << gpt2::test::max_diff(C, scheme).value;
    RowMatrix<double> ref, mag;
    int8_reference(A, p, s.j0, s.N, bias.data(), ref, mag);
    for (Index i = 0; i < s.M; ++i)
      for (Index j = 0; j < s.N; ++j)
        ASSERT_LE(std::fabs(C(i, j) - ref(i, j)), 2e-6 * mag(i, j) + 1e-30) << what << " at " << i << ", " << j;
    // a row alone: the same bits
    const Index r = s.M / 2;
    RowMatrix<float> one(1, s.N);
    gpt2::projection_columns<float>(A.middleRows(r, 1), B, &p, bias_map, s.j0, s.N, one, scratch);
    ASSERT_EQ(std::memcmp(one.data(), C.data() + r * s.N, sizeof(float) * s.N), 0) << what << " row " << r;
    // without a bias: C += A B from C's values
    RowMatrix<float> acc = RowMatrix<float>::Constant(s.M, s.N, 0.5f), acc_scheme = acc;
    gpt2::gemm_accumulate_columns<float>(A, B, &p, s.j0, s.N, acc, scratch);
    k::gemm_int8_scalar(s.M, s.N, s.K, A.data(), s.K, p.int8_panels_from(s.j0), acc_scheme.data(), s.N,
                        nullptr, buf.data());
    ASSERT_EQ(std::memcmp(acc.data(), acc_scheme.data(), sizeof(float) * acc.size()), 0) << what << " (no bias)";
  }
}

// x [T, C] through the sublayer in chunks through a KVCache<float> (chunks of 1: decode).
RowMatrix<float> forward_in_chunks(const gpt2::AttentionWeights<float>& w, const RowMatrix<float>& x,
                                   Index chunk) {
  const Index T_ = x.rows();
  RowMatrix<float> out(T_, x.cols());
  gpt2::KVCache<float> cache(w.config(), T_);
  gpt2::Workspace<float> ws(w.config(), T_);
  for (Index p = 0; p < T_; p += chunk) {
    const Index n = std::min(chunk, T_ - p);
    gpt2::attention_forward<float>(w, x.middleRows(p, n), cache, ws, out.middleRows(p, n));
  }
  return out;
}

TEST_P(Int8Level, ForwardDecodeEqualsPrefillAndMeetsTheBar) {
  for (const auto& [C, heads, T_] : {std::tuple<Index, Index, Index>{64, 4, 37},
                                     std::tuple<Index, Index, Index>{256, 4, 80},
                                     std::tuple<Index, Index, Index>{96, 3, 20}}) {
    const gpt2::test::Model<float> m = gpt2::test::random_model<float>(C, heads, 5);
    const gpt2::AttentionWeights<float> w = gpt2::pack_weights(m.weights(), WeightDtype::int8);
    ASSERT_EQ(w.weight_dtype(), WeightDtype::int8);
    const RowMatrix<float> x = gpt2::test::random_input<float>(T_, C, 9);
    const RowMatrix<float> whole = gpt2::attention(w, x);
    const RowMatrix<float> prefill = forward_in_chunks(w, x, T_);
    const RowMatrix<float> decode = forward_in_chunks(w, x, 1);
    const RowMatrix<float> chunks = forward_in_chunks(w, x, 7);
    const std::string what = "C " + std::to_string(C) + " T " + std::to_string(T_);
    if (GetParam() == Isa::amx) {
      // the AMX core runs the tiles of 16 rows or more, the float32 core the shorter ones: a row's
      // bits depend on its tile (as with bf16 weights: docs/bf16.md), within the bf16 products'
      // rounding
      EXPECT_TRUE(gpt2::test::near(decode, prefill, 2e-3)) << what;
      EXPECT_TRUE(gpt2::test::near(chunks, prefill, 2e-3)) << what;
      EXPECT_EQ(std::memcmp(prefill.data(), whole.data(), sizeof(float) * whole.size()), 0) << what;
    } else if (GetParam() != Isa::generic) {  // the generic level's attention orders sums by shape
      EXPECT_EQ(std::memcmp(prefill.data(), decode.data(), sizeof(float) * decode.size()), 0) << what;
      EXPECT_EQ(std::memcmp(prefill.data(), chunks.data(), sizeof(float) * chunks.size()), 0) << what;
      EXPECT_EQ(std::memcmp(prefill.data(), whole.data(), sizeof(float) * whole.size()), 0) << what;
    }
    const gpt2::test::NaiveAttention ref = gpt2::test::naive_attention(
        x.cast<double>().eval(), m.c_attn_w.cast<double>().eval(), m.c_attn_b.cast<double>().eval(),
        m.c_proj_w.cast<double>().eval(), m.c_proj_b.cast<double>().eval(), heads);
    const double err = (whole.cast<double>() - ref.out).cwiseAbs().maxCoeff() / ref.out.cwiseAbs().maxCoeff();
    EXPECT_LE(err, 1.5e-2) << what;
    std::printf("%s at %s: int8 weights, error %.3e of the largest output\n", what.c_str(),
                gpt2::isa_name(GetParam()), err);
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, Int8Level,
                         ::testing::Values(Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512_bf16,
                                           Isa::amx),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(gpt2::isa_name(info.param));
                         });

}  // namespace
