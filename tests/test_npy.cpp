// Tests of gpt2/npy.hpp: round trips, the exact bytes numpy.save writes, every malformed header
// the reader rejects, and the atomic writer. When /usr/bin/python3 has numpy, files are also
// exchanged with numpy itself.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gpt2/npy.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/tmpdir.hpp"

namespace {

using gpt2::FormatError;
using gpt2::ShapeError;
namespace npy = gpt2::npy;
using gpt2::test::Contains;
using gpt2::test::error_of;

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& values) {
  std::vector<unsigned char> out(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<unsigned char> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// "\x93NUMPY", version, little-endian header length (header.size() unless given; 2 bytes for
// version 1, 4 otherwise), header text as given (no padding added), data.
std::vector<unsigned char> npy_file(const std::string& header,
                                    const std::vector<unsigned char>& data = {}, unsigned major = 1,
                                    std::optional<std::uint32_t> length = std::nullopt) {
  std::vector<unsigned char> out = {
      0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major), 0};
  const std::uint32_t n = length.value_or(static_cast<std::uint32_t>(header.size()));
  for (unsigned i = 0; i < (major == 1 ? 2u : 4u); ++i)
    out.push_back(static_cast<unsigned char>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// A header dict with the given descr / fortran_order / shape source text.
std::string dict(const std::string& descr, const std::string& shape,
                 const std::string& order = "False") {
  return "{'descr': " + descr + ", 'fortran_order': " + order + ", 'shape': " + shape + ", }\n";
}

// What npy::parse throws for `bytes`: a FormatError naming the label.
std::string parse_error(const std::vector<unsigned char>& bytes) {
  const std::string message =
      error_of<FormatError>([&] { npy::parse(bytes.data(), bytes.size(), "bad.npy"); });
  EXPECT_TRUE(Contains(message, "bad.npy: "));
  return message;
}

std::vector<float> iota_f(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(i) * 0.25f - 1.0f;
  return v;
}

// ---------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------

template <class T>
class NpyRoundTrip : public ::testing::Test {};
// The trailing comma passes an empty name generator: clang -Wpedantic rejects an omitted one.
TYPED_TEST_SUITE(NpyRoundTrip, gpt2::test::Scalars, );

TYPED_TEST(NpyRoundTrip, OneTwoThreeDimensionsAndEmpty) {
  using T = TypeParam;
  gpt2::test::TempDir dir;
  const std::vector<std::vector<std::int64_t>> shapes = {{5}, {2, 3}, {2, 3, 4}, {0, 3}, {1, 1, 1}};
  for (const std::vector<std::int64_t>& shape : shapes) {
    SCOPED_TRACE(gpt2::detail::shape_string(shape));
    std::size_t n = 1;
    for (std::int64_t d : shape) n *= std::size_t(d);
    std::vector<T> values(n);
    for (std::size_t i = 0; i < n; ++i) values[i] = T(0.1) * T(i) - T(3);
    const std::string path = dir.file("a.npy");
    npy::write(path, values.data(), shape);
    const npy::Array a = npy::read(path);
    EXPECT_EQ(a.dtype, npy::dtype_of<T>());
    EXPECT_EQ(a.shape, shape);
    EXPECT_EQ(a.numel(), std::int64_t(n));
    EXPECT_EQ(a.bytes.size(), n * sizeof(T));
    EXPECT_EQ(a.template to_vector<T>(), values);
    const std::vector<double> as_double = a.template to_vector<double>();
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(as_double[i], double(values[i]));
    if (shape.size() == 2) {
      const gpt2::RowMatrix<T> m = a.template to_matrix<T>();
      ASSERT_EQ(m.rows(), shape[0]);
      ASSERT_EQ(m.cols(), shape[1]);
      for (Eigen::Index r = 0; r < m.rows(); ++r)
        for (Eigen::Index c = 0; c < m.cols(); ++c)
          EXPECT_EQ(m(r, c), values[std::size_t(r * m.cols() + c)]);
    }
  }
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.npy"});
}

TYPED_TEST(NpyRoundTrip, RowMatrix) {
  using T = TypeParam;
  gpt2::test::TempDir dir;
  gpt2::RowMatrix<T> m(3, 4);
  for (Eigen::Index r = 0; r < 3; ++r)
    for (Eigen::Index c = 0; c < 4; ++c) m(r, c) = T(r * 10 + c) / T(3);
  npy::write(dir.file("m.npy"), m);
  const npy::Array a = npy::read(dir.file("m.npy"));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(a.template to_matrix<T>(), m);
}

TEST(NpyRoundTrip, SpecialValues) {
  gpt2::test::TempDir dir;
  const std::vector<float> v = {std::numeric_limits<float>::infinity(), -0.0f, 1e-45f,
                                std::numeric_limits<float>::max()};
  npy::write(dir.file("s.npy"), v.data(), {4});
  const std::vector<float> back = npy::read(dir.file("s.npy")).to_vector<float>();
  EXPECT_EQ(std::memcmp(back.data(), v.data(), sizeof(float) * 4), 0);
}

// ---------------------------------------------------------------------------------------------
// What numpy writes
// ---------------------------------------------------------------------------------------------

// numpy.save output, as numpy 1.24 writes it: header length 118 (128 bytes before the data),
// the dict, spaces, '\n'.
std::vector<unsigned char> numpy_save_bytes(const std::string& dict_text,
                                            const std::vector<unsigned char>& data) {
  std::string header = dict_text;
  header.append(117 - dict_text.size(), ' ');
  header += '\n';
  std::vector<unsigned char> out = bytes_of(std::string("\x93NUMPY\x01\x00\x76\x00", 10));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

TEST(NpyNumpyFormat, WriterMatchesNumpySaveByteForByte) {
  gpt2::test::TempDir dir;
  const std::vector<float> f = iota_f(24);
  npy::write(dir.file("a.npy"), f.data(), {2, 3});
  EXPECT_EQ(gpt2::test::read_file(dir.file("a.npy")),
            numpy_save_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                             bytes_of(std::vector<float>(f.begin(), f.begin() + 6))));
  npy::write(dir.file("b.npy"), f.data(), {2, 3, 4});
  EXPECT_EQ(gpt2::test::read_file(dir.file("b.npy")),
            numpy_save_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), }",
                             bytes_of(f)));
  const std::vector<double> d = {1.5, -2.0, 3.25};
  npy::write(dir.file("c.npy"), d.data(), {3});
  EXPECT_EQ(
      gpt2::test::read_file(dir.file("c.npy")),
      numpy_save_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", bytes_of(d)));
}

TEST(NpyNumpyFormat, ReadsNumpySaveBytes) {
  const std::vector<double> d = {1.5, -2.0, 3.25};
  const std::vector<unsigned char> file =
      numpy_save_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", bytes_of(d));
  const npy::Array a = npy::parse(file.data(), file.size());
  EXPECT_EQ(a.dtype, npy::Dtype::F64);
  EXPECT_EQ(a.shape, std::vector<std::int64_t>{3});
  EXPECT_EQ(a.to_vector<double>(), d);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1.5f, -2.0f, 3.25f}));
}

