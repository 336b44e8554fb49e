// gpt2::npy: read and write NumPy .npy files holding activations: float32 or float64,
// little-endian, C order, 1 to 8 dimensions (npy::max_dims; e.g. x[T, C], a batch x[B, T, C]
// written from its [B * T, C] matrix with write(path, x, {B, T, C}), a per-head
// att[n_head, T, T] or a batch's probabilities [B, n_head, T, T]). numpy allows more (32, and 64
// since numpy 2.0); the bound keeps what a hostile header can ask for small, and the writer keeps
// to it as well, so every file written here can be read here.
//
// File layout (numpy.lib.format):
//   "\x93NUMPY" major minor   6 + 2 bytes; versions 1.0 (2-byte header length), 2.0 and 3.0
//   (4-byte) header length             little-endian u16 (1.0) or u32 (2.0, 3.0) header a Python
//   dict literal, padded with spaces, ending in '\n':
//                             {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
//   data                      numel * itemsize bytes, nothing after it
//
// The reader checks every field and sizes before allocating anything; each problem is a
// gpt2::FormatError naming the file and the problem. The writer produces exactly what numpy.save
// writes (version 1.0, header padded to 64 bytes) and replaces its target atomically:
//
//   StagedFile::stage(path, ...)  writes the whole file to "<target>.tmp-XXXXXX" beside the real
//                                 target (a symlink at `path` is followed: the link stays, the file
//                                 it points to is replaced); refuses a target that exists and is
//                                 not a regular file (directory, FIFO, device, socket)
//   StagedFile::commit()          renames the temporary over the target
//   commit_all(files)             commits several staged files all or nothing
//   write(path, ...)              stage + commit
//
// An existing target keeps its permission bits; a new file gets 0666 & ~umask, like open(2).
// Ownership, ACLs and extended attributes of an existing target are not carried over, and hard
// links to it keep the old content (the target is a new inode).
//
// Requires a little-endian host and POSIX (mkstemp, rename, link).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt2/detail/io_util.hpp"
#include "gpt2/detail/npy_array.hpp"        // Dtype, Array
#include "gpt2/detail/npy_dict_parser.hpp"  // the header's dict literal
#include "gpt2/detail/npy_header.hpp"       // header parsing and encoding
#include "gpt2/detail/staged_file.hpp"      // atomic output: temporary, commit, commit_all
#include "gpt2/error.hpp"
#include "gpt2/types.hpp"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gpt2/npy.hpp: only little-endian hosts are supported"
#endif

