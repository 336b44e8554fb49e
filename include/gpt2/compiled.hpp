// The compiled part of the library: the kernels of every vector level and the float and double
// forwards (detail/compiled_mode.hpp lists them), for the compiled mode. The CMake target
// gpt2::attention builds it (src/gpt2_attention.cpp) and links it; without CMake, one file of the
// program holds
//     #define GPT2_ATTENTION_KERNELS_IMPLEMENTATION
//     #include <gpt2/compiled.hpp>
// and every file, that one included, is compiled with GPT2_ATTENTION_SEPARATE_KERNELS defined
// (docs/building.md). Compile it optimised (-O2) whatever the rest of the program's flags are.
// Anywhere else it only includes the headers whose code it holds.
#pragma once

#include "gpt2/attention.hpp"
#include "gpt2/batch.hpp"
#include "gpt2/paged_kv_cache.hpp"
