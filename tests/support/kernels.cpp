// The kernels of every level, compiled once for all test programs: they are built with
// GPT2_ATTENTION_SEPARATE_KERNELS (kernels/dispatch.hpp), so their own translation units only
// declare the kernel entry points, and this one defines them.
#define GPT2_ATTENTION_KERNELS_IMPLEMENTATION
#include "gpt2/kernels/dispatch.hpp"
