// Tests of the CLI's picture writer (examples/cli/png_image.hpp, attention_picture.hpp): the colour
// map, the font, the PNG encoding (decoded back with stb_image from the same Debian package) and
// the layout of the attention maps: every pixel of every cell is the colour of the probability it
// shows, the masked triangle and padding are their greys, the labels are drawn.
#include <stb_image.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention_picture.hpp"
#include "gpt2/types.hpp"
#include "png_image.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::cli::Rgb;
using gpt2::cli::RgbImage;

// The picture stored in a PNG file's bytes, decoded by stb_image as 8-bit RGB.
RgbImage decode(const std::vector<unsigned char>& png) {
  int width = 0, height = 0, channels = 0;
  std::unique_ptr<unsigned char, void (*)(void*)> pixels(
      stbi_load_from_memory(png.data(), static_cast<int>(png.size()), &width, &height, &channels, 3),
      stbi_image_free);
  if (!pixels) throw std::runtime_error(std::string("stb_image: ") + stbi_failure_reason());
  EXPECT_EQ(channels, 3) << "the file should be RGB, no alpha";
  RgbImage image(width, height, gpt2::cli::kBlack);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      const unsigned char* p = pixels.get() + 3 * (static_cast<std::size_t>(y) * width + x);
      image.set(x, y, {p[0], p[1], p[2]});
    }
  return image;
}

std::string str(Rgb c) {
  return "(" + std::to_string(c.r) + ", " + std::to_string(c.g) + ", " + std::to_string(c.b) + ")";
}

// Causal attention maps [B * n_head * T, T]: each row i a random distribution over keys 0 .. i
// (zeros after it), with a few exact 0s and 1s; rows and keys outside spans[b] are 0.
RowMatrix<float> random_maps(Index n_head, Index T, const std::vector<gpt2::cli::Span>& spans,
                             unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const Index B = static_cast<Index>(spans.size());
  RowMatrix<float> probs = RowMatrix<float>::Zero(B * n_head * T, T);
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < n_head; ++h)
      for (Index i = spans[b].start; i < spans[b].start + spans[b].length; ++i) {
        auto row = probs.row((b * n_head + h) * T + i);
        if (h == 0) {  // one-hot: the first real key
          row(spans[b].start) = 1.0f;
          continue;
        }
        float sum = 0;
        for (Index j = spans[b].start; j <= i; ++j) sum += row(j) = u(rng) * u(rng);
        row /= sum;
      }
  return probs;
}

// ---------------------------------------------------------------------------------------------

TEST(Viridis, EndsAndMiddleAreMatplotlibs) {
  // matplotlib: viridis(0) = #440154, viridis(0.5) = #21918c, viridis(1) = #fde725.
  EXPECT_EQ(gpt2::cli::viridis(0.0), (Rgb{0x44, 0x01, 0x54}));
  EXPECT_EQ(gpt2::cli::viridis(0.5), (Rgb{0x21, 0x91, 0x8c}));
  EXPECT_EQ(gpt2::cli::viridis(1.0), (Rgb{0xfd, 0xe7, 0x25}));
  // Out of range and NaN are clamped: no colour outside the scale.
  EXPECT_EQ(gpt2::cli::viridis(-0.5), gpt2::cli::viridis(0.0));
  EXPECT_EQ(gpt2::cli::viridis(2.0), gpt2::cli::viridis(1.0));
  EXPECT_EQ(gpt2::cli::viridis(std::numeric_limits<double>::quiet_NaN()), gpt2::cli::viridis(0.0));
}

TEST(Viridis, BrightnessRisesWithProbability) {
  // Perceptually ordered: the luma (Rec. 601) never falls as p grows.
  const auto luma = [](Rgb c) { return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b; };
  double previous = -1;
  for (int k = 0; k <= 1000; ++k) {
    const double l = luma(gpt2::cli::viridis(k / 1000.0));
    EXPECT_GE(l, previous - 0.5) << "p = " << k / 1000.0;  // rounding of the channels
    previous = l;
  }
  EXPECT_GT(luma(gpt2::cli::viridis(1.0)) - luma(gpt2::cli::viridis(0.0)), 150);
}

TEST(Viridis, MaskedAndPaddingGreysAreNoProbabilitysColour) {
  for (int k = 0; k <= 1000; ++k) {
    const Rgb c = gpt2::cli::viridis(k / 1000.0);
    EXPECT_NE(c, gpt2::cli::kMasked);
    EXPECT_NE(c, gpt2::cli::kPadding);
  }
  EXPECT_NE(gpt2::cli::kMasked, gpt2::cli::kPadding);
}

