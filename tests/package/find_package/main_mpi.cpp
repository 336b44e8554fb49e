// A program built against an installed gpt2-attention with the mpi component (find_package
// COMPONENTS mpi): the header compiles against MPI and the head split of GPT-2 XL's 25 heads over
// 3 ranks is 9, 8, 8 (no MPI_Init needed for that).
#include <gpt2/tensor_parallel.hpp>

#include <cstdio>

int main() {
  const gpt2::Index expected_begin[3] = {0, 9, 17}, expected_count[3] = {9, 8, 8};
  for (int r = 0; r < 3; ++r) {
    const gpt2::HeadRange h = gpt2::heads_of_rank(25, r, 3);
    if (h.begin != expected_begin[r] || h.count != expected_count[r]) {
      std::fprintf(stderr, "rank %d: heads [%td, %td), expected [%td, %td)\n", r, h.begin, h.end(),
                   expected_begin[r], expected_begin[r] + expected_count[r]);
      return 1;
    }
  }
  std::printf("find_package mpi consumer: ok\n");
  return 0;
}
