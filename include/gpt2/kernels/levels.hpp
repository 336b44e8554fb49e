// The kernel tables of every level (kernels/table.hpp's interface), side by side, and the entry
// point that hands out the one of a level. Every public header that runs kernels includes this one,
// so that header-only code compiles and links on its own.
//
// Compiling the kernels once: by default every translation unit that uses the library compiles the
// kernels of every level (header-only). A program of many translation units can instead define
// GPT2_ATTENTION_SEPARATE_KERNELS in all of them and, in exactly one, also
// GPT2_ATTENTION_KERNELS_IMPLEMENTATION before including any gpt2 header: the entry point
// (vector_table) is then only declared elsewhere and defined in that one, which alone compiles the
// vector levels (the generic level, Eigen's, stays in every file). The code that runs is the same.
#pragma once

#include <string>

#include "gpt2/error.hpp"
#include "gpt2/kernels/generic.hpp"
#include "gpt2/kernels/table.hpp"

#if defined(GPT2_ATTENTION_KERNELS_IMPLEMENTATION) && !defined(GPT2_ATTENTION_SEPARATE_KERNELS)
#error "GPT2_ATTENTION_KERNELS_IMPLEMENTATION needs GPT2_ATTENTION_SEPARATE_KERNELS (in every translation unit)"
#endif

#if !defined(GPT2_ATTENTION_SEPARATE_KERNELS) || defined(GPT2_ATTENTION_KERNELS_IMPLEMENTATION)
#include "gpt2/kernels/amx.hpp"
#include "gpt2/kernels/amx_attention.hpp"
#include "gpt2/kernels/avx2.hpp"
#include "gpt2/kernels/avx2_attention.hpp"
#include "gpt2/kernels/avx2_bf16.hpp"
#include "gpt2/kernels/avx2_int8.hpp"
#include "gpt2/kernels/avx512.hpp"
#include "gpt2/kernels/avx512_attention.hpp"
#include "gpt2/kernels/avx512_bf16.hpp"
#include "gpt2/kernels/avx512_bf16_attention.hpp"
#include "gpt2/kernels/avx512_vnni.hpp"
#include "gpt2/kernels/pack.hpp"

