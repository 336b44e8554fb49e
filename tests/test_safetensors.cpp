// Tests of gpt2/safetensors.hpp: well-formed files built byte by byte, every malformed case the
// validator rejects, zero-copy views, exact F16/BF16 conversion, load_attention, and (when
// GPT2_SMALL_WEIGHTS names it) the real GPT-2 small layer-0 file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "gpt2/safetensors.hpp"
#include "support/errors.hpp"
#include "support/tmpdir.hpp"

namespace {

using gpt2::FormatError;
using gpt2::ShapeError;
using gpt2::safetensors::Dtype;
using gpt2::safetensors::File;
using gpt2::test::Contains;
using gpt2::test::error_of;

// ---------------------------------------------------------------------------------------------
// Building files
// ---------------------------------------------------------------------------------------------

// One tensor to write: header fields and its raw little-endian bytes.
struct Tensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;
};

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& values) {
  std::vector<unsigned char> out(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// Test-only float -> F16 for values exactly representable as normal halves (or zero).
std::uint16_t f16_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7FFFFFFFu) == 0) return static_cast<std::uint16_t>(b >> 16);
  const int exponent = static_cast<int>((b >> 23) & 0xFF) - 127 + 15;
  EXPECT_TRUE(exponent > 0 && exponent < 31 && (b & 0x1FFFu) == 0) << f << " is not an exact half";
  return static_cast<std::uint16_t>(((b >> 16) & 0x8000u) | (exponent << 10) |
                                    ((b >> 13) & 0x3FFu));
}

// Test-only float -> BF16 for values exactly representable in bfloat16.
std::uint16_t bf16_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  EXPECT_EQ(b & 0xFFFFu, 0u) << f << " is not an exact bfloat16";
  return static_cast<std::uint16_t>(b >> 16);
}

// `values` stored as `dtype` ("F32", "F64", "F16" or "BF16").
std::vector<unsigned char> encode(const std::vector<float>& values, const std::string& dtype) {
  if (dtype == "F32") return bytes_of(values);
  if (dtype == "F64") return bytes_of(std::vector<double>(values.begin(), values.end()));
  std::vector<std::uint16_t> halves;
  for (float v : values) halves.push_back(dtype == "F16" ? f16_bits(v) : bf16_bits(v));
  return bytes_of(halves);
}

// The JSON header for tensors stored back to back in the given order.
std::string header_for(const std::vector<Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::size_t offset = 0;
  for (const Tensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  return header.dump();
}

// 8-byte little-endian length (header.size() unless given), header text, data.
std::vector<unsigned char> raw_file(const std::string& header,
                                    const std::vector<unsigned char>& data = {},
                                    std::optional<std::uint64_t> length = std::nullopt) {
  const std::uint64_t n = length.value_or(header.size());
  std::vector<unsigned char> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// A well-formed file; the header is padded with spaces so that the data section starts at a
// multiple of 8 bytes, as the Hugging Face writer does.
std::vector<unsigned char> make_file(const std::vector<Tensor>& tensors,
                                     const std::map<std::string, std::string>& metadata = {}) {
  std::string header = header_for(tensors, metadata);
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<unsigned char> data;
  for (const Tensor& t : tensors) data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  return raw_file(header, data);
}

// A copy of `bytes` at an 8-byte-aligned address plus `shift` bytes.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(const std::vector<unsigned char>& bytes, std::size_t shift = 0)
      : storage_((bytes.size() + shift) / 8 + 1), size_(bytes.size()), shift_(shift) {
    if (!bytes.empty()) std::memcpy(data(), bytes.data(), bytes.size());
  }
  unsigned char* data() { return reinterpret_cast<unsigned char*>(storage_.data()) + shift_; }
  std::size_t size() const { return size_; }

 private:
  std::vector<std::uint64_t> storage_;
  std::size_t size_;
  std::size_t shift_;
};

// What File::parse throws for `bytes`, which must be an E whose message names the label.
template <class E = FormatError>
std::string parse_error(const std::vector<unsigned char>& bytes) {
  AlignedBuffer buffer(bytes);
  const std::string message =
      error_of<E>([&] { File::parse(buffer.data(), buffer.size(), "bad.safetensors"); });
  EXPECT_NE(message.find("bad.safetensors"), std::string::npos) << message;
  return message;
}

// A tensor entry for hand-written headers.
std::string entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"dtype": ")" + dtype + R"(", "shape": )" + shape + R"(, "data_offsets": )" + offsets +
         "}";
}

// ---------------------------------------------------------------------------------------------
// Dtypes and half-precision conversion
// ---------------------------------------------------------------------------------------------

TEST(SafetensorsDtype, NamesAndSizesRoundTrip) {
  const std::map<std::string, std::size_t> expected = {
      {"F64", 8},  {"F32", 4},     {"F16", 2},     {"BF16", 2},   {"I64", 8}, {"I32", 4},
      {"I16", 2},  {"I8", 1},      {"U64", 8},     {"U32", 4},    {"U16", 2}, {"U8", 1},
      {"BOOL", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}};
  for (const auto& [name, size] : expected) {
    const std::optional<Dtype> d = gpt2::safetensors::dtype_from_name(name);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_EQ(gpt2::safetensors::dtype_name(*d), name);
    EXPECT_EQ(gpt2::safetensors::dtype_size(*d), size) << name;
  }
  EXPECT_FALSE(gpt2::safetensors::dtype_from_name("f32").has_value());
  EXPECT_FALSE(gpt2::safetensors::dtype_from_name("F4").has_value());
}

TEST(SafetensorsDtype, F16KnownValues) {
  using gpt2::safetensors::f16_to_float;
  EXPECT_EQ(f16_to_float(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_float(0xC100), -2.5f);
  EXPECT_EQ(f16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(f16_to_float(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_float(0x8200), -std::ldexp(512.0f, -24));  // negative subnormal
  EXPECT_EQ(f16_to_float(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(f16_to_float(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(f16_to_float(0x8000)));
  EXPECT_EQ(f16_to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_float(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_float(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7C01)));  // signalling-NaN pattern stays NaN
  EXPECT_TRUE(std::isnan(f16_to_float(0xFE00)));
}

// Every finite half against an independent formula: (-1)^s * m * 2^(e - 25), subnormals m * 2^-24.
TEST(SafetensorsDtype, F16AllFiniteValuesExact) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const std::uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    if (exponent == 0x1F) continue;
    const double magnitude = exponent == 0
                                 ? std::ldexp(double(mantissa), -24)
                                 : std::ldexp(double(1024 + mantissa), int(exponent) - 25);
    const double expected = (h & 0x8000) ? -magnitude : magnitude;
    const float got = gpt2::safetensors::f16_to_float(static_cast<std::uint16_t>(h));
    ASSERT_EQ(double(got), expected) << "half 0x" << std::hex << h;
    ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << "half 0x" << std::hex << h;
  }
}

TEST(SafetensorsDtype, BF16KnownValues) {
  using gpt2::safetensors::bf16_to_float;
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xC020), -2.5f);
  EXPECT_EQ(bf16_to_float(0x477F), 65280.0f);                 // 65504 is not a bfloat16; 65280 is
  EXPECT_EQ(bf16_to_float(0x7F7F), std::ldexp(255.0f, 120));  // largest finite
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133));   // smallest subnormal
  EXPECT_TRUE(std::signbit(bf16_to_float(0x8000)));
  EXPECT_EQ(bf16_to_float(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_float(0xFF80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7FC0)));
}

// ---------------------------------------------------------------------------------------------
// Well-formed files
// ---------------------------------------------------------------------------------------------

