// The generic level: Eigen's products (vectorized for whatever the program is compiled for: SSE2
// on a plain x86-64 build) and the fused core in plain C++. It runs float at the generic level and
// double at every level; its table (generic_table) is complete, as every level's is.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/gemm_scratch.hpp"
#include "gpt2/kernels/layout.hpp"
#include "gpt2/kernels/pack.hpp"
#include "gpt2/kernels/table.hpp"
#include "gpt2/types.hpp"

namespace gpt2::kernels::generic {

// Eigen's GEMM driver on row-major A, B (stored in BOrder), C: C += alpha * A * B.
template <class T, int BOrder>
void run_gemm(Index M, Index N, Index K, T alpha, const ConstMatrixRef<T>& A,
              const ConstMatrixRef<T>& B, MatrixRef<T>& C, GemmScratch<T>& scratch) {
  Eigen::internal::general_matrix_matrix_product<Index, T, Eigen::RowMajor, false, T, BOrder, false,
                                                 Eigen::RowMajor, 1>::run(M, N, K, A.data(),
                                                                          A.outerStride(), B.data(),
                                                                          B.outerStride(), C.data(),
                                                                          1, C.outerStride(), alpha,
                                                                          scratch.blocking(),
                                                                          nullptr);
}

// C[1, N] += alpha * A[1, K] * op(B) with Eigen's matrix-vector kernels (no packing, no
// allocation: every operand is contiguous in its inner dimension).
template <class T>
void run_gemv(T alpha, const ConstMatrixRef<T>& A, const ConstMatrixRef<T>& B, Op op_b,
              MatrixRef<T>& C) {
  using RowVectorMap = Eigen::Map<RowVector<T>>;
  using ConstRowVectorMap = Eigen::Map<const RowVector<T>>;
  RowVectorMap c(C.data(), C.cols());
  const ConstRowVectorMap a(A.data(), A.cols());
  if (op_b == Op::None)
    c.noalias() += alpha * a * B;              // B [K, N]: column-major GEMV on B^T
  else
    c.noalias() += alpha * a * B.transpose();  // B [N, K]: one dot product per row of B
}

// C[M, N] += alpha * A[M, K] * op(B) through Eigen (GEMV for one row). Shapes already checked.
template <class T>
void gemm(T alpha, const ConstMatrixRef<T>& A, const ConstMatrixRef<T>& B, Op op_b, MatrixRef<T>& C,
          GemmScratch<T>& scratch) {
  const Index M = A.rows(), K = A.cols(), N = C.cols();
  if (M == 1) {  // one row (a decode step): Eigen's GEMV streams B once and needs no packing
    run_gemv<T>(alpha, A, B, op_b, C);
    return;
  }
  scratch.reserve(M, N, K);
  if (op_b == Op::None)
    run_gemm<T, Eigen::RowMajor>(M, N, K, alpha, A, B, C, scratch);
  else  // B^T of a row-major [N, K] is a column-major [K, N] with the same stride
    run_gemm<T, Eigen::ColMajor>(M, N, K, alpha, A, B, C, scratch);
}

// max(-inf, row[0], ..., row[n-1]); NaN if any entry is NaN.
template <class T>
T running_max(const T* row, Index n) {
  constexpr int kLanes = 8;
  T lane[kLanes];
  for (T& m : lane) m = -std::numeric_limits<T>::infinity();
  bool nan = false;
  Index j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const T v = row[j + l];
      nan |= v != v;
      lane[l] = v > lane[l] ? v : lane[l];
    }
  for (; j < n; ++j) {
    nan |= row[j] != row[j];
    lane[0] = row[j] > lane[0] ? row[j] : lane[0];
  }
  T max = lane[0];
  for (int l = 1; l < kLanes; ++l) max = lane[l] > max ? lane[l] : max;
  return nan ? std::numeric_limits<T>::quiet_NaN() : max;
}