TEST(NpyNumpyFormat, ReadsVersions2And3AndOtherSpellings) {
  const std::vector<float> f = iota_f(6);
  for (unsigned major : {1u, 2u, 3u}) {
    SCOPED_TRACE(major);
    const std::vector<unsigned char> file = npy_file(dict("'<f4'", "(2, 3)"), bytes_of(f), major);
    const npy::Array a = npy::parse(file.data(), file.size());
    EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
    EXPECT_EQ(a.to_vector<float>(), f);
  }
  // Old numpy (16-byte alignment), other key order, double quotes, no trailing comma or newline.
  const std::vector<std::string> headers = {
      "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }      \n",
      "{'shape': (6,), 'fortran_order': False, 'descr': '<f4'}",
      "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (6, )}",
      "{ 'descr' : '<f4' ,\n 'fortran_order' : False , 'shape' : ( 6 , ) , }  ",
  };
  for (const std::string& header : headers) {
    SCOPED_TRACE(header);
    const std::vector<unsigned char> file = npy_file(header, bytes_of(f));
    const npy::Array a = npy::parse(file.data(), file.size());
    EXPECT_EQ(a.shape, std::vector<std::int64_t>{6});
    EXPECT_EQ(a.to_vector<float>(), f);
  }
}

// Interoperability with numpy itself, when /usr/bin/python3 has it.
bool have_numpy() { return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0; }

