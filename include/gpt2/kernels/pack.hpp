// Weights packed once into the vector kernels' panel layout (as oneDNN's format_tag::any and
// llama.cpp's repack do at load): the projections then read B contiguously and never pack it per
// call.
//
// Panel layout of B [K, N]: ceil(N / 32) panels; panel p holds columns [32 p, 32 p + 32) as K rows
// of 32 floats, zeros past N: element (k, j) at data[(j / 32) * K * 32 + k * 32 + j % 32]. 64-byte
// aligned. Every vector level reads this same layout.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "gpt2/error.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

namespace kernels {
inline constexpr Index kPanelCols = 32;      // columns of a panel
inline constexpr Index kPackFloats = 32768;  // floats of a per-call packing buffer (GemmScratch)
}  // namespace kernels

// An owning copy of a float matrix B [K, N] in the panel layout. Move-only.
class PackedMatrix {
 public:
  PackedMatrix() = default;

  // Copies B [K, N] (a row-major view) into the panel layout: one allocation of
  // ceil(N / 32) * K * 32 floats.
  explicit PackedMatrix(const ConstMatrixRef<float>& B) : rows_(B.rows()), cols_(B.cols()) {
    const Index panels = (cols_ + kernels::kPanelCols - 1) / kernels::kPanelCols;
    size_ = panels * rows_ * kernels::kPanelCols;
    if (size_ == 0) return;
    data_.reset(static_cast<float*>(::operator new(static_cast<std::size_t>(size_) * sizeof(float),
                                                   std::align_val_t(64))));
    for (Index p = 0; p < panels; ++p) {
      const Index j0 = p * kernels::kPanelCols;
      const Index width = std::min(kernels::kPanelCols, cols_ - j0);
      float* panel = data_.get() + p * rows_ * kernels::kPanelCols;
      for (Index k = 0; k < rows_; ++k) {
        float* dst = panel + k * kernels::kPanelCols;
        std::memcpy(dst, B.data() + k * B.outerStride() + j0,
                    static_cast<std::size_t>(width) * sizeof(float));
        for (Index j = width; j < kernels::kPanelCols; ++j) dst[j] = 0.0f;
      }
    }
  }

  Index rows() const { return rows_; }  // K
  Index cols() const { return cols_; }  // N
  const float* data() const { return data_.get(); }
  Index bytes() const { return size_ * static_cast<Index>(sizeof(float)); }

  // The panels from column j on (j a multiple of kPanelCols): the packed layout of B[:, j:].
  const float* panels_from(Index j) const {
    if (j % kernels::kPanelCols != 0 || j < 0 || j > cols_)
      throw ShapeError("packed matrix: expected a column offset in [0, " + std::to_string(cols_) +
                       "] that is a multiple of 32, got " + std::to_string(j));
    return data_.get() + (j / kernels::kPanelCols) * rows_ * kernels::kPanelCols;
  }

 private:
  struct AlignedDelete {
    void operator()(float* p) const { ::operator delete(p, std::align_val_t(64)); }
  };
  std::unique_ptr<float, AlignedDelete> data_;
  Index rows_ = 0, cols_ = 0, size_ = 0;
};

}  // namespace gpt2
