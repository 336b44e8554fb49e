// The kernels of every vector level, compiled once for the whole CLI (cli_kernels.hpp); nothing
// when the build links them from elsewhere.
#include "cli_kernels.hpp"

#if GPT2_CLI_COMPILES_KERNELS
#define GPT2_ATTENTION_KERNELS_IMPLEMENTATION
#if __has_include("gpt2/compiled.hpp")
#include "gpt2/compiled.hpp"  // the kernels and, where the headers declare them extern, the forwards
#else
#include "gpt2/kernels/dispatch.hpp"
#endif
#endif
