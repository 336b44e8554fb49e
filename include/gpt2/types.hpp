// Matrix and view types used across gpt2-attention. Everything is row-major, as in the checkpoint:
// x[T, C], c_attn.weight[C, 3C] (Conv1D layout, y = x @ W).
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <type_traits>

namespace gpt2 {

namespace detail {
template <class T>
struct identity {
  using type = T;
};
}  // namespace detail

using Index = Eigen::Index;

// Owning row-major matrix, e.g. x[T, C].
template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Owning row vector, e.g. c_attn.bias[3C].
template <class T>
using RowVector = Eigen::Matrix<T, 1, Eigen::Dynamic>;

// Read-only view of a row-major matrix with unit inner stride and any row stride. A column block of
// a row-major matrix (a head slice `qkv.middleCols(h * head_dim, head_dim)`) binds to it without a
// copy. (Binding an expression with another storage order or a non-unit inner stride would make
// Eigen evaluate it into a hidden temporary: the public functions take their read-only inputs as
// `const Eigen::MatrixBase<D>&` and bind them with detail::as_view, which refuses such inputs at
// compile time. Copies are explicit: `gpt2::RowMatrix<float> x_rm = x_col_major;`.)
template <class T>
using ConstMatrixRef =
    Eigen::Ref<const RowMatrix<typename detail::identity<T>::type>, 0, Eigen::OuterStride<>>;

// Writable view of a row-major matrix with unit inner stride and any row stride. Only binds to
// storage that already has that layout (never copies).
template <class T>
using MatrixRef = Eigen::Ref<RowMatrix<typename detail::identity<T>::type>, 0, Eigen::OuterStride<>>;

namespace detail {

// A read-only input bound as a ConstMatrixRef<T> without a copy. Compile-time errors (never a
// hidden copy) for another scalar type, a column-major or strided layout, or an unevaluated
// expression.
//   m: a RowMatrix, a Map or Ref of one, or a block of those (e.g. x.topRows(T), qkv.middleCols(...))
template <class T, class D>
ConstMatrixRef<T> as_view(const Eigen::MatrixBase<D>& m) {
  static_assert(std::is_same<typename D::Scalar, T>::value,
                "gpt2: the input's scalar type differs from the weights' (cast it explicitly)");
  static_assert(bool(Eigen::internal::traits<D>::Flags & Eigen::DirectAccessBit),
                "gpt2: expected a matrix or a view of one; evaluate the expression explicitly into "
                "a gpt2::RowMatrix first");
  static_assert(int(D::IsRowMajor) == 1,
                "gpt2: expected row-major storage; a column-major input would need a hidden copy "
                "(copy it explicitly into a gpt2::RowMatrix)");
  static_assert(int(D::InnerStrideAtCompileTime) == 1,
                "gpt2: expected unit inner stride (a strided view would need a hidden copy)");
  return ConstMatrixRef<T>(m.derived());
}

// True when the address ranges of the two views overlap (an output must not alias an input it
// reads after writing). Conservative: two disjoint column blocks of one matrix interleave in
// memory and count as overlapping.
template <class A, class B>
bool overlaps(const A& a, const B& b) {
  if (a.size() == 0 || b.size() == 0) return false;
  auto address = [](const auto* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const std::uintptr_t a_begin = address(a.data());
  const std::uintptr_t a_end = address(a.data() + (a.rows() - 1) * a.outerStride() + a.cols());
  const std::uintptr_t b_begin = address(b.data());
  const std::uintptr_t b_end = address(b.data() + (b.rows() - 1) * b.outerStride() + b.cols());
  return a_begin < b_end && b_begin < a_end;
}

}  // namespace detail

// Zero-copy views over contiguous caller-owned buffers (checkpoint tensors).
template <class T>
using ConstMatrixMap = Eigen::Map<const RowMatrix<T>>;
template <class T>
using ConstVectorMap = Eigen::Map<const RowVector<T>>;

// view(m): a zero-copy ConstMatrixMap over an owning row-major matrix [rows, cols] (view(v): a
// ConstVectorMap [n] over a row vector), for building AttentionWeights from plain Eigen matrices.
// The view borrows m's storage: m must outlive it and keep its size. Temporaries and other storage
// orders are rejected at compile time (a view of them would dangle or need a hidden copy).
template <class T>
ConstMatrixMap<T> view(const RowMatrix<T>& m) {
  return {m.data(), m.rows(), m.cols()};
}
template <class T>
ConstVectorMap<T> view(const RowVector<T>& v) {
  return {v.data(), v.size()};
}
template <class T>
ConstMatrixMap<T> view(RowMatrix<T>&&) = delete;
template <class T>
ConstVectorMap<T> view(RowVector<T>&&) = delete;

}  // namespace gpt2