int run(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(NpyNumpyInterop, NumpyLoadsOurFilesAndWeLoadNumpys) {
  if (!have_numpy())
    GTEST_SKIP() << "/usr/bin/python3 with numpy not found: skipping numpy interop";
  gpt2::test::TempDir dir;
  const std::vector<float> f = iota_f(24);
  npy::write(dir.file("ours.npy"), f.data(), {2, 3, 4});
  EXPECT_EQ(run("/usr/bin/python3 -c \"import numpy as np, sys; a = np.load(sys.argv[1]); "
                "assert a.dtype == np.float32 and a.shape == (2, 3, 4), (a.dtype, a.shape); "
                "assert (a.ravel() == np.arange(24, dtype=np.float32) * 0.25 - 1).all()\" " +
                dir.file("ours.npy")),
            0);

  EXPECT_EQ(
      run("/usr/bin/python3 -c \"import numpy as np, sys; d = sys.argv[1]; "
          "a = np.arange(12, dtype=np.float64).reshape(3, 4) / 8 - 0.5; np.save(d + '/v1.npy', a); "
          "[np.lib.format.write_array(open(d + '/v%d.npy' % v, 'wb'), a.astype(np.float32), "
          "version=(v, 0)) "
          "for v in (2, 3)]\" " +
          dir.path().string()),
      0);
  const npy::Array v1 = npy::read(dir.file("v1.npy"));
  EXPECT_EQ(v1.dtype, npy::Dtype::F64);
  ASSERT_EQ(v1.shape, (std::vector<std::int64_t>{3, 4}));
  for (const char* name : {"v2.npy", "v3.npy"}) {
    const npy::Array a = npy::read(dir.file(name));
    EXPECT_EQ(a.dtype, npy::Dtype::F32) << name;
    EXPECT_EQ(a.to_matrix<double>(), v1.to_matrix<double>()) << name;
  }
  const gpt2::RowMatrix<double> m = v1.to_matrix<double>();
  EXPECT_EQ(m(2, 3), 11.0 / 8 - 0.5);
}

// ---------------------------------------------------------------------------------------------
// Malformed files
// ---------------------------------------------------------------------------------------------

const std::vector<unsigned char> six_floats = bytes_of(iota_f(6));

TEST(NpyMalformed, BadMagicOrTooShort) {
  EXPECT_TRUE(Contains(parse_error({}), "not a .npy file: bad magic"));
  EXPECT_TRUE(Contains(parse_error(bytes_of(std::string("\x93NUMP", 5))), "bad magic"));
  EXPECT_TRUE(
      Contains(parse_error(bytes_of(std::string("PK\x03\x04 not numpy at all"))), "bad magic"));
  EXPECT_TRUE(Contains(parse_error(bytes_of(std::string("\x93NUMPY\x01", 7))),
                       "truncated in the version field"));
  EXPECT_TRUE(Contains(parse_error(bytes_of(std::string("\x93NUMPY\x01\x00\x10", 9))),
                       "truncated in the header length field"));
  EXPECT_TRUE(Contains(parse_error(bytes_of(std::string("\x93NUMPY\x02\x00\x10\x00\x00", 11))),
                       "truncated in the header length field"));
}

TEST(NpyMalformed, UnsupportedVersion) {
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(6,)"), six_floats, 4)),
                       "unsupported .npy format version 4.0 (expected 1.0, 2.0 or 3.0)"));
  std::vector<unsigned char> v11 = npy_file(dict("'<f4'", "(6,)"), six_floats);
  v11[7] = 1;
  EXPECT_TRUE(Contains(parse_error(v11), "version 1.1"));
}

TEST(NpyMalformed, HeaderLengthBeyondFileOrCap) {
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(6,)"), {}, 1, 1000)),
                       "header length 1000 exceeds the file"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(6,)"), {}, 2, 0xFFFFFFFFu)),
                       "header length 4294967295 exceeds the cap"));
  EXPECT_TRUE(
      Contains(parse_error(npy_file(dict("'<f4'", "(6,)"), {}, 3, 70000)), "exceeds the cap"));
}

TEST(NpyMalformed, UnsupportedDescr) {
  for (const char* descr : {"'>f4'", "'<f2'", "'<i4'", "'|u1'", "'f4'", "'<c8'", "'>f8'"}) {
    const std::string message = parse_error(npy_file(dict(descr, "(6,)"), six_floats));
    EXPECT_TRUE(Contains(message, std::string("unsupported dtype descr ") + descr));
    EXPECT_TRUE(Contains(message, "expected '<f4' or '<f8'"));
  }
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("True", "(6,)"), six_floats)),
                       "unsupported dtype descr True"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("[('a', '<f4')]", "(6,)"), six_floats)),
                       "malformed header"));
}

TEST(NpyMalformed, FortranOrder) {
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(2, 3)", "True"), six_floats)),
                       "Fortran order (fortran_order: True) is not supported"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(2, 3)", "0"), six_floats)),
                       "malformed header"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(2, 3)", "'False'"), six_floats)),
                       "fortran_order must be True or False, got 'False'"));
}

