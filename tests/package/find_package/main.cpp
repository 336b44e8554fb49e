// A program built against an installed gpt2-attention (find_package), with this tree's flags at
// -O0 (tests/package/CMakeLists.txt). It runs one attention sublayer on a small config and fails
// unless the output is [T, C] and finite and the kernels are the build mode's: the compiled
// library's, optimised (gpt2::attention), or header-only, unoptimised at -O0
// (gpt2::attention_header_only: CONSUMER_HEADER_ONLY).
#include <gpt2/attention.hpp>
#include <gpt2/version.hpp>

#include "../common/small_model.hpp"

static_assert(gpt2::version_major == EXPECTED_VERSION_MAJOR &&
                  gpt2::version_minor == EXPECTED_VERSION_MINOR &&
                  gpt2::version_patch == EXPECTED_VERSION_PATCH,
              "installed version.hpp disagrees with gpt2_attentionConfigVersion.cmake");

int main() {
#if defined(CONSUMER_HEADER_ONLY)
  const char* mode = "header-only";
#else
  const char* mode = "compiled";
#endif
#if defined(__OPTIMIZE__)
  const bool optimized = true;
#else
  const bool optimized = false;
#endif
  if (consumer::check_build(mode, optimized, "find_package consumer") != 0) return 1;
  return consumer::check_output(consumer::small_forward(), "find_package consumer");
}