namespace gpt2::npy {

namespace detail {

// True when the row-major (or vector) direct-access matrix `m` lies in memory in C order without
// gaps: what a .npy file's data section is.
template <class Derived>
bool is_contiguous(const Eigen::MatrixBase<Derived>& m) {
  const Derived& d = m.derived();
  return d.size() <= 1 ||
         (d.innerStride() == 1 && (d.outerSize() <= 1 || d.outerStride() == d.innerSize()));
}

}  // namespace detail

// Parses the n bytes at `bytes` (not kept: the data are copied into the Array). `label` names the
// buffer in error messages. Throws FormatError naming the label and the problem.
inline Array parse(const unsigned char* bytes, std::size_t n,
                   const std::string& label = "<memory>") {
  const detail::Header h = detail::parse_header(bytes, n, n, label);
  Array a;
  a.dtype = h.dtype;
  a.shape = h.shape;
  a.bytes.assign(bytes + h.data_offset, bytes + h.data_offset + h.data_bytes);
  return a;
}

// Reads the .npy file at `path` into an owning Array. Throws FormatError naming the path and the
// problem (strerror for I/O errors). Only the header (at most 64 KiB) is read before the data size
// has been checked against the file size.
inline Array read(const std::string& path) {
  const gpt2::detail::FdCloser fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw detail::error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw detail::error(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw detail::error(path, "cannot read: not a regular file");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  std::vector<unsigned char> prefix(static_cast<std::size_t>(
      std::min<std::uint64_t>(file_size, detail::max_preamble_bytes + detail::max_header_bytes)));
  if (!gpt2::detail::read_all(fd.get(), prefix.data(), prefix.size(), 0))
    throw detail::error(path, std::string("cannot read: ") + std::strerror(errno));
  const detail::Header h = detail::parse_header(prefix.data(), prefix.size(), file_size, path);
  Array a;
  a.dtype = h.dtype;
  a.shape = h.shape;
  a.bytes.resize(h.data_bytes);  // checked against the file size by parse_header
  if (!gpt2::detail::read_all(fd.get(), a.bytes.data(), a.bytes.size(), h.data_offset))
    throw detail::error(path, std::string("cannot read: ") + std::strerror(errno));
  return a;
}

// A complete .npy file written to a temporary beside its target but not yet in place: stage()
// writes it, commit() renames it over the target, and the destructor (or discard()) removes it if
// it was never committed. Move-only.
//
//   auto y = npy::StagedFile::stage("y.npy", y_matrix);    // may throw; "y.npy" is untouched
//   y.commit();                                           // "y.npy" now holds y_matrix
//
// The target is `path`, or, when `path` is a symbolic link (a chain of them), the file the links
// lead to (created if missing): the links stay and keep pointing at the new file. A target that
// exists must be a regular file: a directory, FIFO, device or socket is refused (FormatError
// "<path>: not a regular file (it is a FIFO)") and never opened. The new file gets the existing
// target's permission bits (st_mode & 07777), or 0666 & ~umask for a new one.
class StagedFile {
 public:
  // Stages the numel(shape) values at `data` (C order; caller-owned, only read, not kept) as a
  // version 1.0 .npy file of dtype '<f4' (float) or '<f8' (double), the bytes numpy.save writes.
  // Throws ShapeError for a shape that is not 1 to max_dims (8) non-negative dimensions or whose
  // byte size overflows (or null data for a non-empty one), FormatError naming `path` for a target
  // that is not a regular file and for I/O errors (strerror); nothing is left behind then.
  template <class T>
  static StagedFile stage(const std::string& path, const T* data,
                          const std::vector<std::int64_t>& shape) {
    constexpr Dtype dtype = dtype_of<T>();
    std::size_t n = 0;
    const std::string shape_problem = detail::data_bytes(shape, dtype, n);
    if (!shape_problem.empty()) throw ShapeError("npy::write(" + path + "): " + shape_problem);
    if (data == nullptr && n > 0)
      throw ShapeError("npy::write(" + path + "): expected data, got a null pointer");
    return stage_bytes(path, detail::encode_header(dtype, shape), data, n);
  }

  // Stages the matrix m [rows, cols] as a 2-D array of T (default: m's scalar type; float or
  // double): stage<T>(path, m, {rows, cols}).
  template <class T = void, class Derived>
  static StagedFile stage(const std::string& path, const Eigen::MatrixBase<Derived>& m) {
    return stage<T>(path, m, {static_cast<std::int64_t>(m.rows()),
                              static_cast<std::int64_t>(m.cols())});
  }

  // Stages the values of the matrix m, in C (row) order, as an array of `shape` (1 to 8
  // dimensions) of T (default: m's scalar type). numel(shape) must equal m.size(): a padded batch
  // x [B * T, C] written as shape {B, T, C}, probabilities [n_head * T, T] as {n_head, T, T},
  // [B * n_head * T, T] as {B, n_head, T, T}. m must be row-major (or a vector): a Matrix, Map,
  // Ref, Block or expression. Its data are written in place when they are contiguous (stride 1,
  // rows back to back) and of type T; anything else (a Ref or Block with a row stride, an
  // expression, another scalar type) is first evaluated explicitly into a RowMatrix<T>. Throws
  // ShapeError "npy::write(<path>): shape [2, 3, 4] holds 24 values, the matrix [5, 4] has 20"
  // when the sizes differ, otherwise as stage(path, data, shape).
  template <class T = void, class Derived>
  static StagedFile stage(const std::string& path, const Eigen::MatrixBase<Derived>& m,
                          const std::vector<std::int64_t>& shape) {
    using Scalar = std::conditional_t<std::is_void<T>::value, typename Derived::Scalar, T>;
    static_assert(Derived::IsRowMajor || Derived::RowsAtCompileTime == 1 ||
                      Derived::ColsAtCompileTime == 1,
                  "gpt2::npy: the matrix must be row-major (C order); convert a column-major one "
                  "explicitly, e.g. gpt2::RowMatrix<T>(m)");
    std::size_t n_bytes = 0;
    const std::string shape_problem = detail::data_bytes(shape, dtype_of<Scalar>(), n_bytes);
    if (!shape_problem.empty()) throw ShapeError("npy::write(" + path + "): " + shape_problem);
    const std::size_t numel = n_bytes / sizeof(Scalar);
    if (numel != static_cast<std::size_t>(m.size()))
      throw ShapeError("npy::write(" + path + "): shape " + gpt2::detail::shape_string(shape) +
                       " holds " + std::to_string(numel) + " values, the matrix " +
                       gpt2::detail::shape_string({static_cast<std::int64_t>(m.rows()),
                                                   static_cast<std::int64_t>(m.cols())}) +
                       " has " + std::to_string(m.size()));
    if constexpr (std::is_same<Scalar, typename Derived::Scalar>::value &&
                  (static_cast<unsigned>(Derived::Flags) & Eigen::DirectAccessBit) != 0) {
      if (detail::is_contiguous(m)) return stage<Scalar>(path, m.derived().data(), shape);
    }
    const RowMatrix<Scalar> copy = m.template cast<Scalar>();
    return stage<Scalar>(path, copy.data(), shape);
  }

  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  StagedFile(StagedFile&&) noexcept = default;
  StagedFile& operator=(StagedFile&&) noexcept = default;
  ~StagedFile() = default;  // removes the temporary if it was never committed

  // The path given to stage(); it names the file in error messages.
  const std::string& path() const { return file_.path(); }

  // The file commit() replaces: path(), or the file its symbolic links lead to.
  const std::string& target() const { return file_.target(); }

  // The temporary "<target>.tmp-XXXXXX"; empty once committed or discarded.
  const std::string& temporary() const { return file_.temporary(); }

  // True until commit() or discard().
  bool staged() const { return file_.staged(); }

  // Checks the target again (it must still be a regular file or nothing) and renames the temporary
  // over it. On failure the temporary is removed, the target is untouched and FormatError names
  // path() and the problem. Throws FormatError if nothing is staged.
  void commit() { file_.commit("npy::StagedFile::commit"); }

  // Removes the temporary, if any; the target is untouched.
  void discard() noexcept { file_.discard(); }

 private:
  explicit StagedFile(gpt2::detail::StagedFile file) : file_(std::move(file)) {}

  // Writes header + data to a new temporary beside the (resolved and checked) target.
  static StagedFile stage_bytes(const std::string& path, const std::string& header,
                                const void* data, std::size_t n) {
    return StagedFile(
        gpt2::detail::StagedFile::stage(path, {{header.data(), header.size()}, {data, n}}));
  }

  gpt2::detail::StagedFile file_;
};

// Commits every staged file in `files` or none of them: afterwards either each target holds its
// new file, or each target is as it was before (a target that did not exist does not exist).
//
//   1. check: every file is staged, every target is still a regular file or nothing, and no two
//      targets are the same file; otherwise nothing is committed.
//   2. commit in order. Before a target that exists is replaced (all but the last), a backup is
//      kept under a second name ("<target>.bak-<pid>-<n>", a hard link, or a copy where links are
//      impossible). If a commit still fails (the file system changed under us), the targets
//      committed before it are restored from their backups (or removed if they were new).
//   3. the backups are removed.
//
// Every temporary and backup is removed on success and on failure (unless restoring a target
// itself fails: then the message says where its previous content is). Throws FormatError naming
// the file that failed and the problem, plus which files were rolled back, on one line.
inline void commit_all(std::vector<StagedFile>& files) {
  gpt2::detail::commit_all(files, "npy::commit_all");
}

// Writes the numel(shape) values at `data` (C order) to `path` as a version 1.0 .npy file:
// StagedFile::stage(path, data, shape).commit(). On failure nothing is left behind and an existing
// target is untouched.
template <class T>
void write(const std::string& path, const T* data, const std::vector<std::int64_t>& shape) {
  StagedFile::stage<T>(path, data, shape).commit();
}

// Writes the row-major matrix m [rows, cols] as a 2-D array of T (default: m's scalar type):
// StagedFile::stage<T>(path, m).commit().
template <class T = void, class Derived>
void write(const std::string& path, const Eigen::MatrixBase<Derived>& m) {
  StagedFile::stage<T>(path, m).commit();
}

// Writes the values of the row-major matrix m as an array of `shape` (numel(shape) == m.size()),
// e.g. a padded batch's output y [B * T, C] as [B, T, C]:
//   npy::write("y.npy", y, {B, T, C});
// StagedFile::stage<T>(path, m, shape).commit(). Throws ShapeError when the sizes differ.
template <class T = void, class Derived>
void write(const std::string& path, const Eigen::MatrixBase<Derived>& m,
           const std::vector<std::int64_t>& shape) {
  StagedFile::stage<T>(path, m, shape).commit();
}

}  // namespace gpt2::npy
