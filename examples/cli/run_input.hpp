// The input of gpt2-attention run: X [T, C] or [B, T, C] from a .npy file, and which rows of a
// batch are real tokens (--starts, --lengths).
//
//   X [T, C]      one sequence; --starts and --lengths are errors
//   X [B, T, C]   B sequences padded to T tokens, read as the row-major [B * T, C]; sequence b's
//                 real tokens are its rows starts[b] .. starts[b] + lengths[b] - 1
//                 (default starts 0; default lengths T - starts[b]: every row real)
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "args.hpp"
#include "gpt2/batch.hpp"
#include "gpt2/detail/io_util.hpp"
#include "gpt2/error.hpp"
#include "gpt2/npy.hpp"
#include "gpt2/types.hpp"

namespace gpt2::cli {

// X as read: the data as a matrix, and the shape the file gave it.
template <class T>
struct RunInput {
  RowMatrix<T> x;                    // [T, C], or [B * T, C] (the row-major [B, T, C])
  std::vector<std::int64_t> shape;   // {T, C} or {B, T, C}

  bool batched() const { return shape.size() == 3; }
  Index batch() const { return batched() ? static_cast<Index>(shape[0]) : 1; }           // B
  Index tokens() const { return static_cast<Index>(shape[shape.size() - 2]); }          // T
};

// X [T, n_embd] or [B, T, n_embd] from a float32 or float64 .npy file, converted to T. Read errors
// are passed on in context ("input <path>: <problem>"); an array of another rank is a ShapeError
// naming the shapes run accepts and the one it got: "got [64]" for 1-D, "got 4 dimensions (shape
// [1, 2, 3, 64])" for 4-D or more (npy::read accepts up to npy::max_dims; beyond, its own error).
template <class T>
RunInput<T> read_input(const std::string& path, Index n_embd) {
  npy::Array array;
  try {
    array = npy::read(path);
  } catch (const Error& e) {
    throw Error(in_context("input", path, e.what()));
  }
  const std::string C = std::to_string(n_embd);
  const std::vector<std::int64_t> shape = array.shape;
  if (shape.size() != 2 && shape.size() != 3) {
    const std::string got = detail::shape_string(shape);
    throw ShapeError("input " + path + ": expected shape [T, C] or [B, T, C] with C = " + C +
                     ", got " +
                     (shape.size() > 3
                          ? std::to_string(shape.size()) + " dimensions (shape " + got + ")"
                          : got));
  }
  if (shape.back() != n_embd)
    throw ShapeError("input " + path + ": expected shape " +
                     (shape.size() == 2 ? "[T, " + C + "]" : "[B, T, " + C + "]") + ", got " +
                     detail::shape_string(shape));
  if (shape.size() == 3) array.shape = {shape[0] * shape[1], shape[2]};  // same bytes, as [B*T, C]
  return {array.to_matrix<T>(), shape};
}

// The real rows of a batched input: --starts and --lengths checked against its shape.
// ShapeError naming the flag, what was expected and what was got, when either was given for a
// 2-D input, has a count other than B, or a value beyond T (a start) or T - start (a length).
// Returns the layout of a 3-D input with B * T > 0; nothing for a 2-D input or an empty batch
// (B = 0 or T = 0: nothing to compute). The checks allocate nothing sized by B or T (the lists are
// only compared with them), so a tiny header-only file of shape [1e8, 0, C] costs nothing; the
// layout (2 B indices) is built only when B * T > 0, where B * T * C values were read from the file.
inline std::optional<BatchLayout> input_layout(const std::vector<std::int64_t>& shape,
                                               const std::optional<std::vector<long long>>& starts,
                                               const std::optional<std::vector<long long>>& lengths) {
  const std::string of_input = "input " + detail::shape_string(shape);
  const auto refuse_unless_batched = [&](const char* flag, bool given) {
    if (given && shape.size() != 3)
      throw ShapeError(std::string(flag) +
                       ": expected a 3-D input [B, T, C] (one value per sequence), got " + of_input);
  };
  refuse_unless_batched("--starts", starts.has_value());
  refuse_unless_batched("--lengths", lengths.has_value());
  if (shape.size() != 3) return std::nullopt;

  const Index B = static_cast<Index>(shape[0]), T_ = static_cast<Index>(shape[1]);
  const auto check_count = [&](const char* flag, const std::vector<long long>& values) {
    if (values.size() != static_cast<std::size_t>(B))
      throw ShapeError(std::string(flag) + ": expected " + std::to_string(B) +
                       " values (one per sequence of " + of_input + "), got " +
                       std::to_string(values.size()));
  };
  // Sequence b's start (after the count check): --starts or 0.
  const auto start_of = [&](std::size_t b) -> Index {
    return starts ? static_cast<Index>((*starts)[b]) : 0;
  };
  if (starts) {
    check_count("--starts", *starts);
    for (std::size_t b = 0; b < starts->size(); ++b)
      if ((*starts)[b] > T_)
        throw ShapeError("--starts: expected sequence " + std::to_string(b) + "'s start in [0, " +
                         std::to_string(T_) + "] (T of " + of_input + "), got " +
                         std::to_string((*starts)[b]));
  }
  if (lengths) {
    check_count("--lengths", *lengths);
    for (std::size_t b = 0; b < lengths->size(); ++b) {
      const Index s = start_of(b), max = T_ - s;
      if ((*lengths)[b] > max)
        throw ShapeError("--lengths: expected sequence " + std::to_string(b) + "'s length in [0, " +
                         std::to_string(max) + "] (" +
                         (starts ? "T - start = " + std::to_string(T_) + " - " + std::to_string(s) +
                                       "; " + of_input
                                 : "T of " + of_input) +
                         "), got " + std::to_string((*lengths)[b]));
    }
  }
  if (B == 0 || T_ == 0) return std::nullopt;

  std::vector<Index> s(static_cast<std::size_t>(B)), l(static_cast<std::size_t>(B));
  for (std::size_t b = 0; b < s.size(); ++b) {
    s[b] = start_of(b);
    l[b] = lengths ? static_cast<Index>((*lengths)[b]) : T_ - s[b];
  }
  return BatchLayout(T_, std::move(s), std::move(l));
}

// The warning run prints on stderr (exit status still 0) when a real row of X holds a NaN or an
// infinity; "" when none does. Attention is causal, so such a value makes its row's q, k and v
// NaN and, through the scores, every output row (and probability row) of its sequence from there
// on; the rows before it are untouched. That is what every path computes (plain, --prefill, the
// KV caches, batches, --share-prefix, every kernel level, f32, f64 and bf16; infinities give NaN
// as NaN does). Padded rows of a batch are never read and are not looked at.
//   X [T, C]:    "input X.npy: non-finite value nan at row 3, column 17 (1 in all): output rows
//                 3 to 7 (and their probabilities) are NaN: attention is causal, so every row from
//                 3 on attends to row 3"
//   X [B, T, C]: "... at x[1, 3, 17] (2 in all, in 2 of 3 sequences): output rows 3 to 7 of
//                 sequence 1 (and their probabilities) are NaN, as are every such sequence's rows
//                 from its first non-finite one on: attention is causal"
template <class T>
std::string non_finite_warning(const std::string& path, const RunInput<T>& input,
                               const std::optional<BatchLayout>& layout) {
  const auto name = [](T v) -> std::string {
    return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
  };
  const Index B = input.batch(), T_ = input.tokens(), C = input.x.cols();
  if (input.x.rows() == 0) return "";
  long long count = 0, sequences = 0;
  Index first_b = -1, first_t = 0, first_c = 0, first_end = 0;
  for (Index b = 0; b < B; ++b) {
    const Index start = layout ? layout->start(b) : 0, end = start + (layout ? layout->length(b) : T_);
    bool seen = false;
    for (Index t = start; t < end; ++t)
      for (Index c = 0; c < C; ++c) {
        const T v = input.x(b * T_ + t, c);
        if (std::isfinite(v)) continue;
        ++count;
        if (!seen) ++sequences;
        seen = true;
        if (first_b < 0) first_b = b, first_t = t, first_c = c, first_end = end;
      }
  }
  if (count == 0) return "";
  const T v = input.x(first_b * T_ + first_t, first_c);
  const std::string t = std::to_string(first_t);
  const std::string rows = first_end - 1 == first_t ? "row " + t
                                                    : "rows " + t + " to " + std::to_string(first_end - 1);
  if (!input.batched())
    return "input " + path + ": non-finite value " + name(v) + " at row " + t + ", column " +
           std::to_string(first_c) + " (" + std::to_string(count) +
           " in all): output " + rows + " (and their probabilities) are NaN: attention is causal, "
           "so every row from " + t + " on attends to row " + t;
  return "input " + path + ": non-finite value " + name(v) + " at x[" + std::to_string(first_b) +
         ", " + t + ", " + std::to_string(first_c) + "] (" + std::to_string(count) + " in all, in " +
         std::to_string(sequences) + " of " + std::to_string(B) + " sequences): output " + rows +
         " of sequence " + std::to_string(first_b) + " (and their probabilities) are NaN, as are "
         "every such sequence's rows from its first non-finite one on: attention is causal";
}

}  // namespace gpt2::cli
