// Linked into every GoogleTest program: prints the kernel level the program runs at, and skips
// every test, with "skipped: the CPU has no LEVEL", when GPT2_ATTENTION_ISA asks for a level this
// machine cannot run (ctest then reports the entry as skipped, never as passed). An unknown name
// fails the program, as it fails any user of the library.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gpt2/kernels/dispatch.hpp"

namespace {

class KernelLevel : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* wanted = std::getenv("GPT2_ATTENTION_ISA");
    if (wanted != nullptr && *wanted != '\0') {
      for (const gpt2::Isa isa : gpt2::kAllIsas)
        if (std::string(wanted) == gpt2::isa_name(isa) && !gpt2::isa_supported(isa))
          GTEST_SKIP() << "skipped: the CPU has no " << wanted << " (GPT2_ATTENTION_ISA="
                       << wanted << "; cpu: " << gpt2::kernels::cpu_features().names() << ")";
    }
    const gpt2::KernelInfo info = gpt2::kernel_info();
    std::printf("kernel level: %s (chosen by %s; cpu: %s)\n", info.level.c_str(),
                info.chosen_by.c_str(), info.cpu.c_str());
  }
};

[[maybe_unused]] ::testing::Environment* const kKernelLevel =
    ::testing::AddGlobalTestEnvironment(new KernelLevel);

}  // namespace
