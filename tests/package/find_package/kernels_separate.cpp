// The one translation unit of the separate-kernels consumer that compiles the library's compiled
// part (the kernels and the float/double forwards), at -O2 (CMakeLists.txt).
#define GPT2_ATTENTION_KERNELS_IMPLEMENTATION
#include <gpt2/compiled.hpp>
