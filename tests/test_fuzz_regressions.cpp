// Replays the fuzzers' inputs in the normal test suite: every file of the seed corpus
// (tests/fuzz/corpus/<target>/) and every input a fuzzer found a problem with
// (tests/fuzz/regressions/<target>/), through the very functions the fuzz targets call
// (tests/fuzz/fuzz_*.cpp, compiled here without libFuzzer). Under the asan preset this is a
// sanitized run of each; the regression cases below also check what each such input now gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#define GPT2_FUZZ_NO_ENTRY_POINT
#include "fuzz/fuzz_cli_args.cpp"
#include "fuzz/fuzz_npy.cpp"
#include "fuzz/fuzz_safetensors.cpp"
#include "support/errors.hpp"
#include "support/tmpdir.hpp"

#ifndef GPT2_FUZZ_DIR
#error "GPT2_FUZZ_DIR must name tests/fuzz"
#endif

namespace {

using gpt2::test::Contains;
using gpt2::test::error_of;

// The files of <tests/fuzz>/<kind>/<target>/, sorted (none when the directory does not exist).
std::vector<std::string> inputs(const std::string& kind, const std::string& target) {
  std::vector<std::string> files;
  const std::filesystem::path dir = std::filesystem::path(GPT2_FUZZ_DIR) / kind / target;
  if (!std::filesystem::is_directory(dir)) return files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.is_regular_file()) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

using Entry = int (*)(const std::uint8_t*, std::size_t);

void replay(const std::string& target, Entry entry, bool corpus_must_exist) {
  const std::vector<std::string> corpus = inputs("corpus", target);
  if (corpus_must_exist) {
    EXPECT_FALSE(corpus.empty()) << "no seed corpus for " << target;
  }
  for (const char* kind : {"corpus", "regressions"})
    for (const std::string& path : inputs(kind, target)) {
      SCOPED_TRACE(path);
      const std::vector<unsigned char> bytes = gpt2::test::read_file(path);
      EXPECT_EQ(entry(bytes.data(), bytes.size()), 0);
    }
}

TEST(FuzzReplay, Safetensors) { replay("safetensors", gpt2::fuzz::safetensors_input, true); }
TEST(FuzzReplay, Npy) { replay("npy", gpt2::fuzz::npy_input, true); }
TEST(FuzzReplay, CliArgs) { replay("cli", gpt2::fuzz::cli_args_input, true); }

}  // namespace
