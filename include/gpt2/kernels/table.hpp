// The kernel layer's one interface: a table of the operations the math layer runs, one complete
// table per instruction-set level (generic included), and the entry point that gives the active
// level's. Nothing above kernels/ knows which level runs; kernels/levels.hpp builds the tables,
// kernels/isa.hpp chooses the level.
//
// Bit-for-bit contracts, the same at avx2 and avx512 (so the two levels give the same bits;
// tests/test_kernels.cpp and tests/test_attention_core.cpp check them against the scalar emulation
// in tests/kernel_emulation.hpp):
// - project and gemm at the vector levels: every element of C is one chain of fused multiply-adds
//   in k order, starting from C's value (the bias, for project): whatever M, the blocking or the
//   column split, a row gives the same bits (row_exact). Eigen's GEMM (generic, and double) orders
//   its sums by shape.
// - row_times_transposed: 16 lane partial sums (lane l: d = l mod 16, in order, from +0), added by
//   a fixed tree; c[j] depends on row j alone. generic: four partial sums (d mod 4) added as
//   (s0 + s1) + (s2 + s3).
// - softmax_row: x = row * scale; max from -inf (NaN if any x is NaN); e = exp(x - max); the sum of
//   e; row = e * (1 / sum) on [0, n), zeros on [n, n_keys).
// - attention_tile, row_partials, merge_row_partials: kernels/attention_tile.hpp's arithmetic; a
//   one-row tile's partials over its key blocks, merged in block order, give the tile's own bits.
#pragma once

#include <type_traits>

#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/gemm_scratch.hpp"
#include "gpt2/kernels/isa.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

class PackedMatrix;  // kernels/pack.hpp

namespace kernels {

// A projection's product, all row-major: C[M, N] = bias[0, N) + A[M, K] B_j0, or C += A B_j0 when
// bias is null, where B_j0 = B[:, j0 : j0 + N] of a weight B [K, *] given as its view (B: element
// (k, j0) of the view, stride ldb) and optionally as a packed copy of the whole weight (packed:
// float32 or bf16 panels; j0 a multiple of 32 then). Which copy a level reads is the level's choice:
// a bf16 copy at every level; a float32 copy at the vector levels (bitwise what the view gives
// there); the view otherwise. C overlaps neither A nor B.
template <class T>
struct Projection {
  Index M = 0, N = 0, K = 0;
  const T* A = nullptr;
  Index lda = 0;
  const T* B = nullptr;
  Index ldb = 0;
  const PackedMatrix* packed = nullptr;
  Index j0 = 0;
  const T* bias = nullptr;
  T* C = nullptr;
  Index ldc = 0;
};

// One level's table (Kernels<double> exists at the generic level only: double runs Eigen's products
// and the plain C++ core everywhere).
template <class T>
struct Kernels {
  Isa isa = Isa::generic;
  // Whether a row of a product gets the same bits whatever rows are computed with it: the batched
  // forwards then project several sequences' rows together, and the projections split a long
  // product by rows over threads.
  bool row_exact = false;
  // C = bias + A B_j0 (Projection). Packing buffers in scratch (grown when too small).
  void (*project)(const Projection<T>& p, GemmScratch<T>& scratch) = nullptr;
  // C[M, N] += A[M, K] B[K, N] (B row-major, stride ldb).
  void (*gemm)(Index M, Index N, Index K, const T* A, Index lda, const T* B, Index ldb, T* C,
               Index ldc, GemmScratch<T>& scratch) = nullptr;
  // c[1, N] = a[1, K] B[N, K]^T: the scores of one query row against N key rows (stride ldb).
  void (*row_times_transposed)(Index N, Index K, const T* a, const T* B, Index ldb,
                               T* c) = nullptr;
  // In place on row [n_keys]: the softmax of the first n scores times scale, zeros after them.
  void (*softmax_row)(T* row, Index n, Index n_keys, T scale) = nullptr;
  // The fused core (kernels/attention_tile.hpp): t.rows query rows over t's pages.
  void (*attention_tile)(const AttentionTile<T>& t) = nullptr;
  // A one-row tile's partials over key blocks [block_begin, block_end), partial_stride(head_dim)
  // apart from parts; and the row from all n_blocks of them, merged in order (a decode step split
  // over threads).
  void (*row_partials)(const AttentionTile<T>& t, Index block_begin, Index block_end,
                       T* parts) = nullptr;
  void (*merge_row_partials)(const AttentionTile<T>& t, Index n_blocks, const T* parts) = nullptr;
  // Whether a one-row bf16 tile (t.bf16) reads the key blocks before its row's own block in bf16
  // pairs (kernels/avx512_bf16_attention.hpp): keys and values rounded to bf16 to nearest even as
  // VCVTNEPS2BF16 rounds them, then VDPBF16PS, which reads bf16 subnormals as zero. Such blocks
  // give the same bits over bf16 pages holding the values so rounded as over the float32 pages
  // (the int8 caches' decode steps dequantize them straight to bf16: detail/pipeline.hpp).
  bool bf16_pair_decode = false;
  // Where a level with bf16_pair_decode reads int8 keys and values in place (null elsewhere): a
  // one-row bf16 tile's partials over key blocks [block_begin, block_end), all before its row's
  // own block, from t.keys_t_int8, t.value_pages_int8 and their scales (attention_tile.hpp): the
  // bits row_partials gives over float32 pages holding float(q) * scale.
  void (*row_partials_int8)(const AttentionTile<T>& t, Index block_begin, Index block_end,
                            T* parts) = nullptr;
  // Query rows per tile for a head of width head_dim: more than kTileMaxRows only where a level's
  // bf16 core takes them (bf16 products, no probabilities).
  Index (*tile_rows)(bool bf16_products, Index head_dim, bool probabilities) = nullptr;
};

// The generic level's table for T (kernels/generic.hpp: Eigen's code, compiled in every file that
// uses it, in either mode below).
template <class T>
const Kernels<T>& generic_table();

// The vector levels' tables (kernels/levels.hpp; in the separate-kernels mode compiled in one file
// only): isa is a vector level this build has (ConfigError otherwise).
#if defined(GPT2_ATTENTION_SEPARATE_KERNELS)
inline namespace separate_kernels {
const Kernels<float>& vector_table(Isa isa);
}
#else
inline const Kernels<float>& vector_table(Isa isa);
#endif

// The entry point: level isa's table (isa one this machine can run, as active_isa() gives); double
// runs the generic level's at every level.
template <class T>
const Kernels<T>& table(Isa isa) {
  if constexpr (std::is_same<T, float>::value)
    return isa == Isa::generic ? generic_table<float>() : vector_table(isa);
  else
    return (void)isa, generic_table<T>();
}

// The table the forwards run: the active level's.
template <class T>
const Kernels<T>& table() {
  return table<T>(active_isa());
}

}  // namespace kernels
}  // namespace gpt2
