// The attention maps of one run as one picture: a grid of tiles, one per head (per sequence and
// head for a batch), each the head's [T, T] probabilities with query rows i going down and key
// columns j going right, labelled with the head number ("h3"; "b1 h3" for sequence 1 of a batch).
//
//   cell (i, j), j <= i, real row and key:  viridis(P[i, j]) (0 dark, 1 yellow), or with the
//                                           sqrt scale viridis(sqrt(P[i, j])), which spreads the
//                                           small probabilities of broad heads over more colours
//   cell (i, j), j > i:                     kMasked, a neutral grey (the causal mask; not 0)
//   row or key outside a sequence's real tokens (padding in a batch): kPadding, a light grey
//
// Every probability is a cell x cell square of pixels (cell = ceil(kTargetTile / T), at least 1:
// a tile is about 192 pixels for T <= 192, T pixels beyond). Below the grid: a colour bar from 0
// to 1 (linear in P: under the sqrt scale its colours brighten faster) and the grey swatches,
// labelled ("sqrt" after the bar under the sqrt scale). A sequence's tiles form a grid of ceil(sqrt(n_head))
// columns (GPT-2 small's 12 heads: 4 x 3); the sequences of a batch are stacked top to bottom.
//
//   PictureLayout layout(B, n_head, T, batched);       // where everything goes, in pixels
//   RgbImage image = attention_picture(probs, n_head, T, spans, batched, ColourScale::linear);
//     probs [B * n_head * T, T] = [B, n_head, T, T] row-major (read); spans: B (start, length)
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpt2/types.hpp"
#include "picture.hpp"  // ColourScale, Span
#include "png_image.hpp"

namespace gpt2::cli {

inline constexpr Rgb kMasked{150, 150, 150};   // causal mask: key after the query
inline constexpr Rgb kPadding{225, 225, 225};  // a padded row or key of a batch
inline constexpr Rgb kFrame{60, 60, 60};       // one-pixel frame around each tile
inline constexpr Rgb kInk{20, 20, 20};         // labels
inline constexpr int kTargetTile = 192;        // pixels per tile side for T <= kTargetTile

// The position on the colour map of probability p under `scale`.
inline double scaled(double p, ColourScale scale) {
  return scale == ColourScale::sqrt && p > 0 ? std::sqrt(p) : p;
}

// Where everything of the picture goes, in pixels; (x, y) is the top-left corner, y going down.
class PictureLayout {
 public:
  static constexpr int kMargin = 12;       // around everything
  static constexpr int kGap = 14;          // between tiles
  static constexpr int kBlockGap = 28;     // between the sequences of a batch
  static constexpr int kFontScale = 2;     // labels: 10 x 14 pixel glyphs
  static constexpr int kLabelHeight = kGlyphHeight * kFontScale + 6;  // above each tile
  static constexpr int kBarWidth = 256, kBarHeight = 16;              // colour bar

  // B sequences of n_head maps [T, T] each (B, n_head, T >= 1). Throws gpt2::Error (via
  // RgbImage::check_size) when the picture would be too large to encode.
  PictureLayout(Index batch, Index n_head, Index T, bool batched)
      : batch_(batch), n_head_(n_head), tokens_(T), batched_(batched) {
    if (batch < 1 || n_head < 1 || T < 1)
      throw Error("png: nothing to draw (B = " + std::to_string(batch) + ", n_head = " +
                  std::to_string(n_head) + ", T = " + std::to_string(T) + ")");
    cell_ = static_cast<int>(std::max<Index>(1, (kTargetTile + T - 1) / T));
    columns_ = static_cast<Index>(std::ceil(std::sqrt(static_cast<double>(n_head)) - 1e-9));
    rows_per_block_ = (n_head + columns_ - 1) / columns_;
    const long long tile = static_cast<long long>(T) * cell_ + 2;  // cells + frame
    const long long grid_width = columns_ * tile + (columns_ - 1) * kGap;
    const long long block_height = rows_per_block_ * (kLabelHeight + tile) + (rows_per_block_ - 1) * kGap;
    const long long width = 2 * kMargin + std::max<long long>(grid_width, legend_width());
    const long long height = 2 * kMargin + batch * block_height + (batch - 1) * kBlockGap + kGap +
                             legend_height();
    RgbImage::check_size(width, height);
    tile_ = static_cast<int>(tile);
    block_height_ = static_cast<int>(block_height);
    width_ = static_cast<int>(width);
    height_ = static_cast<int>(height);
  }

  int width() const { return width_; }
  int height() const { return height_; }
  int cell() const { return cell_; }     // pixels per probability, each way
  Index columns() const { return columns_; }
  bool batched() const { return batched_; }
  Index n_head() const { return n_head_; }  // tiles per sequence
  Index tokens() const { return tokens_; }  // T: rows (and columns) of each map

  // Top-left pixel of the cells of map (b, h): cell (i, j) covers x in [x + j*cell, x + (j+1)*cell),
  // y in [y + i*cell, y + (i+1)*cell). The frame is the pixel ring just outside.
  int cells_x(Index /*b*/, Index h) const {
    return kMargin + static_cast<int>(h % columns_) * (tile_ + kGap) + 1;
  }
  int cells_y(Index b, Index h) const {
    return kMargin + static_cast<int>(b) * (block_height_ + kBlockGap) +
           static_cast<int>(h / columns_) * (kLabelHeight + tile_ + kGap) + kLabelHeight + 1;
  }

