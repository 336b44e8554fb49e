// AMX-BF16 in software, for the tests only: the amx kernel level runs on a CPU without AMX (with
// AVX-512 and AVX512-BF16), so its code (tiling, the bf16 splits, the masks, the merges) is run and
// checked on every machine, not only compiled. Its figures say nothing of AMX's speed.
//
// How: tests/CMakeLists.txt compiles every source of an emulated test program with
// `-include support/amx_emulation.hpp`. This header includes <immintrin.h> first, then redefines
// the six tile intrinsics the library uses (_tile_loadconfig, _tile_release, _tile_zero,
// _tile_loadd, _tile_stored, _tile_dpbf16ps) as calls into a per-thread tile file, and defines
// GPT2_ATTENTION_AMX_EMULATED, which makes kernels/cpu.hpp report amx_bf16 and amx_tile wherever
// the CPU has AVX512-BF16 and skip the OS's tile permission.
//
// Semantics:
// - LDTILECFG (64-byte block: byte 0 palette, byte 1 start_row, bytes 16..31 colsb of tiles 0-7 as
//   16-bit values, bytes 48..55 rows of tiles 0-7; every other byte reserved, zero): palette 1
//   configures colsb[t] bytes and rows[t] rows per tile t (both zero, or both non-zero; at most 64
//   bytes and 16 rows); palette 0 releases, as TILERELEASE does. Anything else raises here, as it
//   would fault on the hardware.
// - TILELOADD / TILESTORED: rows[t] rows of colsb[t] bytes, `stride` bytes apart; a load zeroes the
//   rest of the tile; TILEZERO zeroes a tile; TILERELEASE clears the configuration.
// - TDPBF16PS dst, a, b (three different tiles, else #UD): for each row m of dst, for k over a's
//   pairs (colsb(a) / 4), for each column n of dst: dst[m][n] += a[m][2k] b[k][2n], then
//   dst[m][n] += a[m][2k + 1] b[k][2n + 1], each a float32 fused multiply-add rounded to nearest
//   even, with DAZ and FTZ: subnormal inputs (the bf16 values and dst) count as zero, subnormal
//   results are flushed to zero. That is the Intrinsics Guide's pseudo-code for _tile_dpbf16ps;
//   the SDM words it with the even and odd products summed apart before they are added to dst.
//   Neither pins the hardware's order of additions, which is why the library's amx tests hold it
//   to float32 accumulation error, never to bits. (The emulation runs in the caller's MXCSR
//   rounding mode and sets its flags; the hardware does neither. The tests run in the default mode.)
#pragma once

#include <immintrin.h>

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#define GPT2_ATTENTION_AMX_EMULATED 1

