// Which instruction-set level runs the kernels: chosen once at run time from the CPU (cpuid and the
// OS's saved state, kernels/cpu.hpp), reported (kernel_info), and forceable for tests and
// reproducibility (GPT2_ATTENTION_ISA, set_isa). docs/kernels.md describes the levels.
//
// Levels, lowest first (no compiler flag is needed: the kernels carry per-function target
// attributes): generic (Eigen; also the only level of double and of non-x86 builds), avx2 (AVX2 +
// FMA), avx512 (F/BW/DQ/VL), avx512_bf16 (avx512 plus VDPBF16PS for bf16 weights), amx
// (avx512_bf16 plus AMX-BF16 tiles; on Linux the process must be granted the tile data, asked
// once: a refusal makes the level unavailable, with the reason in kernel_info()).
//
// A level the CPU lacks, or an unknown name, is a ConfigError naming the levels available: never a
// silent fallback. Every translation unit of a program should be compiled with the same -m flags
// (as for Eigen itself): the linker keeps one copy of each inline kernel.
#pragma once

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "gpt2/error.hpp"
#include "gpt2/kernels/cpu.hpp"

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

namespace kernels {
// Whether the vector levels' kernels were compiled with optimisation (-O1 or more): in the compiled
// mode, the library's file (built -O2 whatever the program's flags); header-only, the program's own
// files. Unoptimised kernels run tens of times slower.
#if defined(GPT2_ATTENTION_SEPARATE_KERNELS)
inline namespace separate_kernels {
bool built_optimized();  // defined in the library (kernels/levels.hpp)
}
#else
inline bool built_optimized() {
#if defined(__OPTIMIZE__) || (defined(_MSC_VER) && !defined(_DEBUG))
  return true;
#else
  return false;
#endif
}
#endif
}  // namespace kernels

// What runs: the level in use, how it was chosen, the CPU features seen, the levels available, and
// how the kernels were built.
struct KernelInfo {
  Isa isa = Isa::generic;
  std::string level;            // isa_name(isa)
  std::string chosen_by;        // "cpu" (the best it has), "GPT2_ATTENTION_ISA" or "set_isa"
  std::string cpu;              // the features seen, e.g. "avx2 fma avx512f avx512bw ..."
  std::vector<Isa> available;   // lowest first
  std::string unavailable;      // levels the CPU or OS lacks, with the reason: "amx (...)"; or ""
  bool compiled_library = false;  // the kernels come from the compiled library (the compiled mode)
  bool optimized = true;          // they were compiled with optimisation (kernels::built_optimized)

  // One line: "LEVEL; cpu: FEATURES", plus a warning when the kernels were compiled unoptimised.
  std::string summary() const {
    return level + "; cpu: " + cpu + (optimized ? "" : "; " + unoptimized_warning());
  }

  // What an unoptimised build costs and how to avoid it (for a program to print once).
  static std::string unoptimized_warning() {
    return "the kernels were compiled without optimisation (header-only, no -O2): forwards run "
           "tens of times slower; compile with -O2, or link the compiled library (gpt2::attention, "
           "pkg-config gpt2-attention)";
  }
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
#if defined(GPT2_ATTENTION_SEPARATE_KERNELS)
  info.compiled_library = true;
#endif
  info.optimized = kernels::built_optimized();
  return info;
}

}  // namespace gpt2
