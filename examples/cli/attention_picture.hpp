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
// a tile is about 192 pixels for T <= 192, T pixels beyond). Above the grid: a title (the caller's:
// the input, the layer, T; cut on the left, after "...", to the picture's width). Axis labels:
// "query ->" down the left side of each sequence's grid, "key ->" below the last. Below that: the
// colour bar, which shows the colour map evenly from one end to the other, its ticks labelled with
// the probability they stand for ("P=0", "P=0.5", "P=1"; under the sqrt scale the middle is
// "P=0.25", since sqrt(0.25) = 0.5), the grey swatches, and the scale ("colour: P (linear)" or
// "colour: sqrt(P)"). A sequence's tiles form a grid of ceil(sqrt(n_head)) columns (GPT-2 small's
// 12 heads: 4 x 3); the sequences of a batch are stacked top to bottom.
//
//   PictureLayout layout(B, n_head, T, batched);       // where everything goes, in pixels
//   RgbImage image = attention_picture(probs, n_head, T, spans, batched, ColourScale::linear,
//                                      "x.npy, layer 0, T = 9");
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
// It depends on B, n_head, T and batched only (not on the title or the scale).
class PictureLayout {
 public:
  static constexpr int kMargin = 12;       // around everything
  static constexpr int kGap = 14;          // between tiles
  static constexpr int kBlockGap = 28;     // between the sequences of a batch
  static constexpr int kFontScale = 2;     // labels: 10 x 14 pixel glyphs
  static constexpr int kTextHeight = kGlyphHeight * kFontScale;
  static constexpr int kLabelHeight = kTextHeight + 6;   // above each tile
  static constexpr int kTitleHeight = kTextHeight + 10;  // the title line, above the grid
  static constexpr int kAxisWidth = kTextHeight + 8;     // "query ->", left of the grid
  static constexpr int kBarWidth = 256, kBarHeight = 16;  // colour bar
  static constexpr int kTickHeight = 4;                  // tick marks below the bar

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
    const long long width =
        2 * kMargin + std::max<long long>(kAxisWidth + grid_width, legend_width());
    const long long height = 2 * kMargin + kTitleHeight + batch * block_height +
                             (batch - 1) * kBlockGap + kGap + kTextHeight + kGap + legend_height();
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
    return grid_x() + static_cast<int>(h % columns_) * (tile_ + kGap) + 1;
  }
  int cells_y(Index b, Index h) const {
    return block_y(b) + static_cast<int>(h / columns_) * (kLabelHeight + tile_ + kGap) +
           kLabelHeight + 1;
  }

  // The label of map (b, h): "h3", or "b1 h3" in a batch.
  std::string label(Index b, Index h) const {
    return (batched_ ? "b" + std::to_string(b) + " " : std::string()) + "h" + std::to_string(h);
  }

  // The title's top-left pixel, and the width it may take.
  int title_x() const { return kMargin; }
  int title_y() const { return kMargin; }
  int title_width() const { return width_ - 2 * kMargin; }
  // "query ->", drawn down (draw_text_down) at x = query_x(), from the top of sequence b's first
  // tile row; "key ->" at (key_x(), key_y()), below the last sequence's grid.
  int query_x() const { return kMargin; }
  int query_y(Index b) const { return cells_y(b, 0); }
  int key_x() const { return grid_x() + 1; }
  int key_y() const { return block_y(batch_) - kBlockGap + kGap; }

  // The colour bar: x in [bar_x(), bar_x() + kBarWidth), y in [bar_y(), bar_y() + kBarHeight);
  // column k shows viridis(k / (kBarWidth - 1)), the colour of probability k / (kBarWidth - 1)
  // under the linear scale and of its square under the sqrt scale.
  int bar_x() const { return kMargin; }
  int bar_y() const { return key_y() + kTextHeight + kGap; }

 private:
  int grid_x() const { return kMargin + kAxisWidth; }
  int block_y(Index b) const {
    return kMargin + kTitleHeight + static_cast<int>(b) * (block_height_ + kBlockGap);
  }
  static int legend_width() {
    return kBarWidth + 24 + kBarHeight + 6 + text_width("masked", kFontScale) + 24 + kBarHeight +
           6 + text_width("padding", kFontScale) + 24 +
           std::max(text_width("colour: P (linear)", kFontScale),
                    text_width("colour: sqrt(P)", kFontScale));
  }
  static int legend_height() { return kBarHeight + kTickHeight + 2 + kTextHeight; }

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
// colour bar's tick labels follow). title: one line above the grid (any bytes: those the font
// lacks are drawn as '?'; cut on the left to fit). The picture is allocated here
// (width * height * 3 bytes, see PictureLayout).
template <class T>
RgbImage attention_picture(const ConstMatrixRef<T>& probs, Index n_head, Index T_,
                           const std::vector<Span>& spans, bool batched,
                           ColourScale scale = ColourScale::linear, const std::string& title = "") {
  const Index B = static_cast<Index>(spans.size());
  if (probs.rows() != B * n_head * T_ || probs.cols() != T_)
    throw ShapeError("png: expected probabilities [" + std::to_string(B * n_head * T_) + ", " +
                     std::to_string(T_) + "], got [" + std::to_string(probs.rows()) + ", " +
                     std::to_string(probs.cols()) + "]");
  const PictureLayout layout(B, n_head, T_, batched);
  RgbImage image(layout.width(), layout.height(), kWhite);
  const int s = PictureLayout::kFontScale;
  draw_text(image, layout.title_x(), layout.title_y(),
            fit_left(printable(title), layout.title_width(), s), s, kInk);
  const int cell = layout.cell(), side = static_cast<int>(T_) * cell;
  for (Index b = 0; b < B; ++b) {
    draw_text_down(image, layout.query_x(), layout.query_y(b), "query ->", s, kInk);
    for (Index h = 0; h < n_head; ++h) {
      const int x0 = layout.cells_x(b, h), y0 = layout.cells_y(b, h);
      draw_text(image, x0 - 1, y0 - 1 - PictureLayout::kLabelHeight + 2, layout.label(b, h), s,
                kInk);
      image.fill_rect(x0 - 1, y0 - 1, side + 2, side + 2, kFrame);
      const Index first = (b * n_head + h) * T_;
      for (Index i = 0; i < T_; ++i)
        for (Index j = 0; j < T_; ++j)
          image.fill_rect(x0 + static_cast<int>(j) * cell, y0 + static_cast<int>(i) * cell, cell,
                          cell,
                          cell_colour(i, j, spans[static_cast<std::size_t>(b)],
                                      static_cast<double>(probs(first + i, j)), scale));
    }
  }
  draw_text(image, layout.key_x(), layout.key_y(), "key ->", s, kInk);

  // Legend: "[colour bar]   [grey] masked   [light grey] padding   colour: P (linear)" (padding
  // only in a batch), the bar's ticks below it: P=0, the middle (P=0.5, or P=0.25 under the sqrt
  // scale), P=1.
  const int bx = layout.bar_x(), by = layout.bar_y(), bw = PictureLayout::kBarWidth;
  const int text_y = by + (PictureLayout::kBarHeight - PictureLayout::kTextHeight) / 2;
  for (int k = 0; k < bw; ++k)
    image.fill_rect(bx + k, by, 1, PictureLayout::kBarHeight,
                    viridis(static_cast<double>(k) / (bw - 1)));
  const int tick_y = by + PictureLayout::kBarHeight;
  const int label_y = tick_y + PictureLayout::kTickHeight + 2;
  const std::string middle = scale == ColourScale::sqrt ? "P=0.25" : "P=0.5";
  for (const int tx : {bx, bx + bw / 2, bx + bw - 1})
    image.fill_rect(tx, tick_y, 1, PictureLayout::kTickHeight, kInk);
  draw_text(image, bx, label_y, "P=0", s, kInk);
  draw_text(image, bx + bw / 2 - text_width(middle, s) / 2, label_y, middle, s, kInk);
  draw_text(image, bx + bw - text_width("P=1", s), label_y, "P=1", s, kInk);
  int x = bx + bw + 24;
  const auto swatch = [&](Rgb colour, const std::string& name) {
    image.fill_rect(x - 1, by - 1, PictureLayout::kBarHeight + 2, PictureLayout::kBarHeight + 2, kFrame);
    image.fill_rect(x, by, PictureLayout::kBarHeight, PictureLayout::kBarHeight, colour);
    x += PictureLayout::kBarHeight + 6;
    draw_text(image, x, text_y, name, s, kInk);
    x += text_width(name, s) + 24;
  };
  swatch(kMasked, "masked");
  if (batched) swatch(kPadding, "padding");
  draw_text(image, x, text_y, scale == ColourScale::sqrt ? "colour: sqrt(P)" : "colour: P (linear)",
            s, kInk);
  return image;
}

}  // namespace gpt2::cli
