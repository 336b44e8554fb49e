// gpt2-attention demo: what each head of one attention sublayer attends to, and how fast the
// forward pass runs.
//
//   no --weights:  the embedded model (demo_model.hpp) on its position code x [T, 768]
//   --weights F:   layer L of a checkpoint on x = ln_1(wpe[:T]) [T, C] (position-only input)
//
// Per head: the statistics and job of head_analysis.hpp; then the median forward time and GFLOP/s.
// --dtype bf16|int8: everything as in float32 with c_attn.weight and c_proj.weight packed in bf16
// or int8 (packed_weights.hpp); the timing line then names the weight dtype too.
// --png FILE.png [--png-scale linear|sqrt]: the heads' [T, T] maps as one picture
// (attention_picture.hpp), written (all or
// nothing, output_files.hpp) before the report is printed: a picture that cannot be written is an
// error (exit 1) with no report.
//
// This header holds the flags and DemoOptions (checked without running anything; the fuzz target
// tests/fuzz/fuzz_cli_args.cpp includes it); demo_command.cpp runs the demo.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "args.hpp"
#include "demo_model.hpp"
#include "gpt2/kernels/pack.hpp"
#include "head_analysis.hpp"
#include "picture.hpp"
#include "run_command.hpp"

namespace gpt2::cli {

inline const std::vector<std::string> kDemoFlags = {"weights", "layer", "tokens", "n-head", "png",
                                                    "png-scale", "dtype"};

inline constexpr Index kDemoDefaultTokens = 64;
inline constexpr Index kDemoMaxTokens = 1024;  // GPT-2's context length
inline constexpr float kLayerNormEps = 1e-5f;

struct DemoOptions {
  std::string weights;  // empty: the embedded model
  int layer = 0;
  Index tokens = kDemoDefaultTokens;
  Index n_head = 0;  // 0: n_embd / 64
  std::string png;   // empty: no picture
  ColourScale png_scale = ColourScale::linear;
  WeightDtype weights_dtype = WeightDtype::float32;  // --dtype f32|bf16|int8
};

// demo --dtype f32|bf16|int8 (default f32): the dtype of the packed weights; the demo computes in
// float32 (no f64). UsageError naming the accepted values for another one.
inline WeightDtype parse_demo_dtype(const Flags& flags) {
  const std::string dtype = flags.text_or("dtype", "f32");
  if (dtype == "f32") return WeightDtype::float32;
  if (dtype == "bf16") return WeightDtype::bf16;
  if (dtype == "int8") return WeightDtype::int8;
  throw UsageError("--dtype: expected f32, bf16 or int8 (demo computes in float32), got '" +
                   Flags::echoed_value(dtype) + "'");
}

inline DemoOptions parse_demo_options(const Flags& flags) {
  DemoOptions o;
  o.weights = flags.text_or("weights", "");
  o.layer = static_cast<int>(flags.integer_or("layer", 0, 0, 1000000));
  o.tokens = static_cast<Index>(
      flags.integer_or("tokens", kDemoDefaultTokens, kFirstAnalysedRow + 1, kDemoMaxTokens));
  o.n_head = static_cast<Index>(flags.integer_or("n-head", 0, 1, 1000000));
  o.png = flags.text_or("png", "");
  o.png_scale = parse_png_scale(flags);
  o.weights_dtype = parse_demo_dtype(flags);
  if (!o.png.empty() && !o.weights.empty())
    check_not_same_file("png", o.png, "weights", o.weights);
  return o;
}

// printf into a std::string.
[[gnu::format(printf, 1, 2)]] inline std::string strprintf(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string s(static_cast<std::size_t>(std::max(n, 0)) + 1, '\0');
  std::vsnprintf(s.data(), s.size(), format, args);
  va_end(args);
  s.resize(static_cast<std::size_t>(std::max(n, 0)));
  return s;
}

// The timing of the forward (demo_command.cpp): at least kMinTimedRuns runs and kMinTimedSeconds
// in total, after kWarmupRuns untimed runs; at most kMaxTimedRuns.
inline constexpr int kWarmupRuns = 3;
inline constexpr int kMinTimedRuns = 11;
inline constexpr int kMaxTimedRuns = 1001;
inline constexpr double kMinTimedSeconds = 0.25;

// gpt2-attention demo ...; returns the exit status (errors are thrown). demo_command.cpp.
int demo_command(const Flags& flags, std::ostream& out);

}  // namespace gpt2::cli
