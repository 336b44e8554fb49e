// Tests of gpt2/npy.hpp: round trips (from any row-major Eigen matrix), the exact bytes numpy.save
// writes, every malformed header the reader rejects, and the atomic writer: what it replaces
// (symbolic links followed, files that are not regular refused, permissions kept or from the
// umask), StagedFile and the all-or-nothing commit_all. When /usr/bin/python3 has numpy, files are also
// exchanged with numpy itself.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
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

// The permission bits of `path` (following symbolic links).
unsigned mode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    ADD_FAILURE() << "cannot stat " << path;
    return 0;
  }
  return static_cast<unsigned>(st.st_mode & 07777);
}

// Sets the process umask for the life of the guard (the tests run on one thread).
class UmaskGuard {
 public:
  explicit UmaskGuard(mode_t mask) : old_(::umask(mask)) {}
  UmaskGuard(const UmaskGuard&) = delete;
  UmaskGuard& operator=(const UmaskGuard&) = delete;
  ~UmaskGuard() { ::umask(old_); }

 private:
  mode_t old_;
};

bool is_symlink(const std::string& path) {
  return std::filesystem::is_symlink(std::filesystem::symlink_status(path));
}

std::vector<double> read_doubles(const std::string& path) {
  return npy::read(path).to_vector<double>();
}

// ---------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------

template <class T>
class NpyRoundTrip : public ::testing::Test {};
// The trailing comma passes an empty name generator: clang -Wpedantic rejects an omitted one.
TYPED_TEST_SUITE(NpyRoundTrip, gpt2::test::Scalars, );

// Every rank from 1 to npy::max_dims (a batch's attention probabilities are [B, n_head, T, T]),
// empty arrays included: values, dtype and shape survive; only 2-D arrays convert to a matrix.
TYPED_TEST(NpyRoundTrip, EveryRankAndEmpty) {
  using T = TypeParam;
  gpt2::test::TempDir dir;
  const std::vector<std::vector<std::int64_t>> shapes = {
      {5},          {2, 3},       {2, 3, 4},          {0, 3},          {1, 1, 1},
      {2, 3, 4, 5}, {1, 2, 1, 3}, {2, 0, 3, 3},       {2, 1, 2, 1, 3}, {1, 2, 1, 2, 1, 2, 1, 2}};
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
    if (shape.size() != 2) {
      EXPECT_THROW(a.template to_matrix<T>(), ShapeError);
      continue;
    }
    const gpt2::RowMatrix<T> m = a.template to_matrix<T>();
    ASSERT_EQ(m.rows(), shape[0]);
    ASSERT_EQ(m.cols(), shape[1]);
    for (Eigen::Index r = 0; r < m.rows(); ++r)
      for (Eigen::Index c = 0; c < m.cols(); ++c)
        EXPECT_EQ(m(r, c), values[std::size_t(r * m.cols() + c)]);
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

// A matrix written with a shape of any rank: the batch layout x [B * T, C] as [B, T, C].
TYPED_TEST(NpyRoundTrip, MatrixWithAShape) {
  using T = TypeParam;
  gpt2::test::TempDir dir;
  gpt2::RowMatrix<T> x(2 * 3, 4);  // B = 2, T = 3, C = 4
  for (Eigen::Index r = 0; r < x.rows(); ++r)
    for (Eigen::Index c = 0; c < x.cols(); ++c) x(r, c) = T(r * 10 + c) / T(4);
  npy::write(dir.file("x.npy"), x, {2, 3, 4});
  const npy::Array a = npy::read(dir.file("x.npy"));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3, 4}));
  EXPECT_EQ(a.template to_vector<T>(), std::vector<T>(x.data(), x.data() + x.size()));
  // The same bytes as writing the buffer with that shape.
  npy::write(dir.file("p.npy"), x.data(), {2, 3, 4});
  EXPECT_EQ(gpt2::test::read_file(dir.file("x.npy")), gpt2::test::read_file(dir.file("p.npy")));

  // A strided block and an expression are evaluated first; a scalar type is converted on request.
  const gpt2::RowMatrix<T> wide = gpt2::RowMatrix<T>::Random(6, 9);
  npy::write(dir.file("block.npy"), wide.middleCols(2, 4), {3, 2, 4});
  const gpt2::RowMatrix<T> block = wide.middleCols(2, 4);
  EXPECT_EQ(npy::read(dir.file("block.npy")).to_vector<T>(),
            std::vector<T>(block.data(), block.data() + block.size()));
  npy::write(dir.file("twice.npy"), x * T(2), {6, 4, 1});
  EXPECT_EQ(npy::read(dir.file("twice.npy")).shape, (std::vector<std::int64_t>{6, 4, 1}));
  EXPECT_EQ(npy::read(dir.file("twice.npy")).to_vector<T>()[5], x(1, 1) * T(2));
  npy::write<double>(dir.file("f8.npy"), x, {24});
  EXPECT_EQ(npy::read(dir.file("f8.npy")).dtype, npy::Dtype::F64);
  EXPECT_EQ(npy::read(dir.file("f8.npy")).to_vector<double>()[23], double(x(5, 3)));
}