TEST(SafetensorsParse, RoundTripsTensorsAndMetadata) {
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  const std::vector<double> b = {0.5, -1.5, 2.25, 1e300};
  const std::vector<std::int32_t> ids = {7, -9};
  const std::vector<unsigned char> bytes = make_file({{"w", "F32", {2, 3}, bytes_of(w)},
                                                      {"b", "F64", {4}, bytes_of(b)},
                                                      {"ids", "I32", {2}, bytes_of(ids)}},
                                                     {{"format", "pt"}, {"note", "hello"}});
  AlignedBuffer buffer(bytes);
  const File file = File::parse(buffer.data(), buffer.size(), "rt.safetensors");

  EXPECT_EQ(file.label(), "rt.safetensors");
  EXPECT_EQ(file.tensor_count(), 3u);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"b", "ids", "w"}));
  EXPECT_TRUE(file.contains("w"));
  EXPECT_FALSE(file.contains("__metadata__"));
  EXPECT_EQ(file.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hello"}}));

  const gpt2::safetensors::TensorInfo& info = file.tensor("w");
  EXPECT_EQ(info.name, "w");
  EXPECT_EQ(info.dtype, Dtype::F32);
  EXPECT_EQ(info.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(info.numel(), 6);
  EXPECT_EQ(info.nbytes, 24u);
  EXPECT_EQ(file.tensor("ids").dtype, Dtype::I32);

  const gpt2::ConstMatrixMap<float> m = file.matrix<float>("w");
  ASSERT_EQ(m.rows(), 2);
  ASSERT_EQ(m.cols(), 3);
  EXPECT_EQ(m(0, 0), 1.0f);
  EXPECT_EQ(m(0, 2), 3.0f);
  EXPECT_EQ(m(1, 0), 4.0f);
  EXPECT_EQ(m(1, 2), 6.0f);
  const gpt2::ConstVectorMap<double> v = file.vector<double>("b");
  ASSERT_EQ(v.size(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(v(i), b[i]);

  // Zero copy: the views point into the caller's buffer, at the tensor's offset.
  const std::size_t data_start = bytes.size() - (24 + 32 + 8);
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(m.data()), buffer.data() + data_start);
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(v.data()), buffer.data() + data_start + 24);
  EXPECT_EQ(file.bytes(), buffer.data());
  EXPECT_EQ(file.size(), bytes.size());
}

TEST(SafetensorsParse, EmptyFilesAreFine) {
  AlignedBuffer empty(raw_file("{}"));
  const File none = File::parse(empty.data(), empty.size());
  EXPECT_EQ(none.tensor_count(), 0u);
  EXPECT_TRUE(none.names().empty());
  EXPECT_TRUE(none.metadata().empty());

  const std::vector<unsigned char> meta_only = raw_file(R"({"__metadata__": {"a": "b"}}  )");
  AlignedBuffer buffer(meta_only);
  const File file = File::parse(buffer.data(), buffer.size());
  EXPECT_EQ(file.tensor_count(), 0u);
  EXPECT_EQ(file.metadata().at("a"), "b");

  const std::vector<unsigned char> empty_header = raw_file("", {}, 0);
  EXPECT_TRUE(Contains(parse_error(empty_header), "not well-formed JSON"));
}

TEST(SafetensorsParse, EmptyAndScalarTensors) {
  const std::vector<unsigned char> bytes =
      make_file({{"empty", "F32", {0, 3}, {}},
                 {"also_empty", "F16", {4, 0}, {}},
                 {"scalar", "F32", {}, bytes_of(std::vector<float>{2.5f})}});
  AlignedBuffer buffer(bytes);
  const File file = File::parse(buffer.data(), buffer.size());
  EXPECT_EQ(file.tensor("empty").numel(), 0);
  EXPECT_EQ(file.tensor("scalar").numel(), 1);
  const gpt2::ConstMatrixMap<float> empty = file.matrix<float>("empty");
  EXPECT_EQ(empty.rows(), 0);
  EXPECT_EQ(empty.cols(), 3);
  EXPECT_TRUE(file.to_vector<double>("also_empty").empty());
  EXPECT_EQ(file.to_vector<float>("scalar"), std::vector<float>{2.5f});
}

TEST(SafetensorsParse, HeaderPaddedWithSpacesAndUnorderedOffsets) {
  // Tensors listed in the header in another order than their data; trailing spaces in the header.
  const std::vector<float> a = {1, 2}, b = {3, 4, 5};
  std::vector<unsigned char> data = bytes_of(b);
  const std::vector<unsigned char> a_bytes = bytes_of(a);
  data.insert(data.end(), a_bytes.begin(), a_bytes.end());
  const std::string header = "{\"a\": " + entry("F32", "[2]", "[12, 20]") +
                             ", \"b\": " + entry("F32", "[3]", "[0, 12]") + "}      ";
  AlignedBuffer buffer(raw_file(header, data));
  const File file = File::parse(buffer.data(), buffer.size());
  EXPECT_EQ(file.to_vector<float>("a"), a);
  EXPECT_EQ(file.to_vector<float>("b"), b);
}

TEST(SafetensorsParse, MoveKeepsViewsValid) {
  const std::vector<unsigned char> bytes =
      make_file({{"w", "F32", {2, 2}, bytes_of(std::vector<float>{1, 2, 3, 4})}});
  AlignedBuffer buffer(bytes);
  File first = File::parse(buffer.data(), buffer.size());
  const float* p = first.matrix<float>("w").data();
  File second = std::move(first);
  EXPECT_EQ(second.matrix<float>("w").data(), p);
  EXPECT_EQ(second.matrix<float>("w")(1, 1), 4.0f);
}

TEST(SafetensorsParse, MissingTensorNamesFileAndTensor) {
  const std::vector<unsigned char> bytes =
      make_file({{"w", "F32", {1}, bytes_of(std::vector<float>{1})}});
  AlignedBuffer buffer(bytes);
  const File file = File::parse(buffer.data(), buffer.size(), "x.safetensors");
  const std::string message = error_of<FormatError>([&] { file.tensor("nope"); });
  EXPECT_EQ(message,
            "x.safetensors: no tensor named 'nope' (the file has 1 tensor: 'w'; closest: 'w')");
  EXPECT_THROW(file.matrix<float>("nope"), FormatError);
  EXPECT_THROW(file.to_vector<float>("nope"), FormatError);
}

// The message lists the first five names (sorted), the count and the closest name by edit
// distance, wherever it is in the file.
TEST(SafetensorsParse, MissingTensorListsNamesAndTheClosest) {
  std::vector<Tensor> tensors;
  for (const char* name : {"a.0", "a.1", "a.2", "a.3", "a.4", "a.5", "h.0.attn.c_attn.weight",
                           "h.0.attn.c_proj.weight", "wpe.weight"})
    tensors.push_back({name, "F32", {1}, bytes_of(std::vector<float>{1})});
  const std::vector<unsigned char> bytes = make_file(tensors);
  AlignedBuffer buffer(bytes);
  const File file = File::parse(buffer.data(), buffer.size(), "x.safetensors");
  EXPECT_EQ(error_of<FormatError>([&] { file.tensor("h.0.attn.c_atn.weight"); }),
            "x.safetensors: no tensor named 'h.0.attn.c_atn.weight' (the file has 9 tensors: "
            "'a.0', 'a.1', 'a.2', 'a.3', 'a.4' and 4 more; closest: 'h.0.attn.c_attn.weight')");
  EXPECT_EQ(file.tensor_hint({"wpe.weights"}),
            "the file has 9 tensors: 'a.0', 'a.1', 'a.2', 'a.3', 'a.4' and 4 more; closest: "
            "'wpe.weight'");
  // Several names looked for: the closest to any of them.
  EXPECT_EQ(file.tensor_hint({"zzzzzzzzzzzzzz", "h.0.attn.c_proj.weigh"}),
            "the file has 9 tensors: 'a.0', 'a.1', 'a.2', 'a.3', 'a.4' and 4 more; closest: "
            "'h.0.attn.c_proj.weight'");

  // A file without tensors, and names cut at 80 characters.
  const std::vector<unsigned char> empty = make_file({});
  AlignedBuffer empty_buffer(empty);
  EXPECT_EQ(File::parse(empty_buffer.data(), empty_buffer.size()).tensor_hint({"x"}),
            "the file has no tensors");
  const std::string long_name(200, 'q');
  const std::vector<unsigned char> one_long =
      make_file({{long_name, "F32", {1}, bytes_of(std::vector<float>{1})}});
  AlignedBuffer long_buffer(one_long);
  EXPECT_EQ(File::parse(long_buffer.data(), long_buffer.size()).tensor_hint({"x"}),
            "the file has 1 tensor: '" + std::string(80, 'q') + "...'; closest: '" +
                std::string(80, 'q') + "...'");
  // Names over 1024 characters are listed, not compared; nothing to compare: no closest.
  const std::vector<unsigned char> one_huge =
      make_file({{std::string(5000, 'h'), "F32", {1}, bytes_of(std::vector<float>{1})}});
  AlignedBuffer huge_buffer(one_huge);
  const File huge = File::parse(huge_buffer.data(), huge_buffer.size());
  EXPECT_EQ(huge.tensor_hint({"x"}), "the file has 1 tensor: '" + std::string(80, 'h') + "...'");
  EXPECT_EQ(huge.tensor_hint({}), "the file has 1 tensor: '" + std::string(80, 'h') + "...'");
}

TEST(SafetensorsParse, EditDistance) {
  using gpt2::safetensors::detail::edit_distance;
  constexpr std::size_t any = static_cast<std::size_t>(-1);
  EXPECT_EQ(edit_distance("", "", any), 0u);
  EXPECT_EQ(edit_distance("abc", "", any), 3u);
  EXPECT_EQ(edit_distance("", "abc", any), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting", any), 3u);
  EXPECT_EQ(edit_distance("c_attn", "c_atn", any), 1u);
  EXPECT_EQ(edit_distance("flaw", "lawn", any), 2u);
  // Past the bound the answer is only "more than the bound".
  EXPECT_GT(edit_distance("kitten", "sitting", 2), 2u);
  EXPECT_EQ(edit_distance("kitten", "sitting", 3), 3u);
  EXPECT_GT(edit_distance("a", "abcdef", 4), 4u);
}

// ---------------------------------------------------------------------------------------------
// Conversions (explicit copies)
// ---------------------------------------------------------------------------------------------

TEST(SafetensorsConvert, F16AndBF16ToFloatAndDoubleExact) {
  const std::vector<std::uint16_t> f16 = {0x3C00, 0xC100, 0x7BFF, 0x0001, 0x7C00, 0x7E00};
  const std::vector<std::uint16_t> bf16 = {0x3F80, 0xC020, 0x477F, 0x0001, 0x7F80, 0x7FC0};
  const std::vector<unsigned char> bytes =
      make_file({{"h", "F16", {6}, bytes_of(f16)}, {"b", "BF16", {2, 3}, bytes_of(bf16)}});
  AlignedBuffer buffer(bytes);
  const File file = File::parse(buffer.data(), buffer.size());

  const std::vector<float> h = file.to_vector<float>("h");
  const std::vector<double> hd = file.to_vector<double>("h");
  const std::vector<float> expected_h = {1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24),
                                         std::numeric_limits<float>::infinity()};
  ASSERT_EQ(h.size(), 6u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(h[i], expected_h[i]) << i;
    EXPECT_EQ(hd[i], double(expected_h[i])) << i;
  }
  EXPECT_TRUE(std::isnan(h[5]));
  EXPECT_TRUE(std::isnan(hd[5]));

  const std::vector<float> b = file.to_vector<float>("b");
  const std::vector<float> expected_b = {1.0f, -2.5f, 65280.0f, std::ldexp(1.0f, -133),
                                         std::numeric_limits<float>::infinity()};
  ASSERT_EQ(b.size(), 6u);
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(b[i], expected_b[i]) << i;
  EXPECT_TRUE(std::isnan(b[5]));
  EXPECT_EQ(file.to_vector<double>("b")[3], std::ldexp(1.0, -133));

  // Views never convert.
  EXPECT_THROW(file.vector<float>("h"), FormatError);
  EXPECT_FALSE(file.can_view<float>("h"));
}

TEST(SafetensorsConvert, F32ToDoubleAndF64ToFloat) {
  const std::vector<float> f = {0.1f, -3.0f, 1e-40f};
  const std::vector<double> d = {0.1, -3.0, 1e300};
  const std::vector<unsigned char> bytes =
      make_file({{"f", "F32", {3}, bytes_of(f)}, {"d", "F64", {3}, bytes_of(d)}});
  AlignedBuffer buffer(bytes);
  const File file = File::parse(buffer.data(), buffer.size());
  const std::vector<double> fd = file.to_vector<double>("f");
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(fd[i], double(f[i]));
  const std::vector<float> df = file.to_vector<float>("d");
  EXPECT_EQ(df[0], 0.1f);
  EXPECT_EQ(df[1], -3.0f);
  EXPECT_EQ(df[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(file.to_vector<float>("f"), f);
}

TEST(SafetensorsConvert, IntegerDtypesAreNotConverted) {
  const std::vector<unsigned char> bytes =
      make_file({{"i", "I32", {2}, bytes_of(std::vector<std::int32_t>{1, 2})}});
  AlignedBuffer buffer(bytes);
  const File file = File::parse(buffer.data(), buffer.size(), "ints.safetensors");
  const std::string message = error_of<FormatError>([&] { file.to_vector<float>("i"); });
  EXPECT_TRUE(Contains(message, "ints.safetensors: tensor 'i'"));
  EXPECT_TRUE(Contains(message, "got I32"));
}

// ---------------------------------------------------------------------------------------------
// Views: dtype, rank, alignment
// ---------------------------------------------------------------------------------------------

class SafetensorsViews : public ::testing::Test {
 protected:
  SafetensorsViews()
      : bytes_(make_file({{"m", "F32", {2, 2}, bytes_of(std::vector<float>{1, 2, 3, 4})},
                          {"v", "F32", {3}, bytes_of(std::vector<float>{5, 6, 7})},
                          {"s", "F32", {}, bytes_of(std::vector<float>{8})}})),
        buffer_(bytes_),
        file_(File::parse(buffer_.data(), buffer_.size(), "views.safetensors")) {}
  std::vector<unsigned char> bytes_;
  AlignedBuffer buffer_;
  File file_;
};

TEST_F(SafetensorsViews, WrongDtypeIsFormatError) {
  const std::string message = error_of<FormatError>([&] { file_.matrix<double>("m"); });
  EXPECT_TRUE(Contains(message, "views.safetensors: tensor 'm'"));
  EXPECT_TRUE(Contains(message, "needs dtype F64, got F32"));
  EXPECT_THROW(file_.vector<double>("v"), FormatError);
}

TEST_F(SafetensorsViews, WrongRankIsShapeError) {
  std::string message = error_of<ShapeError>([&] { file_.matrix<float>("v"); });
  EXPECT_TRUE(Contains(message, "tensor 'v'"));
  EXPECT_TRUE(Contains(message, "expected rank 2, got rank 1 (shape [3])"));
  message = error_of<ShapeError>([&] { file_.vector<float>("m"); });
  EXPECT_TRUE(Contains(message, "expected rank 1, got rank 2 (shape [2, 2])"));
  message = error_of<ShapeError>([&] { file_.vector<float>("s"); });
  EXPECT_TRUE(Contains(message, "expected rank 1, got rank 0 (shape [])"));
}

// A 1-byte tensor first puts the F32 tensor at an odd address: views refuse, copies work.
TEST(SafetensorsAlignment, MisalignedViewThrowsCopyWorks) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 4.0f};
  const std::vector<unsigned char> bytes =
      make_file({{"pad", "U8", {1}, {0xAB}}, {"x", "F32", {2, 2}, bytes_of(values)}});
  AlignedBuffer buffer(bytes);
  const File file = File::parse(buffer.data(), buffer.size(), "odd.safetensors");
  EXPECT_NE(reinterpret_cast<std::uintptr_t>(file.tensor("x").data) % alignof(float), 0u);
  EXPECT_FALSE(file.can_view<float>("x"));
  const std::string message = error_of<FormatError>([&] { file.matrix<float>("x"); });
  EXPECT_TRUE(Contains(message, "odd.safetensors: tensor 'x'"));
  EXPECT_TRUE(Contains(message, "aligned to 4 bytes"));
  EXPECT_EQ(file.to_vector<float>("x"), values);
}

// A whole buffer shifted by one byte: every F32 tensor in it is misaligned.
TEST(SafetensorsAlignment, MisalignedBuffer) {
  const std::vector<float> values = {1, 2, 3};
  AlignedBuffer shifted(make_file({{"x", "F32", {3}, bytes_of(values)}}), 1);
  const File file = File::parse(shifted.data(), shifted.size());
  EXPECT_THROW(file.vector<float>("x"), FormatError);
  EXPECT_EQ(file.to_vector<float>("x"), values);
}

// ---------------------------------------------------------------------------------------------
// Malformed files
// ---------------------------------------------------------------------------------------------

TEST(SafetensorsMalformed, ShorterThanLengthField) {
  EXPECT_TRUE(Contains(parse_error({}), "file is 0 bytes, shorter than the 8-byte header length"));
  EXPECT_TRUE(Contains(parse_error({1, 0, 0, 0, 0}), "file is 5 bytes"));
  // A null buffer of length 0 is fine to pass.
  EXPECT_THROW(File::parse(nullptr, 0), FormatError);
}

TEST(SafetensorsMalformed, HeaderCut) {
  const std::string header = "{\"w\": " + entry("F32", "[1]", "[0, 4]") + "}";
  std::vector<unsigned char> bytes = raw_file(header, {0, 0, 0, 0});
  bytes.resize(8 + header.size() / 2);
  const std::string message = parse_error(bytes);
  EXPECT_TRUE(
      Contains(message, "header length " + std::to_string(header.size()) + " exceeds the file"));
  EXPECT_TRUE(Contains(message, "truncated"));
}

TEST(SafetensorsMalformed, DataCut) {
  std::vector<unsigned char> bytes =
      make_file({{"w", "F32", {4}, bytes_of(std::vector<float>{1, 2, 3, 4})}});
  bytes.resize(bytes.size() - 3);
  const std::string message = parse_error(bytes);
  EXPECT_TRUE(
      Contains(message, "tensor 'w': data_offsets [0, 16] end past the data section (13 bytes)"));
}

TEST(SafetensorsMalformed, HugeHeaderLength) {
  EXPECT_TRUE(Contains(parse_error(raw_file("{}", {}, std::uint64_t{1} << 63)),
                       "header length 9223372036854775808 exceeds the cap"));
  EXPECT_TRUE(Contains(parse_error(raw_file("{}", {}, std::uint64_t{1} << 40)),
                       "header length 1099511627776 exceeds the cap"));
  EXPECT_TRUE(Contains(parse_error(raw_file("{}", {}, ~std::uint64_t{0})), "exceeds the cap"));
  EXPECT_TRUE(
      Contains(parse_error(raw_file("{}", {}, 1000)), "header length 1000 exceeds the file"));
}

// The cap is 16 MiB (gpt2::safetensors::detail::max_header_bytes): a header of exactly that size is
// read, one byte more is refused before anything is read or allocated.
TEST(SafetensorsMalformed, HeaderCapIs16MiB) {
  constexpr std::size_t cap = std::size_t{16} << 20;
  static_assert(gpt2::safetensors::detail::max_header_bytes == cap, "the cap docs/hardening.md states");
  std::string header = "{}";
  header.resize(cap, ' ');
  std::vector<unsigned char> b(8);
  for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = (header.size() >> (8 * i)) & 0xFF;
  b.insert(b.end(), header.begin(), header.end());
  EXPECT_EQ(File::parse(b.data(), b.size()).tensor_count(), 0u);
  b.push_back(' ');
  b[0] = static_cast<unsigned char>(b[0] + 1);  // cap + 1: the low byte of 2^24 is 0
  EXPECT_EQ(error_of<FormatError>([&] { File::parse(b.data(), b.size(), "big"); }),
            "big: header length 16777217 exceeds the cap of 16777216 bytes (16 MiB)");
}

TEST(SafetensorsMalformed, BadJson) {
  EXPECT_TRUE(Contains(parse_error(raw_file("{\"w\": ")), "header is not well-formed JSON"));
  EXPECT_TRUE(Contains(parse_error(raw_file("{} trailing")), "not well-formed JSON"));
  EXPECT_TRUE(
      Contains(parse_error(raw_file("{\"\xff\": 1}")), "not well-formed JSON"));  // bad UTF-8
  EXPECT_TRUE(Contains(parse_error(raw_file(std::string("{}\0\0", 4))), "not well-formed JSON"));
}

TEST(SafetensorsMalformed, JsonNotAnObject) {
  EXPECT_TRUE(Contains(parse_error(raw_file("[1, 2]")), "header must be a JSON object, got array"));
  EXPECT_TRUE(Contains(parse_error(raw_file("42")), "header must be a JSON object, got number"));
}

TEST(SafetensorsMalformed, DuplicateKeys) {
  const std::string e = entry("F32", "[1]", "[0, 4]");
  EXPECT_TRUE(Contains(parse_error(raw_file("{\"w\": " + e + ", \"w\": " + e + "}", {0, 0, 0, 0})),
                       "duplicate key 'w'"));
  EXPECT_TRUE(Contains(
      parse_error(raw_file(
          R"({"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})",
          {0, 0, 0, 0})),
      "duplicate key 'dtype'"));
}

