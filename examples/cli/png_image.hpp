// A small RGB picture and its PNG encoding: the canvas the attention maps are drawn on
// (attention_picture.hpp). Pixels are 8-bit RGB, row-major, top row first; the PNG is encoded in
// memory by stb_image_write (Debian: libstb-dev, linked as libstb) and written by the caller, so it
// can be staged with the other outputs (output_files.hpp).
//
//   RgbImage image(width, height, kWhite);      // owns width * height * 3 bytes
//   image.fill_rect(x, y, w, h, colour);        // clipped to the image
//   draw_text(image, x, y, "h11", 2, kBlack);   // digits and a few letters, 5x7 glyphs scaled by 2
//   std::vector<unsigned char> png = encode_png(image);
//
// Colours of probabilities: viridis(p) for p in [0, 1] (dark blue-purple at 0, yellow at 1),
// interpolated linearly in a 17-entry table taken from matplotlib's viridis (perceptually uniform,
// readable in grey and by the common forms of colour blindness).
#pragma once

#include <stb_image_write.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpt2/error.hpp"

namespace gpt2::cli {

struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(const Rgb& a, const Rgb& b) { return a.r == b.r && a.g == b.g && a.b == b.b; }
  friend bool operator!=(const Rgb& a, const Rgb& b) { return !(a == b); }
};

inline constexpr Rgb kWhite{255, 255, 255};
inline constexpr Rgb kBlack{0, 0, 0};

// An 8-bit RGB picture, width x height pixels, owned; pixel (x, y) at bytes 3 * (y * width + x).
class RgbImage {
 public:
  // The largest picture: stb_image_write indexes its rows with int, so width * 3 * height must fit.
  static constexpr long long kMaxBytes = INT_MAX / 2;

  RgbImage() = default;
  // Throws gpt2::Error when width or height is < 1 or the picture exceeds kMaxBytes.
  RgbImage(int width, int height, Rgb background) : width_(width), height_(height) {
    check_size(width, height);
    pixels_.resize(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3);
    fill_rect(0, 0, width, height, background);
  }

  // Throws gpt2::Error "png: a picture of W x H pixels ..." when it cannot be made.
  static void check_size(long long width, long long height) {
    if (width < 1 || height < 1)
      throw Error("png: a picture of " + std::to_string(width) + " x " + std::to_string(height) +
                  " pixels is empty");
    if (width > kMaxBytes / 3 || height > kMaxBytes / (3 * width))
      throw Error("png: a picture of " + std::to_string(width) + " x " + std::to_string(height) +
                  " pixels is too large for the PNG writer (at most " + std::to_string(kMaxBytes) +
                  " bytes of RGB)");
  }

  int width() const { return width_; }
  int height() const { return height_; }
  const std::uint8_t* data() const { return pixels_.data(); }  // width * height * 3 bytes

  Rgb at(int x, int y) const {
    const std::uint8_t* p = &pixels_[offset(x, y)];
    return {p[0], p[1], p[2]};
  }
  void set(int x, int y, Rgb c) {
    std::uint8_t* p = &pixels_[offset(x, y)];
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }

  // Paints the w x h rectangle whose top-left pixel is (x, y); the part outside the image is
  // ignored.
  void fill_rect(int x, int y, int w, int h, Rgb c) {
    const int x0 = std::max(x, 0), y0 = std::max(y, 0);
    const int x1 = std::min(x + w, width_), y1 = std::min(y + h, height_);
    for (int yy = y0; yy < y1; ++yy)
      for (int xx = x0; xx < x1; ++xx) set(xx, yy, c);
  }

 private:
  std::size_t offset(int x, int y) const {
    return (static_cast<std::size_t>(y) * static_cast<std::size_t>(width_) +
            static_cast<std::size_t>(x)) * 3;
  }
  int width_ = 0, height_ = 0;
  std::vector<std::uint8_t> pixels_;
};