namespace gpt2::kernels {

namespace vector_level {

using Gemm = void (*)(Index M, Index N, Index K, const float* A, Index lda, const float* B,
                      Index ldb, float* C, Index ldc, float* pack);
using GemmPacked = void (*)(Index M, Index N, Index K, const float* A, Index lda,
                            const float* Bp, float* C, Index ldc);
using GemmBf16 = void (*)(Index M, Index N, Index K, const float* A, Index lda,
                          const std::uint16_t* Bp, Index Kp, float* C, Index ldc, float* scratch,
                          const float* bias);

using GemmInt8 = void (*)(Index M, Index N, Index K, const float* A, Index lda,
                          const std::uint8_t* Bp, float* C, Index ldc, const float* bias,
                          void* buf);

// The int8 product a level runs (the same bits at every level: kernels/int8.hpp): VPDPBUSD on zmm
// where the level has AVX-512 and the CPU AVX512-VNNI; else the avx2 level's (VPDPBUSD on ymm
// with AVX-VNNI, or VPMADDUBSW).
inline GemmInt8 int8_product(Isa isa) {
#if GPT2_KERNELS_HAVE_AVX512
  if (isa != Isa::avx2 && isa != Isa::generic && cpu_features().avx512_vnni)
    return avx512_vnni::gemm_int8;
#endif
#if GPT2_KERNELS_HAVE_AVX2
  if (isa != Isa::generic) return avx2_int8::gemm_int8;
#endif
  (void)isa;
  return gemm_int8_scalar;
}

// A vector level's projection: an int8 copy through its int8 product, a bf16 copy through its
// bf16 product (the bias in both kernels), a float32 copy through gemm_packed, the view through
// gemm (B packed per call); the bias written into C first for the float32 products.
template <Gemm G, GemmPacked GP, GemmBf16 GB, Isa kLevel>
void project(const Projection<float>& p, GemmScratch<float>& scratch) {
  if (p.M == 0 || p.N == 0) return;
  const bool bf16 = p.packed != nullptr && p.packed->dtype() == WeightDtype::bf16;
  const bool int8 = p.packed != nullptr && p.packed->dtype() == WeightDtype::int8;
  if (p.bias != nullptr && ((!bf16 && !int8) || p.K == 0))
    for (Index i = 0; i < p.M; ++i) std::copy_n(p.bias, p.N, p.C + i * p.ldc);
  if (p.K == 0) return;
  if (int8) {
    static const GemmInt8 product = int8_product(kLevel);
    scratch.reserve_int8(p.M, p.K);
    product(p.M, p.N, p.K, p.A, p.lda, p.packed->int8_panels_from(p.j0), p.C, p.ldc, p.bias,
            scratch.int8_rows());
  } else if (bf16)
    GB(p.M, p.N, p.K, p.A, p.lda, p.packed->bf16_panels_from(p.j0), p.packed->depth(), p.C, p.ldc,
       scratch.packed_b(), p.bias);
  else if (p.packed != nullptr)
    GP(p.M, p.N, p.K, p.A, p.lda, p.packed->panels_from(p.j0), p.C, p.ldc);
  else
    G(p.M, p.N, p.K, p.A, p.lda, p.B, p.ldb, p.C, p.ldc, scratch.packed_b());
}

// C += A B: the level's gemm, B packed per call into the scratch's buffer.
template <Gemm G>
void gemm(Index M, Index N, Index K, const float* A, Index lda, const float* B, Index ldb,
          float* C, Index ldc, GemmScratch<float>& scratch) {
  if (M == 0 || N == 0 || K == 0) return;
  G(M, N, K, A, lda, B, ldb, C, ldc, scratch.packed_b());
}

// A vector level's table from its own functions.
inline Kernels<float> make_table(
    Isa isa, void (*project)(const Projection<float>&, GemmScratch<float>&),
    decltype(Kernels<float>::gemm) gemm,
    decltype(Kernels<float>::row_times_transposed) row_times_transposed,
    decltype(Kernels<float>::softmax_row) softmax_row,
    decltype(Kernels<float>::attention_tile) attention_tile,
    decltype(Kernels<float>::row_partials) row_partials,
    decltype(Kernels<float>::merge_row_partials) merge_row_partials) {
  Kernels<float> k;
  k.isa = isa;
  k.row_exact = true;
  k.project = project;
  k.gemm = gemm;
  k.row_times_transposed = row_times_transposed;
  k.softmax_row = softmax_row;
  k.attention_tile = attention_tile;
  k.row_partials = row_partials;
  k.merge_row_partials = merge_row_partials;
  k.tile_rows = generic::tile_rows<float>;
  return k;
}

}  // namespace vector_level

#if defined(GPT2_ATTENTION_SEPARATE_KERNELS)
inline namespace separate_kernels {
const Kernels<float>& vector_table(Isa isa) {
#else
inline const Kernels<float>& vector_table(Isa isa) {
#endif
  using vector_level::make_table;
  using vector_level::project;
#if GPT2_KERNELS_HAVE_AVX2
  static const Kernels<float> avx2_table = make_table(
      Isa::avx2, project<avx2::gemm, avx2::gemm_packed, avx2::gemm_bf16, Isa::avx2>,
      vector_level::gemm<avx2::gemm>, avx2::row_times_transposed, avx2::softmax_row,
      avx2::attention_tile, avx2::row_partials, avx2::merge_row_partials);
  if (isa == Isa::avx2) return avx2_table;
#endif
#if GPT2_KERNELS_HAVE_AVX512
  // avx512_bf16 and amx run avx512's float32 kernels; they differ in their bf16 products and in
  // the attention of bf16 tiles (bf16 weights).
  static const Kernels<float> avx512_table = make_table(
      Isa::avx512, project<avx512::gemm, avx512::gemm_packed, avx512::gemm_bf16, Isa::avx512>,
      vector_level::gemm<avx512::gemm>, avx512::row_times_transposed, avx512::softmax_row,
      avx512::attention_tile, avx512::row_partials, avx512::merge_row_partials);
  if (isa == Isa::avx512) return avx512_table;
  static const Kernels<float> avx512_bf16_table = [] {
    Kernels<float> k = make_table(
        Isa::avx512_bf16, project<avx512::gemm, avx512::gemm_packed, avx512_bf16::gemm_bf16, Isa::avx512_bf16>,
        vector_level::gemm<avx512::gemm>, avx512::row_times_transposed, avx512::softmax_row,
        avx512_bf16::attention_tile, avx512_bf16::row_partials, avx512::merge_row_partials);
    k.bf16_pair_decode = true;
    k.row_partials_int8 = avx512_bf16::row_partials_int8;
    return k;
  }();
  if (isa == Isa::avx512_bf16) return avx512_bf16_table;
#endif
#if GPT2_KERNELS_HAVE_AMX
  static const Kernels<float> amx_table = [] {
    Kernels<float> k = make_table(
        Isa::amx, project<avx512::gemm, avx512::gemm_packed, amx::gemm_bf16, Isa::amx>,
        vector_level::gemm<avx512::gemm>, avx512::row_times_transposed, avx512::softmax_row,
        amx::attention_tile, avx512::row_partials, avx512::merge_row_partials);
    k.tile_rows = amx::tile_rows;
    return k;
  }();
  if (isa == Isa::amx) return amx_table;
#endif
  throw ConfigError(std::string("kernels: this build has no vector kernels for level ") +
                    isa_name(isa));
}
#if defined(GPT2_ATTENTION_SEPARATE_KERNELS)
bool built_optimized() {
#if defined(__OPTIMIZE__) || (defined(_MSC_VER) && !defined(_DEBUG))
  return true;
#else
  return false;
#endif
}
}  // namespace separate_kernels
#endif

}  // namespace gpt2::kernels
#endif
