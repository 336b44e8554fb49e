// Tests of the CLI's picture writer (examples/cli/png_image.hpp, attention_picture.hpp): the colour
// map, the font, the PNG encoding (decoded back with stb_image from the same Debian package) and
// the layout of the attention maps: every pixel of every cell is the colour of the probability it
// shows, the masked triangle and padding are their greys, the labels, the title, the axis labels
// and the colour bar's tick labels are drawn where the layout says.
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
  EXPECT_THROW(gpt2::cli::draw_text(image, 0, 0, "h\x01", 1, gpt2::cli::kBlack), gpt2::Error);
  EXPECT_THROW(gpt2::cli::draw_text(image, 0, 0, "\xc3\xa9", 1, gpt2::cli::kBlack), gpt2::Error);
}

// The font has every printable ASCII character, each glyph distinct; a title goes through
// printable() (other bytes become '?') and fit_left() (cut on the left, after "...").
TEST(PngImage, FontCoversPrintableAsciiAndTitlesAreMadeDrawable) {
  std::vector<std::string> seen;
  for (char c = ' '; c <= '~'; ++c) {
    const char* const* rows = gpt2::cli::glyph(c);
    ASSERT_NE(rows, nullptr) << "'" << c << "'";
    std::string bits;
    for (int y = 0; y < gpt2::cli::kGlyphHeight; ++y) {
      ASSERT_EQ(std::string(rows[y]).size(), std::size_t(gpt2::cli::kGlyphWidth)) << "'" << c << "' row " << y;
      bits += rows[y];
    }
    for (const std::string& other : seen) EXPECT_NE(bits, other) << "'" << c << "' looks like another glyph";
    seen.push_back(bits);
  }
  EXPECT_EQ(gpt2::cli::glyph('\x7f'), nullptr);
  EXPECT_EQ(gpt2::cli::printable("d/\xc3\xa9t\x01.npy"), "d/??t?.npy");
  EXPECT_EQ(gpt2::cli::fit_left("abc", 100, 1), "abc");
  // 24 characters take 24 * 6 - 1 pixels at scale 1; one pixel less leaves room for 23.
  const std::string title = "/long/path/to/x.npy, layer 0, T = 9";
  EXPECT_EQ(gpt2::cli::fit_left(title, 24 * 6 - 1, 1), "...x.npy, layer 0, T = 9");
  EXPECT_EQ(gpt2::cli::fit_left(title, 24 * 6 - 2, 1), "....npy, layer 0, T = 9");
}

