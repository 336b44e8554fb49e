// A program built against an installed gpt2-attention (find_package). It runs one attention
// sublayer on a small config and fails unless the output is [T, C] and finite.
#include <gpt2/attention.hpp>
#include <gpt2/version.hpp>

#include "../common/small_model.hpp"

static_assert(gpt2::version_major == EXPECTED_VERSION_MAJOR &&
                  gpt2::version_minor == EXPECTED_VERSION_MINOR &&
                  gpt2::version_patch == EXPECTED_VERSION_PATCH,
              "installed version.hpp disagrees with gpt2_attentionConfigVersion.cmake");

int main() { return consumer::check_output(consumer::small_forward(), "find_package consumer"); }
