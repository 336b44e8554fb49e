// A program built with nothing but the compiler and pkg-config against an installed gpt2-attention:
//   c++ -std=c++17 -O2 main.cpp $(pkg-config --cflags --libs gpt2-attention) -o app
//   app <version from pkg-config --modversion> openmp|no-openmp compiled|header-only
// It runs one attention sublayer, and fails unless the headers' version is the .pc file's, the
// OpenMP flags the .pc file gave match the installation's build (gpt2::kHasOpenMP) and the kernels
// are the module's mode (gpt2-attention: the compiled library; gpt2-attention-header-only: this
// file's own).
#include <gpt2/attention.hpp>
#include <gpt2/version.hpp>

#include <cstdio>
#include <string>

#include "../common/small_model.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s VERSION openmp|no-openmp compiled|header-only\n", argv[0]);
    return 2;
  }
  const std::string version = std::to_string(gpt2::version_major) + "." +
                              std::to_string(gpt2::version_minor) + "." +
                              std::to_string(gpt2::version_patch);
  if (version != argv[1]) {
    std::fprintf(stderr, "version.hpp says %s, pkg-config says %s\n", version.c_str(), argv[1]);
    return 1;
  }
  const bool want_openmp = std::string(argv[2]) == "openmp";
  if (gpt2::kHasOpenMP != want_openmp) {
    std::fprintf(stderr, "gpt2::kHasOpenMP is %d, expected %d (the .pc file's OpenMP flags)\n",
                 int(gpt2::kHasOpenMP), int(want_openmp));
    return 1;
  }
  std::printf("pkg-config consumer: version %s, OpenMP %s, %d threads\n", version.c_str(),
              want_openmp ? "on" : "off", gpt2::num_threads());
#if defined(__OPTIMIZE__)
  const bool optimized = true;
#else
  const bool optimized = false;
#endif
  if (consumer::check_build(argv[3], optimized, "pkg-config consumer") != 0) return 1;
  return consumer::check_output(consumer::small_forward(), "pkg-config consumer");
}