TEST(PngImage, EncodesEveryPixel) {
  RgbImage image(37, 11, gpt2::cli::kWhite);
  std::mt19937 rng(3);
  for (int y = 0; y < image.height(); ++y)
    for (int x = 0; x < image.width(); ++x)
      image.set(x, y, {static_cast<std::uint8_t>(rng()), static_cast<std::uint8_t>(rng()),
                       static_cast<std::uint8_t>(rng())});
  const std::vector<unsigned char> png = gpt2::cli::encode_png(image);
  ASSERT_GE(png.size(), 8u);
  EXPECT_EQ(std::string(png.begin(), png.begin() + 8), std::string("\x89PNG\r\n\x1a\n", 8));
  const RgbImage back = decode(png);
  ASSERT_EQ(back.width(), 37);
  ASSERT_EQ(back.height(), 11);
  for (int y = 0; y < image.height(); ++y)
    for (int x = 0; x < image.width(); ++x) ASSERT_EQ(back.at(x, y), image.at(x, y)) << x << ", " << y;
}

TEST(PngImage, RefusesEmptyAndHugePictures) {
  EXPECT_THROW(RgbImage(0, 5, gpt2::cli::kWhite), gpt2::Error);
  EXPECT_THROW(RgbImage::check_size(100000, 100000), gpt2::Error);
  EXPECT_NO_THROW(RgbImage::check_size(1000, 1000));
}

TEST(PngImage, TextIsDrawnInsideItsBoxAndUnknownCharactersThrow) {
  RgbImage image(60, 20, gpt2::cli::kWhite);
  gpt2::cli::draw_text(image, 2, 3, "h10", 2, gpt2::cli::kBlack);
  const int w = gpt2::cli::text_width("h10", 2);
  EXPECT_EQ(w, 3 * 12 - 2);
  int ink = 0;
  for (int y = 0; y < image.height(); ++y)
    for (int x = 0; x < image.width(); ++x)
      if (image.at(x, y) == gpt2::cli::kBlack) {
        ++ink;
        EXPECT_TRUE(x >= 2 && x < 2 + w && y >= 3 && y < 3 + 14) << x << ", " << y;
      }
  EXPECT_GT(ink, 40);
  EXPECT_THROW(gpt2::cli::draw_text(image, 0, 0, "h?", 1, gpt2::cli::kBlack), gpt2::Error);
}

// Checks every pixel of every cell of `image` against the layout and the maps.
void expect_cells(const RgbImage& image, const gpt2::cli::PictureLayout& layout,
                  const RowMatrix<float>& probs, Index n_head, Index T,
                  const std::vector<gpt2::cli::Span>& spans) {
  const int cell = layout.cell();
  int masked = 0, padding = 0, shown = 0;
  for (Index b = 0; b < static_cast<Index>(spans.size()); ++b)
    for (Index h = 0; h < n_head; ++h) {
      const int x0 = layout.cells_x(b, h), y0 = layout.cells_y(b, h);
      // The frame is just outside the cells.
      EXPECT_EQ(image.at(x0 - 1, y0 - 1), gpt2::cli::kFrame);
      EXPECT_EQ(image.at(x0 + static_cast<int>(T) * cell, y0 + static_cast<int>(T) * cell), gpt2::cli::kFrame);
      for (Index i = 0; i < T; ++i)
        for (Index j = 0; j < T; ++j) {
          const gpt2::cli::Span& s = spans[static_cast<std::size_t>(b)];
          const bool real = i >= s.start && i < s.start + s.length && j >= s.start && j < s.start + s.length;
          const Rgb expected = !real  ? gpt2::cli::kPadding
                               : j > i ? gpt2::cli::kMasked
                                       : gpt2::cli::viridis(probs((b * n_head + h) * T + i, j));
          (!real ? padding : j > i ? masked : shown) += 1;
          for (int dy = 0; dy < cell; ++dy)
            for (int dx = 0; dx < cell; ++dx) {
              const Rgb got = image.at(x0 + static_cast<int>(j) * cell + dx, y0 + static_cast<int>(i) * cell + dy);
              ASSERT_EQ(got, expected) << "b " << b << " h " << h << " cell (" << i << ", " << j
                                       << ") pixel (" << dx << ", " << dy << "): " << str(got)
                                       << " instead of " << str(expected);
            }
        }
    }
  EXPECT_GT(shown, 0);
  EXPECT_GT(masked, 0);
  (void)padding;
}