TEST(NpyWriteErrors, MatrixAndShapeMustAgree) {
  gpt2::test::TempDir dir;
  const std::string path = dir.file("y.npy");
  const gpt2::RowMatrix<float> m = gpt2::RowMatrix<float>::Zero(5, 4);
  EXPECT_EQ(error_of<ShapeError>([&] { npy::write(path, m, {2, 3, 4}); }),
            "npy::write(" + path + "): shape [2, 3, 4] holds 24 values, the matrix [5, 4] has 20");
  EXPECT_EQ(error_of<ShapeError>([&] { npy::write(path, m, {}); }),
            "npy::write(" + path + "): expected 1 to 8 dimensions, got 0 (shape [])");
  EXPECT_TRUE(Contains(error_of<ShapeError>([&] { npy::write(path, m, {-4, -5}); }),
                       "negative dimension"));
  EXPECT_EQ(dir.list(), std::vector<std::string>{});  // nothing written
  npy::write(path, gpt2::RowMatrix<float>(0, 4), {2, 0, 4});  // empty is fine
  EXPECT_EQ(npy::read(path).shape, (std::vector<std::int64_t>{2, 0, 4}));
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
  npy::write(dir.file("p.npy"), f.data(), {1, 2, 3, 4});
  EXPECT_EQ(gpt2::test::read_file(dir.file("p.npy")),
            numpy_save_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3, 4), }",
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

  // 3-D from a matrix [B * T, C] and the shape {B, T, C}.
  gpt2::RowMatrix<float> x(2 * 3, 4);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = f[std::size_t(i)];
  npy::write(dir.file("batch.npy"), x, {2, 3, 4});
  EXPECT_EQ(run("/usr/bin/python3 -c \"import numpy as np, sys; a = np.load(sys.argv[1]); "
                "assert a.dtype == np.float32 and a.shape == (2, 3, 4), (a.dtype, a.shape); "
                "assert (a[1, 2] == np.arange(20, 24, dtype=np.float32) * 0.25 - 1).all()\" " +
                dir.file("batch.npy")),
            0);

  // 4-D, both ways: [B, n_head, T, T].
  npy::write(dir.file("ours4.npy"), f.data(), {1, 2, 3, 4});
  EXPECT_EQ(run("/usr/bin/python3 -c \"import numpy as np, sys; d = sys.argv[1]; "
                "a = np.load(d + '/ours4.npy'); "
                "assert a.dtype == np.float32 and a.shape == (1, 2, 3, 4), (a.dtype, a.shape); "
                "assert (a.ravel() == np.arange(24, dtype=np.float32) * 0.25 - 1).all(); "
                "np.save(d + '/theirs4.npy', np.arange(24, dtype=np.float64).reshape(2, 1, 3, 4) / 4)\" " +
                dir.path().string()),
            0);
  const npy::Array theirs = npy::read(dir.file("theirs4.npy"));
  EXPECT_EQ(theirs.dtype, npy::Dtype::F64);
  EXPECT_EQ(theirs.shape, (std::vector<std::int64_t>{2, 1, 3, 4}));
  const std::vector<double> v = theirs.to_vector<double>();
  ASSERT_EQ(v.size(), 24u);
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], double(i) / 4) << i;
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

