// Writing several output files all or nothing: either every file appears at its path, or none
// does and the paths keep whatever they held before.
//
//   1. stage: each file is written in full to a temporary beside its target
//             ("<dir>/.<name>.gpt2-attention-<pid>-<i>"); a failure removes the staged ones.
//   2. check: no target is a directory (the one rename failure that is easy to foresee).
//   3. commit: each temporary is renamed over its target. If a later rename still fails, the
//             targets already renamed are removed, so no partial set of outputs is left.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "args.hpp"
#include "gpt2/error.hpp"

namespace gpt2::cli {

// One file to write: `write(p)` writes the whole file at path p (it may throw).
struct PendingFile {
  std::string role;  // names the file in messages: "output", "probs"
  std::string path;
  std::function<void(const std::string& path)> write;
};

// "<dir>/.<name>.gpt2-attention-<pid>-<index>": beside `path`, so the final rename stays within
// one file system.
inline std::string staging_path(const std::string& path, std::size_t index) {
  const std::filesystem::path target(path);
  const std::string name = "." + target.filename().string() + ".gpt2-attention-" +
                           std::to_string(::getpid()) + "-" + std::to_string(index);
  return (target.parent_path() / name).string();
}

// Every occurrence of `from` in `text` replaced by `to` (a staging path by the user's path).
inline std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  for (std::size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, pos + to.size()))
    text.replace(pos, from.size(), to);
  return text;
}

inline bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Writes every file in `files` or none of them (see the top of this header). Throws gpt2::Error
// "<role> <path>: <problem>" for the first file that cannot be written.
inline void write_all_or_nothing(const std::vector<PendingFile>& files) {
  std::vector<std::string> staged;
  const auto discard_staged = [&](std::size_t from) {
    for (std::size_t i = from; i < staged.size(); ++i) ::unlink(staged[i].c_str());
  };

  for (std::size_t i = 0; i < files.size(); ++i) {
    const PendingFile& f = files[i];
    const std::string tmp = staging_path(f.path, i);
    try {
      f.write(tmp);
    } catch (const std::exception& e) {
      ::unlink(tmp.c_str());  // in case the writer left it (gpt2::npy::write never does)
      discard_staged(0);
      throw Error(in_context(f.role, f.path, replace_all(e.what(), tmp, f.path)));
    }
    staged.push_back(tmp);
  }

  for (const PendingFile& f : files)
    if (is_directory(f.path)) {
      discard_staged(0);
      throw Error(f.role + " " + f.path + ": cannot write: it is a directory");
    }

  for (std::size_t i = 0; i < files.size(); ++i) {
    if (std::rename(staged[i].c_str(), files[i].path.c_str()) == 0) continue;
    const int err = errno;
    for (std::size_t j = 0; j < i; ++j) ::unlink(files[j].path.c_str());
    discard_staged(i);
    throw Error(files[i].role + " " + files[i].path + ": cannot write: " + std::strerror(err) +
                (i > 0 ? " (the files written before it were removed)" : ""));
  }
}

}  // namespace gpt2::cli
