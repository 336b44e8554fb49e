// Atomic output: a file written to a temporary beside its real target, then renamed over it
// (StagedFile), and several such files committed all or nothing, with backups of the targets they
// replace and rollback on failure (commit_all). The checks on a target (it must be a regular file
// or nothing; never opened) and the backups are here too. The machinery under npy::StagedFile and
// npy::commit_all; not part of the public API.
//
// Requires POSIX (mkstemp, rename, link).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "gpt2/detail/io_util.hpp"
#include "gpt2/error.hpp"

namespace gpt2::detail {
// "a directory", "a FIFO", ...: what a file that is not a regular file is.
inline std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "of an unknown type";
}

// What is at an output target: nothing, or a regular file with these permission bits.
struct TargetState {
  bool exists = false;
  mode_t mode = 0;  // st_mode & 07777 when it exists
};

// lstat(target) (`target` is `path` with its symbolic links followed). Throws FormatError
// "<path>: not a regular file (it is a FIFO)" for anything but a regular file or nothing. Never
// opens the target, so a FIFO cannot block and a device is never touched.
inline TargetState check_target(const std::string& path, const std::string& target) {
  struct stat st {};
  if (::lstat(target.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    throw file_error(path, std::string("cannot stat: ") + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    const std::string kind = file_kind(st.st_mode);
    throw file_error(
        path, "not a regular file (" +
                  (target == path ? "it is " + kind : "it links to " + target + ", " + kind) + ")");
  }
  return {true, static_cast<mode_t>(st.st_mode & 07777)};
}

// "<pid>-<n>", n counting up within the process: part of a fresh file name.
inline std::string unique_suffix() {
  static std::atomic<unsigned long> counter{0};
  return std::to_string(static_cast<long>(::getpid())) + "-" + std::to_string(counter++);
}

// Copies the regular file `target` to a new "<target>.bak-XXXXXX" with permission bits `mode`;
// returns its name. Throws FormatError naming `path` (nothing is left behind).
inline std::string copy_backup(const std::string& path, const std::string& target, mode_t mode) {
  const auto fail = [&](const std::string& what, int err) {
    return file_error(path,
                      "cannot back up its previous content: " + what + ": " + std::strerror(err));
  };
  FdCloser in(::open(target.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (in.get() < 0) throw fail("cannot open", errno);
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) throw fail("cannot stat", errno);
  if (!S_ISREG(st.st_mode)) throw fail("not a regular file", EINVAL);
  std::string name = target + ".bak-XXXXXX";
  FdCloser out(::mkstemp(name.data()));
  if (out.get() < 0) throw fail("cannot create a file beside it", errno);
  const auto remove_and_throw = [&](const char* what) {
    const int err = errno;
    out.reset();
    ::unlink(name.c_str());
    throw fail(what, err);
  };
  if (::fchmod(out.get(), mode) != 0) remove_and_throw("cannot set the permissions of the copy");
  std::vector<unsigned char> buffer(1 << 16);
  for (;;) {
    const ssize_t r = ::read(in.get(), buffer.data(), buffer.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) remove_and_throw("cannot read");
    if (r == 0) break;
    if (!write_all(out.get(), buffer.data(), static_cast<std::size_t>(r)))
      remove_and_throw("cannot write the copy");
  }
  if (out.reset() != 0) remove_and_throw("cannot write the copy (close failed)");
  return name;
}

// A second name "<target>.bak-<pid>-<n>" for the regular file `target` (a hard link, so it keeps
// the very inode: content, mode, owner), or, where hard links are not possible, a copy. Returns
// the backup's name. Throws FormatError naming `path`.
inline std::string make_backup(const std::string& path, const std::string& target, mode_t mode) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string name = target + ".bak-" + unique_suffix();
    if (::link(target.c_str(), name.c_str()) == 0) return name;
    if (errno != EEXIST) break;
  }
  return copy_backup(path, target, mode);
}

// A complete file written to a temporary beside its target but not yet in place: stage() writes
// it, commit() renames it over the target, and the destructor (or discard()) removes it if it was
// never committed. Move-only. npy::StagedFile is the .npy layer over it; the rules for the target
// (symbolic links followed, a target that is not a regular file refused, permission bits carried
// over) are described there.
class StagedFile {
 public:
  // Bytes written to the file, in order.
  struct Part {
    const void* data;
    std::size_t size;
  };

  // Resolves and checks the target, then writes `parts` back to back to a new temporary beside it.
  // Throws FormatError naming `path` for a target that is not a regular file and for I/O errors
  // (strerror); nothing is left behind then.
  static StagedFile stage(const std::string& path, std::initializer_list<Part> parts) {
    StagedFile f;
    f.path_ = path;
    if (!resolve_final_symlinks(path, f.target_))
      throw file_error(path,
                       std::string("cannot follow the symbolic link: ") + std::strerror(errno));
    const TargetState state = check_target(path, f.target_);
    const mode_t mode = state.exists ? state.mode : (0666 & ~process_umask());
    std::string tmp = f.target_ + ".tmp-XXXXXX";
    FdCloser fd(::mkstemp(tmp.data()));
    if (fd.get() < 0)
      throw file_error(path, "cannot create a temporary file beside " +
                                 (f.target_ == path ? std::string("it") : f.target_) + ": " +
                                 std::strerror(errno));
    f.temporary_ = tmp;  // from here on, f's destructor removes it if anything fails
    const auto fail = [&](const char* what) {
      const int err = errno;
      throw file_error(path, std::string(what) + ": " + std::strerror(err));
    };
    if (::fchmod(fd.get(), mode) != 0) fail("cannot set the permissions of the temporary file");
    for (const Part& part : parts)
      if (!write_all(fd.get(), part.data, part.size)) fail("cannot write");
    if (fd.reset() != 0) fail("cannot write (close failed)");
    return f;
  }

  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  StagedFile(StagedFile&& other) noexcept
      : path_(std::move(other.path_)),
        target_(std::move(other.target_)),
        temporary_(std::exchange(other.temporary_, std::string())) {}
  StagedFile& operator=(StagedFile&& other) noexcept {
    if (this != &other) {
      discard();
      path_ = std::move(other.path_);
      target_ = std::move(other.target_);
      temporary_ = std::exchange(other.temporary_, std::string());
    }
    return *this;
  }
  ~StagedFile() { discard(); }

  // The path given to stage(); it names the file in error messages.
  const std::string& path() const { return path_; }

  // The file commit() replaces: path(), or the file its symbolic links lead to.
  const std::string& target() const { return target_; }

  // The temporary "<target>.tmp-XXXXXX"; empty once committed or discarded.
  const std::string& temporary() const { return temporary_; }

  // True until commit() or discard().
  bool staged() const { return !temporary_.empty(); }

  // Checks the target again (it must still be a regular file or nothing) and renames the temporary
  // over it. On failure the temporary is removed, the target is untouched and FormatError names
  // path() and the problem. Throws FormatError "<path>: <caller>: nothing staged (committed or
  // discarded)" if nothing is staged.
  void commit(const std::string& caller = "StagedFile::commit") {
    if (!staged()) throw file_error(path_, caller + ": nothing staged (committed or discarded)");
    try {
      check_target(path_, target_);
    } catch (...) {
      discard();
      throw;
    }
    if (::rename(temporary_.c_str(), target_.c_str()) != 0) {
      const int err = errno;
      discard();
      throw file_error(
          path_, std::string("cannot rename the temporary file over it: ") + std::strerror(err));
    }
    temporary_.clear();  // it is the target now
  }

  // Removes the temporary, if any; the target is untouched.
  void discard() noexcept {
    if (!temporary_.empty()) ::unlink(temporary_.c_str());
    temporary_.clear();
  }

 private:
  StagedFile() = default;

  std::string path_;
  std::string target_;
  std::string temporary_;
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
// the file that failed and the problem, plus which files were rolled back, on one line; a file
// that is not staged is "<path>: <caller>: nothing staged (committed or discarded)". `Staged` is
// StagedFile or a layer over it (path(), target(), staged(), commit(), discard()).
template <class Staged>
void commit_all(std::vector<Staged>& files, const std::string& caller) {
  const auto discard_all = [&] {
    for (Staged& f : files) f.discard();
  };
  try {
    for (std::size_t i = 0; i < files.size(); ++i) {
      if (!files[i].staged())
        throw file_error(files[i].path(), caller + ": nothing staged (committed or discarded)");
      check_target(files[i].path(), files[i].target());
      for (std::size_t j = 0; j < i; ++j)
        if (same_file(files[j].target(), files[i].target()))
          throw file_error(files[i].path(), "names the same file as " + files[j].path());
    }
  } catch (...) {
    discard_all();
    throw;
  }

  struct Committed {
    std::string backup;  // empty: the target did not exist (or was the last one)
    bool existed = false;
  };
  std::vector<Committed> committed;
  committed.reserve(files.size());
  for (std::size_t i = 0; i < files.size(); ++i) {
    Staged& f = files[i];
    std::string backup;
    try {
      const TargetState state = check_target(f.path(), f.target());
      if (state.exists && i + 1 < files.size())
        backup = make_backup(f.path(), f.target(), state.mode);
      f.commit();
      committed.push_back({backup, state.exists});
    } catch (const std::exception& e) {
      if (!backup.empty()) ::unlink(backup.c_str());
      discard_all();
      std::string restored, problems;
      for (std::size_t j = committed.size(); j-- > 0;) {
        const Committed& c = committed[j];
        const std::string& target = files[j].target();
        const int rc = !c.backup.empty() ? ::rename(c.backup.c_str(), target.c_str())
                                         : ::unlink(target.c_str());
        if (rc == 0) {
          restored += (restored.empty() ? "" : ", ") + files[j].path();
        } else {
          problems += "; could not restore " + files[j].path() + ": " + std::strerror(errno);
          if (!c.backup.empty()) problems += " (its previous content is in " + c.backup + ")";
        }
      }
      std::string message = e.what();
      if (!restored.empty()) message += " (rolled back: " + restored + ")";
      throw FormatError(message + problems);
    }
  }
  for (const Committed& c : committed)
    if (!c.backup.empty()) ::unlink(c.backup.c_str());
}

}  // namespace gpt2::detail