// 1 to npy::max_dims (8) dimensions: a 0-D array (a numpy scalar) and 9 or more are refused.
TEST(NpyMalformed, ShapeRank) {
  EXPECT_EQ(npy::max_dims, 8u);
  EXPECT_EQ(parse_error(npy_file(dict("'<f4'", "()"), bytes_of(iota_f(1)))),
            "bad.npy: expected 1 to 8 dimensions, got 0 (shape [])");
  EXPECT_EQ(parse_error(npy_file(dict("'<f4'", "(1, 2, 3, 1, 1, 1, 1, 1, 1)"), six_floats)),
            "bad.npy: expected 1 to 8 dimensions, got 9 (shape [1, 2, 3, 1, 1, 1, 1, 1, 1])");
  // Refused by rank before the data size is looked at: no data at all.
  EXPECT_EQ(parse_error(npy_file(dict("'<f8'", "(2, 2, 2, 2, 2, 2, 2, 2, 2)"))),
            "bad.npy: expected 1 to 8 dimensions, got 9 (shape [2, 2, 2, 2, 2, 2, 2, 2, 2])");
  // As many dimensions as the 64 KiB header cap allows.
  std::string many = "(";
  for (int i = 0; i < 20000; ++i) many += "1, ";
  many += ")";
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", many), six_floats, 2)),
                       "bad.npy: expected 1 to 8 dimensions, got 20000 (shape [1, 1, "));
}

TEST(NpyMalformed, EightDimensionsAreAccepted) {
  const std::vector<unsigned char> file =
      npy_file(dict("'<f4'", "(1, 2, 1, 1, 3, 1, 1, 1)"), six_floats);
  const npy::Array a = npy::parse(file.data(), file.size());
  EXPECT_EQ(a.dtype, npy::Dtype::F32);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{1, 2, 1, 1, 3, 1, 1, 1}));
  EXPECT_EQ(a.to_vector<float>(), iota_f(6));
  // The data are still checked against an 8-D shape, both ways.
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(1, 2, 1, 1, 3, 1, 1, 2)"), six_floats)),
                       "data truncated: expected 48 bytes of data for shape "
                       "[1, 2, 1, 1, 3, 1, 1, 2] <f4, got 24"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(1, 1, 1, 1, 3, 1, 1, 1)"), six_floats)),
                       "12 unexpected trailing bytes after the data"));
  EXPECT_TRUE(Contains(parse_error(npy_file(dict("'<f4'", "(1, 1, 1, 1, -3, 1, 1, 1)"), six_floats)),
                       "negative dimension in shape [1, 1, 1, 1, -3, 1, 1, 1]"));
  EXPECT_TRUE(Contains(
      parse_error(npy_file(dict("'<f4'", "(65536, 65536, 65536, 65536, 1, 1, 1, 1)"), six_floats)),
      "element count overflows"));
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
  const UmaskGuard umask(022);
  const std::string path = dir.file("a.npy");
  const std::vector<double> first = {1, 2}, second = {3, 4, 5, 6};
  npy::write(path, first.data(), {2});
  npy::write(path, second.data(), {2, 2});
  const npy::Array a = npy::read(path);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(a.to_vector<double>(), second);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.npy"});
  EXPECT_EQ(mode_of(path), 0644u);
}

