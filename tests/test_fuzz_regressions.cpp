// Replays the fuzzers' inputs in the normal test suite: every file of the seed corpus
// (tests/fuzz/corpus/<target>/) and every input a fuzzer found a problem with
// (tests/fuzz/regressions/<target>/), through the very functions the fuzz targets call
// (tests/fuzz/fuzz_*.cpp, compiled here without libFuzzer). Under the asan preset this is a
// sanitized run of each; the regression cases below also check what each such input now gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
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

// ---------------------------------------------------------------------------------------------
// Hostile inputs: regressions
// ---------------------------------------------------------------------------------------------

// A safetensors file from its JSON header (and no data).
std::vector<unsigned char> safetensors_bytes(const std::string& header) {
  std::vector<unsigned char> b(8);
  for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = (header.size() >> (8 * i)) & 0xFF;
  b.insert(b.end(), header.begin(), header.end());
  return b;
}

// Found in review while writing the fuzz targets (libFuzzer's 8 KiB inputs nest too little to
// reach it): a shape nested 100000 deep was parsed (nlohmann's parser is iterative) and then
// quoted in the error message with json::dump(), which recurses once per level and overflowed the
// stack (SIGSEGV). Now any nesting deeper than 32 levels is rejected while parsing.
TEST(FuzzRegressions, DeeplyNestedSafetensorsHeaderIsRejectedWithoutRecursion) {
  for (const std::size_t depth : {std::size_t(33), std::size_t(100000), std::size_t(1000000)}) {
    const std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":" + std::string(depth, '[') +
                               std::string(depth, ']') + ",\"data_offsets\":[0,0]}}";
    const std::vector<unsigned char> b = safetensors_bytes(header);
    EXPECT_EQ(error_of<gpt2::FormatError>([&] {
                gpt2::safetensors::File::parse(b.data(), b.size(), "deep.safetensors");
              }),
              "deep.safetensors: header nests objects and arrays deeper than 32 levels")
        << "depth " << depth;
    EXPECT_EQ(gpt2::fuzz::safetensors_input(b.data(), b.size()), 0);
  }
  // 32 levels deep is still parsed (and then rejected for what it is: a shape entry that is an
  // array).
  const std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":" + std::string(30, '[') +
                             std::string(30, ']') + ",\"data_offsets\":[0,0]}}";
  const std::vector<unsigned char> b = safetensors_bytes(header);
  EXPECT_TRUE(Contains(error_of<gpt2::FormatError>([&] {
                         gpt2::safetensors::File::parse(b.data(), b.size(), "deep.safetensors");
                       }),
                       "entry 0: expected a non-negative integer, got array"));
}

// Found while measuring what a large hostile header costs: the duplicate-key check ran as a parser
// callback, and nlohmann's callback parser scans the enclosing object at the end of every nested
// object, so n tensors cost O(n^2): a 10 MiB header of 180000 empty tensors ran for over 10 minutes.
// Now a separate SAX pass checks keys and nesting, and parsing is linear (about a second here).
TEST(FuzzRegressions, HeaderOfManyTensorsParsesInLinearTime) {
  constexpr int n = 100000;
  std::string header = "{";
  for (int i = 0; i < n; ++i)
    header += (i ? ",\"t" : "\"t") + std::to_string(i) +
              "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  header += "}";
  const std::vector<unsigned char> b = safetensors_bytes(header);
  const auto start = std::chrono::steady_clock::now();
  const gpt2::safetensors::File file = gpt2::safetensors::File::parse(b.data(), b.size(), "many");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(file.tensor_count(), static_cast<std::size_t>(n));
  EXPECT_LT(seconds, 60.0) << "quadratic parsing took minutes";
  // A duplicate among them is still found.
  const std::vector<unsigned char> dup = safetensors_bytes(
      header.substr(0, header.size() - 1) + ",\"t77\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}");
  EXPECT_EQ(error_of<gpt2::FormatError>([&] { gpt2::safetensors::File::parse(dup.data(), dup.size(), "many"); }),
            "many: header has a duplicate key 't77'");
}

// A header field of megabytes is quoted in a message in at most 80 characters.
TEST(FuzzRegressions, LongJsonIsQuotedShortInMessages) {
  const std::string dtype(1 << 20, 'X');
  const std::vector<unsigned char> b = safetensors_bytes(
      "{\"w\":{\"dtype\":\"" + dtype + "\",\"shape\":[],\"data_offsets\":[0,0]}}");
  const std::string message = error_of<gpt2::FormatError>(
      [&] { gpt2::safetensors::File::parse(b.data(), b.size(), "long.safetensors"); });
  EXPECT_EQ(message, "long.safetensors: tensor 'w': unknown dtype \"" + std::string(76, 'X') + "...");
  std::string shape = "[";
  for (int i = 0; i < 100000; ++i) shape += "1,";
  shape += "-1]";
  const std::vector<unsigned char> s = safetensors_bytes(
      "{\"w\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[0,0]}}");
  const std::string m2 = error_of<gpt2::FormatError>(
      [&] { gpt2::safetensors::File::parse(s.data(), s.size(), "long.safetensors"); });
  EXPECT_LT(m2.size(), 200u) << m2;
  EXPECT_TRUE(Contains(m2, "entry 100000: negative value -1"));
}

}  // namespace
