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
//   --dtype f32|f64|bf16: float32, float64, or float32 with bf16 weights (packed_weights.hpp)
//   --png FILE.png: the probabilities as a picture (attention_picture.hpp): one tile per head, or
//                   per sequence and head for a batch (sequences stacked top to bottom)
//
// Everything is read, checked and computed in memory first; the files are written last, all or
// nothing (output_files.hpp). So --output may name the --input file; no output may name the
// --weights file, and --probs and --png may name neither the input nor another output (checked
// up front).
// An empty input (B * T == 0) costs nothing beyond reading its header; the probabilities are
// allocated before anything is computed and held once (see compute_run).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "packed_weights.hpp"
#include "args.hpp"
#include "attention_picture.hpp"
#include "batch_run.hpp"
#include "gpt2/attention.hpp"
#include "gpt2/detail/io_util.hpp"
#include "gpt2/safetensors.hpp"
#include "output_files.hpp"
#include "prefill_run.hpp"
#include "run_input.hpp"
#include "shared_prefix_run.hpp"
#include "sublayer.hpp"

namespace gpt2::cli {

inline const std::vector<std::string> kRunFlags = {
    "weights", "layer", "input", "output", "n-head", "dtype", "probs", "prefill", "lengths", "starts",
    "png", "png-scale", "share-prefix", "kv-cache"};
// Flags without a value.
inline const std::vector<std::string> kRunSwitches = {"tensor-parallel"};

// Whether this build can run --tensor-parallel (it was built with gpt2::mpi).
inline constexpr bool kHasTensorParallel = GPT2_CLI_TENSOR_PARALLEL;

// --dtype: what run computes in. bf16 is float32 with c_attn.weight and c_proj.weight packed in
// bfloat16 (packed_weights.hpp): float32 .npy in and out, as f32.
enum class Precision { f32, f64, bf16 };

// The dtype the weights are packed in for precision p.
inline WeightDtype weight_dtype(Precision p) {
  return p == Precision::bf16 ? WeightDtype::bf16 : WeightDtype::float32;
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
  bool kv_bf16 = false;  // --kv-cache bf16: --prefill's caches hold keys and values in bf16
};

// --dtype f32|f64|bf16 (default f32); UsageError naming the accepted values for another one.
inline Precision parse_precision(const Flags& flags) {
  const std::string dtype = flags.text_or("dtype", "f32");
  if (dtype == "f32") return Precision::f32;
  if (dtype == "f64") return Precision::f64;
  if (dtype == "bf16") return Precision::bf16;
  throw UsageError("--dtype: expected f32, f64 or bf16, got '" + Flags::echoed_value(dtype) + "'");
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
    if (kv != "f32" && kv != "bf16")
      throw UsageError("--kv-cache: expected f32 or bf16, got '" + Flags::echoed_value(kv) + "'");
    o.kv_bf16 = kv == "bf16";
    if (!o.prefill && !o.share_prefix)
      throw UsageError("--kv-cache needs --prefill or --share-prefix (the caches are theirs)");
    if (o.kv_bf16 && o.precision == Precision::f64)
      throw UsageError("--kv-cache bf16: not available with --dtype f64 (a bf16 cache serves "
                       "float32 forwards)");
  }
  if (o.tensor_parallel && !kHasTensorParallel)
    throw UsageError("--tensor-parallel: this gpt2-attention was built without MPI "
                     "(configure with GPT2_ATTENTION_MPI=ON; Debian: libopenmpi-dev, openmpi-bin)");
  check_distinct_files(o);
  return o;
}

// Opens the checkpoint; errors read "weights W.safetensors: <problem>".
inline safetensors::File open_weights(const std::string& path) {
  try {
    return safetensors::File::open(path);
  } catch (const Error& e) {
    throw Error(in_context("weights", path, e.what()));
  }
}

