// gpt2-attention: command-line front end of the gpt2-attention library.
//
//   gpt2-attention run  --weights W.safetensors --input X.npy --output Y.npy [...]   run_command.hpp
//   mpiexec -n R gpt2-attention run --tensor-parallel ...                           tensor_parallel_run.hpp
//   gpt2-attention demo [--weights W.safetensors] [...]                              demo_command.hpp
//   gpt2-attention help | --help | -h                                                usage.hpp
//   gpt2-attention --version      version, kernel level in use and the CPU features seen
//
// Translation units (compiled side by side; the headers declare what crosses them):
//   main.cpp                 this file: the command line dispatched, errors reported
//   run_command.cpp          run: options, float or double, files read and written (run_compute.hpp)
//   run_float.cpp            run's forwards in float (f32, bf16), every path (run_forwards.hpp)
//   run_double.cpp           run's forwards in double (f64)
//   checkpoint.cpp           a checkpoint opened and a layer loaded (run and demo)
//   tensor_parallel_run.cpp  run --tensor-parallel (with MPI only)
//   demo_command.cpp         demo
//   picture.cpp              --png: the picture drawn and encoded
//   kernels.cpp              the vector levels' kernels, compiled once (cli_kernels.hpp)
//
// Exit status: 0 success, 2 a malformed command line (cli::UsageError), 1 anything wrong with the
// data (gpt2::Error: files, tensors, shapes, configuration). Errors are one line on stderr,
// "gpt2-attention: <problem>", and no output file is left behind. Output that cannot be written to
// stdout (a full disk, a closed pipe) is an error too (status 1).
#include "cli_kernels.hpp"  // first: the kernels are compiled once, in kernels.cpp

#include <cerrno>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "args.hpp"
#include "demo_command.hpp"
#include "gpt2/kernels/isa.hpp"
#include "gpt2/version.hpp"
#include "run_command.hpp"
#include "usage.hpp"

namespace {

constexpr int kExitData = 1;
constexpr int kExitUsage = 2;

void report_error(const std::string& message, bool usage) {
  std::cerr << "gpt2-attention: " << gpt2::cli::one_line(message)
            << (usage ? " (see gpt2-attention --help)" : "") << std::endl;
}

// Dispatches on the subcommand; returns the exit status or throws.
int dispatch(const std::vector<std::string>& args) {
  using namespace gpt2::cli;
  if (args.empty()) {
    std::cerr << "gpt2-attention: missing command (run, demo); see gpt2-attention --help"
              << std::endl;
    return kExitUsage;
  }
  const std::string& command = args.front();
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "help" || command == "--help" || command == "-h") {
    std::cout << usage_text();
    return 0;
  }
  if (command == "--version" || command == "version") {
    if (rest.size() > 0) throw UsageError("--version takes no arguments, got '" + rest.front() + "'");
    const gpt2::KernelInfo info = gpt2::kernel_info();  // a bad GPT2_ATTENTION_ISA: ConfigError, exit 1
    std::cout << "gpt2-attention " << gpt2::version_major << "." << gpt2::version_minor << "."
              << gpt2::version_patch
              << " (kernels: " << info.summary() << ")\n";
    return 0;
  }
  if (command != "run" && command != "demo") {
    if (command.rfind("-", 0) == 0)
      throw UsageError("expected a command (run, demo or help) before '" + command + "'");
    throw UsageError("unknown command '" + command + "' (expected run, demo or help)");
  }
  const Flags flags = command == "run" ? parse_flags(command, rest, kRunFlags, kRunSwitches)
                                       : parse_flags(command, rest, kDemoFlags);
  if (flags.help) {
    std::cout << usage_text();
    return 0;
  }
  // A header-only build without optimisation runs tens of times slower: say so, once, on stderr.
  if (!gpt2::kernels::built_optimized())
    std::cerr << "gpt2-attention: warning: " << gpt2::KernelInfo::unoptimized_warning() << std::endl;
  return command == "run" ? run_command(flags) : demo_command(flags, std::cout);
}

// Flushes stdout; false (with a one-line message on stderr) if anything written to it was lost,
// e.g. a full disk or a closed pipe.
bool flush_stdout() {
  errno = 0;
  std::cout.flush();
  if (std::cout) return true;
  const int err = errno;
  report_error(std::string("cannot write to standard output") +
                   (err != 0 ? std::string(": ") + std::strerror(err) : std::string()),
               false);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int status = dispatch(std::vector<std::string>(argv + 1, argv + argc));
    if (!flush_stdout()) return kExitData;
    return status;
  } catch (const gpt2::cli::UsageError& e) {
    report_error(e.what(), true);
    return kExitUsage;
  } catch (const gpt2::cli::ReportedElsewhere&) {  // --tensor-parallel: rank 0 has said it
    return kExitData;
  } catch (const std::bad_alloc&) {
    report_error("out of memory", false);
    return kExitData;
  } catch (const std::exception& e) {  // gpt2::Error and anything else: the data
    report_error(e.what(), false);
    return kExitData;
  }
}
