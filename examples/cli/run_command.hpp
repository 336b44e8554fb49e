// gpt2-attention run: one layer's attention sublayer on X [T, C] or on a padded batch X [B, T, C]
// from a .npy file.
//
//   X [T, C]      -> Y [T, C]      (and probs [n_head, T, T]); --prefill N: through a KV cache
//                                  (prefill_run.hpp)
//   X [B, T, C]   -> Y [B, T, C]   (and probs [B, n_head, T, T]); real rows from --starts and
//                                  --lengths (run_input.hpp), padded rows of Y exactly 0; --prefill
//                                  N: batched decode through one KV cache per sequence (batch_run.hpp)
//                                  --share-prefix N: the common first N rows once, in a paged KV
//                                  cache, every sequence forked from them (shared_prefix_run.hpp)
//   --dtype f32|f64|bf16|int8: float32, float64, or float32 with bf16 or int8 weights
//                        (packed_weights.hpp)
//   --png FILE.png: the probabilities as a picture (attention_picture.hpp): one tile per head, or
//                   per sequence and head for a batch (sequences stacked top to bottom)
//
// Everything is read, checked and computed in memory first; the files are written last, all or
// nothing (output_files.hpp). So --output may name the --input file; no output may name the
// --weights file, and --probs and --png may name neither the input nor another output (checked
// up front).
// An empty input (B * T == 0) costs nothing beyond reading its header; the probabilities are
// allocated before anything is computed and held once (see compute_run).
//
// This header holds the command line's side (the flags, RunOptions, checked without touching the
// data; the fuzz target tests/fuzz/fuzz_cli_args.cpp includes it); run_command.cpp runs it,
// run_compute.hpp computes, in translation units of their own (run_sequence.cpp, run_batch.cpp).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "args.hpp"
#include "gpt2/detail/io_util.hpp"
#include "gpt2/types.hpp"
#include "picture.hpp"
#include "sublayer.hpp"

namespace gpt2::cli {

inline const std::vector<std::string> kRunFlags = {
    "weights", "layer", "input", "output", "n-head", "dtype", "probs", "prefill", "lengths", "starts",
    "png", "png-scale", "share-prefix", "kv-cache"};
// Flags without a value.
inline const std::vector<std::string> kRunSwitches = {"tensor-parallel"};

// Whether this build can run --tensor-parallel (it was built with gpt2::mpi).
inline constexpr bool kHasTensorParallel = GPT2_CLI_TENSOR_PARALLEL;

// --dtype: what run computes in. bf16 and int8 are float32 with c_attn.weight and c_proj.weight
// packed in bfloat16 or int8 (packed_weights.hpp; int8: docs/int8.md): float32 .npy in and out,
// as f32.
enum class Precision { f32, f64, bf16, int8 };

// --kv-cache: what the caches store.
enum class KvStorage { f32, bf16, int8 };
inline const char* kv_storage_name(KvStorage s) {
  return s == KvStorage::bf16 ? "bf16" : s == KvStorage::int8 ? "int8" : "f32";
}

// The dtype the weights are packed in for precision p.
inline WeightDtype weight_dtype(Precision p) {
  return p == Precision::bf16   ? WeightDtype::bf16
         : p == Precision::int8 ? WeightDtype::int8
                                : WeightDtype::float32;
}

// What `run` was asked to do, checked as far as the command line alone allows.
struct RunOptions {
  std::string weights, input, output;
  std::string probs;  // empty: not requested
  std::string png;    // empty: not requested
  ColourScale png_scale = ColourScale::linear;
  int layer = 0;
  Index n_head = 0;  // 0: n_embd / 64
  Precision precision = Precision::f32;
  std::optional<Index> prefill;                      // --prefill N: through KV caches
  std::optional<std::vector<long long>> starts, lengths;  // a batch's real rows
  bool tensor_parallel = false;  // --tensor-parallel: the heads split over the MPI ranks
  std::optional<Index> share_prefix;  // --share-prefix N: a batch's common first N rows, once
  // --kv-cache f32|bf16|int8: what --prefill's and --share-prefix's caches hold keys and values in
  // (f32: the forwards' own type, float or double)
  KvStorage kv = KvStorage::f32;
};

// --dtype f32|f64|bf16|int8 (default f32); UsageError naming the accepted values for another one.
inline Precision parse_precision(const Flags& flags) {
  const std::string dtype = flags.text_or("dtype", "f32");
  if (dtype == "f32") return Precision::f32;
  if (dtype == "f64") return Precision::f64;
  if (dtype == "bf16") return Precision::bf16;
  if (dtype == "int8") return Precision::int8;
  throw UsageError("--dtype: expected f32, f64, bf16 or int8, got '" + Flags::echoed_value(dtype) +
                   "'");
}

// --png-scale linear|sqrt (default linear); UsageError for another value or without --png.
inline ColourScale parse_png_scale(const Flags& flags) {
  if (!flags.has("png-scale")) return ColourScale::linear;
  if (!flags.has("png")) throw UsageError("--png-scale needs --png");
  const std::string scale = flags.required("png-scale");
  if (scale == "linear") return ColourScale::linear;
  if (scale == "sqrt") return ColourScale::sqrt;
  throw UsageError("--png-scale: expected linear or sqrt, got '" + Flags::echoed_value(scale) + "'");
}

// UsageError unless `a` (--flag_a) and `b` (--flag_b) are different files: compared as weakly
// canonical paths with symbolic links followed and, when both exist, by (st_dev, st_ino), so
// "out.npy", "./out.npy", a symlink to it and a hard link all count as the same file.
inline void check_not_same_file(const std::string& flag_a, const std::string& a,
                                const std::string& flag_b, const std::string& b) {
  if (!gpt2::detail::same_file(a, b)) return;
  if (a == b)
    throw UsageError("--" + flag_a + " and --" + flag_b + " name the same file '" + a + "'");
  throw UsageError("--" + flag_a + " '" + a + "' and --" + flag_b + " '" + b +
                   "' name the same file");
}

// The outputs must not overwrite each other, the checkpoint, or (for --probs and --png) the
// input. --output may name the input: X is read in full before anything is written.
inline void check_distinct_files(const RunOptions& o) {
  if (!o.probs.empty()) check_not_same_file("output", o.output, "probs", o.probs);
  if (!o.png.empty()) check_not_same_file("output", o.output, "png", o.png);
  if (!o.probs.empty() && !o.png.empty()) check_not_same_file("probs", o.probs, "png", o.png);
  check_not_same_file("output", o.output, "weights", o.weights);
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"probs", o.probs},
                                   std::pair<const char*, const std::string&>{"png", o.png}}) {
    if (path.empty()) continue;
    check_not_same_file(flag, path, "weights", o.weights);
    check_not_same_file(flag, path, "input", o.input);
  }
}

