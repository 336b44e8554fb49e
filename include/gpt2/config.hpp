// Attention configuration: n_embd (C), n_head and the derived head_dim = C / n_head.
#pragma once

#include <string>

#include "gpt2/error.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// Shape of one GPT-2 attention sublayer. Run-time values: every GPT-2 width works
// (small 768/12, medium 1024/16, large 1280/20, XL 1600/25; head_dim is 64 for all four).
struct AttentionConfig {
  Index n_embd = 768;  // C
  Index n_head = 12;

  // C / n_head (0 while n_head <= 0; validate() rejects that and a non-divisor).
  Index head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }

  // Throws ConfigError unless n_embd > 0, n_head > 0 and n_head divides n_embd.
  void validate() const {
    if (n_embd <= 0)
      throw ConfigError("n_embd: expected a positive value, got " + std::to_string(n_embd));
    if (n_head <= 0)
      throw ConfigError("n_head: expected a positive value, got " + std::to_string(n_head));
    if (n_embd % n_head != 0)
      throw ConfigError("n_head: expected a divisor of n_embd = " + std::to_string(n_embd) +
                        ", got " + std::to_string(n_head));
  }

  // The four GPT-2 sizes (n_embd, n_head).
  static AttentionConfig gpt2_small() { return {768, 12}; }
  static AttentionConfig gpt2_medium() { return {1024, 16}; }
  static AttentionConfig gpt2_large() { return {1280, 20}; }
  static AttentionConfig gpt2_xl() { return {1600, 25}; }
};

namespace detail {

// ShapeError unless h is a head of config (validated first).
inline void check_head(const AttentionConfig& config, Index h) {
  config.validate();
  if (h < 0 || h >= config.n_head)
    throw ShapeError("head: expected an index in [0, " + std::to_string(config.n_head) +
                     "), got " + std::to_string(h));
}

}  // namespace detail

// A validated config. Throws ConfigError naming the bad value.
inline AttentionConfig make_config(Index n_embd, Index n_head) {
  AttentionConfig config{n_embd, n_head};
  config.validate();
  return config;
}

}  // namespace gpt2
