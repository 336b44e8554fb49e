// gpt2_memory T [T ...]: the memory one GPT-2 small (C = 768, 12 heads) fp32 prefill over T tokens
// needs, without probabilities: the Workspace's buffers (Workspace::bytes()), the input and output
// (2 * T * C floats), and the process's peak resident set (VmHWM) growth over the forward, which
// also counts the weights' pages and anything else touched. Prints one line per T.
//   build/release/bench/gpt2_memory 1024 8192
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gpt2/attention.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::RowVector;

// A field of /proc/self/status in kB ("VmHWM", "VmRSS"), or -1.
long status_kb(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field + ":", 0) == 0) return std::strtol(line.c_str() + field.size() + 1, nullptr, 10);
  return -1;
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpt2_memory T [T ...]\n");
    return 2;
  }
  constexpr Index C = 768, n_head = 12;
  const RowMatrix<float> c_attn_w = RowMatrix<float>::Random(C, 3 * C) * 0.05f;
  const RowMatrix<float> c_proj_w = RowMatrix<float>::Random(C, C) * 0.05f;
  const RowVector<float> c_attn_b = RowVector<float>::Random(3 * C) * 0.1f;
  const RowVector<float> c_proj_b = RowVector<float>::Random(C) * 0.1f;
  const gpt2::AttentionWeights<float> w({C, n_head}, gpt2::view(c_attn_w), gpt2::view(c_attn_b),
                                        gpt2::view(c_proj_w), gpt2::view(c_proj_b));
  std::printf("%8s %8s %14s %14s %18s %22s\n", "T", "threads", "workspace_MiB", "x+out_MiB",
              "peak_rss_growth_MiB", "n_head*T*T_floats_MiB");
  for (int i = 1; i < argc; ++i) {
    const Index T = std::strtol(argv[i], nullptr, 10);
    if (T <= 0) {
      std::fprintf(stderr, "gpt2_memory: T must be a positive count, got '%s'\n", argv[i]);
      return 2;
    }
    const long before_kb = status_kb("VmHWM");
    {
      const RowMatrix<float> x = RowMatrix<float>::Random(T, C);
      RowMatrix<float> out(T, C);
      gpt2::Workspace<float> ws(w.config(), T);
      gpt2::attention_forward<float>(w, x, ws, out);
      const long after_kb = status_kb("VmHWM");
      std::printf("%8ld %8d %14.1f %14.1f %18.1f %22.1f\n", static_cast<long>(T),
                  gpt2::num_threads(), mib(static_cast<double>(ws.bytes())),
                  mib(2.0 * 4.0 * static_cast<double>(T * C)),
                  (after_kb - before_kb) / 1024.0,
                  mib(4.0 * static_cast<double>(n_head) * static_cast<double>(T) * static_cast<double>(T)));
    }
  }
  return 0;
}