TEST(SafetensorsMalformed, EntryNotAnObject) {
  EXPECT_TRUE(Contains(parse_error(raw_file(R"({"w": [1, 2]})")),
                       "tensor 'w': entry must be an object, got array"));
}

TEST(SafetensorsMalformed, MissingOrIllTypedFields) {
  EXPECT_TRUE(Contains(
      parse_error(raw_file(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", {0, 0, 0, 0})),
      "tensor 'w': missing 'dtype'"));
  EXPECT_TRUE(Contains(
      parse_error(raw_file(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", {0, 0, 0, 0})),
      "tensor 'w': missing 'shape'"));
  EXPECT_TRUE(
      Contains(parse_error(raw_file(R"({"w": {"dtype": "F32", "shape": [1]}})", {0, 0, 0, 0})),
               "tensor 'w': missing 'data_offsets'"));
  EXPECT_TRUE(
      Contains(parse_error(raw_file(R"({"w": {"dtype": 32, "shape": [1], "data_offsets": [0, 4]}})",
                                    {0, 0, 0, 0})),
               "'dtype' must be a string, got number"));
  EXPECT_TRUE(
      Contains(parse_error(raw_file("{\"w\": " + entry("F32", "1", "[0, 4]") + "}", {0, 0, 0, 0})),
               "'shape' must be an array, got number"));
  EXPECT_TRUE(Contains(
      parse_error(raw_file("{\"w\": " + entry("F32", "[1]", "\"0-4\"") + "}", {0, 0, 0, 0})),
      "'data_offsets' must be an array [begin, end]"));
  EXPECT_TRUE(Contains(
      parse_error(raw_file("{\"w\": " + entry("F32", "[1]", "[0, 4, 8]") + "}", {0, 0, 0, 0})),
      "'data_offsets' must be an array [begin, end], got [0,4,8]"));
}

TEST(SafetensorsMalformed, UnknownDtype) {
  EXPECT_TRUE(Contains(
      parse_error(raw_file("{\"w\": " + entry("F33", "[1]", "[0, 4]") + "}", {0, 0, 0, 0})),
      "tensor 'w': unknown dtype \"F33\""));
  EXPECT_TRUE(Contains(parse_error(raw_file("{\"w\": " + entry("F4", "[2]", "[0, 1]") + "}", {0})),
                       "unknown dtype \"F4\""));
}

TEST(SafetensorsMalformed, BadShapeEntries) {
  EXPECT_TRUE(Contains(parse_error(raw_file("{\"w\": " + entry("F32", "[-1]", "[0, 0]") + "}")),
                       "tensor 'w': shape [-1]: entry 0: negative value -1"));
  EXPECT_TRUE(Contains(parse_error(raw_file("{\"w\": " + entry("F32", "[2, 2.5]", "[0, 0]") + "}")),
                       "entry 1: expected a non-negative integer, got the non-integer number 2.5"));
  EXPECT_TRUE(Contains(parse_error(raw_file("{\"w\": " + entry("F32", "[\"2\"]", "[0, 0]") + "}")),
                       "expected a non-negative integer, got string"));
  EXPECT_TRUE(Contains(parse_error(raw_file("{\"w\": " + entry("F32", "[1e30]", "[0, 0]") + "}")),
                       "non-integer number"));
  EXPECT_TRUE(Contains(
      parse_error(raw_file("{\"w\": " + entry("F32", "[9223372036854775808]", "[0, 0]") + "}")),
      "dimension too large"));
}

TEST(SafetensorsMalformed, SizeOverflow) {
  EXPECT_TRUE(Contains(
      parse_error(raw_file("{\"w\": " + entry("F32", "[4611686018427387904, 4]", "[0, 0]") + "}")),
      "element count overflows"));
  EXPECT_TRUE(Contains(
      parse_error(raw_file("{\"w\": " + entry("F64", "[4611686018427387904]", "[0, 0]") + "}")),
      "byte size overflows"));
  // A zero dimension makes the tensor empty, whatever the others.
  AlignedBuffer ok(
      raw_file("{\"w\": " + entry("F32", "[4611686018427387904, 0, 4]", "[0, 0]") + "}"));
  EXPECT_EQ(File::parse(ok.data(), ok.size()).tensor("w").numel(), 0);
}

TEST(SafetensorsMalformed, ShapeSizeMismatch) {
  EXPECT_TRUE(
      Contains(parse_error(raw_file("{\"w\": " + entry("F32", "[3]", "[0, 8]") + "}",
                                    std::vector<unsigned char>(8))),
               "tensor 'w': data_offsets [0, 8] hold 8 bytes, but shape and dtype need 12"));
}

TEST(SafetensorsMalformed, OffsetsOutOfRange) {
  EXPECT_TRUE(Contains(parse_error(raw_file("{\"w\": " + entry("F32", "[1]", "[4, 8]") + "}",
                                            std::vector<unsigned char>(4))),
                       "data_offsets [4, 8] end past the data section (4 bytes)"));
  EXPECT_TRUE(Contains(parse_error(raw_file("{\"w\": " + entry("F32", "[1]", "[-4, 0]") + "}")),
                       "data_offsets [-4,0]: negative value -4"));
  EXPECT_TRUE(Contains(
      parse_error(raw_file("{\"w\": " + entry("F32", "[1]", "[0, 18446744073709551615]") + "}")),
      "end past the data section"));
  EXPECT_TRUE(Contains(parse_error(raw_file("{\"w\": " + entry("F32", "[1]", "[0, 1e3]") + "}")),
                       "non-integer number"));
}

TEST(SafetensorsMalformed, BeginAfterEnd) {
  EXPECT_TRUE(Contains(parse_error(raw_file("{\"w\": " + entry("F32", "[1]", "[8, 4]") + "}",
                                            std::vector<unsigned char>(8))),
                       "tensor 'w': data_offsets [8, 4] begin > end"));
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  const std::string header = "{\"a\": " + entry("F32", "[2]", "[0, 8]") +
                             ", \"b\": " + entry("F32", "[2]", "[4, 12]") + "}";
  EXPECT_TRUE(Contains(parse_error(raw_file(header, std::vector<unsigned char>(12))),
                       "overlapping tensors: 'a' [0, 8] and 'b' [4, 12]"));
  const std::string same = "{\"a\": " + entry("F32", "[2]", "[0, 8]") +
                           ", \"b\": " + entry("F32", "[2]", "[0, 8]") + "}";
  EXPECT_TRUE(
      Contains(parse_error(raw_file(same, std::vector<unsigned char>(8))), "overlapping tensors"));
  // An empty tensor inside another one overlaps it too.
  const std::string inside = "{\"a\": " + entry("F32", "[2]", "[0, 8]") +
                             ", \"b\": " + entry("F32", "[0]", "[4, 4]") + "}";
  EXPECT_TRUE(Contains(parse_error(raw_file(inside, std::vector<unsigned char>(8))),
                       "overlapping tensors"));
}

TEST(SafetensorsMalformed, HolesInData) {
  const std::string gap = "{\"a\": " + entry("F32", "[1]", "[0, 4]") +
                          ", \"b\": " + entry("F32", "[1]", "[8, 12]") + "}";
  EXPECT_TRUE(Contains(
      parse_error(raw_file(gap, std::vector<unsigned char>(12))),
      "hole in the data section: bytes [4, 8) are not covered by any tensor (before 'b')"));
  const std::string lead = "{\"a\": " + entry("F32", "[1]", "[4, 8]") + "}";
  EXPECT_TRUE(Contains(parse_error(raw_file(lead, std::vector<unsigned char>(8))),
                       "bytes [0, 4) are not covered"));
  const std::string tail = "{\"a\": " + entry("F32", "[1]", "[0, 4]") + "}";
  EXPECT_TRUE(Contains(parse_error(raw_file(tail, std::vector<unsigned char>(6))),
                       "bytes [4, 6) at its end are not covered by any tensor"));
  EXPECT_TRUE(Contains(parse_error(raw_file("{}", std::vector<unsigned char>(3))),
                       "bytes [0, 3) at its end"));
}

TEST(SafetensorsMalformed, BadMetadata) {
  EXPECT_TRUE(Contains(parse_error(raw_file(R"({"__metadata__": [1]})")),
                       "__metadata__ must be an object of strings, got array"));
  EXPECT_TRUE(Contains(parse_error(raw_file(R"({"__metadata__": null})")),
                       "__metadata__ must be an object of strings, got null"));
  EXPECT_TRUE(Contains(parse_error(raw_file(R"({"__metadata__": {"a": "b", "n": 3}})")),
                       "__metadata__ must be an object of strings: 'n' is number"));
}

// ---------------------------------------------------------------------------------------------
// File::open (mmap)
// ---------------------------------------------------------------------------------------------

TEST(SafetensorsOpen, MapsTheFileZeroCopy) {
  gpt2::test::TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  gpt2::test::write_file(path, make_file({{"w", "F32", {3, 2}, bytes_of(w)}}, {{"k", "v"}}));
  const File file = File::open(path);
  EXPECT_EQ(file.label(), path);
  EXPECT_EQ(file.metadata().at("k"), "v");
  const gpt2::ConstMatrixMap<float> m = file.matrix<float>("w");
  const auto* p = reinterpret_cast<const unsigned char*>(m.data());
  EXPECT_GE(p, file.bytes());
  EXPECT_LE(p + 24, file.bytes() + file.size());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(file.bytes()) % 4096, 0u);  // a page: the mapping
  EXPECT_EQ(m(2, 1), 6.0f);
  EXPECT_EQ(m(1, 0), 3.0f);
}

TEST(SafetensorsOpen, MisalignedTensorInMappedFile) {
  gpt2::test::TempDir dir;
  const std::string path = dir.file("odd.safetensors");
  const std::vector<float> values = {1, 2};
  gpt2::test::write_file(
      path, make_file({{"pad", "U8", {3}, {1, 2, 3}}, {"x", "F32", {2}, bytes_of(values)}}));
  const File file = File::open(path);
  EXPECT_THROW(file.vector<float>("x"), FormatError);
  EXPECT_EQ(file.to_vector<float>("x"), values);
}

TEST(SafetensorsOpen, Errors) {
  gpt2::test::TempDir dir;
  const std::string missing = dir.file("missing.safetensors");
  std::string message = error_of<FormatError>([&] { File::open(missing); });
  EXPECT_TRUE(Contains(message, missing));
  EXPECT_TRUE(Contains(message, std::strerror(ENOENT)));

  message = error_of<FormatError>([&] { File::open(dir.path().string()); });
  EXPECT_TRUE(Contains(message, dir.path().string()));
  EXPECT_TRUE(Contains(message, "not a regular file"));

  const std::string empty = dir.file("empty.safetensors");
  gpt2::test::write_file(empty, {});
  message = error_of<FormatError>([&] { File::open(empty); });
  EXPECT_TRUE(Contains(message, empty + ": file is 0 bytes"));

  const std::string bad = dir.file("bad.safetensors");
  gpt2::test::write_file(bad, raw_file("{\"w\": 1}"));
  message = error_of<FormatError>([&] { File::open(bad); });
  EXPECT_TRUE(Contains(message, bad + ": tensor 'w': entry must be an object"));
}

// An empty name is named as such, not as a file ": cannot open: No such file or directory".
TEST(SafetensorsOpen, EmptyFileNameIsNamed) {
  EXPECT_EQ(error_of<FormatError>([] { File::open(""); }), "safetensors: empty file name");
}

// ---------------------------------------------------------------------------------------------
// load_attention on a synthetic layer (C = 8, n_head = 2)
// ---------------------------------------------------------------------------------------------

// Values k/8 - 2 + tensor index: exact in F16 and BF16.
std::vector<float> synthetic(std::size_t n, int tensor) {
  std::vector<float> v(n);
  for (std::size_t k = 0; k < n; ++k) v[k] = float(int(k % 29)) / 8.0f - 2.0f + float(tensor);
  return v;
}

// The four attention tensors of a layer, with C = n_embd, stored as `dtype`.
std::vector<Tensor> attention_tensors(const std::string& prefix, const std::string& dtype,
                                      std::int64_t C = 8) {
  const auto n = [](std::int64_t a) { return static_cast<std::size_t>(a); };
  return {{prefix + "c_attn.weight", dtype, {C, 3 * C}, encode(synthetic(n(C * 3 * C), 0), dtype)},
          {prefix + "c_attn.bias", dtype, {3 * C}, encode(synthetic(n(3 * C), 1), dtype)},
          {prefix + "c_proj.weight", dtype, {C, C}, encode(synthetic(n(C * C), 2), dtype)},
          {prefix + "c_proj.bias", dtype, {C}, encode(synthetic(n(C), 3), dtype)}};
}

template <class T>
void expect_synthetic_values(const gpt2::AttentionWeights<T>& w) {
  const Eigen::Index C = w.n_embd();
  const std::vector<float> a = synthetic(std::size_t(C * 3 * C), 0),
                           ab = synthetic(std::size_t(3 * C), 1);
  const std::vector<float> p = synthetic(std::size_t(C * C), 2), pb = synthetic(std::size_t(C), 3);
  for (Eigen::Index r = 0; r < C; ++r)
    for (Eigen::Index c = 0; c < 3 * C; ++c)
      ASSERT_EQ(w.c_attn_weight()(r, c), T(a[std::size_t(r * 3 * C + c)]));
  for (Eigen::Index i = 0; i < 3 * C; ++i) ASSERT_EQ(w.c_attn_bias()(i), T(ab[std::size_t(i)]));
  for (Eigen::Index r = 0; r < C; ++r)
    for (Eigen::Index c = 0; c < C; ++c)
      ASSERT_EQ(w.c_proj_weight()(r, c), T(p[std::size_t(r * C + c)]));
  for (Eigen::Index i = 0; i < C; ++i) ASSERT_EQ(w.c_proj_bias()(i), T(pb[std::size_t(i)]));
}

// A parsed in-memory file that owns its buffer.
struct MemoryFile {
  explicit MemoryFile(const std::vector<Tensor>& tensors,
                      const std::string& label = "layer.safetensors")
      : buffer(make_file(tensors)), file(File::parse(buffer.data(), buffer.size(), label)) {}
  AlignedBuffer buffer;
  File file;
};

TEST(LoadAttention, F32IsZeroCopy) {
  MemoryFile m(attention_tensors("h.0.attn.", "F32"));
  const auto loaded = gpt2::safetensors::load_attention<float>(m.file, 0, 2);
  EXPECT_TRUE(loaded.zero_copy());
  const gpt2::AttentionWeights<float>& w = loaded.weights();
  EXPECT_EQ(w.n_embd(), 8);
  EXPECT_EQ(w.n_head(), 2);
  EXPECT_EQ(w.head_dim(), 4);
  const auto at = [&](const std::string& name) {
    return reinterpret_cast<const float*>(m.file.tensor("h.0.attn." + name).data);
  };
  EXPECT_EQ(w.c_attn_weight().data(), at("c_attn.weight"));
  EXPECT_EQ(w.c_attn_bias().data(), at("c_attn.bias"));
  EXPECT_EQ(w.c_proj_weight().data(), at("c_proj.weight"));
  EXPECT_EQ(w.c_proj_bias().data(), at("c_proj.bias"));
  expect_synthetic_values(w);
}

TEST(LoadAttention, F16AndBF16AreConvertedExactly) {
  for (const char* dtype : {"F16", "BF16"}) {
    SCOPED_TRACE(dtype);
    MemoryFile m(attention_tensors("h.0.attn.", dtype));
    const auto loaded = gpt2::safetensors::load_attention<float>(m.file, 0, 2);
    EXPECT_FALSE(loaded.zero_copy());
    const auto* p = reinterpret_cast<const unsigned char*>(loaded.weights().c_attn_weight().data());
    EXPECT_TRUE(p < m.file.bytes() || p >= m.file.bytes() + m.file.size());  // an owned buffer
    expect_synthetic_values(loaded.weights());
    expect_synthetic_values(gpt2::safetensors::load_attention<double>(m.file, 0, 2).weights());
  }
}

// A BF16 checkpoint packed in bf16 (pack_weights(w, WeightDtype::bf16)): the packed weights hold
// the file's own bf16 bits, exactly (the loader widens them to float32 exactly, and rounding gives
// them back).
TEST(LoadAttention, BF16CheckpointPacksToItsOwnBits) {
  MemoryFile m(attention_tensors("h.0.attn.", "BF16"));
  const auto loaded = gpt2::safetensors::load_attention<float>(m.file, 0, 2);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(loaded.weights(), gpt2::WeightDtype::bf16);
  ASSERT_EQ(w.weight_dtype(), gpt2::WeightDtype::bf16);
  const auto file_bits = [&](const std::string& name) {
    return reinterpret_cast<const std::uint16_t*>(m.file.tensor("h.0.attn." + name).data);
  };
  const std::uint16_t* attn = file_bits("c_attn.weight");
  const std::uint16_t* proj = file_bits("c_proj.weight");
  const gpt2::PackedMatrix& pa = *w.packed_c_attn_weight();
  const gpt2::PackedMatrix& pp = *w.packed_c_proj_weight();
  for (Eigen::Index k = 0; k < 8; ++k) {
    for (Eigen::Index j = 0; j < 24; ++j)
      ASSERT_EQ(pa.bf16_panels_from(0)[gpt2::kernels::bf16_packed_offset(k, j, pa.depth())], attn[k * 24 + j]);
    for (Eigen::Index j = 0; j < 8; ++j)
      ASSERT_EQ(pp.bf16_panels_from(0)[gpt2::kernels::bf16_packed_offset(k, j, pp.depth())], proj[k * 8 + j]);
  }
}

TEST(LoadAttention, DoubleFromF32IsConvertedAndFloatFromF64) {
  MemoryFile f32(attention_tensors("h.0.attn.", "F32"));
  const auto d = gpt2::safetensors::load_attention<double>(f32.file, 0, 2);
  EXPECT_FALSE(d.zero_copy());
  expect_synthetic_values(d.weights());

  MemoryFile f64(attention_tensors("h.0.attn.", "F64"));
  EXPECT_TRUE(gpt2::safetensors::load_attention<double>(f64.file, 0, 2).zero_copy());
  const auto f = gpt2::safetensors::load_attention<float>(f64.file, 0, 2);
  EXPECT_FALSE(f.zero_copy());
  expect_synthetic_values(f.weights());
}

TEST(LoadAttention, MisalignedF32IsConverted) {
  std::vector<Tensor> tensors = {{"pad", "U8", {1}, {0}}};
  for (const Tensor& t : attention_tensors("h.0.attn.", "F32")) tensors.push_back(t);
  MemoryFile m(tensors);
  const auto loaded = gpt2::safetensors::load_attention<float>(m.file, 0, 2);
  EXPECT_FALSE(loaded.zero_copy());
  expect_synthetic_values(loaded.weights());
}

TEST(LoadAttention, TransformerPrefixAndOtherLayers) {
  std::vector<Tensor> tensors = attention_tensors("transformer.h.0.attn.", "F32");
  for (const Tensor& t : attention_tensors("transformer.h.11.attn.", "F16")) tensors.push_back(t);
  MemoryFile m(tensors);
  const auto l0 = gpt2::safetensors::load_attention<float>(m.file, 0, 2);
  EXPECT_TRUE(l0.zero_copy());
  EXPECT_EQ(l0.weights().c_proj_bias().data(),
            reinterpret_cast<const float*>(m.file.tensor("transformer.h.0.attn.c_proj.bias").data));
  const auto l11 = gpt2::safetensors::load_attention<float>(m.file, 11, 4);
  EXPECT_FALSE(l11.zero_copy());
  EXPECT_EQ(l11.weights().n_head(), 4);
  expect_synthetic_values(l11.weights());
}

TEST(LoadAttention, DefaultNHeadIsNEmbdOver64) {
  MemoryFile m(attention_tensors("h.0.attn.", "F32", 128));
  const auto loaded = gpt2::safetensors::load_attention<float>(m.file, 0);
  EXPECT_EQ(loaded.weights().n_head(), 2);
  EXPECT_EQ(loaded.weights().head_dim(), 64);

  MemoryFile small(attention_tensors("h.0.attn.", "F32", 8));
  const std::string message =
      error_of<gpt2::ConfigError>([&] { gpt2::safetensors::load_attention<float>(small.file, 0); });
  EXPECT_TRUE(
      Contains(message, "n_embd = 8 is not a positive multiple of 64; pass n_head explicitly"));
  EXPECT_TRUE(Contains(error_of<gpt2::ConfigError>(
                           [&] { gpt2::safetensors::load_attention<float>(small.file, 0, 3); }),
                       "n_head: expected a divisor of n_embd = 8, got 3"));
}

TEST(LoadAttention, MovingKeepsConvertedBuffers) {
  MemoryFile m(attention_tensors("h.0.attn.", "F16"));
  auto first = gpt2::safetensors::load_attention<float>(m.file, 0, 2);
  const float* p = first.weights().c_attn_weight().data();
  gpt2::safetensors::LoadedAttention<float> second = std::move(first);
  EXPECT_EQ(second.weights().c_attn_weight().data(), p);
  expect_synthetic_values(second.weights());
}

TEST(LoadAttention, MissingTensorsListTheNamesLookedFor) {
  MemoryFile other(attention_tensors("h.1.attn.", "F32"));
  std::string message =
      error_of<FormatError>([&] { gpt2::safetensors::load_attention<float>(other.file, 0, 2); });
  EXPECT_TRUE(Contains(message, "layer.safetensors"));
  EXPECT_TRUE(Contains(message, "'h.0.attn.c_attn.weight'"));
  EXPECT_TRUE(Contains(message, "'transformer.h.0.attn.c_attn.weight'"));
  // The names the file has, and the closest to those looked for.
  EXPECT_TRUE(Contains(message, "the file has 4 tensors: 'h.1.attn.c_attn.bias'"));
  EXPECT_TRUE(Contains(message, "closest: 'h.1.attn.c_attn.weight'"));

  std::vector<Tensor> three = attention_tensors("h.0.attn.", "F32");
  three.pop_back();
  MemoryFile partial(three);
  message =
      error_of<FormatError>([&] { gpt2::safetensors::load_attention<float>(partial.file, 0, 2); });
  EXPECT_TRUE(Contains(message, "missing tensor 'h.0.attn.c_proj.bias' (the file has 3 tensors"));
  EXPECT_TRUE(Contains(message, "closest: 'h.0.attn.c_attn.bias'"));

  std::vector<Tensor> both = attention_tensors("h.0.attn.", "F32");
  for (const Tensor& t : attention_tensors("transformer.h.0.attn.", "F32")) both.push_back(t);
  MemoryFile ambiguous(both);
  message = error_of<FormatError>(
      [&] { gpt2::safetensors::load_attention<float>(ambiguous.file, 0, 2); });
  EXPECT_TRUE(Contains(message, "both"));
}

TEST(LoadAttention, WrongShapeNamesTensorExpectedAndActual) {
  std::vector<Tensor> tensors = attention_tensors("h.0.attn.", "F32");
  tensors[2] = {"h.0.attn.c_proj.weight", "F32", {8, 7}, bytes_of(synthetic(56, 2))};
  MemoryFile m(tensors);
  const std::string message =
      error_of<ShapeError>([&] { gpt2::safetensors::load_attention<float>(m.file, 0, 2); });
  EXPECT_TRUE(Contains(
      message, "layer.safetensors: h.0.attn.c_proj.weight: expected shape [8, 8], got [8, 7]"));

  tensors = attention_tensors("h.0.attn.", "F16");
  tensors[1] = {"h.0.attn.c_attn.bias", "F16", {16}, encode(synthetic(16, 1), "F16")};
  MemoryFile bias(tensors);
  EXPECT_TRUE(Contains(
      error_of<ShapeError>([&] { gpt2::safetensors::load_attention<float>(bias.file, 0, 2); }),
      "h.0.attn.c_attn.bias: expected shape [24], got [16]"));
}

TEST(LoadAttention, NEmbdComesFromTheBiasesNotTheWeights) {
  // c_attn.weight [7, 24] in a C = 8 layer: reported against C = 8, not C = 7.
  std::vector<Tensor> tensors = attention_tensors("h.0.attn.", "F32");
  tensors[0] = {"h.0.attn.c_attn.weight", "F32", {7, 24}, bytes_of(synthetic(7 * 24, 0))};
  MemoryFile weight(tensors);
  EXPECT_EQ(
      error_of<ShapeError>([&] { gpt2::safetensors::load_attention<float>(weight.file, 0, 2); }),
      "layer.safetensors: h.0.attn.c_attn.weight: expected shape [8, 24], got [7, 24]");

  // c_proj.bias [7] when everything else says C = 8: c_proj.bias is the one reported.
  tensors = attention_tensors("h.0.attn.", "F32");
  tensors[3] = {"h.0.attn.c_proj.bias", "F32", {7}, bytes_of(synthetic(7, 3))};
  MemoryFile bias(tensors);
  EXPECT_EQ(
      error_of<ShapeError>([&] { gpt2::safetensors::load_attention<float>(bias.file, 0, 2); }),
      "layer.safetensors: h.0.attn.c_proj.bias: expected shape [8], got [7]");
}

TEST(LoadAttention, TransposedCAttnWeightGetsAHint) {
  // nn.Linear stores c_attn as [3C, C]; GPT-2's Conv1D as [in, out] = [C, 3C].
  const std::string hint = " (looks like nn.Linear [out, in]; GPT-2's Conv1D stores [in, out])";
  std::vector<Tensor> tensors = attention_tensors("h.0.attn.", "F32");
  tensors[0].shape = {24, 8};
  MemoryFile small(tensors);
  EXPECT_EQ(
      error_of<ShapeError>([&] { gpt2::safetensors::load_attention<float>(small.file, 0, 2); }),
      "layer.safetensors: h.0.attn.c_attn.weight: expected shape [8, 24], got [24, 8]" + hint);

  tensors = attention_tensors("transformer.h.0.attn.", "F16", 128);
  tensors[0].shape = {384, 128};
  MemoryFile gpt2_like(tensors);
  EXPECT_EQ(error_of<ShapeError>(
                [&] { gpt2::safetensors::load_attention<float>(gpt2_like.file, 0); }),
            "layer.safetensors: transformer.h.0.attn.c_attn.weight: expected shape [128, 384], "
            "got [384, 128]" +
                hint);

  // Any other wrong shape gets no hint.
  tensors = attention_tensors("h.0.attn.", "F32");
  tensors[0].shape = {12, 16};
  MemoryFile other(tensors);
  const std::string message =
      error_of<ShapeError>([&] { gpt2::safetensors::load_attention<float>(other.file, 0, 2); });
  EXPECT_EQ(message, "layer.safetensors: h.0.attn.c_attn.weight: expected shape [8, 24], got [12, 16]");
}

TEST(LoadAttention, WrongRankOrDtypeIsCheckedFirst) {
  std::vector<Tensor> tensors = attention_tensors("h.0.attn.", "F32");
  tensors[1].shape = {3, 8};
  MemoryFile rank(tensors);
  EXPECT_TRUE(Contains(
      error_of<ShapeError>([&] { gpt2::safetensors::load_attention<float>(rank.file, 0, 2); }),
      "tensor 'h.0.attn.c_attn.bias': expected rank 1, got rank 2 (shape [3, 8])"));

  tensors = attention_tensors("h.0.attn.", "F32");
  tensors[3] = {"h.0.attn.c_proj.bias", "I32", {8}, bytes_of(std::vector<std::int32_t>(8))};
  MemoryFile ints(tensors);
  EXPECT_TRUE(Contains(
      error_of<FormatError>([&] { gpt2::safetensors::load_attention<float>(ints.file, 0, 2); }),
      "tensor 'h.0.attn.c_proj.bias': expected a floating dtype (F64, F32, F16, BF16), got I32"));
}

// ---------------------------------------------------------------------------------------------
// Real GPT-2 small weights (layer 0), read from where they are: never copied into the repository.
// ---------------------------------------------------------------------------------------------

TEST(RealWeights, Gpt2SmallLayer0) {
  const char* path = std::getenv("GPT2_SMALL_WEIGHTS");
  if (path == nullptr || *path == '\0')
    GTEST_SKIP() << "GPT2_SMALL_WEIGHTS not set: skipping the real GPT-2 weights test";
  const File file = File::open(path);
  const std::map<std::string, std::vector<std::int64_t>> expected = {
      {"wpe.weight", {1024, 768}},      {"h.0.ln_1.weight", {768}},
      {"h.0.ln_1.bias", {768}},         {"h.0.attn.c_attn.weight", {768, 2304}},
      {"h.0.attn.c_attn.bias", {2304}}, {"h.0.attn.c_proj.weight", {768, 768}},
      {"h.0.attn.c_proj.bias", {768}}};
  EXPECT_EQ(file.tensor_count(), expected.size());
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(file.contains(name)) << name;
    EXPECT_EQ(file.tensor(name).dtype, Dtype::F32) << name;
    EXPECT_EQ(file.tensor(name).shape, shape) << name;
  }

  const auto f = gpt2::safetensors::load_attention<float>(file, 0);
  EXPECT_TRUE(f.zero_copy());
  EXPECT_EQ(f.weights().n_head(), 12);
  EXPECT_EQ(f.weights().head_dim(), 64);
  EXPECT_EQ(f.weights().c_attn_weight().data(),
            reinterpret_cast<const float*>(file.tensor("h.0.attn.c_attn.weight").data));
  EXPECT_TRUE(f.weights().c_attn_weight().allFinite());
  EXPECT_TRUE(f.weights().c_proj_weight().allFinite());

  const auto d = gpt2::safetensors::load_attention<double>(file, 0);
  EXPECT_FALSE(d.zero_copy());
  EXPECT_EQ(d.weights().n_head(), 12);
  EXPECT_TRUE(
      (d.weights().c_attn_weight().cast<float>().array() == f.weights().c_attn_weight().array())
          .all());
  EXPECT_TRUE(
      (d.weights().c_attn_bias().cast<float>().array() == f.weights().c_attn_bias().array()).all());
  EXPECT_TRUE(
      (d.weights().c_proj_weight().cast<float>().array() == f.weights().c_proj_weight().array())
          .all());
  EXPECT_TRUE(
      (d.weights().c_proj_bias().cast<float>().array() == f.weights().c_proj_bias().array()).all());
}

}  // namespace
