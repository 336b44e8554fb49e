// The compiled part of the io component behind the CMake target gpt2::io (and the pkg-config
// module gpt2-attention-io): the safetensors header parser (nlohmann-json), compiled once, so that
// files including gpt2/safetensors.hpp parse no nlohmann-json. GPT2_ATTENTION_SEPARATE_IO comes
// from the target.
#define GPT2_ATTENTION_IO_IMPLEMENTATION
#include "gpt2/npy.hpp"
#include "gpt2/safetensors.hpp"