// In place: row[0 .. n) = softmax(row[0 .. n)), row[n .. n_keys) = 0 (1 <= n <= n_keys), with
// Eigen's vectorized exp. The running max starts at minus infinity (never a finite sentinel).
template <class T>
void softmax_row(T* row, Index n, Index n_keys) {
  Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>> visible(row, n);
  const T max = running_max(row, n);
  visible = (visible - max).exp();
  const T sum = visible.sum();
  visible *= T(1) / sum;
  for (Index j = n; j < n_keys; ++j) row[j] = T(0);
}


// ---- the fused core in plain C++ -----------------------------------------------------------


#if defined(_MSC_VER)
#define GPT2_KERNEL_NOINLINE __declspec(noinline)
#else
#define GPT2_KERNEL_NOINLINE __attribute__((noinline))
#endif

// e^x as 2^(x log2 e), with the interface's edge cases (NaN stays NaN; the caller never passes
// +inf - +inf).
template <class T>
T block_exp(T x) {
  return std::exp2(x * static_cast<T>(kLog2e));
}

// The running state of one row: max, reference point, sum, o [hdp].
template <class T>
struct RowState {
  T m, z, l;
  T* o;
};

// One row's partial over the block at b0 (n visible keys; kt its k^T, vrow its values), written to
// part (layout of partial_stride). Out of line, so that every caller runs these very operations.
template <class T>
GPT2_KERNEL_NOINLINE void block_partial(const T* qs, Index head_dim, const T* kt, Index n,
                                        const T* const* vrow, T* part) {
  const T minus_inf = -std::numeric_limits<T>::infinity();
  T score[kKeyBlock] = {};
  for (Index d = 0; d < head_dim; ++d) {
    const T qd = qs[d];
    const T* kd = kt + d * kKeyBlock;
    for (Index j = 0; j < kKeyBlock; ++j) score[j] += qd * kd[j];
  }
  T mb = minus_inf;
  bool nan = false;
  for (Index j = 0; j < n; ++j) {
    nan = nan || std::isnan(score[j]);
    mb = std::max(mb, score[j]);
  }
  if (nan) mb = std::numeric_limits<T>::quiet_NaN();
  const T zb = mb == minus_inf ? T(0) : mb;
  T p[kKeyBlock];
  T lanes[16] = {};
  for (Index j = 0; j < kKeyBlock; ++j) {
    p[j] = j < n ? block_exp<T>(score[j] - zb) : T(0);
    lanes[j % 16] += p[j];
  }
  for (Index half = 8; half >= 1; half /= 2)
    for (Index i = 0; i < half; ++i) lanes[i] += lanes[i + half];
  part[0] = mb;
  part[1] = zb;
  part[2] = lanes[0];
  T* ob = part + kPartialHeader;
  std::fill(ob, ob + head_dim, T(0));
  for (Index j = 0; j < n; ++j) {
    const T pj = p[j];
    const T* v = vrow[j];
    for (Index d = 0; d < head_dim; ++d) ob[d] += pj * v[d];
  }
}

// Merges a partial into the row's running state (the header's merge step).
template <class T>
GPT2_KERNEL_NOINLINE void fold_partial(const T* part, Index head_dim, RowState<T>& st) {
  const T minus_inf = -std::numeric_limits<T>::infinity();
  const T mb = part[0], zb = part[1], lb = part[2];
  const T m_new = (std::isnan(st.m) || std::isnan(mb)) ? std::numeric_limits<T>::quiet_NaN()
                                                       : std::max(st.m, mb);
  const T z_new = m_new == minus_inf ? T(0) : m_new;
  const T a = st.m == minus_inf ? T(0) : block_exp<T>(st.z - z_new);
  const T c = mb == minus_inf ? T(0) : block_exp<T>(zb - z_new);
  st.l = lb * c + st.l * a;
  st.m = m_new;
  st.z = z_new;
  const T* ob = part + kPartialHeader;
  for (Index d = 0; d < head_dim; ++d) st.o[d] = ob[d] * c + st.o[d] * a;
}