// Ink pixels in the label strip above tile (b, h).
int label_ink(const RgbImage& image, const gpt2::cli::PictureLayout& layout, Index b, Index h) {
  int ink = 0;
  const int x0 = layout.cells_x(b, h), y0 = layout.cells_y(b, h);
  for (int y = y0 - gpt2::cli::PictureLayout::kLabelHeight; y < y0 - 1; ++y)
    for (int x = x0; x < x0 + 40; ++x) ink += image.at(x, y) == gpt2::cli::kInk;
  return ink;
}

TEST(AttentionPicture, TilesShowTheirProbabilitiesThroughThePng) {
  constexpr Index n_head = 5, T = 7;
  const std::vector<gpt2::cli::Span> spans = {{0, T}};
  const RowMatrix<float> probs = random_maps(n_head, T, spans, 11);
  const RgbImage image = gpt2::cli::attention_picture<float>(probs, n_head, T, spans, false);
  const gpt2::cli::PictureLayout layout(1, n_head, T, false);
  EXPECT_EQ(layout.cell(), (192 + T - 1) / T);
  EXPECT_EQ(layout.columns(), 3);  // ceil(sqrt(5))
  const RgbImage back = decode(gpt2::cli::encode_png(image));
  ASSERT_EQ(back.width(), layout.width());
  ASSERT_EQ(back.height(), layout.height());
  expect_cells(back, layout, probs, n_head, T, spans);
  for (Index h = 0; h < n_head; ++h) EXPECT_GT(label_ink(back, layout, 0, h), 20) << "label of head " << h;
  // Labels differ: "h0" and "h1" do not look the same.
  EXPECT_NE(label_ink(back, layout, 0, 0), label_ink(back, layout, 0, 1));
  // The colour bar runs from viridis(0) to viridis(1).
  EXPECT_EQ(back.at(layout.bar_x(), layout.bar_y() + 2), gpt2::cli::viridis(0.0));
  EXPECT_EQ(back.at(layout.bar_x() + gpt2::cli::PictureLayout::kBarWidth - 1, layout.bar_y() + 2),
            gpt2::cli::viridis(1.0));
}

TEST(AttentionPicture, BatchesStackOneGridPerSequenceWithPaddingGrey) {
  constexpr Index n_head = 4, T = 6;
  const std::vector<gpt2::cli::Span> spans = {{0, 6}, {2, 3}, {0, 0}};  // full, padded both sides, empty
  const RowMatrix<float> probs = random_maps(n_head, T, spans, 5);
  const RgbImage image = gpt2::cli::attention_picture<float>(probs, n_head, T, spans, true);
  const gpt2::cli::PictureLayout layout(3, n_head, T, true);
  EXPECT_EQ(layout.columns(), 2);
  EXPECT_GT(layout.cells_y(1, 0), layout.cells_y(0, 3)) << "sequence 1 below sequence 0";
  const RgbImage back = decode(gpt2::cli::encode_png(image));
  ASSERT_EQ(back.width(), layout.width());
  ASSERT_EQ(back.height(), layout.height());
  expect_cells(back, layout, probs, n_head, T, spans);
  // "b2 h3" is wider than "h3": labels carry the sequence.
  EXPECT_EQ(layout.label(2, 3), "b2 h3");
}

TEST(AttentionPicture, LongSequencesGetOnePixelPerProbability) {
  const gpt2::cli::PictureLayout layout(1, 12, 300, false);
  EXPECT_EQ(layout.cell(), 1);
  EXPECT_EQ(layout.columns(), 4);
  EXPECT_GE(layout.width(), 4 * 300);
}

TEST(AttentionPicture, WrongShapesAndEmptyInputsThrow) {
  const RowMatrix<float> probs = RowMatrix<float>::Zero(8, 4);
  EXPECT_THROW(gpt2::cli::attention_picture<float>(probs, 3, 4, {{0, 4}}, false), gpt2::ShapeError);
  EXPECT_THROW(gpt2::cli::PictureLayout(0, 12, 4, true), gpt2::Error);
  EXPECT_THROW(gpt2::cli::PictureLayout(1, 12, 0, false), gpt2::Error);
  EXPECT_THROW(gpt2::cli::PictureLayout(1, 12, 100000, false), gpt2::Error);  // too large to encode
}

}  // namespace
