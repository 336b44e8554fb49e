// run's forwards in double (run_forwards.hpp).
#include "cli_kernels.hpp"  // first: the kernels are compiled once, in kernels.cpp

#include "run_forwards.hpp"

namespace gpt2::cli {

GPT2_CLI_INSTANTIATE_RUN(double)

}  // namespace gpt2::cli