  // The label of map (b, h): "h3", or "b1 h3" in a batch.
  std::string label(Index b, Index h) const {
    return (batched_ ? "b" + std::to_string(b) + " " : std::string()) + "h" + std::to_string(h);
  }

  // The colour bar: x in [bar_x(), bar_x() + kBarWidth), y in [bar_y(), bar_y() + kBarHeight);
  // column k shows the colour of probability k / (kBarWidth - 1).
  int bar_x() const { return kMargin + text_width("0", kFontScale) + 6; }
  int bar_y() const {
    return kMargin + static_cast<int>(batch_) * (block_height_ + kBlockGap) - kBlockGap + kGap;
  }

 private:
  static int legend_width() {
    return text_width("0", kFontScale) + 6 + kBarWidth + 6 + text_width("1", kFontScale) + 24 +
           kBarHeight + 6 + text_width("masked", kFontScale) + 24 + kBarHeight + 6 +
           text_width("padding", kFontScale) + 24 + text_width("sqrt", kFontScale);
  }
  static int legend_height() { return kBarHeight + 6 + kGlyphHeight * kFontScale; }

  Index batch_, n_head_, tokens_;
  bool batched_;
  int cell_ = 1;
  Index columns_ = 1, rows_per_block_ = 1;
  int tile_ = 0, block_height_ = 0, width_ = 0, height_ = 0;
};

// The colour of cell (i, j) of a map whose real tokens are `span`, holding probability p.
inline Rgb cell_colour(Index i, Index j, const Span& span, double p,
                       ColourScale scale = ColourScale::linear) {
  const auto real = [&](Index t) { return t >= span.start && t < span.start + span.length; };
  if (!real(i) || !real(j)) return kPadding;
  if (j > i) return kMasked;
  return viridis(scaled(p, scale));
}

// Draws the maps of B sequences. probs [B * n_head * T, T] (read only): rows (b * n_head + h) * T
// .. + T - 1 are map (b, h). spans: B entries, sequence b's real tokens (all of 0 .. T-1 for a
// plain run). batched: label the tiles with the sequence too. scale: linear or sqrt colours (the
// colour bar follows). The picture is allocated here
// (width * height * 3 bytes, see PictureLayout).
template <class T>
RgbImage attention_picture(const ConstMatrixRef<T>& probs, Index n_head, Index T_,
                           const std::vector<Span>& spans, bool batched,
                           ColourScale scale = ColourScale::linear) {
  const Index B = static_cast<Index>(spans.size());
  if (probs.rows() != B * n_head * T_ || probs.cols() != T_)
    throw ShapeError("png: expected probabilities [" + std::to_string(B * n_head * T_) + ", " +
                     std::to_string(T_) + "], got [" + std::to_string(probs.rows()) + ", " +
                     std::to_string(probs.cols()) + "]");
  const PictureLayout layout(B, n_head, T_, batched);
  RgbImage image(layout.width(), layout.height(), kWhite);
  const int cell = layout.cell(), side = static_cast<int>(T_) * cell;
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < n_head; ++h) {
      const int x0 = layout.cells_x(b, h), y0 = layout.cells_y(b, h);
      draw_text(image, x0 - 1, y0 - 1 - PictureLayout::kLabelHeight + 2, layout.label(b, h),
                PictureLayout::kFontScale, kInk);
      image.fill_rect(x0 - 1, y0 - 1, side + 2, side + 2, kFrame);
      const Index first = (b * n_head + h) * T_;
      for (Index i = 0; i < T_; ++i)
        for (Index j = 0; j < T_; ++j)
          image.fill_rect(x0 + static_cast<int>(j) * cell, y0 + static_cast<int>(i) * cell, cell,
                          cell,
                          cell_colour(i, j, spans[static_cast<std::size_t>(b)],
                                      static_cast<double>(probs(first + i, j)), scale));
    }

  // Legend: "0 [colour bar] 1   [grey] masked   [light grey] padding   sqrt" (padding only in a
  // batch, sqrt only under that scale).
  const int s = PictureLayout::kFontScale, bx = layout.bar_x(), by = layout.bar_y();
  const int text_y = by + (PictureLayout::kBarHeight - kGlyphHeight * s) / 2;
  draw_text(image, bx - 6 - text_width("0", s), text_y, "0", s, kInk);
  for (int k = 0; k < PictureLayout::kBarWidth; ++k)
    image.fill_rect(bx + k, by, 1, PictureLayout::kBarHeight,
                    viridis(scaled(static_cast<double>(k) / (PictureLayout::kBarWidth - 1), scale)));
  draw_text(image, bx + PictureLayout::kBarWidth / 2 - text_width("0.5", s) / 2,
            by + PictureLayout::kBarHeight + 4, "0.5", s, kInk);
  int x = bx + PictureLayout::kBarWidth + 6;
  draw_text(image, x, text_y, "1", s, kInk);
  x += text_width("1", s) + 24;
  const auto swatch = [&](Rgb colour, const std::string& name) {
    image.fill_rect(x - 1, by - 1, PictureLayout::kBarHeight + 2, PictureLayout::kBarHeight + 2, kFrame);
    image.fill_rect(x, by, PictureLayout::kBarHeight, PictureLayout::kBarHeight, colour);
    x += PictureLayout::kBarHeight + 6;
    draw_text(image, x, text_y, name, s, kInk);
    x += text_width(name, s) + 24;
  };
  swatch(kMasked, "masked");
  if (batched) swatch(kPadding, "padding");
  if (scale == ColourScale::sqrt) draw_text(image, x, text_y, "sqrt", s, kInk);
  return image;
}

}  // namespace gpt2::cli
