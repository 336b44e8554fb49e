// gpt2-attention run's computation (run_command.hpp has its flags): what one run produces, in
// memory, and how it is written. The forwards themselves (compute_with, run_forwards.hpp) are
// compiled in translation units of their own, one per precision (run_float.cpp, run_double.cpp);
// the picture is drawn and encoded in picture.cpp.
#pragma once

#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "args.hpp"
#include "checkpoint.hpp"
#include "gpt2/attention.hpp"
#include "gpt2/detail/io_util.hpp"
#include "output_files.hpp"
#include "packed_weights.hpp"
#include "picture.hpp"
#include "run_command.hpp"
#include "run_input.hpp"
#include "shared_prefix_run.hpp"  // check_share_prefix_shape
#include "sublayer.hpp"

namespace gpt2::cli {

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
  std::string warning;      // non_finite_warning (run_input.hpp): printed once the files are written
};

// Computes everything `o` asks for with sublayer w on the input that was read, in precision T,
// into r. Writes nothing. w: the whole model, or one rank's TensorParallelAttention<T> shard
// (tensor_parallel_run.hpp), whose r.probs are then its own heads' only (w.heads_here() of the
// n_head heads that r.probs_shape, the shape written, counts). r.out and r.probs may come sized
// already (the tensor-parallel run allocates them first); they are resized otherwise.
//
// Resources: when B * T == 0 (an empty sequence or batch, whatever the other dimension: a
// header-only file) the flags are checked against B and T and nothing is allocated or computed:
// Y and P are written from their shapes alone. Otherwise P ([B, n_head, T, T], the largest
// buffer) is allocated first, before Y and before any computation, so that a P too large for
// memory fails at once (std::bad_alloc: "out of memory", exit 1; see main.cpp), not after the
// long computation of Y.
//
// Defined in run_forwards.hpp; instantiated for T = float (run_float.cpp) and double
// (run_double.cpp), once for every kind of sublayer.
template <class T>
void compute_with(const RunOptions& o, const RunSublayer<T>& w, const RunInput<T>& input,
                  const std::optional<BatchLayout>& layout, RunResult<T>& r);

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
  r.warning = non_finite_warning(o.input, input, layout);
  compute_with<T>(o, SublayerOf<T, AttentionWeights<T>>(w), input, layout, r);
  return r;
}

// The title of run's picture: "X.npy, layer 0, T = 9", or "X.npy, layer 0, B = 3, T = 6".
template <class T>
std::string picture_title(const RunOptions& o, const RunResult<T>& r) {
  return o.input + ", layer " + std::to_string(o.layer) +
         (r.batched ? ", B = " + std::to_string(r.probs_shape[0]) : std::string()) +
         ", T = " + std::to_string(r.probs_shape.back());
}

// Writes Y (and the probabilities) as .npy files of T's dtype and the picture as a PNG, all or
// none. The picture is drawn and encoded first, in memory.
template <class T>
void write_run_result(const RunOptions& o, const RunResult<T>& r) {
  std::vector<unsigned char> png;
  if (!o.png.empty()) {
    try {
      png = attention_png<T>(r.probs, r.probs_shape[r.batched ? 1 : 0], r.probs_shape.back(),
                             r.spans, r.batched, o.png_scale, picture_title(o, r));
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

// Prints r.warning, if any, as one line on stderr: "gpt2-attention: warning: ...". After the files
// are written, so that a run that fails prints its error alone.
template <class T>
void print_warning(const RunResult<T>& r) {
  if (!r.warning.empty()) std::cerr << "gpt2-attention: warning: " << one_line(r.warning) << std::endl;
}

template <class T>
void run_in_precision(const RunOptions& o) {
  const RunResult<T> result = compute_run<T>(o);
  write_run_result<T>(o, result);
  print_warning(result);
}

// The reading and writing both runs share (a plain run, run_command.cpp, and each rank of the
// tensor-parallel run, tensor_parallel_run.cpp) are compiled once, in run_command.cpp.
#define GPT2_CLI_RUN_IO(EXTERN, T)                                                               \
  EXTERN template RunInput<T> read_input<T>(const std::string&, Index);                         \
  EXTERN template std::string non_finite_warning<T>(const std::string&, const RunInput<T>&,      \
                                                    const std::optional<BatchLayout>&);          \
  EXTERN template void write_run_result<T>(const RunOptions&, const RunResult<T>&);             \
  EXTERN template void print_warning<T>(const RunResult<T>&);
#ifndef GPT2_CLI_RUN_IO_HERE
GPT2_CLI_RUN_IO(extern, float)
GPT2_CLI_RUN_IO(extern, double)
#endif

}  // namespace gpt2::cli
