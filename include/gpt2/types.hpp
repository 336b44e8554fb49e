// Matrix and view types used across gpt2-attention. Everything is row-major, as in the checkpoint:
// x[T, C], c_attn.weight[C, 3C] (Conv1D layout, y = x @ W).
#pragma once

#include <Eigen/Core>

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
// copy. Caution: binding an expression with another storage order or a non-unit inner stride makes
// Eigen evaluate it into a hidden temporary; the kernels of this library only ever bind views.
// T is not deduced from a Ref parameter (a RowMatrix<float> argument converts to a Ref but cannot
// deduce it), so every function taking Refs takes T from another parameter (weights, scratch).
template <class T>
using ConstMatrixRef =
    Eigen::Ref<const RowMatrix<typename detail::identity<T>::type>, 0, Eigen::OuterStride<>>;

// Writable view of a row-major matrix with unit inner stride and any row stride. Only binds to
// storage that already has that layout (never copies).
template <class T>
using MatrixRef = Eigen::Ref<RowMatrix<typename detail::identity<T>::type>, 0, Eigen::OuterStride<>>;

// Zero-copy views over contiguous caller-owned buffers (checkpoint tensors).
template <class T>
using ConstMatrixMap = Eigen::Map<const RowMatrix<T>>;
template <class T>
using ConstVectorMap = Eigen::Map<const RowVector<T>>;

// view(m): a zero-copy ConstMatrixMap over an owning row-major matrix, for building
// AttentionWeights from plain Eigen matrices. Temporaries and other storage orders are rejected at
// compile time (a view of them would dangle or need a hidden copy).
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
