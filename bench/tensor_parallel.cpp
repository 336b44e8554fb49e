// gpt2_tensor_parallel [reps] [T]: the tensor-parallel sublayer (gpt2/tensor_parallel.hpp) against
// the single-process one, in the same run, on a GPT-2 small layer (C = 768, 12 heads, fp32, the
// random weights of gpt2_small_layer.hpp):
//   prefill   one forward over T tokens (default 1024)
//   decode    one token with T - 1 positions cached (default: past 1023)
// each as R ranks x 1 thread (the heads split over the ranks, one all-reduce of out) and as
// 1 rank x R threads (rank 0 alone with R OpenMP threads while the other ranks sleep), in
// alternation, reps times (default 10; a decode rep is 64 steps); medians. Also the all-reduce's
// share of a tensor-parallel forward (its time as MPI_Wtime sees it inside the forward, waiting for
// the slowest rank included, over the forward's time) and an all-reduce of the same [T, C] or
// [1, C] buffer alone.
//   OMP_NUM_THREADS=1 mpiexec -n 2 --bind-to none build/release/bench/gpt2_tensor_parallel
// (--bind-to none: else Open MPI pins each rank to one core, and the R-thread baseline with it.)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/tensor_parallel.hpp"
#include "gpt2_small_layer.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double fastest(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

// The slowest rank's value (a forward is over when every rank is done).
double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

