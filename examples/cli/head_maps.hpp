// Attention maps put in their place in the output probabilities with no second buffer.
//
// The probabilities of `run` are [n_head, T, T] per sequence: one block of n_head * T * T values
// (row-major, head h's [T, T] map at h * T * T). A forward over a sequence's l real tokens (rows
// and keys s .. s + l - 1 of its map, s + l <= T) gives its maps as one contiguous
// [n_head * l, l] matrix (rows h*l .. h*l + l - 1: head h). Instead of computing that into a
// scratch matrix and copying, the forward writes it into the block itself, at maps_in_tail(); then
// spread_maps() moves each row to its place, front to back, and zeros everything else. When the
// maps fill the block (s = 0, l = T) they are already in place and nothing moves.
//
// Why front to back is safe: every row's destination starts at or before its source. Row i of
// head h goes from tail + (h*l + i)*l to (h*T + s + i)*T + s, where tail = n_head*(T^2 - l^2);
//   source - destination = (n_head - h)(T^2 - l^2) - s(T + 1) - i(T - l)
//                       >= (T^2 - l^2) - (T - l)(T + 1) - (l - 1)(T - l) = 0
// (n_head - h >= 1, s <= T - l, i <= l - 1). So a row, moved with memmove, overwrites only bytes
// already moved or its own source, and every later source lies at or beyond its source + l.
#pragma once

#include <algorithm>
#include <cstring>

#include "gpt2/types.hpp"

namespace gpt2::cli {

// Where to compute the contiguous [n_head * l, l] maps: the last n_head * l * l values of the
// block of n_head * T * T values at `block`.
template <class T>
Eigen::Map<RowMatrix<T>> maps_in_tail(T* block, Index n_head, Index T_, Index l) {
  return Eigen::Map<RowMatrix<T>>(block + n_head * (T_ * T_ - l * l), n_head * l, l);
}

// Moves the maps that maps_in_tail(block, n_head, T_, l) holds to rows and columns s .. s + l - 1
// of each head's [T, T] map in the block, and sets every other value of the block to 0.
template <class T>
void spread_maps(T* block, Index n_head, Index T_, Index s, Index l) {
  const T* tail = block + n_head * (T_ * T_ - l * l);
  const std::size_t row_bytes = static_cast<std::size_t>(l) * sizeof(T);
  if (l < T_)
    for (Index h = 0; h < n_head; ++h)
      for (Index i = 0; i < l; ++i)
        std::memmove(block + (h * T_ + s + i) * T_ + s, tail + (h * l + i) * l, row_bytes);
  // The rest, once nothing is left to move: rows before s and from s + l on, and the columns
  // around s .. s + l - 1 of the rows between.
  for (Index h = 0; h < n_head; ++h) {
    T* map = block + h * T_ * T_;
    std::fill(map, map + s * T_, T(0));
    for (Index i = s; i < s + l; ++i) {
      std::fill(map + i * T_, map + i * T_ + s, T(0));
      std::fill(map + i * T_ + s + l, map + (i + 1) * T_, T(0));
    }
    std::fill(map + (s + l) * T_, map + T_ * T_, T(0));
  }
}

}  // namespace gpt2::cli
