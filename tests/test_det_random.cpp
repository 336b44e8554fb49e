// tests/support/det_random.hpp against the Python generator in tests/reference/generate.py: hard-coded
// values, and small_T7's stored `x_rows`, which must be reproduced bit for bit.
#include "support/det_random.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::RowVector;
using gpt2::test::det_matrix;
using gpt2::test::det_value;
using gpt2::test::det_vector;

std::uint64_t bits_of(double d) {
  std::uint64_t u = 0;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

// --- A deliberately minimal safetensors reader, enough for the fixtures written by generate.py (the
// --- library's own reader is tested elsewhere; this test does not depend on it).

struct MiniSafetensors {
  std::string header;              // the JSON header
  std::vector<unsigned char> data;  // the byte buffer after the header

  static MiniSafetensors load(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::vector<unsigned char> blob((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (blob.size() < 8) throw std::runtime_error(path + ": shorter than 8 bytes");
    std::uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = (n << 8) | blob[static_cast<std::size_t>(b)];  // little-endian
    if (n > blob.size() - 8) throw std::runtime_error(path + ": header length past the end");
    MiniSafetensors st;
    st.header.assign(blob.begin() + 8, blob.begin() + 8 + static_cast<std::ptrdiff_t>(n));
    st.data.assign(blob.begin() + 8 + static_cast<std::ptrdiff_t>(n), blob.end());
    return st;
  }

  // The text of the JSON object that is the value of top-level key `name` (no nested objects in
  // the entries generate.py writes).
  std::string object(const std::string& name) const {
    const std::string key = "\"" + name + "\":";
    const auto at = header.find(key);
    if (at == std::string::npos) throw std::runtime_error("no entry " + name);
    const auto open = header.find('{', at + key.size());
    const auto close = header.find('}', open);
    return header.substr(open, close - open + 1);
  }

  // A string value inside an object: "key":"value".
  static std::string string_field(const std::string& obj, const std::string& key) {
    const std::string k = "\"" + key + "\":\"";
    const auto at = obj.find(k);
    if (at == std::string::npos) throw std::runtime_error("no field " + key);
    const auto begin = at + k.size();
    return obj.substr(begin, obj.find('"', begin) - begin);
  }

  // An integer array inside an object: "key":[a,b,...].
  static std::vector<std::uint64_t> array_field(const std::string& obj, const std::string& key) {
    const std::string k = "\"" + key + "\":[";
    const auto at = obj.find(k);
    if (at == std::string::npos) throw std::runtime_error("no field " + key);
    const auto begin = at + k.size();
    std::string list = obj.substr(begin, obj.find(']', begin) - begin);
    for (char& c : list)
      if (c == ',') c = ' ';
    std::istringstream is(list);
    std::vector<std::uint64_t> out;
    for (std::uint64_t v; is >> v;) out.push_back(v);
    return out;
  }

  std::string metadata(const std::string& key) const { return string_field(object("__metadata__"), key); }

  // An F64 tensor of rank 2 as a row-major matrix.
  RowMatrix<double> matrix_f64(const std::string& name) const {
    const std::string obj = object(name);
    if (string_field(obj, "dtype") != "F64") throw std::runtime_error(name + ": expected F64");
    const auto shape = array_field(obj, "shape");
    const auto offsets = array_field(obj, "data_offsets");
    if (shape.size() != 2 || offsets.size() != 2) throw std::runtime_error(name + ": expected rank 2");
    const std::uint64_t count = shape[0] * shape[1];
    if (offsets[1] - offsets[0] != count * 8 || offsets[1] > data.size())
      throw std::runtime_error(name + ": data_offsets do not match the shape");
    RowMatrix<double> m(static_cast<Index>(shape[0]), static_cast<Index>(shape[1]));
    std::memcpy(m.data(), data.data() + offsets[0], count * 8);  // host is little-endian (checked)
    return m;
  }
};

bool host_is_little_endian() {
  const std::uint32_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// --- det_value

// Values printed by `generate.py --print-det-values` (Python integers, independent of numpy).
TEST(DetValue, MatchesPythonGenerator) {
  EXPECT_EQ(det_value(0u, 0u), 0x1.04da407d768c0p-6);
  EXPECT_EQ(det_value(1u, 0u), -0x1.4bc35ce060620p-1);
  EXPECT_EQ(det_value(2000u, 5u), 0x1.6d0256998b4a6p-1);
  EXPECT_EQ(det_value(2000u, 12345u), -0x1.ea4cf0a461e90p-4);
  EXPECT_EQ(det_value(18446744073709551615u, 1099511627776u), 0x1.ea5b05c242c62p-1);
  EXPECT_EQ(det_value(3000u, 1048583u), 0x1.761f6aae18118p-2);
}

TEST(DetValue, IsConstexpr) {
  static_assert(det_value(0u, 0u) == 0x1.04da407d768c0p-6, "det_value must be usable at compile time");
  SUCCEED();
}

TEST(DetValue, LiesInMinusOneToOneAndUsesTheWholeRange) {
  double lo = 1.0, hi = -1.0, sum = 0.0;
  constexpr int n = 100000;
  for (std::uint64_t i = 0; i < n; ++i) {
    const double v = det_value(42u, i);
    ASSERT_GE(v, -1.0) << "i = " << i;
    ASSERT_LT(v, 1.0) << "i = " << i;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  EXPECT_LT(lo, -0.999);
  EXPECT_GT(hi, 0.999);
  EXPECT_NEAR(sum / n, 0.0, 0.01);
}

// --- det_matrix / det_vector

TEST(DetMatrix, IsRowMajorFlatIndexTimesScale) {
  const RowMatrix<double> m = det_matrix<double>(7u, 3, 5, 0.25);
  ASSERT_EQ(m.rows(), 3);
  ASSERT_EQ(m.cols(), 5);
  for (Index r = 0; r < 3; ++r)
    for (Index c = 0; c < 5; ++c)
      EXPECT_EQ(bits_of(m(r, c)), bits_of(0.25 * det_value(7u, static_cast<std::uint64_t>(r * 5 + c))))
          << "at (" << r << ", " << c << ")";
}

TEST(DetMatrix, FloatIsTheDoubleRoundedToNearest) {
  const RowMatrix<double> d = det_matrix<double>(11u, 4, 33, 0.1);
  const RowMatrix<float> f = det_matrix<float>(11u, 4, 33, 0.1);
  for (Index r = 0; r < d.rows(); ++r)
    for (Index c = 0; c < d.cols(); ++c) {
      EXPECT_EQ(f(r, c), static_cast<float>(d(r, c))) << "at (" << r << ", " << c << ")";
      // Round to nearest: no other float is closer.
      const float here = f(r, c);
      const double err = std::abs(static_cast<double>(here) - d(r, c));
      const float up = std::nextafter(here, std::numeric_limits<float>::infinity());
      const float down = std::nextafter(here, -std::numeric_limits<float>::infinity());
      EXPECT_LE(err, std::abs(static_cast<double>(up) - d(r, c)));
      EXPECT_LE(err, std::abs(static_cast<double>(down) - d(r, c)));
    }
}

TEST(DetVector, EqualsAOneRowMatrix) {
  const RowVector<double> v = det_vector<double>(123u, 17, 0.125);
  const RowMatrix<double> m = det_matrix<double>(123u, 1, 17, 0.125);
  ASSERT_EQ(v.size(), 17);
  for (Index i = 0; i < 17; ++i) EXPECT_EQ(bits_of(v(i)), bits_of(m(0, i))) << "at " << i;
  const RowVector<float> vf = det_vector<float>(123u, 17, 0.125);
  for (Index i = 0; i < 17; ++i) EXPECT_EQ(vf(i), static_cast<float>(v(i))) << "at " << i;
}

// --- against the committed fixture

TEST(DetMatrix, ReproducesSmallT7XRowsBitwise) {
  if (!host_is_little_endian()) GTEST_SKIP() << "the fixture reader assumes a little-endian host";
  const auto st = MiniSafetensors::load(std::string(GPT2_FIXTURE_DIR) + "/small_T7.safetensors");
  const std::uint64_t seed = std::stoull(st.metadata("seed"));
  const double scale_x = std::stod(st.metadata("scale_x"));
  const Index T = std::stol(st.metadata("T"));
  const Index C = std::stol(st.metadata("n_embd"));
  ASSERT_EQ(st.metadata("rows"), "0,1,2,3,4,5,6");

  const RowMatrix<double> expected = st.matrix_f64("x_rows");
  ASSERT_EQ(expected.rows(), T);
  ASSERT_EQ(expected.cols(), C);

  const RowMatrix<double> x = det_matrix<double>(seed + gpt2::test::kSeedOffsetX, T, C, scale_x);
  Index mismatches = 0;
  for (Index r = 0; r < T; ++r)
    for (Index c = 0; c < C; ++c)
      if (bits_of(x(r, c)) != bits_of(expected(r, c))) {
        if (mismatches++ < 5)
          ADD_FAILURE() << "x(" << r << ", " << c << ") = " << x(r, c) << ", python: " << expected(r, c);
      }
  EXPECT_EQ(mismatches, 0) << "of " << T * C << " elements";
}

}  // namespace
