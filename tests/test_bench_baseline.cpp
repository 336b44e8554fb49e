// The benchmark's baseline (bench/baseline.hpp) must compute the same sublayer, or its timings
// mean nothing.
#include <gtest/gtest.h>

#include <cstdlib>

#include "../bench/baseline.hpp"
#include "support/compare.hpp"
#include "support/reference.hpp"

TEST(BenchBaseline, MatchesNaiveReference) {
  const gpt2::Index C = 64, n_head = 4, T = 23;
  std::srand(5);
  const gpt2::RowMatrix<double> c_attn_w = gpt2::RowMatrix<double>::Random(C, 3 * C) * 0.5,
                                c_proj_w = gpt2::RowMatrix<double>::Random(C, C) * 0.2,
                                x = gpt2::RowMatrix<double>::Random(T, C);
  const gpt2::RowVector<double> c_attn_b = gpt2::RowVector<double>::Random(3 * C),
                                c_proj_b = gpt2::RowVector<double>::Random(C);
  const gpt2::AttentionWeights<double> w({C, n_head}, gpt2::view(c_attn_w), gpt2::view(c_attn_b),
                                         gpt2::view(c_proj_w), gpt2::view(c_proj_b));
  const gpt2::test::NaiveAttention ref =
      gpt2::test::naive_attention(x, c_attn_w, c_attn_b, c_proj_w, c_proj_b, n_head);
  EXPECT_TRUE(gpt2::test::near(gpt2::bench::baseline_attention(w, x), ref.out, 1e-12, 1e-14));
}

TEST(BenchBaseline, DecodeStepMatchesNaiveReference) {
  const gpt2::Index C = 64, n_head = 4, T = 9;
  std::srand(6);
  const gpt2::RowMatrix<double> c_attn_w = gpt2::RowMatrix<double>::Random(C, 3 * C) * 0.5,
                                c_proj_w = gpt2::RowMatrix<double>::Random(C, C) * 0.2,
                                x = gpt2::RowMatrix<double>::Random(T, C);
  const gpt2::RowVector<double> c_attn_b = gpt2::RowVector<double>::Random(3 * C),
                                c_proj_b = gpt2::RowVector<double>::Random(C);
  const gpt2::AttentionWeights<double> w({C, n_head}, gpt2::view(c_attn_w), gpt2::view(c_attn_b),
                                         gpt2::view(c_proj_w), gpt2::view(c_proj_b));
  const gpt2::test::NaiveAttention ref =
      gpt2::test::naive_attention(x, c_attn_w, c_attn_b, c_proj_w, c_proj_b, n_head);
  gpt2::RowMatrix<double> K(T, C), V(T, C);
  for (gpt2::Index t = 0; t < T; ++t) {  // token by token: row t sees rows 0 .. t
    const gpt2::RowMatrix<double> x_t = x.row(t);
    const gpt2::RowMatrix<double> out = gpt2::bench::baseline_decode_step(w, x_t, K, V, t);
    EXPECT_TRUE(gpt2::test::near(out, ref.out.row(t), 1e-12, 1e-14)) << "token " << t;
  }
}
