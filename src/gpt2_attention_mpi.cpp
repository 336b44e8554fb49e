// The compiled part of the tensor-parallel component behind the CMake target gpt2::mpi: the float
// and double forwards of a TensorParallelAttention shard, single-sequence and batched, over every
// cache type (the end of gpt2/tensor_parallel.hpp lists them), compiled once, so that files using
// the shard compile only their calls. GPT2_ATTENTION_SEPARATE_MPI comes from the target.
#define GPT2_ATTENTION_MPI_IMPLEMENTATION
#include "gpt2/tensor_parallel.hpp"
