// The one pipeline above the kernels (internal): the sublayer's steps written once, over two
// concepts, and run by sublayer.hpp's forward and batch.hpp's batch forward.
//
//   a sublayer   what the forward computes with: AttentionWeights<T> (every head, here), or one
//                rank's shard of the heads (TensorParallelAttention<T>, tensor_parallel.hpp):
//                SublayerTraits gives its Sublayer<T> and two hooks, agree (checks, on every rank)
//                and all_reduce (out summed over the ranks).
//   a KV cache   kv_cache.hpp's concept: where the new rows' keys and values go and what they
//                attend to; NoCache for a forward without one (the keys are the new rows' own).
//
//   qkv [T, 3 C_h] = x [T, C] @ c_attn + c_attn.bias          project_parts (threads by columns,
//                                                              or by rows where rows are exact)
//   cache rows p .. p + T - 1 = qkv's k and v blocks          cache.write_head
//   merged [T, C_h] = heads of q over cache.head_pages(h)      attend_heads: (head, tile) tasks,
//                                                              or a decode step's key blocks'
//                                                              partials (decode_step)
//   out [T, C] = merged @ c_proj + c_proj.bias                 project_parts
// A decode step (T = 1, at least as many heads as threads) runs all of it in one parallel region
// (decode_step_region). Every task computes its own part with the same arithmetic whichever thread
// runs it: results do not depend on the number of threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "gpt2/config.hpp"
#include "gpt2/detail/parallel.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/int8_dequant.hpp"
#include "gpt2/kernels/pack.hpp"
#include "gpt2/kernels/table.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"
#include "gpt2/workspace.hpp"

