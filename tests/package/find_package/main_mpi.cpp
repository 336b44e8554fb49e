// A program built against an installed gpt2-attention with the mpi component (find_package
// COMPONENTS mpi): the header compiles against MPI, the head split of GPT-2 XL's 25 heads over
// 3 ranks is 9, 8, 8, and, on one rank (MPI_Init without mpiexec), a shard's forwards (compiled in
// libgpt2_attention_mpi.a: a missing one fails the link) give what the plain forwards give.
#include <gpt2/attention.hpp>
#include <gpt2/tensor_parallel.hpp>

#include <cstdio>
#include <exception>
#include <vector>

#include "../common/small_model.hpp"

namespace {

// The shard of one rank (every head) against the weights: one forward, and a batch of two
// sequences through KV caches.
int shard_matches_weights() {
  using gpt2::Index;
  using gpt2::RowMatrix;
  const RowMatrix<float> c_attn_w = RowMatrix<float>::Random(64, 192);
  const gpt2::RowVector<float> c_attn_b = gpt2::RowVector<float>::Random(192);
  const RowMatrix<float> c_proj_w = RowMatrix<float>::Random(64, 64);
  const gpt2::RowVector<float> c_proj_b = gpt2::RowVector<float>::Random(64);
  const gpt2::AttentionWeights<float> w(consumer::kConfig, gpt2::view(c_attn_w),
                                        gpt2::view(c_attn_b), gpt2::view(c_proj_w),
                                        gpt2::view(c_proj_b));
  const gpt2::TensorParallelAttention<float> tp(w, MPI_COMM_WORLD);
  const RowMatrix<float> x = RowMatrix<float>::Random(2 * consumer::kT, 64);

  RowMatrix<float> want(x.rows(), 64), got(x.rows(), 64);
  gpt2::Workspace<float> ws(w.config(), x.rows());
  gpt2::attention_forward<float>(w, x, ws, want);
  gpt2::Workspace<float> tp_ws = tp.workspace(x.rows());
  gpt2::attention_forward<float>(tp, x, tp_ws, got);
  if (!got.isApprox(want, 1e-5f)) {
    std::fprintf(stderr, "one rank's shard: the forward differs from the weights' forward\n");
    return 1;
  }

  const gpt2::BatchLayout batch = gpt2::BatchLayout::full(2, consumer::kT);
  std::vector<gpt2::KVCache<float>> caches, tp_caches;
  for (int b = 0; b < 2; ++b) {
    caches.emplace_back(w.config(), consumer::kT);
    tp_caches.push_back(tp.cache(consumer::kT));
  }
  gpt2::attention_forward<float>(w, x, batch, caches, ws, want);
  gpt2::attention_forward<float>(tp, x, batch, tp_caches, tp_ws, got);
  if (!got.isApprox(want, 1e-5f)) {
    std::fprintf(stderr, "one rank's shard: the batch forward differs from the weights'\n");
    return 1;
  }
  std::printf("find_package mpi consumer: one rank's shard matches the weights\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const gpt2::Index expected_begin[3] = {0, 9, 17}, expected_count[3] = {9, 8, 8};
  for (int r = 0; r < 3; ++r) {
    const gpt2::HeadRange h = gpt2::heads_of_rank(25, r, 3);
    if (h.begin != expected_begin[r] || h.count != expected_count[r]) {
      std::fprintf(stderr, "rank %d: heads [%td, %td), expected [%td, %td)\n", r, h.begin, h.end(),
                   expected_begin[r], expected_begin[r] + expected_count[r]);
      return 1;
    }
  }
  std::printf("find_package mpi consumer: head split ok\n");
  MPI_Init(&argc, &argv);
  int status = 1;
  try {
    status = shard_matches_weights();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "find_package mpi consumer: %s\n", e.what());
  }
  MPI_Finalize();
  return status;
}
