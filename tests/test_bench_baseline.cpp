// The benchmark's baseline (bench/baseline.hpp) must compute the same sublayer, or its timings
// mean nothing.
#include <gtest/gtest.h>

#include <cstdlib>

#include "../bench/baseline.hpp"
#include "support/compare.hpp"
#include "support/reference.hpp"

// A random sublayer (C = 64, 4 heads) in double, its input x [T, C] and the naive reference.
struct Case {
  gpt2::RowMatrix<double> c_attn_w, c_proj_w, x;
  gpt2::RowVector<double> c_attn_b, c_proj_b;
  gpt2::AttentionWeights<double> weights() const {
    return {{64, 4}, gpt2::view(c_attn_w), gpt2::view(c_attn_b), gpt2::view(c_proj_w),
            gpt2::view(c_proj_b)};
  }
  gpt2::test::NaiveAttention reference() const {
    return gpt2::test::naive_attention(x, c_attn_w, c_attn_b, c_proj_w, c_proj_b, 4);
  }
};

Case random_case(gpt2::Index T, unsigned seed) {
  const gpt2::Index C = 64;
  std::srand(seed);
  Case c;
  c.c_attn_w = gpt2::RowMatrix<double>::Random(C, 3 * C) * 0.5;
  c.c_proj_w = gpt2::RowMatrix<double>::Random(C, C) * 0.2;
  c.x = gpt2::RowMatrix<double>::Random(T, C);
  c.c_attn_b = gpt2::RowVector<double>::Random(3 * C);
  c.c_proj_b = gpt2::RowVector<double>::Random(C);
  return c;
}

TEST(BenchBaseline, MatchesNaiveReference) {
  const Case c = random_case(23, 5);
  EXPECT_TRUE(gpt2::test::near(gpt2::bench::baseline_attention(c.weights(), c.x),
                               c.reference().out, 1e-12, 1e-14));
}

TEST(BenchBaseline, DecodeStepMatchesNaiveReference) {
  const gpt2::Index T = 9, C = 64;
  const Case c = random_case(T, 6);
  const gpt2::test::NaiveAttention ref = c.reference();
  gpt2::RowMatrix<double> K(T, C), V(T, C);
  for (gpt2::Index t = 0; t < T; ++t) {  // token by token: row t sees rows 0 .. t
    const gpt2::RowMatrix<double> x_t = c.x.row(t);
    const gpt2::RowMatrix<double> out = gpt2::bench::baseline_decode_step(c.weights(), x_t, K, V, t);
    EXPECT_TRUE(gpt2::test::near(out, ref.out.row(t), 1e-12, 1e-14)) << "token " << t;
  }
}