namespace gpt2_amx_emulation {

struct TileFile {
  bool configured = false;
  std::uint16_t colsb[8] = {};
  std::uint8_t rows[8] = {};
  alignas(64) unsigned char data[8][16][64] = {};
};

inline TileFile& tiles() {
  thread_local TileFile file;
  return file;
}

inline void check(int t, const char* what) {
  if (t < 0 || t > 7) throw std::logic_error(std::string("AMX emulation: ") + what + ": no tile register");
  if (!tiles().configured) throw std::logic_error(std::string("AMX emulation: ") + what + " before LDTILECFG");
}

inline void release();

inline void loadconfig(const void* config) {
  const unsigned char* c = static_cast<const unsigned char*>(config);
  if (c[0] == 0) {
    release();
    return;
  }
  if (c[0] != 1) throw std::logic_error("AMX emulation: LDTILECFG with a palette other than 0 or 1");
  for (int i = 2; i < 64; ++i) {
    const bool reserved = i < 16 || (i >= 32 && i < 48) || i >= 56;
    if (reserved && c[i] != 0) throw std::logic_error("AMX emulation: LDTILECFG: a reserved byte is not zero");
  }
  TileFile& f = tiles();
  for (int t = 0; t < 8; ++t) {
    std::uint16_t colsb;
    std::memcpy(&colsb, c + 16 + 2 * t, 2);
    const std::uint8_t rows = c[48 + t];
    if (colsb > 64 || rows > 16)
      throw std::logic_error("AMX emulation: LDTILECFG: a tile of more than 16 rows or 64 bytes a row");
    if ((colsb == 0) != (rows == 0))
      throw std::logic_error("AMX emulation: LDTILECFG: a tile with rows but no columns, or columns but no rows");
    f.colsb[t] = colsb;
    f.rows[t] = rows;
  }
  std::memset(f.data, 0, sizeof f.data);
  f.configured = true;
}

inline void release() { tiles() = TileFile{}; }

inline void zero(int t) {
  check(t, "TILEZERO");
  std::memset(tiles().data[t], 0, sizeof tiles().data[t]);
}

inline void loadd(int t, const void* base, long stride) {
  check(t, "TILELOADD");
  TileFile& f = tiles();
  std::memset(f.data[t], 0, sizeof f.data[t]);
  for (int r = 0; r < f.rows[t]; ++r)
    std::memcpy(f.data[t][r], static_cast<const unsigned char*>(base) + r * stride, f.colsb[t]);
}

inline void stored(int t, void* base, long stride) {
  check(t, "TILESTORED");
  const TileFile& f = tiles();
  for (int r = 0; r < f.rows[t]; ++r)
    std::memcpy(static_cast<unsigned char*>(base) + r * stride, f.data[t][r], f.colsb[t]);
}

// Lanes n = 0..15: the bf16 at position 2n + odd of 32 packed bf16, as float32 (subnormals as 0).
__attribute__((target("avx512f"))) inline __m512 bf16_lanes(__m512i pairs, bool odd) {
  const __m512i bits = odd ? _mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))
                           : _mm512_slli_epi32(pairs, 16);
  const __mmask16 subnormal = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x7f800000)) ^ 0xffff;
  return _mm512_castsi512_ps(_mm512_maskz_mov_epi32(static_cast<__mmask16>(~subnormal), bits));
}

__attribute__((target("avx512f"))) inline __m512 flush_subnormals(__m512 x) {
  const __m512 magnitude = _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
  const __mmask16 tiny = _mm512_cmp_ps_mask(magnitude, _mm512_set1_ps(FLT_MIN), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(x, tiny, _mm512_setzero_ps());
}

__attribute__((target("avx512f"))) inline void dpbf16ps(int dst, int a, int b) {
  check(dst, "TDPBF16PS");
  check(a, "TDPBF16PS");
  check(b, "TDPBF16PS");
  if (dst == a || dst == b || a == b) throw std::logic_error("AMX emulation: TDPBF16PS on the same tile twice (#UD)");
  TileFile& f = tiles();
  if (f.colsb[dst] != 64 || f.colsb[b] != 64 || f.rows[a] != f.rows[dst] || f.colsb[a] / 4 != f.rows[b])
    throw std::logic_error("AMX emulation: TDPBF16PS: tile shapes that do not fit (this emulation "
                           "covers 64-byte rows of dst and b)");
  const int pairs = f.colsb[a] / 4;
  for (int m = 0; m < f.rows[dst]; ++m) {
    __m512 acc = flush_subnormals(_mm512_loadu_ps(f.data[dst][m]));  // DAZ
    for (int k = 0; k < pairs; ++k) {
      std::uint32_t pair;
      std::memcpy(&pair, f.data[a][m] + 4 * k, 4);
      const __m512i a_pair = _mm512_set1_epi32(static_cast<int>(pair));
      const __m512i b_row = _mm512_loadu_si512(f.data[b][k]);
      acc = flush_subnormals(_mm512_fmadd_ps(bf16_lanes(a_pair, false), bf16_lanes(b_row, false), acc));
      acc = flush_subnormals(_mm512_fmadd_ps(bf16_lanes(a_pair, true), bf16_lanes(b_row, true), acc));
    }
    _mm512_storeu_ps(f.data[dst][m], acc);
  }
}

}  // namespace gpt2_amx_emulation

#undef _tile_loadconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) ::gpt2_amx_emulation::loadconfig(config)
#define _tile_release() ::gpt2_amx_emulation::release()
#define _tile_zero(t) ::gpt2_amx_emulation::zero(t)
#define _tile_loadd(t, base, stride) ::gpt2_amx_emulation::loadd((t), (base), static_cast<long>(stride))
#define _tile_stored(t, base, stride) ::gpt2_amx_emulation::stored((t), (base), static_cast<long>(stride))
#define _tile_dpbf16ps(dst, a, b) ::gpt2_amx_emulation::dpbf16ps((dst), (a), (b))
