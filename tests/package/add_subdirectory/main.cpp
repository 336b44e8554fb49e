// A program that builds gpt2-attention as part of itself (add_subdirectory). It runs one attention
// sublayer on a small config and fails unless the output is [T, C] and finite.
#include <gpt2/attention.hpp>

#include "../common/small_model.hpp"

int main() { return consumer::check_output(consumer::small_forward(), "add_subdirectory consumer"); }
