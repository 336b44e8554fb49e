// libFuzzer target: the command-line handling of gpt2-attention (examples/cli), without running a
// command. The input is [B][T] followed by the arguments, separated by NUL bytes:
//   argv = command, flags...   as main.cpp dispatches them: the command, parse_flags with the
//                              command's flags, then parse_run_options / parse_demo_options
//   B, T (one byte each)       the shape [B, T, 64] of a batched input against which run's
//                              --starts / --lengths are checked (input_layout), and [T, 64]
// A cli::UsageError or gpt2::Error is a correct rejection; anything else is a bug. Only the file
// system is read (run compares its paths with stat); nothing is opened or written.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "args.hpp"
#include "demo_command.hpp"
#include "run_command.hpp"
#include "run_input.hpp"

namespace gpt2::fuzz::cli_args_detail {

void run_args(const std::vector<std::string>& args, std::int64_t B, std::int64_t T) {
  using namespace gpt2::cli;
  if (args.empty()) return;
  const std::string& command = args.front();
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command != "run" && command != "demo") return;
  const Flags flags = command == "run" ? parse_flags(command, rest, kRunFlags, kRunSwitches)
                                       : parse_flags(command, rest, kDemoFlags);
  if (flags.help) return;
  if (command == "demo") {
    const DemoOptions o = parse_demo_options(flags);
    (void)o;
    return;
  }
  const RunOptions o = parse_run_options(flags);
  for (const std::vector<std::int64_t>& shape :
       {std::vector<std::int64_t>{B, T, 64}, std::vector<std::int64_t>{T, 64}}) {
    try {
      const std::optional<gpt2::BatchLayout> layout = input_layout(shape, o.starts, o.lengths);
      if (layout) {
        volatile gpt2::Index sink = layout->rows() + layout->max_length();
        (void)sink;
      }
    } catch (const gpt2::Error& e) {
      (void)one_line(e.what());
    }
  }
  (void)in_context("input", o.input, o.input + ": x");
}

}  // namespace gpt2::fuzz::cli_args_detail

namespace gpt2::fuzz {

// One input; the same as LLVMFuzzerTestOneInput below (tests/test_fuzz_regressions.cpp calls it).
inline int cli_args_input(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::int64_t B = data[0] % 16, T = data[1];
  std::vector<std::string> args(1);
  for (std::size_t i = 2; i < size; ++i) {
    if (data[i] == 0)
      args.emplace_back();
    else
      args.back() += static_cast<char>(data[i]);
  }
  try {
    cli_args_detail::run_args(args, B, T);
  } catch (const gpt2::cli::UsageError& e) {
    (void)gpt2::cli::one_line(e.what());
  } catch (const gpt2::Error& e) {
    (void)gpt2::cli::one_line(e.what());
  }
  return 0;
}

}  // namespace gpt2::fuzz

#ifndef GPT2_FUZZ_NO_ENTRY_POINT
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return gpt2::fuzz::cli_args_input(data, size);
}
#endif