TEST(NpyMalformed, ShapeRank) {
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "()"), bytes_of(iota_f(1)))),
                       "expected 1 to 3 dimensions, got 0 (shape [])"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(1, 2, 3, 1)"), six_floats)),
                       "expected 1 to 3 dimensions, got 4 (shape [1, 2, 3, 1])"));
}

TEST(NpyMalformed, ShapeValues) {
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(-1, 6)"), six_floats)),
                       "negative dimension in shape [-1, 6]"));
  EXPECT_TRUE(
      Contains(parse_error(npy_file(dict("'<f4'", "(6)"), six_floats)), "'(n)' is not a tuple"));
  EXPECT_TRUE(
      Contains(parse_error(npy_file(dict("'<f4'", "[2, 3]"), six_floats)), "malformed header"));
  EXPECT_TRUE(
      Contains(parse_error(npy_file(dict("'<f4'", "(2.0, 3)"), six_floats)), "malformed header"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "'(6,)'"), six_floats)),
                       "shape must be a tuple of integers"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(99999999999999999999,)"), six_floats)),
                       "integer too large"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(4611686018427387904, 4)"), six_floats)),
                       "element count overflows"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f8'", "(4611686018427387904,)"), six_floats)),
                       "byte size overflows"));
}

TEST(NpyMalformed, DictSyntaxAndKeys) {
  EXPECT_TRUE(
      Contains(parse_error(npy_file("{'descr': '<f4', 'fortran_order': False}", six_floats)),
               "header has no 'shape'"));
  EXPECT_TRUE(Contains(parse_error(npy_file("{'fortran_order': False, 'shape': (6,)}", six_floats)),
                       "header has no 'descr'"));
  EXPECT_TRUE(Contains(parse_error(npy_file("{'descr': '<f4', 'shape': (6,)}", six_floats)),
                       "header has no 'fortran_order'"));
  EXPECT_TRUE(Contains(
      parse_error(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': True}",
                           six_floats)),
      "unexpected key 'x'"));
  EXPECT_TRUE(Contains(
      parse_error(npy_file(
          "{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (6,)}", six_floats)),
      "duplicate key 'descr'"));
  EXPECT_TRUE(Contains(
      parse_error(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)", six_floats)),
      "malformed header"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(6,)") + "x", six_floats)),
                       "unexpected text after the closing '}'"));
  EXPECT_TRUE(Contains(parse_error(npy_file("{'descr: '<f4'}", six_floats)), "malformed header"));
  EXPECT_TRUE(Contains(parse_error(npy_file("", six_floats)), "malformed header"));
  EXPECT_TRUE(Contains(parse_error(npy_file(std::string("{'descr': '<f4',") + '\0' +
                                                " 'fortran_order': False, 'shape': (6,)}",
                                            six_floats)),
                       "malformed header"));
}

TEST(NpyMalformed, TruncatedOrTrailingData) {
  std::vector<unsigned char> cut = npy_file(dict("'<f4'", "(2, 3)"), six_floats);
  cut.resize(cut.size() - 5);
  EXPECT_TRUE(Contains(parse_error(cut),
                       "data truncated: expected 24 bytes of data for shape [2, 3] <f4, got 19"));
  // A huge shape in a tiny file: rejected against the file size, nothing allocated.
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f8'", "(1000000000, 1000)"), six_floats)),
                       "data truncated: expected 8000000000000 bytes"));
  std::vector<unsigned char> extra = npy_file(dict("'<f4'", "(2, 3)"), six_floats);
  extra.push_back(0);
  extra.push_back(0);
  EXPECT_TRUE(Contains(parse_error(extra),
                       "2 unexpected trailing bytes after the data (expected 24 bytes"));
}

// ---------------------------------------------------------------------------------------------
// read() and Array
// ---------------------------------------------------------------------------------------------

TEST(NpyRead, ErrorsNameThePath) {
  gpt2::test::TempDir dir;
  const std::string missing = dir.file("missing.npy");
  std::string message = error_of<FormatError>([&] { npy::read(missing); });
  EXPECT_TRUE(Contains(message, missing + ": cannot open: " + std::strerror(ENOENT)));

  message = error_of<FormatError>([&] { npy::read(dir.path().string()); });
  EXPECT_TRUE(Contains(message, "not a regular file"));

  const std::string cut = dir.file("cut.npy");
  std::vector<unsigned char> bytes = npy_file(dict("'<f4'", "(2, 3)"), six_floats);
  bytes.pop_back();
  gpt2::test::write_file(cut, bytes);
  message = error_of<FormatError>([&] { npy::read(cut); });
  EXPECT_TRUE(Contains(message, cut + ": data truncated: expected 24 bytes"));

  const std::string huge = dir.file("huge.npy");
  gpt2::test::write_file(huge, npy_file(dict("'<f4'", "(1000000000, 1000000)"), six_floats));
  EXPECT_TRUE(Contains(error_of<FormatError>([&] { npy::read(huge); }), "data truncated"));

  const std::string empty = dir.file("empty.npy");
  gpt2::test::write_file(empty, {});
  EXPECT_TRUE(
      Contains(error_of<FormatError>([&] { npy::read(empty); }), empty + ": not a .npy file"));
}

