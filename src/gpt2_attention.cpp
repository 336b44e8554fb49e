// The compiled library behind the CMake target gpt2::attention (and the pkg-config module
// gpt2-attention): the kernels of every vector level and the float and double forwards, compiled
// once per build tree with optimisation of their own (CMakeLists.txt). GPT2_ATTENTION_SEPARATE_KERNELS
// comes from the target, as it does for every file that links it.
#define GPT2_ATTENTION_KERNELS_IMPLEMENTATION
#include "gpt2/compiled.hpp"
