// The one translation unit of the separate-kernels consumer that compiles the kernels.
#define GPT2_ATTENTION_KERNELS_IMPLEMENTATION
#include <gpt2/kernels/dispatch.hpp>
