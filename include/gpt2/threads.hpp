// Threads: how many the forwards use, and how to choose it.
//
// The forwards (plain, cached, batched) spread their work over threads when the code that
// includes this library is compiled with OpenMP: link gpt2::attention in a build configured with
// GPT2_ATTENTION_OPENMP=ON (the default when CMake finds OpenMP), or compile with -fopenmp
// yourself. Without OpenMP everything runs on the calling thread and the library needs nothing
// but Eigen. Results are bitwise the same for every thread count.
//
// The count follows OpenMP's rules: OMP_NUM_THREADS, or set_num_threads() below, which (like
// omp_set_num_threads) applies to the forwards the calling thread runs from then on. A forward
// called from inside another OpenMP parallel region runs on its caller's thread only.
//
// The threads themselves are the library's own, not OpenMP's: each thread that calls forwards
// keeps a team of num_threads() - 1 workers, started by the first Workspace it makes or reserves
// (or its first multi-threaded forward) and joined when it exits. Between forwards the workers
// wait as OMP_WAIT_POLICY says: by default they poll for 100 us, yield the CPU between polls up to
// 2 ms, then sleep; PASSIVE: they sleep at once; ACTIVE: they never sleep. So a decode step pays
// no thread start-up or wake-up (detail/worker_team.hpp says why not OpenMP's regions). A forked
// child makes its teams anew. If the OS refuses a thread, the forwards run on the calling thread.
//
// Every translation unit of a program must agree on whether OpenMP is on (one binary, one setting),
// as for any header-only library whose code depends on a compiler flag.
#pragma once

#include <string>

#include "gpt2/error.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace gpt2 {

// True when this code is compiled with OpenMP, so a forward can use more than one thread.
inline constexpr bool kHasOpenMP =
#ifdef _OPENMP
    true;
#else
    false;
#endif

// The number of threads the next forward called from this thread will use: 1 without OpenMP, 1
// inside an enclosing parallel region, else omp_get_max_threads().
inline int num_threads() {
#ifdef _OPENMP
  return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  return 1;
#endif
}

// Sets the number of threads the forwards called from this thread use from now on (n >= 1, else
// ConfigError) and returns the number they will actually use: n with OpenMP, 1 without it.
inline int set_num_threads(int n) {
  if (n < 1)
    throw ConfigError("threads: expected a count of at least 1, got " + std::to_string(n));
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
  return num_threads();
}

}  // namespace gpt2