TEST(NpyWrite, DirectoryTargetIsRefusedAndLeavesNothing) {
  gpt2::test::TempDir dir;
  const std::string target = dir.file("taken");
  std::filesystem::create_directory(target);
  std::filesystem::create_directory(dir.file("taken/child"));
  const std::vector<float> f = iota_f(3);
  const std::string message = error_of<FormatError>([&] { npy::write(target, f.data(), {3}); });
  EXPECT_EQ(message, target + ": not a regular file (it is a directory)");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"taken"});
  EXPECT_EQ(dir.list("taken"), std::vector<std::string>{"child"});
}

TEST(NpyWrite, BadShapesAreShapeErrors) {
  gpt2::test::TempDir dir;
  const std::vector<float> f = iota_f(16);
  const std::string path = dir.file("a.npy");
  EXPECT_EQ(error_of<ShapeError>([&] { npy::write(path, f.data(), {}); }),
            "npy::write(" + path + "): expected 1 to 8 dimensions, got 0 (shape [])");
  EXPECT_EQ(error_of<ShapeError>([&] {
              npy::write(path, f.data(), {2, 2, 2, 2, 1, 1, 1, 1, 1});
            }),
            "npy::write(" + path +
                "): expected 1 to 8 dimensions, got 9 (shape [2, 2, 2, 2, 1, 1, 1, 1, 1])");
  EXPECT_TRUE(dir.list().empty());
  npy::write(path, f.data(), {2, 2, 2, 2, 1, 1, 1, 1});  // 8 dimensions are fine
  EXPECT_EQ(npy::read(path).shape, (std::vector<std::int64_t>{2, 2, 2, 2, 1, 1, 1, 1}));
  EXPECT_TRUE(Contains(error_of<ShapeError>([&] { npy::write(path, f.data(), {-1}); }),
                       "negative dimension"));
  EXPECT_TRUE(Contains(error_of<ShapeError>([&] { npy::write<float>(path, nullptr, {2}); }),
                       "null pointer"));
  npy::write<float>(path, nullptr, {0, 4});  // empty arrays need no data
  EXPECT_EQ(npy::read(path).numel(), 0);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.npy"});
}

// ---------------------------------------------------------------------------------------------
// What write() replaces: symbolic links, files that are not regular, permission bits
// ---------------------------------------------------------------------------------------------

TEST(NpyWriteTarget, SymlinkStaysAndTheFileItPointsToIsReplaced) {
  gpt2::test::TempDir dir;
  std::filesystem::create_directory(dir.file("real"));
  const std::vector<double> first = {1, 2}, second = {3, 4, 5}, third = {6};
  npy::write(dir.file("real/a.npy"), first.data(), {2});
  std::filesystem::create_symlink("real/a.npy", dir.file("link.npy"));  // relative to its dir
  npy::write(dir.file("link.npy"), second.data(), {3});
  EXPECT_TRUE(is_symlink(dir.file("link.npy")));
  EXPECT_EQ(std::filesystem::read_symlink(dir.file("link.npy")), "real/a.npy");
  EXPECT_EQ(read_doubles(dir.file("real/a.npy")), second);

  // A chain of links, one of them absolute.
  std::filesystem::create_symlink(dir.file("link.npy"), dir.file("chain.npy"));
  npy::write(dir.file("chain.npy"), third.data(), {1});
  EXPECT_TRUE(is_symlink(dir.file("chain.npy")));
  EXPECT_TRUE(is_symlink(dir.file("link.npy")));
  EXPECT_EQ(read_doubles(dir.file("real/a.npy")), third);

  // A dangling link: the file it names is created.
  std::filesystem::create_symlink("real/new.npy", dir.file("dangling.npy"));
  npy::write(dir.file("dangling.npy"), first.data(), {2});
  EXPECT_TRUE(is_symlink(dir.file("dangling.npy")));
  EXPECT_EQ(read_doubles(dir.file("real/new.npy")), first);

  EXPECT_EQ(dir.list(), (std::vector<std::string>{"chain.npy", "dangling.npy", "link.npy", "real"}));
  EXPECT_EQ(dir.list("real"), (std::vector<std::string>{"a.npy", "new.npy"}));
}

