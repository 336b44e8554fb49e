// gpt2-attention run (run_command.hpp): the options checked, then everything computed in float or
// double (run_compute.hpp) and written, or handed to the tensor-parallel run. The reading and
// writing a plain run and a tensor-parallel rank share (run_compute.hpp) are compiled here, once.
#include "cli_kernels.hpp"  // first: the kernels are compiled once, in kernels.cpp

#include "run_command.hpp"

#define GPT2_CLI_RUN_IO_HERE
#include "run_compute.hpp"

namespace gpt2::cli {

int run_command(const Flags& flags) {
  const RunOptions o = parse_run_options(flags);
#if GPT2_CLI_TENSOR_PARALLEL
  if (o.tensor_parallel) return run_tensor_parallel(o);
#endif
  if (o.precision == Precision::f64)
    run_in_precision<double>(o);
  else  // f32, bf16: float32 files, the weights packed in weight_dtype(o.precision)
    run_in_precision<float>(o);
  return 0;
}

GPT2_CLI_RUN_IO(, float)
GPT2_CLI_RUN_IO(, double)

}  // namespace gpt2::cli
