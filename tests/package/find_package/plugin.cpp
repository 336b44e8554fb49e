// A shared library of the consumer project that links gpt2::attention itself (two_targets.cpp).
#include <gpt2/attention.hpp>

#include "../common/small_model.hpp"

gpt2::RowMatrix<float> plugin_forward() { return consumer::small_forward(); }
