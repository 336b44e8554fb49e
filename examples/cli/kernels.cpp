// The library's compiled part (gpt2/compiled.hpp), compiled once for the whole CLI when
// gpt2::attention is header-only (GPT2_ATTENTION_HEADER_ONLY; cli_kernels.hpp); empty when the CLI
// links the compiled library, as it does by default.
#include "cli_kernels.hpp"

#if GPT2_CLI_COMPILES_KERNELS
#define GPT2_ATTENTION_KERNELS_IMPLEMENTATION
#include "gpt2/compiled.hpp"
#endif
