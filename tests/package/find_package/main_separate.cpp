// A consumer that compiles the kernels once (GPT2_ATTENTION_SEPARATE_KERNELS, kernels/dispatch.hpp):
// this file only declares the kernel entry points, kernels_separate.cpp defines them. It runs the
// small sublayer at the level the CPU chooses and at generic (Eigen, no kernel table), and fails
// unless both are [T, C], finite and agree within float32 rounding.
#include <gpt2/attention.hpp>

#include <cstdio>
#include <cstdlib>

#include "../common/small_model.hpp"

int main() {
  std::srand(7);  // Eigen's Random draws from std::rand: both runs get the same weights and input
  const gpt2::RowMatrix<float> y = consumer::small_forward();
  if (consumer::check_output(y, "separate-kernels consumer") != 0) return 1;
  const gpt2::KernelInfo info = gpt2::kernel_info();
  gpt2::set_isa(gpt2::Isa::generic);
  std::srand(7);
  const gpt2::RowMatrix<float> y_generic = consumer::small_forward();
  gpt2::reset_isa();
  const float diff = (y - y_generic).cwiseAbs().maxCoeff(), scale = y_generic.cwiseAbs().maxCoeff();
  if (!(diff <= 1e-4f * scale)) {
    std::fprintf(stderr, "separate-kernels consumer: level %s differs from generic by %g (max |y| %g)\n",
                 info.level.c_str(), diff, scale);
    return 1;
  }
  std::printf("separate-kernels consumer: level %s agrees with generic (%g)\n", info.level.c_str(),
              diff);
  return 0;
}
