// The kernel layer's one interface: which instruction-set level runs the float kernels, chosen once
// at run time from the CPU (cpuid and the OS's saved state, kernels/cpu.hpp), reported, and
// forceable for tests and reproducibility.
//
// Levels, lowest first (each runs on any CPU that has its features; no compiler flag is needed:
// the kernels carry per-function target attributes):
//   generic  Eigen's own kernels, vectorized for whatever the program is compiled for (SSE2 on a
//            plain x86-64 build); also the only level of double, of MSVC and of non-x86 builds
//   avx2     AVX2 + FMA, 256-bit (kernels/avx2.hpp)
//   avx512   AVX-512 F/BW/DQ/VL, 512-bit (kernels/avx512.hpp)
//   avx512_bf16  avx512 plus AVX512-BF16: bf16 products on VDPBF16PS (kernels/avx512_bf16.hpp),
//            and with bf16 weights the attention core's too (kernels/avx512_bf16_attention.hpp);
//            its float32 kernels are avx512's
//   amx      avx512_bf16 plus AMX-BF16 tiles: bf16 products on TDPBF16PS (kernels/amx.hpp); on
//            Linux the process must be granted the tile data (arch_prctl, asked once): a refusal
//            makes the level unavailable, with the reason in kernel_info(). Float32 kernels: avx512's
//
// bf16 weights (pack_weights(w, WeightDtype::bf16)) run at every level: generic, avx2 and avx512
// widen them to float32 (float32 math, half the bytes); avx512_bf16 and amx round the activations
// to bf16 for the instruction and accumulate in float32.
//
// Every translation unit of a program should be compiled with the same -m flags (as for Eigen
// itself): the linker keeps one copy of each inline kernel, and a copy compiled with -mavx512f
// could carry AVX-512 instructions into the avx2 level.
//
// The level in use is the highest the CPU has, unless forced: by the environment variable
// GPT2_ATTENTION_ISA=generic|avx2|avx512|avx512_bf16|amx (read once, at the first use), or by set_isa() (which wins
// over the environment). A level the CPU lacks, or an unknown name, is a ConfigError naming the
// levels available: never a silent fallback.
//
// The float kernels' interface (all row-major; strides in floats; C never overlaps A or B):
//   gemm(M, N, K, A, lda, B, ldb, C, ldc, pack)      C[M, N] += A[M, K] B[K, N] (B packed per call
//                                                    into pack: kernels::kPackFloats floats,
//                                                    64-byte aligned)
//   gemm_packed(M, N, K, A, lda, Bp, C, ldc)         the same, B in the panel layout (pack.hpp;
//                                                    Bp 64-byte aligned)
//   row_times_matrix(N, K, a, B, ldb, c)             c[1, N] += a[1, K] B[K, N]
//   row_times_packed(N, K, a, Bp, c)                 the same, B in the panel layout
//   row_times_transposed(N, K, a, B, ldb, c)         c[1, N] = a[1, K] B[N, K]^T (q k^T of a row)
//   softmax_row(row, n, n_keys, scale)               x = row * scale; row[:n] = softmax(x[:n]);
//                                                    row[n:n_keys] = 0
//   attention_tile(tile)                             the fused causal attention of a tile of query
//                                                    rows over paged keys and values (online
//                                                    softmax over 64-key blocks; the arithmetic of
//                                                    kernels/attention_tile.hpp)
//   row_partials(tile, b0, b1, parts)                 a one-row tile's per-block partials over key
//                                                    blocks [b0, b1) (a decode step split over
//                                                    threads)
//   merge_row_partials(tile, n_blocks, parts)        its output from all of them, merged in order
//                                                    (the tile's own bits)
//   row_partials_kv_bf16(tile, b0, b1, parts)         row_partials over keys and values held as
//                                                    bf16 bits (a KVCacheBF16's decode step),
//                                                    bitwise row_partials on the widened values
//                                                    (widened in registers)
// with these bit-for-bit contracts, identical at avx2 and avx512 (so the two levels give the same
// bits), checked by tests/test_kernels.cpp against the scalar emulation in tests/kernel_emulation.hpp:
// - the gemm family: every element of C is one chain of fused multiply-adds in k order, starting
//   from C's value: whatever M, the blocking or the column split, a row gives the same bits;
// - row_times_transposed: 16 lane partial sums (lane l: d = l mod 16, in order, from +0), added by
//   the tree of avx512::lane_sums16;
// - softmax_row: max from -inf (NaN if any x is NaN); e = kexp(x - max), a Cephes-style exp
//   (within 2 ulp; 0 below -87.33654); 16 lane sums of e (lane j mod 16, in order, from +0) added
//   by halves (8, 4, 2, 1); row = e * (1 / sum);
// - attention_tile: every step of a row as kernels/attention_tile.hpp writes it (its key blocks sit
//   at absolute positions, so a row gives the same bits in any tile, chunk or batch).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpt2/error.hpp"
#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/bf16.hpp"
#include "gpt2/kernels/cpu.hpp"
#include "gpt2/kernels/pack.hpp"
#include "gpt2/types.hpp"