namespace gpt2::detail {

// ---- the sublayer ------------------------------------------------------------------------------

// A weight of the sublayer: its view (row-major, stride ld), its packed copy or null, its bias.
template <class T>
struct SublayerWeight {
  const T* weight = nullptr;
  Index ld = 0;
  const PackedMatrix* packed = nullptr;
  const T* bias = nullptr;
};

// What a forward computes with. heads: n_head heads of head_dim, C_h = heads.n_embd wide (the
// config of its workspace and caches); n_embd: C, the width of x and out. c_attn [C, 3 C_h] (q | k
// | v blocks of C_h, head h at h * head_dim in each), c_proj [C_h, C].
template <class T>
struct Sublayer {
  AttentionConfig heads;
  Index n_embd = 0;
  SublayerWeight<T> c_attn, c_proj;
  bool bf16_products = false;  // bf16 or int8 weights: the attention core's products in bf16 too
                               // (at the levels that have bf16 products)
  bool shard = false;  // one rank's heads: errors name the shard
  const char* probs_name = "probs";
};

// Values every rank of a tensor-parallel call must have in common (its shapes; at most kMax, no
// allocation), named for the error that a disagreement gives.
struct CallShape {
  static constexpr int kMax = 8;
  const char* names[kMax] = {};
  long long values[kMax] = {};
  int n = 0;
  CallShape& add(const char* name, long long value) {
    names[n] = name;
    values[n] = value;
    ++n;
    return *this;
  }
};

// The sublayer concept: SublayerTraits<S> for each sublayer type S (tensor_parallel.hpp adds
// TensorParallelAttention's): of(s), its Sublayer; agree(s, check, shape), check() run (on every
// rank, which then agree on the shape or throw the same error); all_reduce(s, out), out summed (over
// the ranks).
template <class S>
struct SublayerTraits {
  static constexpr bool kIsSublayer = false;
};

template <class T>
struct SublayerTraits<AttentionWeights<T>> {
  static constexpr bool kIsSublayer = true;
  static Sublayer<T> of(const AttentionWeights<T>& w) {
    Sublayer<T> s;
    s.heads = w.config();
    s.n_embd = w.n_embd();
    s.c_attn = {w.c_attn_weight().data(), 3 * w.n_embd(), w.packed_c_attn_weight(),
                w.c_attn_bias().data()};
    s.c_proj = {w.c_proj_weight().data(), w.n_embd(), w.packed_c_proj_weight(),
                w.c_proj_bias().data()};
    s.bf16_products = w.weight_dtype() != WeightDtype::float32;
    return s;
  }
  template <class F>
  static void agree(const AttentionWeights<T>&, const F& check, const CallShape&) {
    check();
  }
  static void all_reduce(const AttentionWeights<T>&, MatrixRef<T>&) {}
};

// ---- checks -----------------------------------------------------------------------------------

// ConfigError unless a workspace or cache (`what`) is shaped for the sublayer's heads.
template <class T>
void check_heads(const Sublayer<T>& s, const std::string& what, const AttentionConfig& got) {
  const AttentionConfig& want = s.heads;
  if (want.n_embd == got.n_embd && want.n_head == got.n_head) return;
  const std::string source =
      !s.shard ? "the weights'" : what == "workspace" ? "tp.workspace()" : "tp.cache()";
  throw ConfigError(what + ": expected " + (s.shard ? "this rank's shard, " : "") + "n_embd " +
                    std::to_string(want.n_embd) + ", n_head " + std::to_string(want.n_head) +
                    " (" + source + "), got n_embd " + std::to_string(got.n_embd) + ", n_head " +
                    std::to_string(got.n_head));
}

// Once the workspace has room for `rows` tokens: out and probs must not overlap its buffers (the
// steps would read what another step has overwritten), nor each other. They may alias x: x is
// fully read by the first step.
template <class T>
void check_workspace_overlap(const Workspace<T>& ws, Index rows, const MatrixRef<T>& out,
                             const MatrixRef<T>* probs) {
  if (rows == 0) return;
  const ConstMatrixRef<T> qkv = ws.qkv.topRows(rows), merged = ws.merged.topRows(rows);
  if (overlaps(out, qkv) || overlaps(out, merged))
    throw ShapeError("out: must not overlap the workspace");
  if (probs && (overlaps(*probs, out) || overlaps(*probs, qkv) || overlaps(*probs, merged)))
    throw ShapeError("probs: must not overlap out or the workspace");
}

// The workspace grown for `rows` tokens attending to max_keys keys, and its packing buffers for
// the sublayer's products ([rows, C] x [C, 3 C_h] and [rows, C_h] x [C_h, C]); the weights'
// precision recorded in every thread's attention scratch (and its tile buffer sized for it, before
// any thread starts, so that no forward allocates later whichever threads its tiles land on);
// with `dequantizes` (an int8 cache), every thread's room for the workspace's key capacity in
// dequantized keys and values.
template <class T>
void reserve_for(const Sublayer<T>& s, Index rows, Index max_keys, Workspace<T>& ws,
                 bool dequantizes = false) {
  ws.reserve(rows, std::max(max_keys, rows));
  const Index C = s.n_embd, Ch = s.heads.n_embd;
  const bool int8 = s.c_attn.packed != nullptr && s.c_attn.packed->dtype() == WeightDtype::int8;
  for (ThreadScratch<T>& t : ws.threads) {
    t.gemm.reserve(std::max<Index>(rows, 1), std::max(3 * Ch, C), std::max(C, Ch));
    if (int8) t.gemm.reserve_int8(rows, std::max(C, Ch));
    t.attention.set_bf16_products(s.bf16_products);
    t.attention.reserve_tile(s.heads.head_dim());
    if (dequantizes) t.attention.reserve_dequantized(ws.key_capacity(), s.heads.head_dim());
  }
}

// Whether a cache (or the keys of a forward) C holds int8 rows: its forwards dequantize what they
// read into the threads' scratch (reserve_for's `dequantizes`).
template <class C, class = void>
struct StoresInt8 : std::false_type {};
template <class C>
struct StoresInt8<C, std::void_t<typename C::Element>>
    : std::is_same<typename C::Element, std::int8_t> {};

// Threads a forward uses: num_threads(), capped by the workspace's thread slots.
template <class T>
int forward_threads(const Workspace<T>& ws) {
  return static_cast<int>(std::min<Index>(num_threads(), ws.thread_capacity()));
}

// ---- products ---------------------------------------------------------------------------------

// C[M, n] = bias[j0 : j0 + n] + A[M, K] W[:, j0 : j0 + n] (the kernels choose which copy of W to
// read: kernels/table.hpp's Projection). A sublayer's own call: shapes hold by construction; a
// packed copy needs j0 on a panel boundary.
template <class T>
void project_columns(const kernels::Kernels<T>& k, const ConstMatrixRef<T>& A,
                     const SublayerWeight<T>& w, Index j0, Index n, MatrixRef<T> C,
                     GemmScratch<T>& gemm) {
  if (w.packed != nullptr && j0 % kernels::kPanelCols != 0)
    throw ShapeError("packed weight: expected a first column that is a multiple of 32, got " +
                     std::to_string(j0));
  kernels::Projection<T> p;
  p.M = A.rows();
  p.N = n;
  p.K = A.cols();
  p.A = A.data();
  p.lda = A.outerStride();
  p.B = w.weight + j0;
  p.ldb = w.ld;
  p.packed = w.packed;
  p.j0 = j0;
  p.bias = w.bias != nullptr ? w.bias + j0 : nullptr;
  p.C = C.data();
  p.ldc = C.outerStride();
  k.project(p, gemm);
}

inline void check_gemm_shapes(Index a_rows, Index a_cols, Index kb, Index n, Index c_rows,
                              Index c_cols) {
  if (kb != a_cols || c_rows != a_rows || c_cols != n)
    throw ShapeError("gemm: expected [M, K] x [K, N] -> [M, N], got A " +
                     shape_string({a_rows, a_cols}) + ", op(B) " + shape_string({kb, n}) + ", C " +
                     shape_string({c_rows, c_cols}));
}

// The checks of the column products: the columns within B, the shapes, a packed copy of B's shape
// with j0 on a panel boundary, C not overlapping A.
template <class T>
void check_columns(const ConstMatrixRef<T>& A, const ConstMatrixRef<T>& B,
                   const PackedMatrix* packed, Index j0, Index n, const MatrixRef<T>& C) {
  if (j0 < 0 || n < 0 || j0 + n > B.cols())
    throw ShapeError("gemm: columns [" + std::to_string(j0) + ", " + std::to_string(j0 + n) +
                     ") outside B's " + std::to_string(B.cols()));
  check_gemm_shapes(A.rows(), A.cols(), B.rows(), n, C.rows(), C.cols());
  if (packed != nullptr) {
    if (packed->rows() != B.rows() || packed->cols() != B.cols())
      throw ShapeError("packed weight: expected shape " + shape_string({B.rows(), B.cols()}) +
                       ", got " + shape_string({packed->rows(), packed->cols()}));
    if (j0 % kernels::kPanelCols != 0)
      throw ShapeError("packed weight: expected a first column that is a multiple of 32, got " +
                       std::to_string(j0));
  }
  if (overlaps(C, A)) throw ShapeError("gemm: the output C overlaps an input");
}


// The public projections' call (gemm.hpp, qkv.hpp, projection.hpp): every check, then
// C[M, n] = bias[j0 : j0 + n] + A B[:, j0 : j0 + n].
template <class T>
void checked_projection(const ConstMatrixRef<T>& A, const ConstMatrixRef<T>& B,
                        const PackedMatrix* packed, const ConstVectorMap<T>& bias, Index j0,
                        Index n, MatrixRef<T> C, GemmScratch<T>& scratch) {
  if (j0 < 0 || n < 0 || j0 + n > bias.size())
    throw ShapeError("projection: columns [" + std::to_string(j0) + ", " + std::to_string(j0 + n) +
                     ") outside the bias's " + std::to_string(bias.size()));
  check_columns<T>(A, B, packed, j0, n, C);
  project_columns<T>(kernels::table<T>(), A, {B.data(), B.outerStride(), packed, bias.data()}, j0,
                     n, C, scratch);
}

// Columns of a projection are handed to threads in multiples of this many: a multiple of every
// row panel Eigen's GEMM kernel uses (3 packets: 48 floats with AVX-512, 24 with AVX, 12 with SSE)
// and of the vector levels' 32-column panels, so each part is covered by full panels and every
// column is computed by the same kernel path, with the same sums, whatever the split.
inline constexpr Index kProjectionColumnAlign = 192;

// Rows per thread from which a product whose rows are exact is split by rows, not columns (each
// thread then reads all of the weight but only its rows of x and out).
inline constexpr Index kProjectionRowSplit = 64;

// Part `part` of `parts` of out[M, N] = x[M, K] @ w + bias, in thread `thread`'s packing buffers:
// a row range when rows are exact and there are kProjectionRowSplit rows per part, else a column
// range. Either way every element gets the bits of the unsplit product.
template <class T>
void project_part(const kernels::Kernels<T>& k, const ConstMatrixRef<T>& x,
                  const SublayerWeight<T>& w, Index N, MatrixRef<T>& out, Workspace<T>& ws,
                  Index part, Index parts, int thread) {
  const Index M = x.rows();
  GemmScratch<T>& gemm = ws.threads[static_cast<std::size_t>(thread)].gemm;
  if (parts > 1 && k.row_exact && M >= kProjectionRowSplit * parts) {
    const ColumnRange rows = column_part(M, part, parts, 1);
    if (rows.size() > 0)
      project_columns<T>(k, x.middleRows(rows.begin, rows.size()), w, 0, N,
                         out.middleRows(rows.begin, rows.size()), gemm);
    return;
  }
  const ColumnRange cols = column_part(N, part, parts, kProjectionColumnAlign);
  if (cols.size() > 0)
    project_columns<T>(k, x, w, cols.begin, cols.size(), out.middleCols(cols.begin, cols.size()),
                       gemm);
}

template <class T>
Index projection_parts(const Workspace<T>& ws, int n_threads) {
  return std::min<Index>(n_threads, ws.thread_capacity());
}

// out[M, N] = x @ w + bias on n_threads threads.
template <class T>
void project_parallel(const kernels::Kernels<T>& k, const ConstMatrixRef<T>& x,
                      const SublayerWeight<T>& w, Index N, MatrixRef<T>& out, Workspace<T>& ws,
                      int n_threads) {
  const Index parts = projection_parts(ws, n_threads);
  parallel_tasks(parts, static_cast<int>(parts), [&](Index part, int thread) {
    project_part<T>(k, x, w, N, out, ws, part, parts, thread);
  });
}

// ---- one head's attention over pages ----------------------------------------------------------

// The fused core's tile for query rows r0 .. r0 + nb - 1 of q [T, head_dim] (q row i is position
// kv.n_keys - T + i) over kv's pages, writing out's rows r0 ..
template <class T, class E>
kernels::AttentionTile<T> tile_over(const ConstMatrixRef<T>& q, const HeadPages<E>& kv, Index r0,
                                    Index nb, MatrixRef<T>& out, AttentionScratch<T>& scratch) {
  scratch.reserve_tile(q.cols());
  kernels::AttentionTile<T> t;
  t.rows = nb;
  t.first_pos = kv.n_keys - q.rows() + r0;
  t.head_dim = q.cols();
  t.q = q.data() + r0 * q.outerStride();
  t.ldq = q.outerStride();
  // attend_heads runs a head's tiles from the last rows back: the rows before r0 come next
  t.next_rows = std::min(nb, r0);
  t.next_q = t.next_rows > 0 ? q.data() + (r0 - t.next_rows) * q.outerStride() : nullptr;
  t.scale = T(1) / std::sqrt(T(q.cols()));
  t.out = out.data() + r0 * out.outerStride();
  t.ldo = out.outerStride();
  t.scratch = scratch.tile();
  t.bf16 = scratch.bf16_products();
  t.page_rows = kv.page_rows;
  t.key_stride = kv.row_stride;
  t.value_stride = kv.values_stride();
  if constexpr (std::is_same<E, std::uint16_t>::value) {
    t.key_pages_bf16 = kv.key_pages;
    t.value_pages_bf16 = kv.value_pages;
    t.keys_t_bf16 = kv.keys_t;
  } else {
    static_assert(std::is_same<E, T>::value, "gpt2: a cache's elements are T or bf16 bits");
    t.key_pages = kv.key_pages;
    t.value_pages = kv.value_pages;
    t.keys_t = kv.keys_t;
  }
  return t;
}

// ---- int8 pages: dequantized into the thread's scratch, read by the float kernels ---------------

// Key blocks a decode step over int8 pages dequantizes at a time (keys and values: 2 x 32 KB at
// head_dim 64, in L2 while the row's partials read them).
inline constexpr Index kDequantBlocks = 2;
// The same for the blocks dequantized to bf16 (dequantize_head_bf16): half the bytes per block.
inline constexpr Index kDequantBlocksBf16 = 4;

// What dequantize_head converts: key rows and value rows (a tile), key rows only (probabilities),
// or the transposed key blocks where kv has them (one page: a contiguous cache) and the level
// reads them (else key rows), and value rows (a decode step).
enum class Dequantize { rows, keys, decode };

// The scratch's pages for the dequantized keys and values of int8 head kv (keys and vals: the
// scratch's two halves; pages: its page table, keys' first then values'), key blocks
// [b_begin, b_end) pointed at their own positions: kKeyBlock rows of padded_head_dim(head_dim)
// elements per page, with kv's n_keys.
template <class E>
HeadPages<E> scratch_pages(const HeadPages<std::int8_t>& kv, std::vector<const E*>& pages, E* keys,
                           E* vals, Index b_begin, Index b_end) {
  const Index ld = kernels::padded_head_dim(kv.head_dim), kb = kernels::kKeyBlock;
  const Index blocks = static_cast<Index>(pages.size() / 2);
  HeadPages<E> f;
  f.key_pages = pages.data();
  f.value_pages = pages.data() + blocks;
  f.page_rows = kb;
  f.row_stride = ld;
  f.n_keys = kv.n_keys;
  f.head_dim = kv.head_dim;
  for (Index b = b_begin; b < b_end; ++b) {
    pages[static_cast<std::size_t>(b)] = keys + b * kb * ld;
    pages[static_cast<std::size_t>(blocks + b)] = vals + b * kb * ld;
  }
  return f;
}

// Rows [j0, j1) of int8 head kv (j0 a multiple of kKeyBlock) dequantized into the scratch
// (float(q) * scale: kernels/int8_dequant.hpp, at level isa; the same bits at every level), each
// at its own position: float pages of kKeyBlock rows, padded_head_dim apart, and keys_t when
// converted, with kv's n_keys; rows [j0, j1) are kv's dequantized (no others may be read). No
// allocation once reserve_for has reserved the scratch for j1 keys.
inline HeadPages<float> dequantize_head(Isa isa, const HeadPages<std::int8_t>& kv, Index j0,
                                        Index j1, Dequantize what,
                                        AttentionScratch<float>& scratch) {
  const Index hd = kv.head_dim, ld = kernels::padded_head_dim(hd), kb = kernels::kKeyBlock;
  scratch.reserve_dequantized(j1, hd);
  float* const keys = scratch.dequantized();
  float* const vals = keys + scratch.dequantized_size() / 2;
  HeadPages<float> f = scratch_pages<float>(kv, scratch.dequantized_pages(), keys, vals, j0 / kb,
                                            (j1 + kb - 1) / kb);
  // (the vector levels' one-row steps read keys_t; the generic level's read key rows)
  if (what == Dequantize::decode && kv.keys_t != nullptr && isa != Isa::generic) {
    kernels::dequantize_key_blocks(isa, kv.keys_t, kv.key_scale_pages[0], j0 / kb,
                                   (j1 + kb - 1) / kb, hd, keys);
    f.keys_t = keys;
  } else {
    kernels::dequantize_rows(isa, kv.key_pages, kv.key_scale_pages, kv.page_rows, kv.row_stride,
                             j0, j1 - j0, hd, keys + j0 * ld, ld);
  }
  if (what != Dequantize::keys)
    kernels::dequantize_rows(isa, kv.value_pages, kv.value_scale_pages, kv.page_rows,
                             kv.values_stride(), j0, j1 - j0, hd, vals + j0 * ld, ld);
  return f;
}

// Key blocks [b0, b1) of int8 head kv dequantized and rounded to bf16 bits into the scratch's bf16
// pages (kernels/int8_dequant.hpp's dequantize_rows_bf16, at level isa), each at its own position
// (dequantize_head's layout in bf16 elements), keys_t too where kv has them, with kv's n_keys:
// what a level with bf16 pair products (Kernels::bf16_pair_decode) reads of those blocks, at half
// the bytes of the float32 pages. No allocation once reserve_for has reserved the scratch.
inline HeadPages<std::uint16_t> dequantize_head_bf16(Isa isa, const HeadPages<std::int8_t>& kv,
                                                     Index b0, Index b1,
                                                     AttentionScratch<float>& scratch) {
  const Index hd = kv.head_dim, ld = kernels::padded_head_dim(hd), kb = kernels::kKeyBlock;
  const Index j0 = b0 * kb, j1 = std::min(b1 * kb, kv.n_keys);
  scratch.reserve_dequantized_bf16(j1, hd);
  std::uint16_t* const keys = scratch.dequantized_bf16();
  std::uint16_t* const vals = keys + scratch.dequantized_bf16_size() / 2;
  HeadPages<std::uint16_t> f = scratch_pages<std::uint16_t>(
      kv, scratch.dequantized_bf16_pages(), keys, vals, b0, b1);
  if (kv.keys_t != nullptr) {
    kernels::dequantize_key_blocks_bf16(isa, kv.keys_t, kv.key_scale_pages[0], b0, b1, hd, keys);
    f.keys_t = keys;
  } else {
    kernels::dequantize_rows_bf16(isa, kv.key_pages, kv.key_scale_pages, kv.page_rows,
                                  kv.row_stride, j0, j1 - j0, hd, keys + j0 * ld, ld);
  }
  kernels::dequantize_rows_bf16(isa, kv.value_pages, kv.value_scale_pages, kv.page_rows,
                                kv.values_stride(), j0, j1 - j0, hd, vals + j0 * ld, ld);
  return f;
}

// Query rows r0 .. r0 + nb - 1 of q [T, head_dim] attend over kv: out's rows r0 ... A row's bits
// depend only on its position and data (not on r0, nb or how the keys are paged). int8 pages: the
// keys and values the tile sees (0 .. its last row's position) dequantized first.
template <class T, class E>
void attend_rows(const kernels::Kernels<T>& k, const ConstMatrixRef<T>& q, const HeadPages<E>& kv,
                 Index r0, Index nb, MatrixRef<T>& out, AttentionScratch<T>& scratch) {
  if (nb <= 0) return;
  if constexpr (std::is_same<E, std::int8_t>::value) {
    const Index seen = kv.n_keys - q.rows() + r0 + nb;
    const HeadPages<T> f = dequantize_head(k.isa, kv, 0, seen, Dequantize::rows, scratch);
    k.attention_tile(tile_over<T, T>(q, f, r0, nb, out, scratch));
  } else {
    k.attention_tile(tile_over<T, E>(q, kv, r0, nb, out, scratch));
  }
}

// The probabilities of rows r0 .. r0 + nb - 1 (nb <= kTileMaxRows) of q [T, head_dim] over kv:
// probs' rows r0 .. (keys past the tile's last row 0). Scores key by key over the pages (bf16 keys
// widened a block at a time, int8 keys dequantized first), then each row's softmax: a row's
// probabilities depend on its own data only. The scratch has room (reserve_probabilities). The
// output comes from the fused core either way, so asking for the probabilities never changes it.
template <class T, class E>
void probability_rows(const kernels::Kernels<T>& k, const ConstMatrixRef<T>& q,
                      const HeadPages<E>& kv, Index r0, Index nb, MatrixRef<T>& probs,
                      AttentionScratch<T>& scratch) {
  const Index hd = q.cols(), n_past = kv.n_keys - q.rows(), n_visible = n_past + r0 + nb;
  if constexpr (std::is_same<E, std::int8_t>::value) {
    const HeadPages<T> f = dequantize_head(k.isa, kv, 0, n_visible, Dequantize::keys, scratch);
    probability_rows<T, T>(k, q, f, r0, nb, probs, scratch);
  } else {
    const T scale = T(1) / std::sqrt(T(hd));
    MatrixRef<T> att = scratch.scores.topLeftCorner(nb, n_visible);
    for (Index j0 = 0; j0 < n_visible;) {  // a run of keys within one page and one block
      const Index page = j0 / kv.page_rows, in_page = j0 % kv.page_rows;
      const Index n = std::min({n_visible - j0, kv.page_rows - in_page, kernels::kKeyBlock});
      const T* keys;
      Index ldk;
      if constexpr (std::is_same<E, std::uint16_t>::value) {
        for (Index j = 0; j < n; ++j)
          for (Index d = 0; d < hd; ++d)
            scratch.widened(j, d) =
                kernels::bf16_to_float(kv.key_pages[page][(in_page + j) * kv.row_stride + d]);
        keys = scratch.widened.data();
        ldk = scratch.widened.outerStride();
      } else {
        keys = kv.key_pages[page] + in_page * kv.row_stride;
        ldk = kv.row_stride;
      }
      for (Index i = 0; i < nb; ++i)
        k.row_times_transposed(n, hd, q.data() + (r0 + i) * q.outerStride(), keys, ldk,
                               &att(i, j0));
      j0 += n;
    }
    for (Index i = 0; i < nb; ++i) k.softmax_row(&att(i, 0), n_past + r0 + i + 1, n_visible, scale);
    probs.middleRows(r0, nb).leftCols(n_visible) = att;
    probs.middleRows(r0, nb).rightCols(probs.cols() - n_visible).setZero();
  }
}

// A decode step's row split over threads: the partials of q's last row (position kv.n_keys - 1)
// over key blocks [b0, b1), and the row from all of them: merged in block order they give
// attend_rows' bits. int8 pages: kDequantBlocks blocks dequantized at a time, then their partials;
// where the level reads the blocks before the row's own in bf16 pairs (a bf16 tile,
// Kernels::bf16_pair_decode), those dequantized straight to bf16 (the same operands, so the same
// bits: partials are per block, so splitting the range does not change them), the own block to
// float32.
template <class T, class E>
void row_partials(const kernels::Kernels<T>& k, const ConstMatrixRef<T>& q, const HeadPages<E>& kv,
                  Index b0, Index b1, T* parts, AttentionScratch<T>& scratch) {
  if constexpr (std::is_same<E, std::int8_t>::value) {
    const Index stride = kernels::partial_stride(kv.head_dim);
    const Index own = (kv.n_keys - 1) / kernels::kKeyBlock;  // the row's own block
    const Index pairs_end =
        k.bf16_pair_decode && scratch.bf16_products() ? std::clamp(own, b0, b1) : b0;
    Index b0_done = b0;  // blocks whose partials are written
    if (k.row_partials_int8 != nullptr && kv.keys_t != nullptr && pairs_end > b0) {
      // read in place, converted in registers
      HeadPages<T> layout;  // the paging and sizes only: no float32 rows are read
      layout.page_rows = kv.page_rows;
      layout.row_stride = kv.row_stride;
      layout.value_stride = kv.values_stride();
      layout.n_keys = kv.n_keys;
      layout.head_dim = kv.head_dim;
      Eigen::Map<RowMatrix<T>, 0, Eigen::OuterStride<>> no_out(nullptr, 0, 0,
                                                               Eigen::OuterStride<>(1));
      MatrixRef<T> none(no_out);
      kernels::AttentionTile<T> t = tile_over<T, T>(q, layout, q.rows() - 1, 1, none, scratch);
      t.next_q = nullptr;
      t.next_rows = 0;
      t.keys_t_int8 = kv.keys_t;
      t.key_scales = kv.key_scale_pages[0];
      t.value_pages_int8 = kv.value_pages;
      t.value_scale_pages = kv.value_scale_pages;
      k.row_partials_int8(t, b0, pairs_end, parts);
      b0_done = pairs_end;
    }
    for (Index c0 = b0_done; c0 < pairs_end; c0 += kDequantBlocksBf16) {
      const Index c1 = std::min(pairs_end, c0 + kDequantBlocksBf16);
      const HeadPages<std::uint16_t> f = dequantize_head_bf16(k.isa, kv, c0, c1, scratch);
      row_partials<T, std::uint16_t>(k, q, f, c0, c1, parts + (c0 - b0) * stride, scratch);
    }
    for (Index c0 = pairs_end; c0 < b1; c0 += kDequantBlocks) {
      const Index c1 = std::min(b1, c0 + kDequantBlocks);
      const HeadPages<T> f = dequantize_head(k.isa, kv, c0 * kernels::kKeyBlock,
                                             std::min(c1 * kernels::kKeyBlock, kv.n_keys),
                                             Dequantize::decode, scratch);
      row_partials<T, T>(k, q, f, c0, c1, parts + (c0 - b0) * stride, scratch);
    }
  } else {
    Eigen::Map<RowMatrix<T>, 0, Eigen::OuterStride<>> no_out(nullptr, 0, 0,
                                                             Eigen::OuterStride<>(1));
    MatrixRef<T> none(no_out);
    kernels::AttentionTile<T> t = tile_over<T, E>(q, kv, q.rows() - 1, 1, none, scratch);
    t.next_q = nullptr;
    t.next_rows = 0;
    k.row_partials(t, b0, b1, parts);
  }
}
template <class T>
void merge_row_partials(const kernels::Kernels<T>& k, Index head_dim, Index n_keys, const T* parts,
                        T* out, AttentionScratch<T>& scratch) {
  scratch.reserve_tile(head_dim);
  kernels::AttentionTile<T> t;
  t.rows = 1;
  t.first_pos = n_keys - 1;
  t.head_dim = head_dim;
  t.out = out;
  t.ldo = head_dim;
  t.scratch = scratch.tile();
  k.merge_row_partials(t, (n_keys + kernels::kKeyBlock - 1) / kernels::kKeyBlock, parts);
}

// ---- the keys a forward attends to ------------------------------------------------------------

// Whether C models the cache concept (kv_cache.hpp).
template <class C, class = void>
struct IsKVCache : std::false_type {};
template <class C>
struct IsKVCache<C, std::void_t<decltype(std::declval<C&>().begin_append(Index(0))),
                                typename C::Element>> : std::true_type {};

// A forward without a KV cache: nothing to store; the new rows attend to their own keys (the k and
// v blocks of qkv: QkvKeys). The cache concept's operations are no-ops.
struct NoCache {
  static const char* label() { return "workspace"; }
  Index n_past() const { return 0; }
  void check_append(Index) const {}
  Index begin_append(Index) { return 0; }
  void rollback(Index) {}
  template <class M>
  void write_head(Index, Index, const M&, const M&) {}
};

// The keys and values of the rows of qkv [T, 3 C_h] as pages: one page per head, rows of qkv's
// stride, the page pointers in `pages` (the workspace's qkv_pages).
template <class T>
class QkvKeys {
 public:
  QkvKeys(const AttentionConfig& heads, const ConstMatrixRef<T>& qkv, std::vector<const T*>& pages)
      : heads_(heads), qkv_(qkv), pages_(pages) {
    const Index C = heads.n_embd, hd = heads.head_dim();
    for (Index h = 0; h < heads.n_head; ++h) {
      pages_[2 * static_cast<std::size_t>(h)] = qkv.data() + C + h * hd;
      pages_[2 * static_cast<std::size_t>(h) + 1] = qkv.data() + 2 * C + h * hd;
    }
  }
  HeadPages<T> head_pages(Index h) const {
    HeadPages<T> kv;
    kv.key_pages = &pages_[2 * static_cast<std::size_t>(h)];
    kv.value_pages = &pages_[2 * static_cast<std::size_t>(h) + 1];
    kv.page_rows = std::max<Index>(qkv_.rows(), 1);
    kv.row_stride = qkv_.outerStride();
    kv.n_keys = qkv_.rows();
    kv.head_dim = heads_.head_dim();
    return kv;
  }