TEST(NpyArray, ToMatrixNeedsRank2) {
  const std::vector<unsigned char> file = npy_file(dict("'<f4'", "(1, 2, 3)"), six_floats);
  const npy::Array a = npy::parse(file.data(), file.size());
  const std::string message = error_of<ShapeError>([&] { a.to_matrix<float>(); });
  EXPECT_TRUE(Contains(message, "expected rank 2, got rank 3 (shape [1, 2, 3])"));
  EXPECT_EQ(a.to_vector<float>(), iota_f(6));
}

TEST(NpyArray, InconsistentArrayIsShapeError) {
  npy::Array a;
  a.dtype = npy::Dtype::F64;
  a.shape = {2, 2};
  a.bytes.resize(16);
  EXPECT_TRUE(
      Contains(error_of<ShapeError>([&] { a.to_vector<double>(); }), "needs 32 bytes, got 16"));
  EXPECT_THROW(a.to_matrix<double>(), ShapeError);
}

// ---------------------------------------------------------------------------------------------
// Atomic write
// ---------------------------------------------------------------------------------------------

TEST(NpyWrite, MissingDirectoryThrowsAndLeavesNothing) {
  gpt2::test::TempDir dir;
  const std::string path = dir.file("no/such/dir/a.npy");
  const std::vector<float> f = iota_f(3);
  const std::string message = error_of<FormatError>([&] { npy::write(path, f.data(), {3}); });
  EXPECT_TRUE(Contains(message, path + ": "));
  EXPECT_TRUE(Contains(message, std::strerror(ENOENT)));
  EXPECT_TRUE(dir.list().empty());
}

TEST(NpyWrite, ReplacesAnExistingFileAndLeavesNoTemporaries) {
  gpt2::test::TempDir dir;
  const std::string path = dir.file("a.npy");
  const std::vector<double> first = {1, 2}, second = {3, 4, 5, 6};
  npy::write(path, first.data(), {2});
  npy::write(path, second.data(), {2, 2});
  const npy::Array a = npy::read(path);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(a.to_vector<double>(), second);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.npy"});
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms(0644));
}

TEST(NpyWrite, FailedRenameRemovesTheTemporary) {
  gpt2::test::TempDir dir;
  const std::string target = dir.file("taken");
  std::filesystem::create_directory(target);
  std::filesystem::create_directory(
      dir.file("taken/child"));  // a non-empty directory: rename fails
  const std::vector<float> f = iota_f(3);
  const std::string message = error_of<FormatError>([&] { npy::write(target, f.data(), {3}); });
  EXPECT_TRUE(Contains(message, target + ": cannot rename the temporary file over it"));
  EXPECT_EQ(dir.list(), std::vector<std::string>{"taken"});
  EXPECT_TRUE(std::filesystem::is_directory(dir.file("taken/child")));
}

TEST(NpyWrite, BadShapesAreShapeErrors) {
  gpt2::test::TempDir dir;
  const std::vector<float> f = iota_f(16);
  const std::string path = dir.file("a.npy");
  EXPECT_TRUE(Contains(error_of<ShapeError>([&] { npy::write(path, f.data(), {}); }),
                       "expected 1 to 3 dimensions, got 0 (shape [])"));
  EXPECT_TRUE(Contains(error_of<ShapeError>([&] {
                         npy::write(path, f.data(), {2, 2, 2, 2});
                       }),
                       "got 4 (shape [2, 2, 2, 2])"));
  EXPECT_TRUE(Contains(error_of<ShapeError>([&] { npy::write(path, f.data(), {-1}); }),
                       "negative dimension"));
  EXPECT_TRUE(Contains(error_of<ShapeError>([&] { npy::write<float>(path, nullptr, {2}); }),
                       "null pointer"));
  npy::write<float>(path, nullptr, {0, 4});  // empty arrays need no data
  EXPECT_EQ(npy::read(path).numel(), 0);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.npy"});
}

}  // namespace