// Compiling the kernels once. By default every translation unit that uses the library compiles
// the kernels of every level (header-only). A program of many translation units can instead define
// GPT2_ATTENTION_SEPARATE_KERNELS in all of them and, in exactly one, also
// GPT2_ATTENTION_KERNELS_IMPLEMENTATION before including any gpt2 header: the three entry points
// below (float_kernels, bf16_gemm, bf16_attention_tile) are then only declared elsewhere and
// defined in that one, which alone compiles the vector levels' kernels (generic's, Eigen's, stay in
// every file). The code that runs is the same.
#if defined(GPT2_ATTENTION_KERNELS_IMPLEMENTATION) && !defined(GPT2_ATTENTION_SEPARATE_KERNELS)
#error "GPT2_ATTENTION_KERNELS_IMPLEMENTATION needs GPT2_ATTENTION_SEPARATE_KERNELS (in every translation unit)"
#endif
#if defined(GPT2_ATTENTION_SEPARATE_KERNELS) && !defined(GPT2_ATTENTION_KERNELS_IMPLEMENTATION)
#define GPT2_KERNELS_DECLARED_ONLY 1
#else
#define GPT2_KERNELS_DECLARED_ONLY 0
#include "gpt2/kernels/amx.hpp"
#include "gpt2/kernels/amx_attention.hpp"
#include "gpt2/kernels/avx2.hpp"
#include "gpt2/kernels/avx2_attention.hpp"
#include "gpt2/kernels/avx2_bf16.hpp"
#include "gpt2/kernels/avx512.hpp"
#include "gpt2/kernels/avx512_attention.hpp"
#include "gpt2/kernels/avx512_bf16.hpp"
#include "gpt2/kernels/avx512_bf16_attention.hpp"
#endif
// In the separate mode the entry points live in an inline namespace of their own: a program whose
// implementation file is missing fails to link (rather than linking through some header-only
// file's inline copies), and they are declared before they are defined (-Wmissing-declarations).
#if defined(GPT2_ATTENTION_SEPARATE_KERNELS)
#define GPT2_KERNELS_ENTRY
#define GPT2_KERNELS_ENTRY_BEGIN inline namespace separate_kernels {
#define GPT2_KERNELS_ENTRY_END }
#else
#define GPT2_KERNELS_ENTRY inline
#define GPT2_KERNELS_ENTRY_BEGIN
#define GPT2_KERNELS_ENTRY_END
#endif

namespace gpt2 {

// The kernel levels, lowest first.
enum class Isa : int { generic = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3, amx = 4 };

inline constexpr Isa kAllIsas[] = {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512_bf16,
                                   Isa::amx};

// "generic", "avx2", "avx512", "avx512_bf16", "amx": the names GPT2_ATTENTION_ISA and set_isa take.
inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512_bf16: return "avx512_bf16";
    case Isa::amx: return "amx";
    default: return "generic";
  }
}

// The float32 kernels a level runs: avx512_bf16 and amx add bf16 products to avx512's.
inline Isa float_level(Isa isa) {
  return isa == Isa::avx512_bf16 || isa == Isa::amx ? Isa::avx512 : isa;
}

