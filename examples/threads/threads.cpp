// gpt2_threads: choosing how many threads the forwards use, and checking that the count changes
// the speed only, never a bit of the result.   gpt2_threads [N]
//
// The count: set_num_threads(N) (this program's argument), or the environment variable
// OMP_NUM_THREADS (`OMP_NUM_THREADS=4 gpt2_threads`), else OpenMP's default, one per core. Without
// OpenMP (GPT2_ATTENTION_OPENMP=OFF, or no -fopenmp) everything runs on the calling thread.
// Times one forward of GPT-2 small's shape at 1 thread and at N; exit status 1 unless the two
// outputs are bitwise identical.
#include <gpt2/attention.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using gpt2::Index;
using Mat = gpt2::RowMatrix<float>;

// Median time of 7 forwards x [T, C] -> out [T, C] on the threads the count allows.
double median_ms(const gpt2::AttentionWeights<float>& w, const Mat& x, gpt2::Workspace<float>& ws,
                 Mat& out) {
  std::vector<double> ms;
  for (int run = 0; run < 8; ++run) {
    const auto start = std::chrono::steady_clock::now();
    gpt2::attention_forward<float>(w, x, ws, out);
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    if (run > 0) ms.push_back(took.count());  // the first run warms up
  }
  std::nth_element(ms.begin(), ms.begin() + 3, ms.end());
  return ms[3];
}

int main(int argc, char** argv) {
  // GPT-2 small's shape (C = 768, 12 heads of 64), pseudo-random weights; x [T, C], T = 256.
  const gpt2::AttentionConfig config{768, 12};
  const Mat c_attn_w = Mat::Random(768, 2304) * 0.05f, c_proj_w = Mat::Random(768, 768) * 0.05f;
  const gpt2::RowVector<float> c_attn_b = gpt2::RowVector<float>::Random(2304) * 0.05f;
  const gpt2::RowVector<float> c_proj_b = gpt2::RowVector<float>::Random(768) * 0.05f;
  // pack_weights: one copy into the kernels' panel layout, made once for every forward below
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(gpt2::AttentionWeights<float>(
      config, gpt2::view(c_attn_w), gpt2::view(c_attn_b), gpt2::view(c_proj_w), gpt2::view(c_proj_b)));
  const Mat x = Mat::Random(256, 768);

  // What this thread's forwards would use now: OMP_NUM_THREADS or OpenMP's default (1 without it).
  const char* env = std::getenv("OMP_NUM_THREADS");
  std::printf("OpenMP: %s; OMP_NUM_THREADS=%s; num_threads() = %d\n", gpt2::kHasOpenMP ? "on" : "off",
              env ? env : "(unset)", gpt2::num_threads());
  const int wanted = argc > 1 ? std::atoi(argv[1]) : gpt2::num_threads();

  // Weights are shared read-only; a Workspace belongs to one calling thread (each forward's own
  // worker threads are the library's business). Outputs [T, C], one per thread count.
  gpt2::Workspace<float> ws(config, x.rows());
  Mat out_1(x.rows(), 768), out_n(x.rows(), 768);
  gpt2::set_num_threads(1);
  const double ms_1 = median_ms(w, x, ws, out_1);
  const int used = gpt2::set_num_threads(std::max(wanted, 1));  // n with OpenMP, 1 without
  const double ms_n = median_ms(w, x, ws, out_n);

  const bool same = std::memcmp(out_1.data(), out_n.data(), sizeof(float) * out_1.size()) == 0;
  std::printf("forward [256, 768]: %.2f ms on 1 thread, %.2f ms on %d (x%.2f); bitwise identical: %s\n",
              ms_1, ms_n, used, ms_1 / ms_n, same ? "yes" : "NO");
  return same && out_1.allFinite() ? 0 : 1;
}
