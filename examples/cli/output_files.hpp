// Writing the run's output files all or nothing, with gpt2::npy's staging: every file is staged
// beside its target (npy::StagedFile::stage for a .npy, the same machinery under it,
// gpt2::detail::StagedFile, for the bytes of a PNG), then all are committed together
// (gpt2::detail::commit_all, what npy::commit_all runs), which restores the targets already
// replaced if a later one fails. Either every file appears at
// its path, or none does and the paths keep whatever they held before; no temporary is left.
// Symbolic links are followed (the link stays, its target is replaced), a target that is not a
// regular file is refused, and an existing target keeps its permission bits (see gpt2/npy.hpp).
//
// The files are Y [T, C] or [B, T, C] and the probabilities [n_head, T, T] or [B, n_head, T, T]
// (all within the 1 to npy::max_dims (8) dimensions gpt2::npy writes), and the picture (a PNG).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "args.hpp"
#include "gpt2/error.hpp"
#include "gpt2/detail/staged_file.hpp"
#include "gpt2/npy.hpp"

namespace gpt2::cli {

// One staged output file: a .npy (npy::StagedFile) or any other bytes (gpt2::detail::StagedFile).
// Move-only; the temporary is removed unless committed. What gpt2::detail::commit_all needs.
class StagedOutput {
 public:
  StagedOutput(npy::StagedFile file) : file_(std::move(file)) {}           // NOLINT: implicit
  StagedOutput(gpt2::detail::StagedFile file) : file_(std::move(file)) {}  // NOLINT: implicit

  const std::string& path() const {
    return std::visit([](const auto& f) -> const std::string& { return f.path(); }, file_);
  }
  const std::string& target() const {
    return std::visit([](const auto& f) -> const std::string& { return f.target(); }, file_);
  }
  bool staged() const { return std::visit([](const auto& f) { return f.staged(); }, file_); }
  void commit() { std::visit([](auto& f) { f.commit(); }, file_); }
  void discard() noexcept { std::visit([](auto& f) { f.discard(); }, file_); }

 private:
  std::variant<npy::StagedFile, gpt2::detail::StagedFile> file_;
};

// Stages the numel(shape) values at `data` (C order; only read) as a .npy file of T's dtype:
// npy::StagedFile::stage, which throws ShapeError for a bad shape and FormatError naming `path`
// for a target it cannot write.
template <class T>
StagedOutput stage_npy(const std::string& path, const T* data,
                       const std::vector<std::int64_t>& shape) {
  return npy::StagedFile::stage<T>(path, data, shape);
}

// Stages `bytes` (only read) as the whole file `path`, with the same rules for the target as a
// .npy (FormatError naming `path` for a target it cannot write).
inline StagedOutput stage_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  return gpt2::detail::StagedFile::stage(path, {{bytes.data(), bytes.size()}});
}

// One file to write: `stage(path)` stages the whole file for `path` (it may throw).
struct PendingFile {
  std::string role;  // names the file in messages: "output", "probs", "png"
  std::string path;
  std::function<StagedOutput(const std::string& path)> stage;
};

// Writes every file in `files` or none of them. Throws gpt2::Error "<role> <path>: <problem>"
// for the first file that cannot be written.
inline void write_all_or_nothing(const std::vector<PendingFile>& files) {
  std::vector<StagedOutput> staged;
  staged.reserve(files.size());
  for (const PendingFile& f : files) {
    try {
      staged.push_back(f.stage(f.path));
    } catch (const Error& e) {
      throw Error(in_context(f.role, f.path, e.what()));
    }
  }
  try {
    gpt2::detail::commit_all(staged, "gpt2-attention");
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