// Whether the CPU (and OS) has what the level needs, and why not (empty when it has).
inline std::string isa_missing(Isa isa) {
  const kernels::CpuFeatures& f = kernels::cpu_features();
  const bool avx512 = GPT2_KERNELS_HAVE_AVX512 && f.avx2 && f.fma && f.avx512f && f.avx512bw &&
                      f.avx512dq && f.avx512vl;
  switch (isa) {
    case Isa::generic: return "";
    case Isa::avx2: return GPT2_KERNELS_HAVE_AVX2 && f.avx2 && f.fma ? "" : "avx2";
    case Isa::avx512: return avx512 ? "" : "avx512";
    case Isa::avx512_bf16: return avx512 && f.avx512_bf16 ? "" : "avx512_bf16";
    case Isa::amx:
      if (!(GPT2_KERNELS_HAVE_AMX && avx512 && f.avx512_bf16 && f.amx_bf16 && f.amx_tile))
        return "amx";
      if (!kernels::amx_permission().granted) return "amx (" + kernels::amx_permission().reason + ")";
      return "";
  }
  return "unknown";
}

// Whether this build and this CPU (and OS) can run the level.
inline bool isa_supported(Isa isa) { return isa_missing(isa).empty(); }

// The levels this machine can run, lowest first (generic always).
inline std::vector<Isa> available_isas() {
  std::vector<Isa> levels;
  for (Isa isa : kAllIsas)
    if (isa_supported(isa)) levels.push_back(isa);
  return levels;
}

// The highest level this machine can run (found once; no allocation after the first call).
inline Isa best_isa() {
  static const Isa best = available_isas().back();
  return best;
}

namespace detail {

inline std::string isa_list(const std::vector<Isa>& levels) {
  std::string s;
  for (Isa isa : levels) s += (s.empty() ? "" : ", ") + std::string(isa_name(isa));
  return s;
}

inline std::vector<Isa> all_isas() { return {std::begin(kAllIsas), std::end(kAllIsas)}; }

// The level named `name`, or a ConfigError (prefixed with `who`) for an unknown name or a level
// this machine cannot run.
inline Isa parse_isa(const std::string& name, const std::string& who) {
  for (Isa isa : kAllIsas) {
    if (name != isa_name(isa)) continue;
    if (!isa_supported(isa))
      throw ConfigError(who + ": the CPU has no " + isa_missing(isa) + " (levels available here: " +
                        isa_list(available_isas()) + "; cpu: " + kernels::cpu_features().names() +
                        ")");
    return isa;
  }
  throw ConfigError(who + ": unknown kernel level '" + name + "' (expected one of " +
                    isa_list(all_isas()) + "; available here: " + isa_list(available_isas()) +
                    ")");
}

// GPT2_ATTENTION_ISA, read once: unset (empty), a level, or the error it gives.
struct IsaFromEnvironment {
  bool set = false;
  Isa isa = Isa::generic;
  std::string error;
};

inline const IsaFromEnvironment& isa_from_environment() {
  static const IsaFromEnvironment choice = [] {
    IsaFromEnvironment c;
    const char* value = std::getenv("GPT2_ATTENTION_ISA");
    if (value == nullptr || *value == '\0') return c;
    c.set = true;
    try {
      c.isa = parse_isa(value, "GPT2_ATTENTION_ISA");
    } catch (const ConfigError& e) {
      c.error = e.what();
    }
    return c;
  }();
  return choice;
}

// The level set_isa() forced (-1: none).
inline std::atomic<int>& forced_isa() {
  static std::atomic<int> level{-1};
  return level;
}

}  // namespace detail

// The level the kernels run at: set_isa()'s, else GPT2_ATTENTION_ISA's, else best_isa().
// Throws ConfigError when GPT2_ATTENTION_ISA names an unknown level or one the CPU lacks (and
// set_isa() has not overridden it).
inline Isa active_isa() {
  const int forced = detail::forced_isa().load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<Isa>(forced);
  const detail::IsaFromEnvironment& env = detail::isa_from_environment();
  if (!env.error.empty()) throw ConfigError(env.error);
  return env.set ? env.isa : best_isa();
}

// Forces the kernels to `isa` from now on, for every thread (ConfigError if the machine cannot
// run it). Call it between forwards, not while one runs. Results within one level are bitwise
// reproducible; across levels they agree within the float32 bar.
inline void set_isa(Isa isa) {
  const int level = static_cast<int>(isa);
  if (level < 0 || level > static_cast<int>(Isa::amx))
    throw ConfigError("set_isa: unknown kernel level " + std::to_string(level) +
                      " (expected one of " + detail::isa_list(detail::all_isas()) + ")");
  if (!isa_supported(isa)) detail::parse_isa(isa_name(isa), "set_isa");  // throws the error
  detail::forced_isa().store(static_cast<int>(isa), std::memory_order_relaxed);
}