TEST(NpyWriteTarget, SymlinkLoopIsAnError) {
  gpt2::test::TempDir dir;
  std::filesystem::create_symlink("b", dir.file("a"));
  std::filesystem::create_symlink("a", dir.file("b"));
  const std::vector<float> f = iota_f(2);
  EXPECT_TRUE(Contains(error_of<FormatError>([&] { npy::write(dir.file("a"), f.data(), {2}); }),
                       dir.file("a") + ": cannot follow the symbolic link: " + std::strerror(ELOOP)));
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"a", "b"}));
}

TEST(NpyWriteTarget, FilesThatAreNotRegularAreRefusedWithoutBlocking) {
  gpt2::test::TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0644), 0);
  std::filesystem::create_directory(dir.file("dir"));
  std::filesystem::create_symlink("fifo", dir.file("fifolink"));
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock_path = dir.file("sock");
  ASSERT_LT(sock_path.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, sock_path.c_str(), sock_path.size() + 1);
  ASSERT_EQ(::bind(sock, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  const std::vector<std::string> before = dir.list();

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"fifo", "(it is a FIFO)"},
      {"dir", "(it is a directory)"},
      {"sock", "(it is a socket)"},
      {"fifolink", "(it links to " + dir.file("fifo") + ", a FIFO)"}};
  const std::vector<float> f = iota_f(3);
  for (const auto& [name, kind] : cases) {
    SCOPED_TRACE(name);
    const std::string path = dir.file(name);
    // Opening the FIFO for writing would block (no reader): run the write where a hang shows.
    auto result = std::async(std::launch::async, [&] {
      return error_of<FormatError>([&] { npy::write(path, f.data(), {3}); });
    });
    if (result.wait_for(std::chrono::seconds(20)) == std::future_status::timeout) {
      ADD_FAILURE() << "npy::write blocked on " << path;
      const int reader = ::open(dir.file("fifo").c_str(), O_RDONLY | O_NONBLOCK);  // unblock it
      result.wait();
      ::close(reader);
      continue;
    }
    EXPECT_EQ(result.get(), path + ": not a regular file " + kind);
  }
  ::close(sock);
  EXPECT_EQ(dir.list(), before);
  struct stat st {};
  ASSERT_EQ(::lstat(dir.file("fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_EQ(::lstat(dir.file("sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_TRUE(is_symlink(dir.file("fifolink")));
}

TEST(NpyWriteTarget, ExistingPermissionsAreKept) {
  gpt2::test::TempDir dir;
  const UmaskGuard umask(022);
  const std::vector<double> v = {1, 2};
  for (const unsigned mode : {0600u, 0640u, 0755u, 0444u}) {
    SCOPED_TRACE(mode);
    const std::string path = dir.file("a.npy");
    gpt2::test::write_text(path, "old");
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    npy::write(path, v.data(), {2});
    EXPECT_EQ(mode_of(path), mode);
    EXPECT_EQ(read_doubles(path), v);
  }
  // Through a symbolic link: the mode of the file it points to.
  std::filesystem::create_symlink("a.npy", dir.file("link.npy"));
  ASSERT_EQ(::chmod(dir.file("a.npy").c_str(), 0600), 0);
  npy::write(dir.file("link.npy"), v.data(), {2});
  EXPECT_EQ(mode_of(dir.file("a.npy")), 0600u);
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"a.npy", "link.npy"}));
}

TEST(NpyWriteTarget, NewFilesFollowTheUmask) {
  gpt2::test::TempDir dir;
  const std::vector<double> v = {1, 2};
  for (const auto& [mask, expected] :
       std::vector<std::pair<mode_t, unsigned>>{{022, 0644}, {027, 0640}, {077, 0600}, {002, 0664}}) {
    SCOPED_TRACE(mask);
    const UmaskGuard umask(mask);
    const std::string path = dir.file("new" + std::to_string(mask) + ".npy");
    npy::write(path, v.data(), {2});
    EXPECT_EQ(mode_of(path), expected);
  }
  EXPECT_EQ(dir.list().size(), 4u);
}

