// The compiled part of the library (gpt2/compiled.hpp: the kernels of every vector level and the
// float and double forwards), compiled once for all test programs, which are built in the compiled
// mode (GPT2_ATTENTION_SEPARATE_KERNELS) with the tests' own flags.
#define GPT2_ATTENTION_KERNELS_IMPLEMENTATION
#include "gpt2/compiled.hpp"
