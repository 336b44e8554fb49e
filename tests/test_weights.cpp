// AttentionConfig validation and AttentionWeights shape checks: every message names the tensor
// (or value), the expected and the actual shape.
#include <gtest/gtest.h>

#include "gpt2/weights.hpp"
#include "support/errors.hpp"

namespace {

using gpt2::RowMatrix;
using gpt2::RowVector;
using gpt2::test::error_of;

std::string config_error(gpt2::Index n_embd, gpt2::Index n_head) {
  return error_of<gpt2::ConfigError>([&] { gpt2::make_config(n_embd, n_head); });
}

TEST(Config, EveryGpt2WidthIsValid) {
  for (const gpt2::AttentionConfig c :
       {gpt2::AttentionConfig::gpt2_small(), gpt2::AttentionConfig::gpt2_medium(),
        gpt2::AttentionConfig::gpt2_large(), gpt2::AttentionConfig::gpt2_xl()}) {
    EXPECT_NO_THROW(c.validate());
    EXPECT_EQ(c.head_dim(), 64);
  }
  EXPECT_EQ(gpt2::make_config(1600, 25).head_dim(), 64);
}

TEST(Config, InvalidValuesAreNamed) {
  EXPECT_EQ(config_error(768, 7), "n_head: expected a divisor of n_embd = 768, got 7");
  EXPECT_EQ(config_error(0, 12), "n_embd: expected a positive value, got 0");
  EXPECT_EQ(config_error(768, 0), "n_head: expected a positive value, got 0");
  EXPECT_EQ(config_error(768, -4), "n_head: expected a positive value, got -4");
}

struct Buffers {
  RowMatrix<float> c_attn_w, c_proj_w;
  RowVector<float> c_attn_b, c_proj_b;
};

std::string weights_error(const gpt2::AttentionConfig& config, const Buffers& b) {
  return error_of<gpt2::Error>([&] {
    gpt2::AttentionWeights<float> w(config, gpt2::view(b.c_attn_w), gpt2::view(b.c_attn_b),
                                    gpt2::view(b.c_proj_w), gpt2::view(b.c_proj_b));
  });
}

Buffers good(gpt2::Index C) {
  return {RowMatrix<float>::Zero(C, 3 * C), RowMatrix<float>::Zero(C, C),
          RowVector<float>::Zero(3 * C), RowVector<float>::Zero(C)};
}

TEST(Weights, ViewsPointAtTheCallersBuffers) {
  const Buffers b = good(16);
  const gpt2::AttentionWeights<float> w({16, 4}, gpt2::view(b.c_attn_w), gpt2::view(b.c_attn_b),
                                        gpt2::view(b.c_proj_w), gpt2::view(b.c_proj_b));
  EXPECT_EQ(w.c_attn_weight().data(), b.c_attn_w.data());
  EXPECT_EQ(w.c_attn_bias().data(), b.c_attn_b.data());
  EXPECT_EQ(w.c_proj_weight().data(), b.c_proj_w.data());
  EXPECT_EQ(w.c_proj_bias().data(), b.c_proj_b.data());
  EXPECT_EQ(w.head_dim(), 4);
  const gpt2::AttentionWeights<float> copy = w;  // copies the views, not the data
  EXPECT_EQ(copy.c_attn_weight().data(), b.c_attn_w.data());
}

TEST(Weights, WrongShapesAreNamed) {
  Buffers b = good(768);
  b.c_attn_w = RowMatrix<float>::Zero(768, 768);
  EXPECT_EQ(weights_error({768, 12}, b), "c_attn.weight: expected shape [768, 2304], got [768, 768]");
  b = good(768);
  b.c_attn_w = RowMatrix<float>::Zero(2304, 768);  // nn.Linear layout [out, in]: rejected
  EXPECT_EQ(weights_error({768, 12}, b), "c_attn.weight: expected shape [768, 2304], got [2304, 768]");
  b = good(768);
  b.c_attn_b = RowVector<float>::Zero(768);
  EXPECT_EQ(weights_error({768, 12}, b), "c_attn.bias: expected shape [2304], got [768]");
  b = good(768);
  b.c_proj_w = RowMatrix<float>::Zero(768, 769);
  EXPECT_EQ(weights_error({768, 12}, b), "c_proj.weight: expected shape [768, 768], got [768, 769]");
  b = good(768);
  b.c_proj_b = RowVector<float>::Zero(0);
  EXPECT_EQ(weights_error({768, 12}, b), "c_proj.bias: expected shape [768], got [0]");
  EXPECT_EQ(weights_error({768, 5}, good(768)), "n_head: expected a divisor of n_embd = 768, got 5");
}

}  // namespace