 private:
  AttentionConfig heads_;
  ConstMatrixRef<T> qkv_;
  std::vector<const T*>& pages_;
};

// What the new rows (qkv) attend to: the cache's keys, or without one their own.
template <class Cache, class T>
const Cache& keys_of(const Cache& cache, const QkvKeys<T>&) {
  return cache;
}
template <class T>
const QkvKeys<T>& keys_of(const NoCache&, const QkvKeys<T>& own) {
  return own;
}

// The new rows' keys and values (qkv [n, 3 C_h]'s k and v blocks) into the cache's rows from p.
template <class T, class Cache>
void store_rows(Cache& cache, const AttentionConfig& heads, Index p, const ConstMatrixRef<T>& qkv) {
  const Index C = heads.n_embd;
  const ConstMatrixRef<T> k = qkv.middleCols(C, C), v = qkv.middleCols(2 * C, C);
  for (Index h = 0; h < heads.n_head; ++h) cache.write_head(h, p, k, v);
}

// Keys a workspace should have room for when a forward appends n rows to the cache: the cache's
// capacity where it has one (decode steps after the first then never grow the workspace).
template <class Cache>
auto keys_to_reserve(const Cache& cache, Index n, int) -> decltype(cache.capacity()) {
  return std::max(cache.capacity(), cache.n_past() + n);
}
template <class Cache>
Index keys_to_reserve(const Cache& cache, Index n, long) {
  return cache.n_past() + n;
}

// ---- the heads ----------------------------------------------------------------------------------

// q of head h in qkv [T, 3 C_h]: [T, head_dim], a view.
template <class T>
ConstMatrixRef<T> q_of(const ConstMatrixRef<T>& qkv, const AttentionConfig& heads, Index h) {
  return qkv.middleCols(h * heads.head_dim(), heads.head_dim());
}

// One head of a decode step: q's one row over all of kv's key blocks, each block's partial written
// to parts (room for every block), then merged in block order into out: attend_rows' bits. The
// fused core would fold the partials block by block instead; written out and merged after, the
// keys stream from memory faster (CHANGELOG.md, 0.3.0).
template <class T, class E>
void decode_head(const kernels::Kernels<T>& k, const ConstMatrixRef<T>& q, const HeadPages<E>& kv,
                 T* parts, T* out, AttentionScratch<T>& scratch) {
  const Index n_blocks = (kv.n_keys + kernels::kKeyBlock - 1) / kernels::kKeyBlock;
  row_partials<T>(k, q, kv, 0, n_blocks, parts, scratch);
  merge_row_partials<T>(k, kv.head_dim, kv.n_keys, parts, out, scratch);
}

// A decode step (one row, no probabilities): each head's row from its key blocks' partials,
// merged in block order (decode_head). With fewer heads than threads, each head's blocks split
// into chunks over the threads, then the merges: the same bits on any thread count. False
// (nothing done) when the step is not a decode step.
template <class T, class Keys>
bool decode_step(const kernels::Kernels<T>& k, const AttentionConfig& heads,
                 const ConstMatrixRef<T>& qkv, const Keys& keys, Workspace<T>& ws,
                 MatrixRef<T>& merged, int n_threads) {
  const Index n_head = heads.n_head, hd = heads.head_dim();
  if (qkv.rows() != 1) return false;
  const Index n_keys = keys.head_pages(0).n_keys;
  const Index n_blocks = (n_keys + kernels::kKeyBlock - 1) / kernels::kKeyBlock;
  const Index chunks = std::min<Index>(n_blocks, (n_threads + n_head - 1) / n_head);
  const Index stride = kernels::partial_stride(hd);
  if (n_head * n_blocks * stride > ws.partials_size()) return false;
  T* parts = ws.partials();
  if (chunks < 2) {
    parallel_tasks(n_head, n_threads, [&](Index h, int thread) {
      decode_head<T>(k, q_of<T>(qkv, heads, h), keys.head_pages(h),
                     parts + h * n_blocks * stride, merged.data() + h * hd,
                     ws.threads[static_cast<std::size_t>(thread)].attention);
    });
    return true;
  }
  parallel_tasks(n_head * chunks, n_threads, [&](Index task, int thread) {
    const Index h = task / chunks, c = task % chunks;
    const Index b0 = c * n_blocks / chunks, b1 = (c + 1) * n_blocks / chunks;
    row_partials<T>(k, q_of<T>(qkv, heads, h), keys.head_pages(h), b0, b1,
                    parts + (h * n_blocks + b0) * stride,
                    ws.threads[static_cast<std::size_t>(thread)].attention);
  });
  parallel_tasks(n_head, n_threads, [&](Index h, int thread) {
    merge_row_partials<T>(k, hd, n_keys, parts + h * n_blocks * stride,
                          merged.data() + h * hd,
                          ws.threads[static_cast<std::size_t>(thread)].attention);
  });
  return true;
}

// The heads of the new rows (q in qkv [T, 3 C_h]) over keys.head_pages(h): merged [T, C_h] (head
// h at columns h * head_dim), and probs [n_head * T, n_keys] when not null. The (head, row tile)
// pairs run on n_threads threads, head by head (the threads share one head's keys in cache), each
// head's costliest tiles (its last rows) first.
template <class T, class Keys>
void attend_heads(const kernels::Kernels<T>& k, const Sublayer<T>& s, const ConstMatrixRef<T>& qkv,
                  const Keys& keys, Workspace<T>& ws, MatrixRef<T>& merged, MatrixRef<T>* probs,
                  int n_threads) {
  const AttentionConfig& heads = s.heads;
  const Index T_ = qkv.rows(), n_head = heads.n_head, hd = heads.head_dim();
  if (!probs && decode_step<T>(k, heads, qkv, keys, ws, merged, n_threads)) return;
  const Index row_block = probs ? kernels::kTileMaxRows
                                : k.tile_rows(s.bf16_products, hd, false);
  const Index tiles = (T_ + row_block - 1) / row_block;
  if (probs) ws.reserve_probabilities();
  parallel_tasks(n_head * tiles, n_threads, [&](Index task, int thread) {
    const Index h = task / tiles, tile = tiles - 1 - task % tiles;
    const Index r0 = tile * row_block, nb = std::min(row_block, T_ - r0);
    MatrixRef<T> y = merged.middleCols(h * hd, hd);
    AttentionScratch<T>& scratch = ws.threads[static_cast<std::size_t>(thread)].attention;
    const auto kv = keys.head_pages(h);
    attend_rows(k, q_of<T>(qkv, heads, h), kv, r0, nb, y, scratch);
    if (probs) {
      MatrixRef<T> p = probs->middleRows(h * T_, T_);
      probability_rows(k, q_of<T>(qkv, heads, h), kv, r0, nb, p, scratch);
    }
  });
}

// Whether a decode step's heads split into `parts` contiguous ranges (column_part over the heads)
// whose q, k and v columns start and end on multiples of kProjectionColumnAlign: then each column
// is computed by the same kernel path as in the qkv product's own column parts (the same bits),
// and one thread can compute a range's columns and attend its heads with no barrier in between.
inline bool decode_heads_split_aligned(const AttentionConfig& heads, Index parts) {
  for (Index part = 1; part < parts; ++part)
    if (column_part(heads.n_head, part, parts, 1).begin * heads.head_dim() %
            kProjectionColumnAlign != 0)
      return false;
  return true;
}

// A decode step (x [1, C], no probabilities) on n_threads >= 2 threads, at least as many heads as
// threads, in one parallel region: each task a range of heads when they split on aligned columns
// (their q, k and v columns, then their head steps, with no barrier between), else the qkv
// product's column parts, a barrier, then a task per head; then the output projection's column
// parts. head_step(h, thread): head h's cache rows, then its slot of merged. The same parts,
// kernels and order as the general path: the same bits, for one region's start and two barriers.
template <class T, class HeadStep>
void decode_step_region(const kernels::Kernels<T>& k, const Sublayer<T>& s,
                        const ConstMatrixRef<T>& x, Workspace<T>& ws, MatrixRef<T>& out,
                        int n_threads, const HeadStep& head_step) {
  MatrixRef<T> qkv = ws.qkv.topRows(1);
  const ConstMatrixRef<T> merged = ws.merged.topRows(1);
  const AttentionConfig& heads = s.heads;
  const Index parts = projection_parts(ws, n_threads), Ch = heads.n_embd, hd = heads.head_dim();
  const bool by_heads = decode_heads_split_aligned(heads, parts);
  parallel_steps(n_threads, [&](const Team& team) {
    if (by_heads) {
      team.tasks(parts, [&](Index part, int thread) {  // heads [begin, end): q, k, v, then heads
        const ColumnRange range = column_part(heads.n_head, part, parts, 1);
        GemmScratch<T>& gemm = ws.threads[static_cast<std::size_t>(thread)].gemm;
        for (Index block = 0; block < 3; ++block) {  // q | k | v
          const Index j0 = block * Ch + range.begin * hd, n = range.size() * hd;
          project_columns<T>(k, x, s.c_attn, j0, n, qkv.middleCols(j0, n), gemm);
        }
        for (Index h = range.begin; h < range.end; ++h) head_step(h, thread);
      });
    } else {
      team.tasks(parts, [&](Index part, int thread) {  // qkv = x @ c_attn.weight + c_attn.bias
        project_part<T>(k, x, s.c_attn, 3 * Ch, qkv, ws, part, parts, thread);
      });
      team.tasks(heads.n_head, head_step);
    }
    team.tasks(parts, [&](Index part, int thread) {  // out = merged @ c_proj.weight + c_proj.bias
      project_part<T>(k, merged, s.c_proj, s.n_embd, out, ws, part, parts, thread);
    });
  });
}

// The heads of T new rows of one sequence whose projections are in qkv [T, 3 C_h] and whose keys
// and values are stored (cache: its pages; NoCache: qkv's own): merged [T, C_h] and probs.
template <class T, class Cache>
void attend_sequence(const kernels::Kernels<T>& k, const Sublayer<T>& s,
                     const ConstMatrixRef<T>& qkv, const Cache& cache, Workspace<T>& ws,
                     MatrixRef<T>& merged, MatrixRef<T>* probs, int n_threads) {
  const QkvKeys<T> own(s.heads, qkv, ws.qkv_pages());
  attend_heads(k, s, qkv, keys_of(cache, own), ws, merged, probs, n_threads);
}

// The forward of T new rows x [T, C] of one sequence after every check, with the workspace grown
// and the cache's rows p .. p + T - 1 appended (not yet written): out [T, C], probs.
template <class T, class Cache>
void run_forward(const kernels::Kernels<T>& k, const Sublayer<T>& s, const ConstMatrixRef<T>& x,
                 Cache& cache, Index p, Workspace<T>& ws, MatrixRef<T>& out, MatrixRef<T>* probs) {
  const Index T_ = x.rows(), Ch = s.heads.n_embd, hd = s.heads.head_dim();
  MatrixRef<T> qkv = ws.qkv.topRows(T_);
  MatrixRef<T> merged = ws.merged.topRows(T_);
  const int n_threads = forward_threads(ws);
  const ConstMatrixRef<T> qkv_read = qkv;
  // x is fully read by the first step (here or in the region): out may alias x
  // each head's partials: ws.partials() + h * head_parts (decode_head)
  const Index head_parts =
      (p + 1 + kernels::kKeyBlock - 1) / kernels::kKeyBlock * kernels::partial_stride(hd);
  if (!probs && T_ == 1 && n_threads >= 2 && s.heads.n_head >= n_threads &&
      s.heads.n_head * head_parts <= ws.partials_size()) {
    const QkvKeys<T> own(s.heads, qkv_read, ws.qkv_pages());
    const auto& keys = keys_of(cache, own);
    decode_step_region<T>(k, s, x, ws, out, n_threads, [&](Index h, int thread) {
      cache.write_head(h, p, qkv_read.middleCols(Ch, Ch), qkv_read.middleCols(2 * Ch, Ch));
      decode_head<T>(k, q_of<T>(qkv_read, s.heads, h), keys.head_pages(h),
                     ws.partials() + h * head_parts, merged.data() + h * hd,
                     ws.threads[static_cast<std::size_t>(thread)].attention);
    });
    return;
  }
  project_parallel<T>(k, x, s.c_attn, 3 * Ch, qkv, ws, n_threads);
  store_rows<T>(cache, s.heads, p, qkv_read);
  attend_sequence<T>(k, s, qkv_read, cache, ws, merged, probs, n_threads);
  const ConstMatrixRef<T> merged_read = merged;
  project_parallel<T>(k, merged_read, s.c_proj, s.n_embd, out, ws, n_threads);
}

// The single-sequence forward over any cache (NoCache: none), for any sublayer S:
//   x [T, C] (positions cache.n_past() .. + T - 1), out [T, C] (may alias x),
//   probs (or null) [n_head * T, n_past + T] (this sublayer's heads).
// Every check runs (and, for a shard, every rank agrees) before anything changes; the cache gains
// T rows, or, if anything throws after that, is rolled back.
template <class T, class S, class Cache>
void forward(const S& sublayer, const ConstMatrixRef<T>& x, Cache& cache, Workspace<T>& ws,
             MatrixRef<T>& out, MatrixRef<T>* probs) {
  using Traits = SublayerTraits<S>;
  const Sublayer<T> s = Traits::of(sublayer);
  const kernels::Kernels<T>& k = kernels::table<T>();
  const Index T_ = x.rows(), C = s.n_embd, n_past = cache.n_past();
  constexpr bool cached = !std::is_same<Cache, NoCache>::value;
  Index p = -1;  // the first new position, once appended
  try {
    Traits::agree(
        sublayer,
        [&] {
          check_shape("x", {T_, C}, {x.rows(), x.cols()});
          check_shape("out", {T_, C}, {out.rows(), out.cols()});
          if (probs)
            check_shape(s.probs_name, {s.heads.n_head * T_, n_past + T_},
                        {probs->rows(), probs->cols()});
          check_heads(s, "workspace", ws.config());
          if constexpr (cached) {
            check_heads(s, Cache::label(), cache.config());
            cache.check_append(T_);
            cache.check_disjoint("out", out);
            if (probs) cache.check_disjoint("probs", *probs);
          }
          if (T_ == 0) return;
          reserve_for(s, T_, keys_to_reserve(cache, T_, 0), ws, StoresInt8<Cache>::value);
          check_workspace_overlap<T>(ws, T_, out, probs);
          if (overlaps(x, ws.qkv.topRows(T_))) throw ShapeError("x: must not overlap the workspace");
          p = cache.begin_append(T_);  // CapacityError: nothing changed
        },
        CallShape()
            .add("the call", cached ? 2 : 1)
            .add("x's rows (T)", T_)
            .add("the cached positions (n_past)", n_past)
            .add("whether probs are written", probs != nullptr));
  } catch (...) {
    if (p >= 0) cache.rollback(p);  // another rank failed: undo this one's append
    throw;
  }
  if (T_ == 0) return;
  try {
    run_forward<T>(k, s, x, cache, p, ws, out, probs);
    Traits::all_reduce(sublayer, out);
  } catch (...) {  // not expected after the checks
    cache.rollback(p);
    throw;
  }
}

}  // namespace gpt2::detail