// kt[d][j] = rows[j][d] for j < n (block keys), d < head_dim.
template <class T>
void pack_keys_t(const T* const* rows, Index n, Index head_dim, T* kt) {
  for (Index j = 0; j < n; ++j)
    for (Index d = 0; d < head_dim; ++d) kt[d * kKeyBlock + j] = rows[j][d];
  for (Index j = n; j < kKeyBlock; ++j)
    for (Index d = 0; d < head_dim; ++d) kt[d * kKeyBlock + j] = T(0);
}

// The tile, in plain C++ (float or double): the steps of the header's comment, row by row, each
// block a partial merged in order.
template <class T>
void attention_tile(const AttentionTile<T>& t) {
  const Index hd = t.head_dim, hdp = padded_head_dim(hd), nb = t.rows;
  TileScratch<T> s(t.scratch, hd);
  for (Index r = 0; r < nb; ++r) {
    for (Index d = 0; d < hd; ++d) s.qs[r * hdp + d] = t.q[r * t.ldq + d] * t.scale;
    std::fill(s.o + r * hdp, s.o + r * hdp + hdp, T(0));
    s.m[r] = -std::numeric_limits<T>::infinity();
    s.z[r] = T(0);
    s.l[r] = T(0);
  }
  const Index last = t.first_pos + nb - 1;
  const T* krow[kKeyBlock];
  const T* vrow[kKeyBlock];
  T* part = s.vb;  // one partial at a time
  for (Index b0 = 0; b0 <= last; b0 += kKeyBlock) {
    const Index n_blk = std::min(kKeyBlock, last + 1 - b0);
    block_rows<T>(t, b0, n_blk, krow, vrow, s.kw, s.vw);
    pack_keys_t<T>(krow, n_blk, hd, s.kt);
    for (Index r = std::max<Index>(0, b0 - t.first_pos); r < nb; ++r) {
      block_partial<T>(s.qs + r * hdp, hd, s.kt, visible_in_block(t.first_pos + r, b0), vrow,
                       part);
      RowState<T> st{s.m[r], s.z[r], s.l[r], s.o + r * hdp};
      fold_partial<T>(part, hd, st);
      s.m[r] = st.m;
      s.z[r] = st.z;
      s.l[r] = st.l;
    }
  }
  for (Index r = 0; r < nb; ++r)
    for (Index d = 0; d < hd; ++d) t.out[r * t.ldo + d] = s.o[r * hdp + d] / s.l[r];
}

// The partials of the tile's one row (t.rows == 1) over key blocks [block_begin, block_end),
// partial_stride(head_dim) apart from parts.
template <class T>
void row_partials(const AttentionTile<T>& t, Index block_begin, Index block_end, T* parts) {
  const Index hd = t.head_dim;
  TileScratch<T> s(t.scratch, hd);
  for (Index d = 0; d < hd; ++d) s.qs[d] = t.q[d] * t.scale;
  const T* krow[kKeyBlock];
  const T* vrow[kKeyBlock];
  for (Index b = block_begin; b < block_end; ++b) {
    const Index b0 = b * kKeyBlock, n = visible_in_block(t.first_pos, b0);
    block_rows<T>(t, b0, n, krow, vrow, s.kw, s.vw);
    pack_keys_t<T>(krow, n, hd, s.kt);
    block_partial<T>(s.qs, hd, s.kt, n, vrow, parts + (b - block_begin) * partial_stride(hd));
  }
}

// The tile's one row from all its partials (blocks 0 .. n_blocks - 1, in order): t.out.
template <class T>
void merge_row_partials(const AttentionTile<T>& t, Index n_blocks, const T* parts) {
  const Index hd = t.head_dim;
  TileScratch<T> s(t.scratch, hd);
  std::fill(s.o, s.o + padded_head_dim(hd), T(0));
  RowState<T> st{-std::numeric_limits<T>::infinity(), T(0), T(0), s.o};
  for (Index b = 0; b < n_blocks; ++b) fold_partial<T>(parts + b * partial_stride(hd), hd, st);
  for (Index d = 0; d < hd; ++d) t.out[d] = s.o[d] / st.l;
}