// ---------------------------------------------------------------------------------------------
// Any row-major Eigen matrix
// ---------------------------------------------------------------------------------------------

TYPED_TEST(NpyRoundTrip, MapsRefsBlocksAndExpressions) {
  using T = TypeParam;
  using Matrix = gpt2::RowMatrix<T>;
  gpt2::test::TempDir dir;
  Matrix m(4, 5);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = T(i) / T(4) - T(1);
  const auto written = [&](const auto& expression) {
    const std::string path = dir.file("m.npy");
    npy::write(path, expression);
    const npy::Array a = npy::read(path);
    EXPECT_EQ(a.dtype, npy::dtype_of<T>());
    return a.template to_matrix<T>();
  };
  EXPECT_EQ(written(Eigen::Map<const Matrix>(m.data(), 4, 5)), m);
  EXPECT_EQ(written(Eigen::Map<Matrix>(m.data(), 2, 10)),
            Eigen::Map<const Matrix>(m.data(), 2, 10));
  EXPECT_EQ(written(Eigen::Ref<const Matrix>(m)), m);
  EXPECT_EQ(written(m.middleRows(1, 2)), Matrix(m.middleRows(1, 2)));  // contiguous rows
  EXPECT_EQ(written(m.block(1, 1, 2, 3)), Matrix(m.block(1, 1, 2, 3)));  // row stride 5
  const Eigen::Ref<const Matrix, 0, Eigen::OuterStride<>> strided = m.block(0, 2, 4, 2);
  EXPECT_EQ(written(strided), Matrix(m.block(0, 2, 4, 2)));
  EXPECT_EQ(written(m * T(2)), Matrix(m * T(2)));  // an expression
  EXPECT_EQ(written(m.row(2)), Matrix(m.row(2)));
  EXPECT_EQ(written(m.col(3)), Matrix(m.col(3)));  // a column: stride 5
  const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> col_major = m;
  EXPECT_EQ(written(col_major.transpose()), Matrix(m.transpose()));
  EXPECT_EQ(written(Matrix(0, 5)).rows(), 0);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"m.npy"});

  // Another scalar type, converted explicitly.
  npy::write<double>(dir.file("d.npy"), m);
  EXPECT_EQ(npy::read(dir.file("d.npy")).dtype, npy::Dtype::F64);
  EXPECT_EQ(npy::read(dir.file("d.npy")).to_matrix<double>(), m.template cast<double>());
}

// ---------------------------------------------------------------------------------------------
// StagedFile and commit_all
// ---------------------------------------------------------------------------------------------

TEST(NpyStagedFile, StageCommitAndDiscard) {
  gpt2::test::TempDir dir;
  const std::string path = dir.file("a.npy");
  gpt2::test::write_text(path, "old");
  const std::vector<double> v = {1, 2, 3};
  {
    npy::StagedFile staged = npy::StagedFile::stage(path, v.data(), {3});
    EXPECT_TRUE(staged.staged());
    EXPECT_EQ(staged.path(), path);
    EXPECT_EQ(staged.target(), path);
    EXPECT_EQ(staged.temporary().rfind(path + ".tmp-", 0), 0u) << staged.temporary();
    EXPECT_EQ(gpt2::test::read_text(path), "old");  // not committed yet
    EXPECT_EQ(read_doubles(staged.temporary()), v);
    EXPECT_EQ(dir.list().size(), 2u);
  }  // destroyed uncommitted: the temporary goes
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.npy"});
  EXPECT_EQ(gpt2::test::read_text(path), "old");

  npy::StagedFile discarded = npy::StagedFile::stage(path, v.data(), {3});
  discarded.discard();
  EXPECT_FALSE(discarded.staged());
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.npy"});
  EXPECT_TRUE(Contains(error_of<FormatError>([&] { discarded.commit(); }), "nothing staged"));

  npy::StagedFile first = npy::StagedFile::stage(path, v.data(), {3});
  npy::StagedFile moved = std::move(first);
  EXPECT_FALSE(first.staged());  // NOLINT(bugprone-use-after-move): moved-from is empty
  moved.commit();
  EXPECT_FALSE(moved.staged());
  EXPECT_EQ(read_doubles(path), v);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.npy"});
  EXPECT_TRUE(Contains(error_of<FormatError>([&] { moved.commit(); }), "nothing staged"));
}