// The same by name ("generic", "avx2", "avx512", "avx512_bf16", "amx").
inline void set_isa(const std::string& name) { set_isa(detail::parse_isa(name, "set_isa")); }

// Undoes set_isa(): back to GPT2_ATTENTION_ISA or the CPU's best.
inline void reset_isa() { detail::forced_isa().store(-1, std::memory_order_relaxed); }

// What runs: the level in use, how it was chosen, the CPU features seen, the levels available.
struct KernelInfo {
  Isa isa = Isa::generic;
  std::string level;            // isa_name(isa)
  std::string chosen_by;        // "cpu" (the best it has), "GPT2_ATTENTION_ISA" or "set_isa"
  std::string cpu;              // the features seen, e.g. "avx2 fma avx512f avx512bw ..."
  std::vector<Isa> available;   // lowest first
  std::string unavailable;      // levels the CPU or OS lacks, with the reason: "amx (...)"; or ""

  // "avx512 (cpu: avx2 fma avx512f ...)"-style one-line summary: "LEVEL; cpu: FEATURES".
  std::string summary() const { return level + "; cpu: " + cpu; }
};

// Throws ConfigError as active_isa() does.
inline KernelInfo kernel_info() {
  KernelInfo info;
  info.isa = active_isa();
  info.level = isa_name(info.isa);
  if (detail::forced_isa().load(std::memory_order_relaxed) >= 0)
    info.chosen_by = "set_isa";
  else if (detail::isa_from_environment().set)
    info.chosen_by = "GPT2_ATTENTION_ISA";
  else
    info.chosen_by = "cpu";
  info.cpu = kernels::cpu_features().names();
  info.available = available_isas();
  for (Isa isa : kAllIsas) {
    const std::string missing = isa_missing(isa);
    if (!missing.empty()) info.unavailable += (info.unavailable.empty() ? "" : ", ") + missing;
  }
  return info;
}

