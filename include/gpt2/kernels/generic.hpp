// The generic kernel level: Eigen's own kernels, vectorized for whatever the program is compiled
// for (SSE2 on a plain x86-64 build, AVX-512 under -march=native on such a machine). It runs
// float at the generic level, and double at every level.
//
// GemmScratch keeps the packing buffers of Eigen's GEMM (and the vector levels' per-call packing
// buffer), so that repeated products allocate nothing; gemm() calls Eigen's internal GEMM driver
// (general_matrix_matrix_product and gemm_blocking_space), whose interface is stable across the
// 3.4 series but not public: hence the version check.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

#include "gpt2/kernels/pack.hpp"
#include "gpt2/types.hpp"

static_assert(EIGEN_VERSION_AT_LEAST(3, 4, 0) && !EIGEN_VERSION_AT_LEAST(3, 4, 90),
              "gpt2/kernels/generic.hpp uses Eigen 3.4's internal GEMM driver: check it before "
              "using another Eigen version");

namespace gpt2 {

// Packing buffers for products with at most max_m rows, max_n columns and depth max_k.
// Not thread-safe: one GemmScratch per thread.
template <class T>
class GemmScratch {
 public:
  using Blocking = Eigen::internal::gemm_blocking_space<Eigen::RowMajor, T, T, Eigen::Dynamic,
                                                        Eigen::Dynamic, Eigen::Dynamic, 1, false>;

  // Empty: grows on the first product. The second form allocates (and owns) packing buffers for
  // products up to [max_m, max_k] x [max_k, max_n] up front.
  GemmScratch() = default;
  GemmScratch(Index max_m, Index max_n, Index max_k) { reserve(max_m, max_n, max_k); }

  // Grows the buffers to fit an [max_m, max_k] x [max_k, max_n] product (allocates only when
  // they grow; a smaller request keeps the current buffers). If an allocation throws, the scratch
  // keeps its current buffers and stays usable (the vector levels' buffer, allocated first, may
  // have been added).
  void reserve(Index max_m, Index max_n, Index max_k) {
    reserve_packed_b();
    if (fits(max_m, max_n, max_k)) return;
    const Index m = std::max(max_m, max_m_), n = std::max(max_n, max_n_), k = std::max(max_k, max_k_);
    auto blocking = std::make_unique<Blocking>(m, n, k, 1, true);
    blocking->allocateAll();
    blocking_ = std::move(blocking);
    max_m_ = m;
    max_n_ = n;
    max_k_ = k;
  }

  // Whether an [m, k] x [k, n] product runs without growing the buffers.
  bool fits(Index m, Index n, Index k) const {
    return blocking_ != nullptr && m <= max_m_ && n <= max_n_ && k <= max_k_;
  }

  // Eigen's blocking object over the buffers (owned by this scratch; valid until it grows).
  // Precondition: the scratch has been reserved (fits() for some size).
  Blocking& blocking() { return *blocking_; }

  // Bytes of the packing buffers held.
  Index bytes() const {
    const Index packed = packed_b_ ? kernels::kPackFloats * static_cast<Index>(sizeof(T)) : 0;
    if (!blocking_) return packed;
    Blocking& b = *blocking_;
    return packed + (b.mc() * b.kc() + b.kc() * b.nc()) * static_cast<Index>(sizeof(T));
  }

  // The vector levels' buffer for B's blocks (kernels::kPackFloats floats, 64-byte aligned),
  // allocated by reserve() or here on first use. Empty for double.
  T* packed_b() {
    reserve_packed_b();
    return packed_b_.get();
  }

 private:
  void reserve_packed_b() {
    if constexpr (std::is_same<T, float>::value) {
      if (!packed_b_)
        packed_b_.reset(static_cast<T*>(::operator new(
            static_cast<std::size_t>(kernels::kPackFloats) * sizeof(T), std::align_val_t(64))));
    }
  }

  struct AlignedDelete {
    void operator()(T* p) const { ::operator delete(p, std::align_val_t(64)); }
  };
  std::unique_ptr<Blocking> blocking_;
  std::unique_ptr<T, AlignedDelete> packed_b_;  // 64-byte aligned (the vector levels' stores)
  Index max_m_ = 0, max_n_ = 0, max_k_ = 0;
};

enum class Op { None, Transpose };

namespace kernels::generic {

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

}  // namespace kernels::generic
}  // namespace gpt2
