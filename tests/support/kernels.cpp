// The vector levels' kernels for the test programs built on emulated AMX tiles
// (tests/CMakeLists.txt): they cannot link the library's, whose amx level runs real tiles. Only the
// kernel table is defined here; those programs compile their own forwards
// (GPT2_ATTENTION_NO_EXTERN_FORWARDS), on the same emulation, so no Eigen code is shared between
// this file and theirs (a test that watches Eigen's allocations sees its own copy).
#define GPT2_ATTENTION_KERNELS_IMPLEMENTATION
#include "gpt2/kernels/levels.hpp"
