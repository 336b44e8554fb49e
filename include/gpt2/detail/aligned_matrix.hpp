// AlignedMatrix<E>: a row-major matrix whose storage starts on a 64-byte boundary (a cache line,
// an AVX-512 vector), read and written through Eigen maps.
//
// Why: Eigen aligns its own matrices to EIGEN_MAX_ALIGN_BYTES, which is 16 in a build without
// -march flags (the plain build this library is made for: its kernels are chosen at run time). A
// row of 64 floats then straddles two cache lines, so every 64-byte vector load of it is a split
// load. The KV caches' streams are read that way once per decode step; aligned, they are not
// (the measurements: bench/results/history-speed.md).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <utility>

#include "gpt2/types.hpp"

namespace gpt2::detail {

// How far apart an AlignedMatrix's rows start.
// - dense: cols elements (rows back to back);
// - odd_lines: a whole, odd number of cache lines. A row of 2304 floats is 144 lines, and rows
//   144 lines apart fall into a quarter of a 1 MB 8-way L2's sets and of a 48 KB 12-way L1's: a
//   head's 64 key rows (256 lines) then no longer fit in L1 together, nor its keys and values of
//   1024 positions (512 KB) in L2. 145 lines apart they spread over every set.
enum class RowStride { dense, odd_lines };

template <class E>
class AlignedMatrix {
 public:
  using Map = Eigen::Map<RowMatrix<E>, Eigen::Aligned64, Eigen::OuterStride<>>;
  using ConstMap = Eigen::Map<const RowMatrix<E>, Eigen::Aligned64, Eigen::OuterStride<>>;
  static constexpr std::size_t kAlignment = 64;

  AlignedMatrix() = default;
  // rows x cols, uninitialized; rows `layout` apart (RowStride).
  AlignedMatrix(Index rows, Index cols, RowStride layout = RowStride::dense) : layout_(layout) {
    resize(rows, cols);
  }

  AlignedMatrix(const AlignedMatrix&) = delete;
  AlignedMatrix& operator=(const AlignedMatrix&) = delete;
  // Moving leaves the source 0 x cols (its width kept: views of it stay well-formed).
  AlignedMatrix(AlignedMatrix&& other) noexcept
      : data_(std::move(other.data_)),
        rows_(std::exchange(other.rows_, 0)),
        cols_(other.cols_),
        stride_(other.stride_),
        layout_(other.layout_) {}
  AlignedMatrix& operator=(AlignedMatrix&& other) noexcept {
    if (&other != this) {
      data_ = std::move(other.data_);
      rows_ = std::exchange(other.rows_, 0);
      cols_ = other.cols_;
      stride_ = other.stride_;
      layout_ = other.layout_;
    }
    return *this;
  }

  // rows x cols; reallocates (contents unspecified) unless the storage needed is unchanged.
  void resize(Index rows, Index cols) {
    const Index stride = stride_for(cols, layout_);
    if (rows * stride != rows_ * stride_) {
      data_.reset();
      if (rows * stride > 0) data_.reset(allocate(static_cast<std::size_t>(rows * stride)));
    }
    rows_ = rows;
    cols_ = cols;
    stride_ = stride;
  }
  void setZero() { std::fill_n(data(), storage_size(), E(0)); }

  Index rows() const { return rows_; }
  Index cols() const { return cols_; }
  Index size() const { return rows_ * cols_; }
  // Elements from one row's start to the next's (cols, or more with RowStride::odd_lines).
  Index outerStride() const { return stride_; }
  // Elements allocated: rows x outerStride.
  Index storage_size() const { return rows_ * stride_; }
  E* data() { return data_.get(); }
  const E* data() const { return data_.get(); }

  Map map() { return Map(data(), rows_, cols_, Eigen::OuterStride<>(stride_)); }
  ConstMap map() const { return ConstMap(data(), rows_, cols_, Eigen::OuterStride<>(stride_)); }
  // Views of parts, as a RowMatrix's (MatrixRef and ConstMatrixRef take them).
  auto topRows(Index n) { return map().topRows(n); }
  auto topRows(Index n) const { return map().topRows(n); }
  auto topLeftCorner(Index r, Index c) { return map().topLeftCorner(r, c); }
  auto middleRows(Index r, Index n) { return map().middleRows(r, n); }
  auto middleRows(Index r, Index n) const { return map().middleRows(r, n); }

  void swap(AlignedMatrix& other) noexcept {
    data_.swap(other.data_);
    std::swap(rows_, other.rows_);
    std::swap(cols_, other.cols_);
    std::swap(stride_, other.stride_);
    std::swap(layout_, other.layout_);
  }

  // The row stride (elements) of a cols-wide row under `layout`.
  static Index stride_for(Index cols, RowStride layout) {
    if (layout == RowStride::dense || cols <= 0) return cols;
    constexpr Index line = static_cast<Index>(kAlignment / sizeof(E));
    const Index lines = (cols + line - 1) / line;
    return (lines % 2 == 0 ? lines + 1 : lines) * line;
  }

 private:
  // malloc's family, as Eigen's own storage: a failed allocation throws std::bad_alloc (also
  // under AddressSanitizer with allocator_may_return_null, which aborts in operator new instead).
  static E* allocate(std::size_t elements) {
    if (elements > (std::numeric_limits<std::size_t>::max() - kAlignment) / sizeof(E))
      throw std::bad_alloc();
    const std::size_t bytes = (elements * sizeof(E) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, bytes);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<E*>(p);
  }
  struct Free {
    void operator()(E* p) const { std::free(p); }
  };
  std::unique_ptr<E, Free> data_;
  Index rows_ = 0;
  Index cols_ = 0;
  Index stride_ = 0;
  RowStride layout_ = RowStride::dense;
};

}  // namespace gpt2::detail
