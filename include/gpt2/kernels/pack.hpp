// Weights packed once into the kernels' panel layouts (kernels/layout.hpp), as oneDNN's
// format_tag::any and llama.cpp's repack do at load: the projections then read B contiguously and
// never pack it per call. A float32 copy is read by the vector levels (the generic level reads the
// checkpoint's view); a bf16 copy (B rounded to nearest even) and an int8 copy (kernels/int8.hpp:
// blocks of 32 rows per column, one float32 scale each) by every level.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "gpt2/error.hpp"
#include "gpt2/kernels/int8.hpp"
#include "gpt2/kernels/layout.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// The precision of a packed weight: float32 (bitwise the checkpoint's values), bfloat16, or int8
// (blocks of 32 rows per column with a float32 scale each; the activations quantized as the
// products run: kernels/int8.hpp, docs/int8.md).
enum class WeightDtype { float32, bf16, int8 };

// "float32", "bf16", "int8" (the names --dtype takes).
inline const char* dtype_name(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::bf16: return "bf16";
    case WeightDtype::int8: return "int8";
    default: return "float32";
  }
}

// An owning copy of a float matrix B [K, N] in the panel layout, float32 or bf16. Move-only.
class PackedMatrix {
 public:
  PackedMatrix() = default;

  // B [K, N] in the layout of `dtype`: float32 as below, or bf16 (kernels/layout.hpp: each element
  // rounded to nearest even; one allocation of ceil(N / 32) * Kp * 32 bf16, Kp = K rounded up to
  // a multiple of 32).
  PackedMatrix(const ConstMatrixRef<float>& B, WeightDtype dtype) : PackedMatrix() {
    if (dtype == WeightDtype::float32) {
      *this = PackedMatrix(B);
      return;
    }
    if (dtype == WeightDtype::int8) {
      pack_int8(B);
      return;
    }
    dtype_ = WeightDtype::bf16;
    rows_ = B.rows();
    cols_ = B.cols();
    depth_ = kernels::bf16_depth(rows_);
    const Index panels = (cols_ + kernels::kBf16PanelCols - 1) / kernels::kBf16PanelCols;
    size_ = panels * depth_ * kernels::kBf16PanelCols;
    if (size_ == 0) return;
    bf16_.reset(static_cast<std::uint16_t*>(::operator new(
        static_cast<std::size_t>(size_) * sizeof(std::uint16_t), std::align_val_t(64))));
    std::memset(bf16_.get(), 0, static_cast<std::size_t>(size_) * sizeof(std::uint16_t));
    for (Index k = 0; k < rows_; ++k)
      for (Index j = 0; j < cols_; ++j)
        bf16_.get()[kernels::bf16_packed_offset(k, j, depth_)] =
            kernels::round_to_bf16(B(k, j));
  }

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
  WeightDtype dtype() const { return dtype_; }
  const float* data() const { return data_.get(); }  // float32 (null for bf16)
  Index bytes() const {
    if (dtype_ == WeightDtype::int8) return size_;
    return size_ * static_cast<Index>(dtype_ == WeightDtype::bf16 ? sizeof(std::uint16_t)
                                                                  : sizeof(float));
  }

  // int8: the number of 32-row blocks (Kp / 32), and the panels from column j on (j a multiple of
  // 32): the int8 layout of B[:, j:] (kernels/int8.hpp).
  Index int8_blocks() const { return kernels::int8_blocks(rows_); }
  const std::uint8_t* int8_panels_from(Index j) const {
    if (dtype_ != WeightDtype::int8)
      throw ShapeError(std::string("packed matrix: expected an int8 weight, got a ") +
                       dtype_name(dtype_) + " one");
    if (j % kernels::kInt8PanelCols != 0 || j < 0 || j > cols_)
      throw ShapeError("packed matrix: expected a column offset in [0, " + std::to_string(cols_) +
                       "] that is a multiple of 32, got " + std::to_string(j));
    return int8_.get() + kernels::int8_block_offset(0, j, int8_blocks());
  }

