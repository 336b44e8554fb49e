// The CLI is several translation units (main.cpp lists them): the vector levels' kernels are
// compiled once, in kernels.cpp, not in each of them (gpt2/kernels/levels.hpp: define
// GPT2_ATTENTION_SEPARATE_KERNELS in every file, GPT2_ATTENTION_KERNELS_IMPLEMENTATION in one).
// When the build gives GPT2_ATTENTION_SEPARATE_KERNELS already (the compiled gpt2::attention, the
// default), the kernels and forwards come from the library and kernels.cpp is empty. Every .cpp of
// the CLI includes this header before any other.
#pragma once

#ifndef GPT2_ATTENTION_SEPARATE_KERNELS
#define GPT2_ATTENTION_SEPARATE_KERNELS
#define GPT2_CLI_COMPILES_KERNELS 1
#else
#define GPT2_CLI_COMPILES_KERNELS 0
#endif
