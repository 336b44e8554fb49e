// Test helpers: a per-test temporary directory removed with its contents, and whole-file I/O
// (bytes or text).
#pragma once

#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace gpt2::test {

// A fresh directory "<temp>/<prefix>-XXXXXX"; the destructor removes it and everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "gpt2-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + tmpl);
    path_ = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }

  const std::filesystem::path& path() const { return path_; }
  std::string path_string() const { return path_.string(); }

  // "<dir>/<name>"
  std::string file(const std::string& name) const { return (path_ / name).string(); }

  // Names of the entries in the directory (or in its subdirectory `sub`), hidden ones included,
  // sorted.
  std::vector<std::string> list(const std::string& sub = "") const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(sub.empty() ? path_ : path_ / sub))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

// Writes the characters of `text` to `path`, unchanged (binary mode), replacing it.
inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

// The whole content of `path` as a string, unchanged (binary mode).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Writes `bytes` to `path`, replacing it.
inline void write_file(const std::string& path, const std::vector<unsigned char>& bytes) {
  write_text(path, std::string(bytes.begin(), bytes.end()));
}

// The whole content of `path`.
inline std::vector<unsigned char> read_file(const std::string& path) {
  const std::string text = read_text(path);
  return {text.begin(), text.end()};
}

}  // namespace gpt2::test
