// The AMX attention core's tile rows and scratch size (kernels/amx_attention.hpp): plain constants,
// no intrinsics, so that the math layer can size its tiles and buffers without the kernels.
#pragma once

#include "gpt2/types.hpp"

namespace gpt2::kernels::amx {

inline constexpr Index kAmxTileMaxRows = 256;  // query rows of one AMX tile (4 groups of 64)
// Tiles with fewer rows run the float32 core (amx::attention_tile).
inline constexpr Index kAmxMinRows = 16;

// Scratch floats the AMX core uses for head_dim D (independent of the number of keys).
inline constexpr Index attention_floats(Index D) {
  return 2 * kAmxTileMaxRows * D / 2 + 4 * 64 * D / 2 + 64 * 64 + 2 * 64 * 64 / 2 + 64 * D +
         kAmxTileMaxRows * D + 3 * kAmxTileMaxRows + 4 * 64 + 2 * 64 * D;
}

// Whether the AMX core takes this head size (else the float32 core runs): a multiple of 32, up to
// 256.
inline bool attention_fits(Index head_dim) { return head_dim % 32 == 0 && head_dim <= 256; }

}  // namespace gpt2::kernels::amx
