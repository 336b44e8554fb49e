// What the rest of the CLI needs of its pictures (--png): how probabilities become colours, the
// real tokens of a sequence, and the whole picture as PNG bytes. The drawing (attention_picture.hpp)
// and the encoding (png_image.hpp) are compiled in picture.cpp alone.
#pragma once

#include <string>
#include <vector>

#include "gpt2/types.hpp"

namespace gpt2::cli {

// How a probability becomes a colour: viridis(p), or viridis(sqrt(p)).
enum class ColourScale { linear, sqrt };

// The real tokens of one sequence: rows and keys start .. start + length - 1 of its maps.
struct Span {
  Index start = 0, length = 0;
};

// encode_png(attention_picture<T>(probs, n_head, T_, spans, batched, scale, title)): the PNG file
// of the maps probs [B * n_head * T, T] (B = spans.size()) under `title`, as bytes. Throws
// gpt2::Error ("png: ...") when the picture cannot be drawn or encoded. T: float or double
// (picture.cpp).
template <class T>
std::vector<unsigned char> attention_png(const ConstMatrixRef<T>& probs, Index n_head, Index T_,
                                         const std::vector<Span>& spans, bool batched,
                                         ColourScale scale, const std::string& title);

}  // namespace gpt2::cli