namespace kernels {

// One level's float kernels (see the interface above).
struct FloatKernels {
  Isa isa;
  void (*gemm)(Index M, Index N, Index K, const float* A, Index lda, const float* B, Index ldb,
               float* C, Index ldc, float* pack);
  void (*gemm_packed)(Index M, Index N, Index K, const float* A, Index lda, const float* Bp,
                      float* C, Index ldc);
  void (*row_times_matrix)(Index N, Index K, const float* a, const float* B, Index ldb, float* c);
  void (*row_times_packed)(Index N, Index K, const float* a, const float* Bp, float* c);
  void (*row_times_transposed)(Index N, Index K, const float* a, const float* B, Index ldb,
                               float* c);
  void (*softmax_row)(float* row, Index n, Index n_keys, float scale);
  void (*attention_tile)(const AttentionTile<float>& tile);
  void (*row_partials)(const AttentionTile<float>& tile, Index block_begin, Index block_end,
                       float* partials);
  void (*merge_row_partials)(const AttentionTile<float>& tile, Index n_blocks,
                             const float* partials);
  // row_partials over keys and values held as bf16 bits (tile.key_pages_bf16, value_pages_bf16),
  // bitwise row_partials on the widened values (at generic, which has no table, the caller widens).
  void (*row_partials_kv_bf16)(const AttentionTile<float>& tile, Index block_begin,
                               Index block_end, float* partials);
};

// The table of a vector level (null for generic, and for a level this build does not have);
// amx runs avx512's; avx512_bf16 avx512's but for the attention entries, whose bf16 tiles
// (AttentionTile::bf16: bf16 weights) run both products on VDPBF16PS before a row's own block.
GPT2_KERNELS_ENTRY_BEGIN
#if defined(GPT2_ATTENTION_SEPARATE_KERNELS)
const FloatKernels* float_kernels(Isa isa);
#endif
#if !GPT2_KERNELS_DECLARED_ONLY
GPT2_KERNELS_ENTRY const FloatKernels* float_kernels(Isa isa) {
#if GPT2_KERNELS_HAVE_AVX512
  // avx512's, but a bf16 tile's attention (bf16 weights) runs both products on VDPBF16PS in the
  // key blocks before a row's own (kernels/avx512_bf16_attention.hpp)
  static const FloatKernels avx512_bf16_table{Isa::avx512_bf16,        avx512::gemm,
                                              avx512::gemm_packed,     avx512::row_times_matrix,
                                              avx512::row_times_packed,
                                              avx512::row_times_transposed,
                                              avx512::softmax_row,     avx512_bf16::attention_tile,
                                              avx512_bf16::row_partials,
                                              avx512::merge_row_partials,
                                              avx512_bf16::row_partials_kv_bf16};
  if (isa == Isa::avx512_bf16) return &avx512_bf16_table;
#endif
  isa = float_level(isa);
#if GPT2_KERNELS_HAVE_AVX512
  static const FloatKernels avx512_table{Isa::avx512,           avx512::gemm,
                                         avx512::gemm_packed,    avx512::row_times_matrix,
                                         avx512::row_times_packed, avx512::row_times_transposed,
                                         avx512::softmax_row,    avx512::attention_tile,
                                         avx512::row_partials,   avx512::merge_row_partials,
                                         avx512::row_partials_kv_bf16};
  if (isa == Isa::avx512) return &avx512_table;
#endif
#if GPT2_KERNELS_HAVE_AVX2
  static const FloatKernels avx2_table{Isa::avx2,           avx2::gemm,
                                       avx2::gemm_packed,    avx2::row_times_matrix,
                                       avx2::row_times_packed, avx2::row_times_transposed,
                                       avx2::softmax_row,    avx2::attention_tile,
                                       avx2::row_partials,   avx2::merge_row_partials,
                                       avx2::row_partials_kv_bf16};
  if (isa == Isa::avx2) return &avx2_table;
#endif
  (void)isa;
  return nullptr;
}
#endif
GPT2_KERNELS_ENTRY_END

// The active level's float kernels, or null at the generic level (the math then runs Eigen).
inline const FloatKernels* float_kernels() { return float_kernels(active_isa()); }

// One level's bf16 product: C[M, N] += A[M, K] * B[K, N], A float32 row-major (stride lda), B a
// bf16 weight's panels (kernels/bf16.hpp; depth Kp), C row-major (stride ldc); scratch:
// kPackFloats floats, 64-byte aligned (GemmScratch::packed_b()). With bias [N] (not null):
// C = bias + A B, bitwise what C = bias; C += A B gives, without reading C.
using Bf16Gemm = void (*)(Index M, Index N, Index K, const float* A, Index lda,
                          const std::uint16_t* Bp, Index Kp, float* C, Index ldc, float* scratch,
                          const float* bias);

// The bf16 product of a vector level (null for generic, which runs kernels::generic::gemm_bf16
// through Eigen, and for a level this build does not have).
GPT2_KERNELS_ENTRY_BEGIN
#if defined(GPT2_ATTENTION_SEPARATE_KERNELS)
Bf16Gemm bf16_gemm(Isa isa);
#endif
#if !GPT2_KERNELS_DECLARED_ONLY
GPT2_KERNELS_ENTRY Bf16Gemm bf16_gemm(Isa isa) {
  switch (isa) {
#if GPT2_KERNELS_HAVE_AMX
    case Isa::amx: return amx::gemm_bf16;
#endif
#if GPT2_KERNELS_HAVE_AVX512
    case Isa::avx512_bf16: return avx512_bf16::gemm_bf16;
    case Isa::avx512: return avx512::gemm_bf16;
#endif
#if GPT2_KERNELS_HAVE_AVX2
    case Isa::avx2: return avx2::gemm_bf16;
#endif
    default: return nullptr;
  }
}
#endif
GPT2_KERNELS_ENTRY_END

// A level's attention core for tiles with bf16 products (bf16 weights): amx's AMX core for tiles
// of amx::kAmxMinRows rows or more whose head size amx::attention_fits; null at every other level
// (the float32 core runs).
using Bf16AttentionTile = void (*)(const AttentionTile<float>& tile);

GPT2_KERNELS_ENTRY_BEGIN
#if defined(GPT2_ATTENTION_SEPARATE_KERNELS)
Bf16AttentionTile bf16_attention_tile(Isa isa);
#endif
#if !GPT2_KERNELS_DECLARED_ONLY
GPT2_KERNELS_ENTRY Bf16AttentionTile bf16_attention_tile(Isa isa) {
#if GPT2_KERNELS_HAVE_AMX
  if (isa == Isa::amx) return amx::attention_tile_bf16;
#endif
  (void)isa;
  return nullptr;
}
#endif
GPT2_KERNELS_ENTRY_END

}  // namespace kernels
}  // namespace gpt2
