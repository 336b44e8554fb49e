// What the CPU and the operating system offer: the instruction-set features the kernel levels need,
// read once from cpuid and xgetbv (the OS must save the wider registers' state on a context switch,
// or the instructions fault even where cpuid lists them).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#define GPT2_ATTENTION_X86 1
#else
#define GPT2_ATTENTION_X86 0
#endif

// The vector levels this compiler builds (their kernels carry per-function target attributes, so
// no -m flag is needed): avx2 and avx512 with GCC or clang on x86; amx (tile intrinsics) also needs
// clang or GCC 11.
#if GPT2_ATTENTION_X86
#define GPT2_KERNELS_HAVE_AVX2 1
#define GPT2_KERNELS_HAVE_AVX512 1
#else
#define GPT2_KERNELS_HAVE_AVX2 0
#define GPT2_KERNELS_HAVE_AVX512 0
#endif
#if GPT2_KERNELS_HAVE_AVX512 && (defined(__clang__) || __GNUC__ >= 11)
#define GPT2_KERNELS_HAVE_AMX 1
#else
#define GPT2_KERNELS_HAVE_AMX 0
#endif

// GPT2_ATTENTION_AMX_EMULATED is for the tests only, defined by tests/support/amx_emulation.hpp,
// which replaces the tile intrinsics: defined without it, the amx level would run real tile
// instructions without having asked the OS for them.
#if defined(GPT2_ATTENTION_AMX_EMULATED) && !defined(_tile_release)
#error "GPT2_ATTENTION_AMX_EMULATED is defined by tests/support/amx_emulation.hpp (tests only)"
#endif

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace gpt2::kernels {

// Features seen on this machine. A flag is true only when the CPU has the instructions and the OS
// saves the registers they use (ymm for AVX2/FMA, zmm and the opmasks for AVX-512, the tile data
// for AMX, which Linux also gates per process with arch_prctl: for a future bf16 level).
struct CpuFeatures {
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false, avx_vnni = false;  // VPDPBUSD on zmm (AVX512-VNNI), on ymm (AVX-VNNI)
  bool amx_bf16 = false, amx_tile = false;
  bool os_ymm = false, os_zmm = false, os_amx = false;  // XCR0: the OS saves these states
  std::string vendor;                                  // "GenuineIntel", "AuthenticAMD", ...

  // The features present, space-separated, in a fixed order (what --version prints after "cpu:"),
  // e.g. "avx2 fma avx512f avx512bw avx512dq avx512vl avx512_bf16 amx_bf16 amx_tile".
  std::string names() const {
    std::string s;
    const auto add = [&s](bool on, const char* name) {
      if (!on) return;
      if (!s.empty()) s += ' ';
      s += name;
    };
    add(avx2, "avx2");
    add(fma, "fma");
    add(avx512f, "avx512f");
    add(avx512bw, "avx512bw");
    add(avx512dq, "avx512dq");
    add(avx512vl, "avx512vl");
    add(avx512_bf16, "avx512_bf16");
    add(avx512_vnni, "avx512_vnni");
    add(avx_vnni, "avx_vnni");
#ifdef GPT2_ATTENTION_AMX_EMULATED
    add(amx_bf16, "amx_bf16(emulated)");
    add(amx_tile, "amx_tile(emulated)");
#else
    add(amx_bf16, "amx_bf16");
    add(amx_tile, "amx_tile");
#endif
    return s.empty() ? std::string("none") : s;
  }
};

namespace detail {

#if GPT2_ATTENTION_X86
// XCR0, the state components the OS saves (xgetbv with ecx = 0; the instruction needs no -mxsave).
inline std::uint64_t read_xcr0() {
  std::uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<std::uint64_t>(edx) << 32) | eax;
}
#endif

inline CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if GPT2_ATTENTION_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  for (int i = 0; i < 4; ++i) {
    vendor[i] = static_cast<char>(b >> (8 * i));
    vendor[4 + i] = static_cast<char>(d >> (8 * i));
    vendor[8 + i] = static_cast<char>(c >> (8 * i));
  }
  f.vendor = vendor;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u;
  const bool fma = (c >> 12) & 1u;
  if (osxsave && avx) {
    const std::uint64_t xcr0 = read_xcr0();
    f.os_ymm = (xcr0 & 0x6) == 0x6;                   // SSE and AVX state
    f.os_zmm = f.os_ymm && (xcr0 & 0xE0) == 0xE0;     // opmask, ZMM_Hi256, Hi16_ZMM
    f.os_amx = (xcr0 & 0x60000) == 0x60000;           // XTILECFG, XTILEDATA
  }
  f.fma = fma && f.os_ymm;
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = ((b >> 5) & 1u) && f.os_ymm;
  f.avx512f = ((b >> 16) & 1u) && f.os_zmm;
  f.avx512dq = ((b >> 17) & 1u) && f.os_zmm;
  f.avx512bw = ((b >> 30) & 1u) && f.os_zmm;
  f.avx512vl = ((b >> 31) & 1u) && f.os_zmm;
  f.avx512_vnni = ((c >> 11) & 1u) && f.os_zmm;
  f.amx_bf16 = ((d >> 22) & 1u) && f.os_amx;
  f.amx_tile = ((d >> 24) & 1u) && f.os_amx;
  const unsigned max_subleaf = a;
  if (max_subleaf >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = ((a >> 5) & 1u) && f.os_zmm;
    f.avx_vnni = ((a >> 4) & 1u) && f.os_ymm;
  }
#endif
#ifdef GPT2_ATTENTION_AMX_EMULATED  // tests only: tests/support/amx_emulation.hpp runs the tiles
  f.amx_bf16 = f.amx_tile = f.avx512_bf16;
#endif
  return f;
}

}  // namespace detail

// Whether this process may use the AMX tile data (asked once; Linux only), and why not.
struct AmxPermission {
  bool granted = false;
  std::string reason;  // empty when granted
};

inline AmxPermission request_amx_permission() {
  AmxPermission p;
#if defined(GPT2_ATTENTION_AMX_EMULATED)  // tests only: no tile state to ask for
  p.granted = true;
#elif defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) {
    p.granted = true;
  } else {
    p.reason = "the kernel refused the AMX tile data (arch_prctl(ARCH_REQ_XCOMP_PERM): " +
               std::string(std::strerror(errno)) + ")";
  }
#else
  p.reason = "AMX needs Linux's arch_prctl(ARCH_REQ_XCOMP_PERM) in this build";
#endif
  return p;
}

// Asked once per process, on the first call (thread-safe).
inline const AmxPermission& amx_permission() {
  static const AmxPermission permission = request_amx_permission();
  return permission;
}

// The features of this machine, detected on the first call (thread-safe) and cached.
inline const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detail::detect_cpu_features();
  return features;
}

}  // namespace gpt2::kernels
