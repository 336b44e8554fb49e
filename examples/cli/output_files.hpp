// Writing the run's output files all or nothing: every file is staged beside its target, then all
// are committed together (gpt2::detail::commit_all, what npy::commit_all runs), which restores the
// targets already replaced if a later one fails. Either every file appears at its path, or none
// does and the paths keep whatever they held before; no temporary is left. Symbolic links are
// followed (the link stays, its target is replaced), a target that is not a regular file is
// refused, and an existing target keeps its permission bits (see gpt2/npy.hpp).
//
// Files are .npy of any rank: gpt2::npy::StagedFile stops at 3 dimensions, and the probabilities
// of a batch are [B, n_head, T, T]. stage_npy writes the header npy::StagedFile writes (the one
// numpy.save writes) through the same staging layer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "args.hpp"
#include "gpt2/detail/npy_header.hpp"
#include "gpt2/detail/staged_file.hpp"
#include "gpt2/error.hpp"
#include "gpt2/npy.hpp"
#include "gpt2/types.hpp"

namespace gpt2::cli {

// Stages the values at `data` (C order, numel(shape) of them; only read) as a .npy file of T's
// dtype and any rank. Throws FormatError naming `path` (see npy::StagedFile::stage).
template <class T>
gpt2::detail::StagedFile stage_npy(const std::string& path, const T* data,
                                   const std::vector<std::int64_t>& shape) {
  std::size_t bytes = sizeof(T);
  for (std::int64_t d : shape) bytes *= static_cast<std::size_t>(d);
  const std::string header = npy::detail::encode_header(npy::dtype_of<T>(), shape);
  return gpt2::detail::StagedFile::stage(path, {{header.data(), header.size()}, {data, bytes}});
}

// One file to write: `stage(path)` stages the whole file for `path` (it may throw).
struct PendingFile {
  std::string role;  // names the file in messages: "output", "probs"
  std::string path;
  std::function<gpt2::detail::StagedFile(const std::string& path)> stage;
};

// Writes every file in `files` or none of them. Throws gpt2::Error "<role> <path>: <problem>"
// for the first file that cannot be written.
inline void write_all_or_nothing(const std::vector<PendingFile>& files) {
  std::vector<gpt2::detail::StagedFile> staged;
  staged.reserve(files.size());
  for (const PendingFile& f : files) {
    try {
      staged.push_back(f.stage(f.path));
    } catch (const Error& e) {
      throw Error(in_context(f.role, f.path, e.what()));
    }
  }
  try {
    gpt2::detail::commit_all(staged, "npy::commit_all");
  } catch (const Error& e) {
    // The message starts "<path>: ": find whose (the longest path that matches).
    const std::string message = e.what();
    const PendingFile* named = nullptr;
    for (const PendingFile& f : files)
      if (message.rfind(f.path + ": ", 0) == 0 && (!named || f.path.size() > named->path.size()))
        named = &f;
    throw Error(named ? in_context(named->role, named->path, message) : message);
  }
}

}  // namespace gpt2::cli
