// What the amx level's two kernels share (kernels/amx.hpp's product, kernels/amx_attention.hpp's
// core): the target attribute of their functions and the tile configuration they load.
#pragma once

#include <cstdint>

#include "gpt2/kernels/avx512.hpp"  // first: <immintrin.h> under its GCC 12 workaround
#include "gpt2/kernels/cpu.hpp"

#if GPT2_KERNELS_HAVE_AMX
#define GPT2_KERNEL_AMX \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16,avx2,fma")))

namespace gpt2::kernels::amx {

// The tile configuration (palette 1): tmm0-3 C (16 x 64 bytes), tmm4-5 A (16 rows x 32 bf16),
// tmm6-7 B (16 pair rows x 16 columns).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

GPT2_KERNEL_AMX inline void load_tile_config() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

}  // namespace gpt2::kernels::amx
#endif  // GPT2_KERNELS_HAVE_AMX
