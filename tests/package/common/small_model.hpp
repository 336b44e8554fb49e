// Shared by the consumer programs of tests/package/: one attention sublayer on a small config,
// through the public front door, and the check of its output.
#pragma once

#include <gpt2/attention.hpp>

#include <cstdio>
#include <cstring>

namespace consumer {

constexpr gpt2::Index kT = 5;
inline const gpt2::AttentionConfig kConfig{64, 4};  // n_embd, n_head

// y = attention(x) with random weights and input: x [kT, 64] -> y [kT, 64].
inline gpt2::RowMatrix<float> small_forward() {
  const gpt2::RowMatrix<float> c_attn_w = gpt2::RowMatrix<float>::Random(64, 192);
  const gpt2::RowVector<float> c_attn_b = gpt2::RowVector<float>::Zero(192);
  const gpt2::RowMatrix<float> c_proj_w = gpt2::RowMatrix<float>::Random(64, 64);
  const gpt2::RowVector<float> c_proj_b = gpt2::RowVector<float>::Zero(64);
  const gpt2::RowMatrix<float> x = gpt2::RowMatrix<float>::Random(kT, 64);
  const gpt2::AttentionWeights<float> weights(kConfig, gpt2::view(c_attn_w), gpt2::view(c_attn_b),
                                              gpt2::view(c_proj_w), gpt2::view(c_proj_b));
  return gpt2::attention(weights, x);
}

// 0 when y is [kT, 64] and finite; otherwise says why on stderr and returns 1.
inline int check_output(const gpt2::RowMatrix<float>& y, const char* who) {
  if (y.rows() != kT || y.cols() != kConfig.n_embd) {
    std::fprintf(stderr, "%s: y: expected shape [%td, %td], got [%td, %td]\n", who, kT,
                 kConfig.n_embd, y.rows(), y.cols());
    return 1;
  }
  if (!y.allFinite()) {
    std::fprintf(stderr, "%s: y: not finite\n", who);
    return 1;
  }
  std::printf("%s: y [%td, %td] ok\n", who, y.rows(), y.cols());
  return 0;
}

// 0 when kernel_info() reports the build mode `mode` ("compiled": the compiled library, whose
// kernels are optimised whatever this file's flags; "header-only": this program's own, optimised as
// `optimized` says); otherwise says why on stderr and returns 1.
inline int check_build(const char* mode, bool optimized, const char* who) {
  const gpt2::KernelInfo info = gpt2::kernel_info();
  const bool compiled = std::strcmp(mode, "compiled") == 0;
  if (info.compiled_library != compiled || info.optimized != (compiled || optimized)) {
    std::fprintf(stderr, "%s: kernel_info() says compiled_library %d, optimized %d; expected %s%s\n",
                 who, int(info.compiled_library), int(info.optimized), mode,
                 compiled || optimized ? ", optimised" : ", unoptimised");
    return 1;
  }
  if (info.optimized != (info.summary().find("without optimisation") == std::string::npos)) {
    std::fprintf(stderr, "%s: summary() '%s' disagrees with optimized %d\n", who,
                 info.summary().c_str(), int(info.optimized));
    return 1;
  }
  std::printf("%s: %s mode, kernels %s\n", who, mode, info.optimized ? "optimised" : "unoptimised");
  return 0;
}

}  // namespace consumer