TEST(NpyStagedFile, TemporaryIsBesideTheFileALinkPointsTo) {
  gpt2::test::TempDir dir;
  std::filesystem::create_directory(dir.file("real"));
  std::filesystem::create_symlink("real/a.npy", dir.file("link.npy"));
  const std::vector<double> v = {1};
  npy::StagedFile staged = npy::StagedFile::stage(dir.file("link.npy"), v.data(), {1});
  EXPECT_EQ(staged.target(), dir.file("real/a.npy"));
  EXPECT_EQ(staged.temporary().rfind(dir.file("real/a.npy.tmp-"), 0), 0u) << staged.temporary();
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"link.npy", "real"}));
  staged.commit();
  EXPECT_EQ(dir.list("real"), std::vector<std::string>{"a.npy"});
}

TEST(NpyStagedFile, CommitChecksTheTargetAgain) {
  gpt2::test::TempDir dir;
  const std::string path = dir.file("a.npy");
  const std::vector<double> v = {1};
  npy::StagedFile staged = npy::StagedFile::stage(path, v.data(), {1});
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);  // appears after staging
  EXPECT_EQ(error_of<FormatError>([&] { staged.commit(); }),
            path + ": not a regular file (it is a FIFO)");
  EXPECT_FALSE(staged.staged());
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.npy"});
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

// Stages `values` [n] for each path.
std::vector<npy::StagedFile> stage_all(const std::vector<std::string>& paths,
                                       const std::vector<double>& values) {
  std::vector<npy::StagedFile> files;
  for (const std::string& p : paths)
    files.push_back(npy::StagedFile::stage(p, values.data(), {std::int64_t(values.size())}));
  return files;
}

TEST(NpyCommitAll, CommitsEveryFile) {
  gpt2::test::TempDir dir;
  gpt2::test::write_text(dir.file("a.npy"), "old a");
  ASSERT_EQ(::chmod(dir.file("a.npy").c_str(), 0600), 0);
  const std::vector<double> v = {1, 2};
  std::vector<npy::StagedFile> files =
      stage_all({dir.file("a.npy"), dir.file("b.npy"), dir.file("c.npy")}, v);
  npy::commit_all(files);
  for (const char* name : {"a.npy", "b.npy", "c.npy"}) EXPECT_EQ(read_doubles(dir.file(name)), v);
  EXPECT_EQ(mode_of(dir.file("a.npy")), 0600u);
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"a.npy", "b.npy", "c.npy"}));  // no backups
  for (const npy::StagedFile& f : files) EXPECT_FALSE(f.staged());
}