// ---------------------------------------------------------------------------------------------
// Colour map
// ---------------------------------------------------------------------------------------------

// matplotlib's viridis (CC0) at 0, 1/16, ..., 1: entries 0, 16, ..., 240, 255 of its 256.
inline constexpr std::array<Rgb, 17> kViridis = {{
    {68, 1, 84},    {72, 24, 106},  {71, 45, 123},  {66, 64, 134},   {59, 82, 139},   {51, 99, 141},
    {44, 114, 142}, {38, 130, 142}, {33, 145, 140}, {31, 160, 136},  {40, 174, 128},  {63, 188, 115},
    {94, 201, 98},  {132, 212, 75}, {173, 220, 48}, {216, 226, 25},  {253, 231, 37},
}};

// The colour of probability p: viridis, linear in p (p < 0 and NaN give the colour of 0, p > 1
// that of 1). Channels are rounded to the nearest integer.
inline Rgb viridis(double p) {
  if (!(p > 0)) p = 0;
  if (p > 1) p = 1;
  const double pos = p * static_cast<double>(kViridis.size() - 1);
  const std::size_t i = std::min(static_cast<std::size_t>(pos), kViridis.size() - 2);
  const double f = pos - static_cast<double>(i);
  const auto mix = [f](std::uint8_t a, std::uint8_t b) {
    return static_cast<std::uint8_t>(std::lround(a + f * (static_cast<double>(b) - a)));
  };
  const Rgb& a = kViridis[i];
  const Rgb& b = kViridis[i + 1];
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

// ---------------------------------------------------------------------------------------------
// Text: a tiny built-in 5x7 bitmap font: the printable ASCII characters (' ' to '~')
// ---------------------------------------------------------------------------------------------

inline constexpr int kGlyphWidth = 5, kGlyphHeight = 7;

// The 7 rows of `c`'s glyph, '#' for ink; nullptr for a character the font lacks.
inline const char* const* glyph(char c) {
  struct Glyph {
    char c;
    const char* rows[kGlyphHeight];
  };
  static const Glyph glyphs[] = {
      {'0', {" ### ", "#   #", "#  ##", "# # #", "##  #", "#   #", " ### "}},
      {'1', {"  #  ", " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "}},
      {'2', {" ### ", "#   #", "    #", "   # ", "  #  ", " #   ", "#####"}},
      {'3', {"#####", "   # ", "  #  ", "   # ", "    #", "#   #", " ### "}},
      {'4', {"   # ", "  ## ", " # # ", "#  # ", "#####", "   # ", "   # "}},
      {'5', {"#####", "#    ", "#### ", "    #", "    #", "#   #", " ### "}},
      {'6', {"  ## ", " #   ", "#    ", "#### ", "#   #", "#   #", " ### "}},
      {'7', {"#####", "    #", "   # ", "  #  ", " #   ", " #   ", " #   "}},
      {'8', {" ### ", "#   #", "#   #", " ### ", "#   #", "#   #", " ### "}},
      {'9', {" ### ", "#   #", "#   #", " ####", "    #", "   # ", " ##  "}},
      {'.', {"     ", "     ", "     ", "     ", "     ", " ##  ", " ##  "}},
      {'-', {"     ", "     ", "     ", "#####", "     ", "     ", "     "}},
      {'=', {"     ", "     ", "#####", "     ", "#####", "     ", "     "}},
      {' ', {"     ", "     ", "     ", "     ", "     ", "     ", "     "}},
      {'b', {"#    ", "#    ", "# ## ", "##  #", "#   #", "#   #", "#### "}},
      {'h', {"#    ", "#    ", "# ## ", "##  #", "#   #", "#   #", "#   #"}},
      {'p', {"     ", "     ", "#### ", "#   #", "#### ", "#    ", "#    "}},
      {'T', {"#####", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  "}},
      {'a', {"     ", "     ", " ### ", "    #", " ####", "#   #", " ####"}},
      {'d', {"    #", "    #", " ## #", "#  ##", "#   #", "#   #", " ####"}},
      {'e', {"     ", "     ", " ### ", "#   #", "#####", "#    ", " ### "}},
      {'g', {"     ", " ####", "#   #", "#   #", " ####", "    #", " ### "}},
      {'i', {"  #  ", "     ", " ##  ", "  #  ", "  #  ", "  #  ", " ### "}},
      {'k', {"#    ", "#    ", "#  # ", "# #  ", "##   ", "# #  ", "#  # "}},
      {'m', {"     ", "     ", "## # ", "# # #", "# # #", "#   #", "#   #"}},
      {'n', {"     ", "     ", "# ## ", "##  #", "#   #", "#   #", "#   #"}},
      {'q', {"     ", "     ", " ####", "#   #", " ####", "    #", "    #"}},
      {'r', {"     ", "     ", "# ## ", "##  #", "#    ", "#    ", "#    "}},
      {'t', {" #   ", " #   ", "#### ", " #   ", " #   ", " #  #", "  ## "}},
      {'s', {"     ", "     ", " ####", "#    ", " ### ", "    #", "#### "}},
      {'A', {" ### ", "#   #", "#   #", "#####", "#   #", "#   #", "#   #"}},
      {'B', {"#### ", "#   #", "#   #", "#### ", "#   #", "#   #", "#### "}},
      {'C', {" ### ", "#   #", "#    ", "#    ", "#    ", "#   #", " ### "}},
      {'D', {"#### ", "#   #", "#   #", "#   #", "#   #", "#   #", "#### "}},
      {'E', {"#####", "#    ", "#    ", "#### ", "#    ", "#    ", "#####"}},
      {'F', {"#####", "#    ", "#    ", "#### ", "#    ", "#    ", "#    "}},
      {'G', {" ### ", "#   #", "#    ", "# ###", "#   #", "#   #", " ####"}},
      {'H', {"#   #", "#   #", "#   #", "#####", "#   #", "#   #", "#   #"}},
      {'I', {" ### ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "}},
      {'J', {"  ###", "   # ", "   # ", "   # ", "   # ", "#  # ", " ##  "}},
      {'K', {"#   #", "#  # ", "# #  ", "##   ", "# #  ", "#  # ", "#   #"}},
      {'L', {"#    ", "#    ", "#    ", "#    ", "#    ", "#    ", "#####"}},
      {'M', {"#   #", "## ##", "# # #", "# # #", "#   #", "#   #", "#   #"}},
      {'N', {"#   #", "#   #", "##  #", "# # #", "#  ##", "#   #", "#   #"}},
      {'O', {" ### ", "#   #", "#   #", "#   #", "#   #", "#   #", " ### "}},
      {'P', {"#### ", "#   #", "#   #", "#### ", "#    ", "#    ", "#    "}},
      {'Q', {" ### ", "#   #", "#   #", "#   #", "# # #", "#  # ", " ## #"}},
      {'R', {"#### ", "#   #", "#   #", "#### ", "# #  ", "#  # ", "#   #"}},
      {'S', {" ####", "#    ", "#    ", " ### ", "    #", "    #", "#### "}},
      {'U', {"#   #", "#   #", "#   #", "#   #", "#   #", "#   #", " ### "}},
      {'V', {"#   #", "#   #", "#   #", "#   #", "#   #", " # # ", "  #  "}},
      {'W', {"#   #", "#   #", "#   #", "# # #", "# # #", "# # #", " # # "}},
      {'X', {"#   #", "#   #", " # # ", "  #  ", " # # ", "#   #", "#   #"}},
      {'Y', {"#   #", "#   #", " # # ", "  #  ", "  #  ", "  #  ", "  #  "}},
      {'Z', {"#####", "    #", "   # ", "  #  ", " #   ", "#    ", "#####"}},
      {'c', {"     ", "     ", " ### ", "#    ", "#    ", "#   #", " ### "}},
      {'f', {"  ## ", " #  #", " #   ", "###  ", " #   ", " #   ", " #   "}},
      {'j', {"   # ", "     ", "  ## ", "   # ", "   # ", "#  # ", " ##  "}},
      {'l', {" ##  ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "}},
      {'o', {"     ", "     ", " ### ", "#   #", "#   #", "#   #", " ### "}},
      {'u', {"     ", "     ", "#   #", "#   #", "#   #", "#  ##", " ## #"}},
      {'v', {"     ", "     ", "#   #", "#   #", "#   #", " # # ", "  #  "}},
      {'w', {"     ", "     ", "#   #", "#   #", "# # #", "# # #", " # # "}},
      {'x', {"     ", "     ", "#   #", " # # ", "  #  ", " # # ", "#   #"}},
      {'y', {"     ", "     ", "#   #", "#   #", " ####", "    #", " ### "}},
      {'z', {"     ", "     ", "#####", "   # ", "  #  ", " #   ", "#####"}},
      {'!', {"  #  ", "  #  ", "  #  ", "  #  ", "  #  ", "     ", "  #  "}},
      {'"', {" # # ", " # # ", "     ", "     ", "     ", "     ", "     "}},
      {'#', {" # # ", " # # ", "#####", " # # ", "#####", " # # ", " # # "}},
      {'$', {"  #  ", " ####", "# #  ", " ### ", "  # #", "#### ", "  #  "}},
      {'%', {"##   ", "##  #", "   # ", "  #  ", " #   ", "#  ##", "   ##"}},
      {'&', {" ##  ", "#  # ", "# #  ", " #   ", "# # #", "#  # ", " ## #"}},
      {'\'', {"  #  ", "  #  ", "     ", "     ", "     ", "     ", "     "}},
      {'(', {"   # ", "  #  ", " #   ", " #   ", " #   ", "  #  ", "   # "}},
      {')', {" #   ", "  #  ", "   # ", "   # ", "   # ", "  #  ", " #   "}},
      {'*', {"     ", "  #  ", "# # #", " ### ", "# # #", "  #  ", "     "}},
      {'+', {"     ", "  #  ", "  #  ", "#####", "  #  ", "  #  ", "     "}},
      {',', {"     ", "     ", "     ", "     ", " ##  ", "  #  ", " #   "}},
      {'/', {"     ", "    #", "   # ", "  #  ", " #   ", "#    ", "     "}},
      {':', {"     ", " ##  ", " ##  ", "     ", " ##  ", " ##  ", "     "}},
      {';', {"     ", " ##  ", " ##  ", "     ", " ##  ", "  #  ", " #   "}},
      {'<', {"   # ", "  #  ", " #   ", "#    ", " #   ", "  #  ", "   # "}},
      {'>', {" #   ", "  #  ", "   # ", "    #", "   # ", "  #  ", " #   "}},
      {'?', {" ### ", "#   #", "    #", "   # ", "  #  ", "     ", "  #  "}},
      {'@', {" ### ", "#   #", "# ###", "# # #", "# ###", "#    ", " ####"}},
      {'[', {" ### ", " #   ", " #   ", " #   ", " #   ", " #   ", " ### "}},
      {'\\', {"     ", "#    ", " #   ", "  #  ", "   # ", "    #", "     "}},
      {']', {" ### ", "   # ", "   # ", "   # ", "   # ", "   # ", " ### "}},
      {'^', {"  #  ", " # # ", "#   #", "     ", "     ", "     ", "     "}},
      {'_', {"     ", "     ", "     ", "     ", "     ", "     ", "#####"}},
      {'`', {" #   ", "  #  ", "     ", "     ", "     ", "     ", "     "}},
      {'{', {"   # ", "  #  ", "  #  ", " #   ", "  #  ", "  #  ", "   # "}},
      {'|', {"  #  ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  "}},
      {'}', {" #   ", "  #  ", "  #  ", "   # ", "  #  ", "  #  ", " #   "}},
      {'~', {"     ", "     ", " #   ", "# # #", "   # ", "     ", "     "}},
  };
  for (const Glyph& g : glyphs)
    if (g.c == c) return g.rows;
  return nullptr;
}

// Width in pixels of `text` drawn at `scale` (one blank column between glyphs).
inline int text_width(const std::string& text, int scale) {
  return text.empty() ? 0 : static_cast<int>(text.size()) * (kGlyphWidth + 1) * scale - scale;
}

// Draws `text` with its top-left corner at (x, y), each font pixel a scale x scale square.
// Throws gpt2::Error for a character the font lacks (a bug in the caller, not in the data: text
// from the user goes through printable() first).
inline void draw_text(RgbImage& image, int x, int y, const std::string& text, int scale, Rgb ink) {
  for (const char c : text) {
    const char* const* rows = glyph(c);
    if (rows == nullptr) throw Error(std::string("png: the built-in font has no glyph for '") + c + "'");
    for (int gy = 0; gy < kGlyphHeight; ++gy)
      for (int gx = 0; gx < kGlyphWidth; ++gx)
        if (rows[gy][gx] == '#') image.fill_rect(x + gx * scale, y + gy * scale, scale, scale, ink);
    x += (kGlyphWidth + 1) * scale;
  }
}

// Draws `text` turned a quarter turn clockwise, reading top to bottom (an axis label down the
// side): its top-right corner at (x + kGlyphHeight * scale - 1, y); it is kGlyphHeight * scale
// pixels wide and text_width(text, scale) tall. Throws as draw_text.
inline void draw_text_down(RgbImage& image, int x, int y, const std::string& text, int scale, Rgb ink) {
  for (const char c : text) {
    const char* const* rows = glyph(c);
    if (rows == nullptr) throw Error(std::string("png: the built-in font has no glyph for '") + c + "'");
    for (int gy = 0; gy < kGlyphHeight; ++gy)
      for (int gx = 0; gx < kGlyphWidth; ++gx)
        if (rows[gy][gx] == '#')
          image.fill_rect(x + (kGlyphHeight - 1 - gy) * scale, y + gx * scale, scale, scale, ink);
    y += (kGlyphWidth + 1) * scale;
  }
}

// `text` with every byte the font lacks (control characters, and the bytes of UTF-8 beyond ASCII)
// replaced by '?': a file name as the font can draw it.
inline std::string printable(std::string text) {
  for (char& c : text)
    if (glyph(c) == nullptr) c = '?';
  return text;
}

// `text` cut to at most `width` pixels at `scale`: the last characters that fit, after "...";
// unchanged when it fits.
inline std::string fit_left(const std::string& text, int width, int scale) {
  if (text_width(text, scale) <= width) return text;
  std::string tail = text;
  while (!tail.empty() && text_width("..." + tail, scale) > width) tail.erase(0, 1);
  return tail.empty() ? std::string() : "..." + tail;
}

// ---------------------------------------------------------------------------------------------
// PNG
// ---------------------------------------------------------------------------------------------

// The PNG file of `image` (8-bit RGB, zlib level 9), as bytes. Throws gpt2::Error if encoding fails.
inline std::vector<unsigned char> encode_png(const RgbImage& image) {
  RgbImage::check_size(image.width(), image.height());
  std::vector<unsigned char> bytes;
  const auto append = [](void* context, void* data, int size) {
    auto* out = static_cast<std::vector<unsigned char>*>(context);
    const auto* p = static_cast<const unsigned char*>(data);
    out->insert(out->end(), p, p + size);
  };
  stbi_write_png_compression_level = 9;
  if (stbi_write_png_to_func(append, &bytes, image.width(), image.height(), 3, image.data(),
                             image.width() * 3) == 0 ||
      bytes.empty())
    throw Error("png: stb_image_write could not encode a picture of " +
                std::to_string(image.width()) + " x " + std::to_string(image.height()) + " pixels");
  return bytes;
}

}  // namespace gpt2::cli