// Layer `layer`'s attention weights as T (converted when the file stores another dtype).
template <class T>
safetensors::LoadedAttention<T> load_layer(const safetensors::File& file, int layer, Index n_head) {
  try {
    return safetensors::load_attention<T>(file, layer, n_head);
  } catch (const Error& e) {
    throw Error(in_context("weights", file.label(), e.what()));
  }
}

// The results of one run, all in memory, with the shapes they are written with.
template <class T>
struct RunResult {
  RowMatrix<T> out;    // [T, C] or [B * T, C]; left empty (0 x 0) when B * T == 0
  RowMatrix<T> probs;  // [n_head * T, T] or [B * n_head * T, T]; left empty when neither --probs
                       // nor --png asks for it, or when B * T == 0
  std::vector<std::int64_t> out_shape, probs_shape;  // [T, C] or [B, T, C]; [n_head, T, T] or
                                                     // [B, n_head, T, T]
  std::vector<Span> spans;  // with --png: each sequence's real tokens (0 .. T-1 for a 2-D input)
  bool batched = false;     // a 3-D input
};

// Computes everything `o` asks for with sublayer w on the input that was read, in precision T,
// into r. Writes nothing. W: AttentionWeights<T>, or one rank's TensorParallelAttention<T> shard
// (tensor_parallel_run.hpp), whose r.probs are then its own heads' only (heads_here(w) of the
// n_head heads that r.probs_shape, the shape written, counts). r.out and r.probs may come sized
// already (the tensor-parallel run allocates them first); they are resized otherwise.
//
// Resources: when B * T == 0 (an empty sequence or batch, whatever the other dimension: a
// header-only file) the flags are checked against B and T and nothing is allocated or computed:
// Y and P are written from their shapes alone. Otherwise P ([B, n_head, T, T], the largest
// buffer) is allocated first, before Y and before any computation, so that a P too large for
// memory fails at once (std::bad_alloc: "out of memory", exit 1; see main.cpp), not after the
// long computation of Y.
template <class T, class W>
void compute_with(const RunOptions& o, const W& w, const RunInput<T>& input,
                  const std::optional<BatchLayout>& layout, RunResult<T>& r) {
  const Index n_head = w.n_head(), B = input.batch(), T_ = input.tokens();
  r.out_shape = input.shape;
  r.probs_shape = input.batched() ? std::vector<std::int64_t>{B, n_head, T_, T_}
                                  : std::vector<std::int64_t>{n_head, T_, T_};
  r.batched = input.batched();
  if (input.x.rows() == 0) {  // B * T == 0: empty Y and P, nothing to compute
    if (!o.png.empty())
      throw Error("png " + o.png + ": the input " + detail::shape_string(input.shape) +
                  " has no tokens: nothing to draw");
    return;
  }
  if (!o.png.empty())
    for (Index b = 0; b < B; ++b)
      r.spans.push_back(layout ? Span{layout->start(b), layout->length(b)} : Span{0, T_});

  RowMatrix<T>* probs = o.probs.empty() && o.png.empty() ? nullptr : &r.probs;
  if (probs) probs->resize(B * heads_here(w) * T_, T_);  // first: see above
  r.out.resize(input.x.rows(), w.n_embd());
  if (!input.batched()) {
    if (o.prefill && o.kv_bf16) {
      if constexpr (std::is_same<T, float>::value) {
        KVCache<bfloat16> cache(heads_config(w), T_);
        prefill_forward_through<T>(w, input.x, *o.prefill, r.out, probs, cache);
      } else {
        throw UsageError("--kv-cache bf16: needs --dtype f32 or bf16");
      }
    } else if (o.prefill) {
      prefill_forward<T>(w, input.x, *o.prefill, r.out, probs);
    } else {
      Workspace<T> ws = make_workspace(w, T_);
      if (probs)
        attention_forward<T>(w, input.x, ws, r.out, *probs);
      else
        attention_forward<T>(w, input.x, ws, r.out);
    }
  } else {
    if (o.share_prefix && o.kv_bf16) {
      if constexpr (std::is_same<T, float>::value)
        shared_prefix_decode<T, bfloat16>(w, input.x, *layout, *o.share_prefix, o.prefill, r.out);
      else
        throw UsageError("--kv-cache bf16: needs --dtype f32 or bf16");
    } else if (o.share_prefix) {
      shared_prefix_decode<T, T>(w, input.x, *layout, *o.share_prefix, o.prefill, r.out);
    } else if (o.prefill && o.kv_bf16) {
      if constexpr (std::is_same<T, float>::value)
        batch_decode_through<T, KVCache<bfloat16>>(
            w, input.x, *layout, *o.prefill, r.out,
            [](const W& sub, Index n) { return KVCache<bfloat16>(heads_config(sub), n); });
      else
        throw UsageError("--kv-cache bf16: needs --dtype f32 or bf16");
    } else if (o.prefill)
      batch_decode<T>(w, input.x, *layout, *o.prefill, r.out);
    else
      batch_forward<T>(w, input.x, *layout, r.out);
    if (probs) batch_probs<T>(w, input.x, *layout, *probs);
  }
}