TEST(NpyCommitAll, FailedLaterCommitRestoresTheEarlierTargets) {
  gpt2::test::TempDir dir;
  gpt2::test::write_text(dir.file("a.npy"), "old a");
  ASSERT_EQ(::chmod(dir.file("a.npy").c_str(), 0640), 0);
  struct stat before {};
  ASSERT_EQ(::stat(dir.file("a.npy").c_str(), &before), 0);
  gpt2::test::write_text(dir.file("c.npy"), "old c");
  const std::vector<double> v = {1, 2};
  // a.npy exists, n.npy is new, c.npy exists and fails: its temporary vanishes after staging.
  std::vector<npy::StagedFile> files =
      stage_all({dir.file("a.npy"), dir.file("n.npy"), dir.file("c.npy")}, v);
  ASSERT_EQ(::unlink(files[2].temporary().c_str()), 0);
  const std::string message = error_of<FormatError>([&] { npy::commit_all(files); });
  EXPECT_EQ(message, dir.file("c.npy") + ": cannot rename the temporary file over it: " +
                         std::strerror(ENOENT) + " (rolled back: " + dir.file("n.npy") + ", " +
                         dir.file("a.npy") + ")");
  EXPECT_EQ(gpt2::test::read_text(dir.file("a.npy")), "old a");
  EXPECT_EQ(gpt2::test::read_text(dir.file("c.npy")), "old c");
  struct stat after {};
  ASSERT_EQ(::stat(dir.file("a.npy").c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);  // the very file, restored from its hard link
  EXPECT_EQ(after.st_mode & 07777, 0640u);
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"a.npy", "c.npy"}));  // no n.npy, no leftovers
  for (const npy::StagedFile& f : files) EXPECT_FALSE(f.staged());
}

TEST(NpyCommitAll, RefusesBeforeCommittingAnything) {
  gpt2::test::TempDir dir;
  gpt2::test::write_text(dir.file("a.npy"), "old a");
  const std::vector<double> v = {1, 2};
  std::vector<npy::StagedFile> files = stage_all({dir.file("a.npy"), dir.file("b.npy")}, v);
  ASSERT_EQ(::mkfifo(dir.file("b.npy").c_str(), 0644), 0);
  EXPECT_EQ(error_of<FormatError>([&] { npy::commit_all(files); }),
            dir.file("b.npy") + ": not a regular file (it is a FIFO)");
  EXPECT_EQ(gpt2::test::read_text(dir.file("a.npy")), "old a");
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"a.npy", "b.npy"}));

  // The same file twice, under two names.
  std::filesystem::create_symlink("a.npy", dir.file("link.npy"));
  files = stage_all({dir.file("a.npy"), dir.path_string() + "/./link.npy"}, v);
  EXPECT_TRUE(Contains(error_of<FormatError>([&] { npy::commit_all(files); }),
                       "link.npy: names the same file as " + dir.file("a.npy")));
  EXPECT_EQ(gpt2::test::read_text(dir.file("a.npy")), "old a");
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"a.npy", "b.npy", "link.npy"}));
}

TEST(NpyCommitAll, BackupsKeepTheOldFile) {
  gpt2::test::TempDir dir;
  const std::string path = dir.file("a.npy");
  gpt2::test::write_text(path, "old content");
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);

  const std::string link = gpt2::detail::make_backup(path, path, 0640);  // a hard link
  EXPECT_EQ(link.rfind(path + ".bak-", 0), 0u) << link;
  struct stat linked {};
  ASSERT_EQ(::stat(link.c_str(), &linked), 0);
  EXPECT_EQ(linked.st_ino, st.st_ino);

  const std::string copy = gpt2::detail::copy_backup(path, path, 0640);  // where links fail
  EXPECT_EQ(copy.rfind(path + ".bak-", 0), 0u) << copy;
  EXPECT_EQ(gpt2::test::read_text(copy), "old content");
  EXPECT_EQ(mode_of(copy), 0640u);
  struct stat copied {};
  ASSERT_EQ(::stat(copy.c_str(), &copied), 0);
  EXPECT_NE(copied.st_ino, st.st_ino);
  EXPECT_EQ(dir.list().size(), 3u);

  EXPECT_TRUE(Contains(error_of<FormatError>([&] {
                         gpt2::detail::copy_backup(dir.file("x"), dir.file("missing"), 0600);
                       }),
                       dir.file("x") + ": cannot back up its previous content: cannot open: "));
  EXPECT_EQ(dir.list().size(), 3u);
}

}  // namespace