inline RunOptions parse_run_options(const Flags& flags) {
  RunOptions o;
  o.weights = flags.required("weights");
  o.input = flags.required("input");
  o.output = flags.required("output");
  o.probs = flags.text_or("probs", "");
  o.png = flags.text_or("png", "");
  o.png_scale = parse_png_scale(flags);
  o.layer = static_cast<int>(flags.integer_or("layer", 0, 0, 1000000));
  o.n_head = static_cast<Index>(flags.integer_or("n-head", 0, 1, 1000000));
  o.precision = parse_precision(flags);
  if (flags.has("prefill"))
    o.prefill = static_cast<Index>(flags.integer_or("prefill", 0, 0, Flags::kNoMax));
  o.starts = flags.count_list("starts");
  o.lengths = flags.count_list("lengths");
  o.tensor_parallel = flags.has("tensor-parallel");
  if (flags.has("share-prefix"))
    o.share_prefix = static_cast<Index>(flags.integer_or("share-prefix", 0, 0, Flags::kNoMax));
  if (flags.has("kv-cache")) {
    const std::string kv = flags.required("kv-cache");
    if (kv != "f32" && kv != "bf16" && kv != "int8")
      throw UsageError("--kv-cache: expected f32, bf16 or int8, got '" + Flags::echoed_value(kv) +
                       "'");
    o.kv = kv == "bf16" ? KvStorage::bf16 : kv == "int8" ? KvStorage::int8 : KvStorage::f32;
    if (!o.prefill && !o.share_prefix)
      throw UsageError("--kv-cache needs --prefill or --share-prefix (the caches are theirs)");
    if (o.kv != KvStorage::f32 && o.precision == Precision::f64)
      throw UsageError(std::string("--kv-cache ") + kv_storage_name(o.kv) +
                       ": not available with --dtype f64 (" +
                       (o.kv == KvStorage::int8 ? "an int8" : "a bf16") +
                       " cache serves float32 forwards)");
  }
  if (o.tensor_parallel && !kHasTensorParallel)
    throw UsageError("--tensor-parallel: this gpt2-attention was built without MPI "
                     "(configure with GPT2_ATTENTION_MPI=ON; Debian: libopenmpi-dev, openmpi-bin)");
  check_distinct_files(o);
  return o;
}

// run --tensor-parallel (tensor_parallel_run.cpp, built with gpt2::mpi only).
int run_tensor_parallel(const RunOptions& o);

// gpt2-attention run ...; returns the exit status (errors are thrown). run_command.cpp.
int run_command(const Flags& flags);

}  // namespace gpt2::cli