// Rank 0 runs f() alone while the other ranks wait without spinning (they poll a non-blocking
// barrier every 0.2 ms, so rank 0's threads have the other cores); returns rank 0's seconds.
template <class F>
double on_rank0_alone(int rank, const F& f) {
  double seconds = 0;
  if (rank == 0) {
    const double start = MPI_Wtime();
    f();
    seconds = MPI_Wtime() - start;
  }
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done && rank != 0) {
      const timespec pause{0, 200000};
      nanosleep(&pause, nullptr);
    }
  }
  MPI_Bcast(&seconds, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n_ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const Index T_ = argc > 2 ? std::atoll(argv[2]) : 1024;
  if (reps < 1 || T_ < 2) {
    if (rank == 0) std::fprintf(stderr, "usage: mpiexec -n R gpt2_tensor_parallel [reps >= 1] [T >= 2]\n");
    MPI_Finalize();
    return 2;
  }
  constexpr int kDecodeSteps = 64;
  const Index C = gpt2::bench::Gpt2SmallLayer::kC;
  const gpt2::bench::Gpt2SmallLayer layer(1);  // the same rand() sequence on every rank
  const gpt2::AttentionWeights<float> w = layer.weights();
  std::srand(2);
  const RowMatrix<float> x = RowMatrix<float>::Random(T_, C);
  RowMatrix<float> out(T_, C);

  {
    gpt2::set_num_threads(1);
    gpt2::TensorParallelAttention<float> tp(w, MPI_COMM_WORLD);
    gpt2::Workspace<float> tp_ws = tp.workspace(T_);
    gpt2::KVCache<float> tp_cache = tp.cache(T_);
    gpt2::attention_forward<float>(tp, x.topRows(T_ - 1), tp_cache, tp_ws, out.topRows(T_ - 1));
    // rank 0's single-process state (R threads)
    gpt2::Workspace<float> ws(w.config());
    gpt2::KVCache<float> cache(w.config(), rank == 0 ? T_ : 0);
    if (rank == 0) {
      gpt2::set_num_threads(n_ranks);
      ws.reserve(T_, T_);
      gpt2::attention_forward<float>(w, x.topRows(T_ - 1), cache, ws, out.topRows(T_ - 1));
      gpt2::set_num_threads(1);
    }
    RowMatrix<float> buffer = RowMatrix<float>::Zero(T_, C);

    std::vector<double> tp_prefill, single_prefill, tp_decode, single_decode, share_prefill,
        share_decode, reduce_prefill, reduce_decode;
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0: warm-up, not recorded
      // prefill, tensor parallel
      MPI_Barrier(MPI_COMM_WORLD);
      tp.reset_times();
      double start = MPI_Wtime();
      gpt2::attention_forward<float>(tp, x, tp_ws, out);
      const double tp_p = max_over_ranks(MPI_Wtime() - start);
      const double share_p = max_over_ranks(tp.reduce_seconds()) / tp_p;
      // prefill, one process
      const double single_p = on_rank0_alone(rank, [&] {
        gpt2::set_num_threads(n_ranks);
        gpt2::attention_forward<float>(w, x, ws, out);
        gpt2::set_num_threads(1);
      });
      // decode past T - 1, tensor parallel
      MPI_Barrier(MPI_COMM_WORLD);
      tp.reset_times();
      start = MPI_Wtime();
      for (int s = 0; s < kDecodeSteps; ++s) {
        tp_cache.truncate(T_ - 1);
        gpt2::attention_forward<float>(tp, x.bottomRows(1), tp_cache, tp_ws, out.topRows(1));
      }
      const double tp_d = max_over_ranks(MPI_Wtime() - start) / kDecodeSteps;
      const double share_d = max_over_ranks(tp.reduce_seconds()) / kDecodeSteps / tp_d;
      // decode, one process
      const double single_d = on_rank0_alone(rank, [&] {
        gpt2::set_num_threads(n_ranks);
        for (int s = 0; s < kDecodeSteps; ++s) {
          cache.truncate(T_ - 1);
          gpt2::attention_forward<float>(w, x.bottomRows(1), cache, ws, out.topRows(1));
        }
        gpt2::set_num_threads(1);
      }) / kDecodeSteps;
      // the all-reduces alone
      MPI_Barrier(MPI_COMM_WORLD);
      start = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(buffer.size()), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      const double reduce_p = max_over_ranks(MPI_Wtime() - start);
      MPI_Barrier(MPI_COMM_WORLD);
      start = MPI_Wtime();
      for (int s = 0; s < kDecodeSteps; ++s)
        MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(C), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      const double reduce_d = max_over_ranks(MPI_Wtime() - start) / kDecodeSteps;
      if (rep == 0) continue;
      tp_prefill.push_back(tp_p);
      single_prefill.push_back(single_p);
      tp_decode.push_back(tp_d);
      single_decode.push_back(single_d);
      share_prefill.push_back(share_p);
      share_decode.push_back(share_d);
      reduce_prefill.push_back(reduce_p);
      reduce_decode.push_back(reduce_d);
    }
    if (rank == 0) {
      std::printf("GPT-2 small layer (C %td, 12 heads, fp32), %d reps: median (fastest)\n", C, reps);
      std::printf("| phase | %d ranks x 1 thread | 1 rank x %d threads | speed-up (medians) | "
                  "all-reduce share of the TP forward | all-reduce alone |\n", n_ranks, n_ranks);
      std::printf("|---|---|---|---|---|---|\n");
      std::printf("| prefill T=%td | %.2f (%.2f) ms | %.2f (%.2f) ms | %.2fx | %.1f %% | %.3f (%.3f) ms, [%td, %td] |\n",
                  T_, 1e3 * median(tp_prefill), 1e3 * fastest(tp_prefill), 1e3 * median(single_prefill),
                  1e3 * fastest(single_prefill), median(single_prefill) / median(tp_prefill),
                  100 * median(share_prefill), 1e3 * median(reduce_prefill), 1e3 * fastest(reduce_prefill), T_, C);
      std::printf("| decode past %td | %.1f (%.1f) us | %.1f (%.1f) us | %.2fx | %.1f %% | %.1f (%.1f) us, [1, %td] |\n",
                  T_ - 1, 1e6 * median(tp_decode), 1e6 * fastest(tp_decode), 1e6 * median(single_decode),
                  1e6 * fastest(single_decode), median(single_decode) / median(tp_decode),
                  100 * median(share_decode), 1e6 * median(reduce_decode), 1e6 * fastest(reduce_decode), C);
    }
  }
  MPI_Finalize();
  return 0;
}