  // bf16: the packed depth Kp (K rounded up to a multiple of 32), and the panels from column j on
  // (j a multiple of 32), the bf16 layout of B[:, j:].
  Index depth() const { return dtype_ == WeightDtype::float32 ? rows_ : depth_; }
  const std::uint16_t* bf16_panels_from(Index j) const {
    if (dtype_ != WeightDtype::bf16)
      throw ShapeError(std::string("packed matrix: expected a bf16 weight, got a ") +
                       dtype_name(dtype_) + " one");
    if (j % kernels::kBf16PanelCols != 0 || j < 0 || j > cols_)
      throw ShapeError("packed matrix: expected a column offset in [0, " + std::to_string(cols_) +
                       "] that is a multiple of 32, got " + std::to_string(j));
    return bf16_.get() + (j / kernels::kBf16PanelCols) * depth_ * kernels::kBf16PanelCols;
  }

  // The panels from column j on (j a multiple of kPanelCols): the packed layout of B[:, j:].
  const float* panels_from(Index j) const {
    if (dtype_ != WeightDtype::float32)
      throw ShapeError(std::string("packed matrix: expected a float32 weight, got a ") +
                       dtype_name(dtype_) + " one");
    if (j % kernels::kPanelCols != 0 || j < 0 || j > cols_)
      throw ShapeError("packed matrix: expected a column offset in [0, " + std::to_string(cols_) +
                       "] that is a multiple of 32, got " + std::to_string(j));
    return data_.get() + (j / kernels::kPanelCols) * rows_ * kernels::kPanelCols;
  }

 private:
  // B [K, N] quantized (kernels/int8.hpp): per column, blocks of 32 rows (zero rows past K), each
  // block's 32 values and scale into the int8 panel layout; one allocation of ceil(N / 32) *
  // (Kp / 32) * kInt8BlockBytes bytes (zero columns past N: value 0, stored 128, scale 0).
  void pack_int8(const ConstMatrixRef<float>& B) {
    dtype_ = WeightDtype::int8;
    rows_ = B.rows();
    cols_ = B.cols();
    depth_ = kernels::int8_depth(rows_);
    const Index nb = kernels::int8_blocks(rows_);
    const Index panels = (cols_ + kernels::kInt8PanelCols - 1) / kernels::kInt8PanelCols;
    size_ = panels * nb * kernels::kInt8BlockBytes;
    if (size_ == 0) return;
    int8_.reset(static_cast<std::uint8_t*>(
        ::operator new(static_cast<std::size_t>(size_), std::align_val_t(64))));
    std::uint8_t* data = int8_.get();
    std::memset(data, kernels::kInt8Offset, static_cast<std::size_t>(size_));
    float column[kernels::kInt8Block];
    std::int8_t q[kernels::kInt8Block];
    for (Index j = 0; j < panels * kernels::kInt8PanelCols; ++j) {
      for (Index b = 0; b < nb; ++b) {
        std::uint8_t* block = data + kernels::int8_block_offset(b, j, nb);
        float scale = 0.0f;
        if (j < cols_) {
          const Index k0 = b * kernels::kInt8Block;
          const Index n = std::min(kernels::kInt8Block, rows_ - k0);
          for (Index k = 0; k < n; ++k) column[k] = B(k0 + k, j);
          scale = kernels::quantize_block(column, n, q);
          for (Index k = 0; k < n; ++k)
            data[kernels::int8_weight_offset(k0 + k, j, nb)] =
                static_cast<std::uint8_t>(q[k] + kernels::kInt8Offset);
        }
        std::memcpy(block + kernels::kInt8WeightBytes + (j % kernels::kInt8PanelCols) * 4, &scale,
                    sizeof scale);
      }
    }
  }

  struct AlignedDelete {
    void operator()(float* p) const { ::operator delete(p, std::align_val_t(64)); }
    void operator()(std::uint16_t* p) const { ::operator delete(p, std::align_val_t(64)); }
    void operator()(std::uint8_t* p) const { ::operator delete(p, std::align_val_t(64)); }
  };
  std::unique_ptr<float, AlignedDelete> data_;
  std::unique_ptr<std::uint16_t, AlignedDelete> bf16_;
  std::unique_ptr<std::uint8_t, AlignedDelete> int8_;
  WeightDtype dtype_ = WeightDtype::float32;
  Index rows_ = 0, cols_ = 0, size_ = 0, depth_ = 0;
};

}  // namespace gpt2
