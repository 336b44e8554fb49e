// run --tensor-parallel (tensor_parallel_run.hpp), in a CLI built with gpt2::mpi
// (GPT2_CLI_TENSOR_PARALLEL, examples/CMakeLists.txt); empty otherwise.
#include "cli_kernels.hpp"  // first: the kernels are compiled once, in kernels.cpp

#include "sublayer.hpp"  // GPT2_CLI_TENSOR_PARALLEL

#if GPT2_CLI_TENSOR_PARALLEL
#include "tensor_parallel_run.hpp"
#endif