// C[M, N] += A[M, K] * B[K, N], B bf16-packed (depth Kp, from its first panel): each 32-column
// panel is widened to float32 into `buffer` (buffer_floats floats; up to that many rows of the
// panel at a time) and multiplied by Eigen (`multiply(A_block, B_block, C_block)`, which
// accumulates). A stays float32: the widening levels' arithmetic, in Eigen's order.
template <class Multiply>
void gemm_bf16(Index M, Index N, Index K, const float* A, Index lda, const std::uint16_t* Bp,
               Index Kp, float* C, Index ldc, float* buffer, Index buffer_floats,
               const Multiply& multiply) {
  const Index depth_block = std::max<Index>(2, buffer_floats / kBf16PanelCols / 2 * 2);
  for (Index j0 = 0; j0 < N; j0 += kBf16PanelCols) {
    const Index cols = std::min(kBf16PanelCols, N - j0);
    const std::uint16_t* panel = Bp + (j0 / kBf16PanelCols) * Kp * kBf16PanelCols;
    for (Index k0 = 0; k0 < K; k0 += depth_block) {
      const Index depth = std::min(depth_block, K - k0);
      for (Index k = 0; k < depth; ++k) {
        const std::uint16_t* pair_row = panel + ((k0 + k) / 2) * 2 * kBf16PanelCols + (k0 + k) % 2;
        for (Index c = 0; c < cols; ++c) buffer[k * cols + c] = bf16_to_float(pair_row[2 * c]);
      }
      using ConstStrided = Eigen::Map<const RowMatrix<float>, 0, Eigen::OuterStride<>>;
      using Strided = Eigen::Map<RowMatrix<float>, 0, Eigen::OuterStride<>>;
      const ConstMatrixRef<float> a(ConstStrided(A + k0, M, depth, Eigen::OuterStride<>(lda)));
      const ConstMatrixRef<float> b(ConstStrided(buffer, depth, cols, Eigen::OuterStride<>(cols)));
      MatrixRef<float> c(Strided(C + j0, M, cols, Eigen::OuterStride<>(ldc)));
      multiply(a, b, c);
    }
  }
}

template <class T>
using StridedMap = Eigen::Map<RowMatrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ConstStridedMap = Eigen::Map<const RowMatrix<T>, 0, Eigen::OuterStride<>>;

// C[M, N] += alpha A op(B) through Eigen.
template <class T>
void gemm_entry(Op op, T alpha, Index M, Index N, Index K, const T* A, Index lda, const T* B,
                Index ldb, T* C, Index ldc, GemmScratch<T>& scratch) {
  if (M == 0 || N == 0 || K == 0) return;
  const ConstMatrixRef<T> a(ConstStridedMap<T>(A, M, K, Eigen::OuterStride<>(lda)));
  const ConstMatrixRef<T> b(op == Op::None
                                ? ConstStridedMap<T>(B, K, N, Eigen::OuterStride<>(ldb))
                                : ConstStridedMap<T>(B, N, K, Eigen::OuterStride<>(ldb)));
  MatrixRef<T> c(StridedMap<T>(C, M, N, Eigen::OuterStride<>(ldc)));
  gemm<T>(alpha, a, b, op, c, scratch);
}

// The table's gemm: C[M, N] += A B.
template <class T>
void gemm_plain(Index M, Index N, Index K, const T* A, Index lda, const T* B, Index ldb, T* C,
                Index ldc, GemmScratch<T>& scratch) {
  gemm_entry<T>(Op::None, T(1), M, N, K, A, lda, B, ldb, C, ldc, scratch);
}