TEST(PngImage, TextDrawnDownIsTheTextTurnedClockwise) {
  RgbImage across(40, 20, gpt2::cli::kWhite), down(20, 40, gpt2::cli::kWhite);
  gpt2::cli::draw_text(across, 0, 0, "q->", 1, gpt2::cli::kBlack);
  gpt2::cli::draw_text_down(down, 0, 0, "q->", 1, gpt2::cli::kBlack);
  // Pixel (x, y) of the text across is pixel (kGlyphHeight - 1 - y, x) of the text down.
  for (int y = 0; y < gpt2::cli::kGlyphHeight; ++y)
    for (int x = 0; x < gpt2::cli::text_width("q->", 1); ++x)
      EXPECT_EQ(across.at(x, y), down.at(gpt2::cli::kGlyphHeight - 1 - y, x)) << x << ", " << y;
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

// The pixels of `text` drawn at (x, y) (scale 2, kInk) on white, against the same rectangle of
// `image`: true when `image` holds exactly that text there.
bool shows_text(const RgbImage& image, int x, int y, const std::string& text, bool down = false) {
  const int s = gpt2::cli::PictureLayout::kFontScale;
  const int w = down ? gpt2::cli::kGlyphHeight * s : gpt2::cli::text_width(text, s);
  const int h = down ? gpt2::cli::text_width(text, s) : gpt2::cli::kGlyphHeight * s;
  RgbImage expected(w, h, gpt2::cli::kWhite);
  if (down)
    gpt2::cli::draw_text_down(expected, 0, 0, text, s, gpt2::cli::kInk);
  else
    gpt2::cli::draw_text(expected, 0, 0, text, s, gpt2::cli::kInk);
  for (int yy = 0; yy < h; ++yy)
    for (int xx = 0; xx < w; ++xx)
      if (image.at(x + xx, y + yy) != expected.at(xx, yy)) return false;
  return true;
}

// The title (the caller's, cut to the width), the axis labels ("query ->" down the left of each
// sequence's grid, "key ->" below), the colour bar (the colour map evenly, for either scale) and
// its ticks, labelled with the probability each stands for: the middle is P=0.5 under the linear
// scale and P=0.25 under the sqrt scale (sqrt(0.25) = 0.5), and the legend says which scale.
TEST(AttentionPicture, TitleAxisLabelsAndTicksSayWhatTheyShow) {
  constexpr Index n_head = 4, T = 6;
  const std::vector<gpt2::cli::Span> spans = {{0, T}, {1, 4}};
  const RowMatrix<float> probs = random_maps(n_head, T, spans, 9);
  const gpt2::cli::PictureLayout layout(2, n_head, T, true);
  const int s = gpt2::cli::PictureLayout::kFontScale, bw = gpt2::cli::PictureLayout::kBarWidth;
  const int label_y = layout.bar_y() + gpt2::cli::PictureLayout::kBarHeight +
                      gpt2::cli::PictureLayout::kTickHeight + 2;
  const std::string title = "x.npy, layer 0, B = 2, T = 6";
  const RgbImage linear = decode(gpt2::cli::encode_png(gpt2::cli::attention_picture<float>(
      probs, n_head, T, spans, true, gpt2::cli::ColourScale::linear, title)));
  const RgbImage sqrt = decode(gpt2::cli::encode_png(gpt2::cli::attention_picture<float>(
      probs, n_head, T, spans, true, gpt2::cli::ColourScale::sqrt, title)));
  for (const RgbImage* image : {&linear, &sqrt}) {
    ASSERT_EQ(image->width(), layout.width());
    ASSERT_EQ(image->height(), layout.height());
    EXPECT_TRUE(shows_text(*image, layout.title_x(), layout.title_y(), title));
    for (Index b = 0; b < 2; ++b)
      EXPECT_TRUE(shows_text(*image, layout.query_x(), layout.query_y(b), "query ->", true)) << "b " << b;
    EXPECT_TRUE(shows_text(*image, layout.key_x(), layout.key_y(), "key ->"));
    for (int k = 0; k < bw; ++k)
      ASSERT_EQ(image->at(layout.bar_x() + k, layout.bar_y() + 2), gpt2::cli::viridis(k / double(bw - 1))) << k;
    EXPECT_TRUE(shows_text(*image, layout.bar_x(), label_y, "P=0"));
    EXPECT_TRUE(shows_text(*image, layout.bar_x() + bw - gpt2::cli::text_width("P=1", s), label_y, "P=1"));
    for (const int tick : {0, bw / 2, bw - 1})
      EXPECT_EQ(image->at(layout.bar_x() + tick, layout.bar_y() + gpt2::cli::PictureLayout::kBarHeight + 1),
                gpt2::cli::kInk) << "tick at " << tick;
  }
  const int middle_x = layout.bar_x() + bw / 2;
  EXPECT_TRUE(shows_text(linear, middle_x - gpt2::cli::text_width("P=0.5", s) / 2, label_y, "P=0.5"));
  EXPECT_TRUE(shows_text(sqrt, middle_x - gpt2::cli::text_width("P=0.25", s) / 2, label_y, "P=0.25"));
  // Under the sqrt scale the bar's middle colour is that of a cell holding P = 0.25.
  // (Column 128 of 256 is 128/255 of the way, a hair past the middle: equal up to a step or two.)
  const Rgb middle = sqrt.at(middle_x, layout.bar_y() + 2);
  const Rgb quarter = gpt2::cli::cell_colour(1, 0, {0, 2}, 0.25, gpt2::cli::ColourScale::sqrt);
  EXPECT_LE(std::abs(middle.r - quarter.r) + std::abs(middle.g - quarter.g) + std::abs(middle.b - quarter.b), 3)
      << str(middle) << " against " << str(quarter);
  // The legend names the scale.
  int scale_ink_linear = 0, scale_ink_sqrt = 0;
  for (int y = layout.bar_y(); y < layout.bar_y() + gpt2::cli::PictureLayout::kBarHeight; ++y)
    for (int x = layout.width() - 12 - gpt2::cli::text_width("colour: P (linear)", s); x < layout.width(); ++x) {
      scale_ink_linear += linear.at(x, y) == gpt2::cli::kInk;
      scale_ink_sqrt += sqrt.at(x, y) == gpt2::cli::kInk;
    }
  EXPECT_GT(scale_ink_linear, 0);
  EXPECT_NE(scale_ink_linear, scale_ink_sqrt);
  // No title: nothing drawn there.
  const RgbImage untitled = gpt2::cli::attention_picture<float>(probs, n_head, T, spans, true);
  for (int y = layout.title_y(); y < layout.title_y() + gpt2::cli::kGlyphHeight * s; ++y)
    for (int x = 0; x < layout.width(); ++x) ASSERT_EQ(untitled.at(x, y), gpt2::cli::kWhite) << x << ", " << y;
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