// Loads, reads and computes everything `o` asks for, in precision T (float for f32 and bf16, with
// the weights packed in weight_dtype(o.precision); double for f64), in this process. Writes
// nothing.
template <class T>
RunResult<T> compute_run(const RunOptions& o) {
  const safetensors::File file = open_weights(o.weights);
  const safetensors::LoadedAttention<T> loaded = load_layer<T>(file, o.layer, o.n_head);
  const AttentionWeights<T> w = packed_for_kernels(loaded.weights(), weight_dtype(o.precision));
  const RunInput<T> input = read_input<T>(o.input, w.n_embd());
  const std::optional<BatchLayout> layout = input_layout(input.shape, o.starts, o.lengths);
  if (o.share_prefix) check_share_prefix_shape(input.shape, *o.share_prefix);
  RunResult<T> r;
  compute_with<T>(o, w, input, layout, r);
  return r;
}

// Writes Y (and the probabilities) as .npy files of T's dtype and the picture as a PNG, all or
// none. The picture is drawn and encoded first, in memory.
template <class T>
void write_run_result(const RunOptions& o, const RunResult<T>& r) {
  std::vector<unsigned char> png;
  if (!o.png.empty()) {
    try {
      png = encode_png(attention_picture<T>(r.probs, r.probs_shape[r.batched ? 1 : 0],
                                            r.probs_shape.back(), r.spans, r.batched,
                                            o.png_scale));
    } catch (const Error& e) {
      throw Error(in_context("png", o.png, e.what()));
    }
  }
  std::vector<PendingFile> files;
  files.push_back({"output", o.output, [&r](const std::string& path) {
                     return stage_npy<T>(path, r.out.data(), r.out_shape);
                   }});
  if (!o.probs.empty())
    files.push_back({"probs", o.probs, [&r](const std::string& path) {
                       return stage_npy<T>(path, r.probs.data(), r.probs_shape);
                     }});
  if (!o.png.empty())
    files.push_back({"png", o.png, [&png](const std::string& path) { return stage_bytes(path, png); }});
  write_all_or_nothing(files);
}

template <class T>
void run_in_precision(const RunOptions& o) {
  const RunResult<T> result = compute_run<T>(o);
  write_run_result<T>(o, result);
}

// run --tensor-parallel (tensor_parallel_run.hpp, built with gpt2::mpi only).
inline int run_tensor_parallel(const RunOptions& o);

// gpt2-attention run ...; returns the exit status (errors are thrown).
inline int run_command(const Flags& flags) {
  const RunOptions o = parse_run_options(flags);
#if GPT2_CLI_TENSOR_PARALLEL
  if (o.tensor_parallel) return run_tensor_parallel(o);
#endif
  if (o.precision == Precision::f64)
    run_in_precision<double>(o);
  else  // f32, bf16: float32 files, the weights packed in weight_dtype(o.precision)
    run_in_precision<float>(o);
  return 0;
}

}  // namespace gpt2::cli