// C = bias + A B_j0 (Projection): an int8 copy by the scheme's plain C++ (kernels/int8.hpp: the
// bits of every level), a bf16 copy widened panel by panel, else Eigen's GEMM on the view (the
// float32 copy's bits are the vector levels' own).
template <class T>
void project(const Projection<T>& p, GemmScratch<T>& scratch) {
  if (p.M == 0 || p.N == 0) return;
  MatrixRef<T> C(StridedMap<T>(p.C, p.M, p.N, Eigen::OuterStride<>(p.ldc)));
  if (p.bias != nullptr) C.rowwise() = Eigen::Map<const RowVector<T>>(p.bias, p.N);
  if (p.K == 0) return;
  if constexpr (std::is_same<T, float>::value) {
    if (p.packed != nullptr && p.packed->dtype() == WeightDtype::int8) {
      scratch.reserve_int8(p.M, p.K);
      gemm_int8_scalar(p.M, p.N, p.K, p.A, p.lda, p.packed->int8_panels_from(p.j0), p.C, p.ldc,
                       nullptr, scratch.int8_rows());
      return;
    }
    if (p.packed != nullptr && p.packed->dtype() == WeightDtype::bf16) {
      const Index depth_block = std::min<Index>(bf16_depth(p.K), kPackFloats / kBf16PanelCols);
      scratch.reserve(p.M, kBf16PanelCols, depth_block);
      gemm_bf16(p.M, p.N, p.K, p.A, p.lda, p.packed->bf16_panels_from(p.j0), p.packed->depth(),
                p.C, p.ldc, scratch.packed_b(), kPackFloats,
                [&scratch](const ConstMatrixRef<float>& a, const ConstMatrixRef<float>& b,
                           MatrixRef<float>& c) { gemm<float>(1.0f, a, b, Op::None, c, scratch); });
      return;
    }
  }
  gemm_entry<T>(Op::None, T(1), p.M, p.N, p.K, p.A, p.lda, p.B, p.ldb, p.C, p.ldc, scratch);
}

// a . b over n scalars in four partial sums (d mod 4, in order) added as (s0 + s1) + (s2 + s3).
template <class T>
T dot4(const T* a, const T* b, Index n) {
  T s[4] = {T(0), T(0), T(0), T(0)};
  Index d = 0;
  for (; d + 4 <= n; d += 4)
    for (int l = 0; l < 4; ++l) s[l] += a[d + l] * b[d + l];
  for (int l = 0; d < n; ++d, ++l) s[l] += a[d] * b[d];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// c[j] = a . B[j] (dot4), j < N.
template <class T>
void row_times_transposed(Index N, Index K, const T* a, const T* B, Index ldb, T* c) {
  for (Index j = 0; j < N; ++j) c[j] = dot4<T>(a, B + j * ldb, K);
}

// The table's softmax_row: x = row * scale on [0, n), then softmax_row.
template <class T>
void scaled_softmax_row(T* row, Index n, Index n_keys, T scale) {
  for (Index j = 0; j < n; ++j) row[j] *= scale;
  softmax_row<T>(row, n, n_keys);
}

template <class T>
Index tile_rows(bool, Index, bool) {
  return kTileMaxRows;
}

}  // namespace gpt2::kernels::generic

namespace gpt2::kernels {

template <class T>
const Kernels<T>& generic_table() {
  static const Kernels<T> t = [] {
    Kernels<T> k;
    k.isa = Isa::generic;
    k.row_exact = false;
    k.project = generic::project<T>;
    k.gemm = generic::gemm_plain<T>;
    k.row_times_transposed = generic::row_times_transposed<T>;
    k.softmax_row = generic::scaled_softmax_row<T>;
    k.attention_tile = generic::attention_tile<T>;
    k.row_partials = generic::row_partials<T>;
    k.merge_row_partials = generic::merge_row_partials<T>;
    k.tile_rows = generic::tile_rows<T>;
    return k;
  }();
  return t;
}

// C[M, N] += alpha A op(B): the active level's product when it is a plain one (op None, alpha 1),
// Eigen's otherwise (the vector levels have no kernel for the others).
template <class T>
void product(Op op, T alpha, Index M, Index N, Index K, const T* A, Index lda, const T* B,
             Index ldb, T* C, Index ldc, GemmScratch<T>& scratch) {
  if (op == Op::None && alpha == T(1))
    table<T>().gemm(M, N, K, A, lda, B, ldb, C, ldc, scratch);
  else
    generic::gemm_entry<T>(op, alpha, M, N, K, A, lda, B, ldb, C, ldc, scratch);
}

}  // namespace gpt2::kernels
