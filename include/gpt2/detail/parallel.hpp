// How the forwards spread work over threads (see threads.hpp): independent tasks handed out one
// at a time, steps of tasks with a barrier between them, and column ranges of a product, run on the
// calling thread's WorkerTeam (detail/worker_team.hpp). Internal (namespace detail).
//
// Every task writes its own part of the output with the same arithmetic whichever thread runs it,
// so results do not depend on the number of threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "gpt2/detail/worker_team.hpp"
#include "gpt2/threads.hpp"
#include "gpt2/types.hpp"

namespace gpt2::detail {

// What the parallel runners below share: f(task, thread) run unless an earlier task has failed,
// and the first exception kept (rethrow() once every thread has stopped: an exception may not
// leave a worker's thread).
class TaskFailure {
 public:
  template <class F>
  void run(Index task, int thread, const F& f) {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      f(task, thread);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  // After every thread has stopped.
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::exception_ptr error_;
};

// The calling thread's WorkerTeam (detail/worker_team.hpp) with room for n_threads threads, or
// null when the work runs on the calling thread alone: one thread, no OpenMP (the switch for
// threads), the OS refusing threads, or a call from inside a team's work.
inline WorkerTeam* team_for(int n_threads) {
#ifdef _OPENMP
  if (n_threads > 1) return WorkerTeam::of_this_thread(n_threads - 1);
#endif
  (void)n_threads;
  return nullptr;
}

// f(task, thread) for every task in [0, n_tasks), on up to n_threads threads (the calling
// thread's WorkerTeam; the calling thread alone where team_for says so); `thread` is in
// [0, n_threads) and no two tasks run at once with the same `thread`, so it can index per-thread
// scratch. Tasks are handed out in increasing order, one at a time (put the longest first). If a
// task throws, the tasks not yet started are skipped and the first exception is rethrown here once
// every thread has stopped.
template <class F>
void parallel_tasks(Index n_tasks, int n_threads, const F& f) {
  if (n_tasks <= 0) return;
  const int threads = static_cast<int>(std::min<Index>(std::max(n_threads, 1), n_tasks));
  WorkerTeam* const team = team_for(threads);
  if (team == nullptr) {
    for (Index task = 0; task < n_tasks; ++task) f(task, 0);
    return;
  }
  TaskFailure failure;
  std::atomic<Index> next{0};
  team->run(threads, [&](int thread) {
    for (Index task = next.fetch_add(1, std::memory_order_relaxed); task < n_tasks;
         task = next.fetch_add(1, std::memory_order_relaxed))
      failure.run(task, thread, f);
  });
  failure.rethrow();
}

// Steps that follow one another on the same threads, on the calling thread's WorkerTeam
// (team_for; detail/worker_team.hpp: the library's own threads, kept between calls): a decode
// step's three steps pay for no thread start or wake-up.
// parallel_steps(n_threads, f) calls f(team) on each of n_threads threads (f must be safe to call
// concurrently); inside, team.tasks(n, g) runs g(task, thread) for every task in [0, n), handed
// out one at a time in increasing order, once every thread has finished the tasks of the step
// before (a barrier between steps; the return waits for the last step's, so the last one pays no
// barrier of its own). What a step wrote is seen by the next step's tasks and after parallel_steps
// returns, not by code between two team.tasks calls. Every thread must make the same team.tasks
// calls in the same order. If a task throws, the tasks not yet started, in this step and the later
// ones, are skipped and the first exception is rethrown by parallel_steps once every thread has
// stopped. f itself, outside its tasks, must not throw (terminate).
//
// The hand-out and the barrier are the team's own (an atomic counter; arrivals counted, the last
// one opens the next generation), not OpenMP's `for` and barrier: libgomp's barrier makes a
// futex_wake system call at every release, which a decode step's short steps pay for in full in a
// virtual machine (measured: bench/results/history-speed.md). Waiting threads spin, then yield the
// CPU between polls once a wait grows long (more threads than cores).
class StepBarrier {
 public:
  // The team's size, set by each of its threads before it first arrives (all with the same
  // value: the team's size is known only inside the region, and no barrier is needed to share it).
  void set_threads(int threads) { threads_.store(threads, std::memory_order_relaxed); }

  // The next task of the current step (>= n once they are all handed out).
  Index next_task() { return next_.fetch_add(1, std::memory_order_relaxed); }

  // Returns once all threads have called it (each thread's writes before it are seen by every
  // thread after it); the task counter starts again from 0 for the next step.
  void arrive_and_wait() {
    const unsigned generation = generation_.load(std::memory_order_acquire);
    const int threads = threads_.load(std::memory_order_relaxed);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == threads - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      next_.store(0, std::memory_order_relaxed);
      generation_.store(generation + 1, std::memory_order_release);
      return;
    }
    for (long spins = 0; generation_.load(std::memory_order_acquire) == generation; ++spins) {
      if (spins < kSpinsBeforeYield)
        pause();
      else
        std::this_thread::yield();
    }
  }

 private:
  static constexpr long kSpinsBeforeYield = 1L << 16;  // a few hundred microseconds
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  std::atomic<int> threads_{0};
  alignas(64) std::atomic<Index> next_{0};
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<unsigned> generation_{0};
};

class Team {
 public:
  int thread() const { return thread_; }

  template <class G>
  void tasks(Index n_tasks, const G& g) const {
    if (barrier_ == nullptr) {
      for (Index task = 0; task < n_tasks; ++task) run(task, g);
      return;
    }
    if (step_before_) barrier_->arrive_and_wait();  // every thread done with the step before
    for (Index task = barrier_->next_task(); task < n_tasks; task = barrier_->next_task())
      run(task, g);
    step_before_ = true;
  }

 private:
  template <class F>
  friend void parallel_steps(int n_threads, const F& f);
  Team(int thread, StepBarrier* barrier, TaskFailure* failure)
      : thread_(thread), barrier_(barrier), failure_(failure) {}

  template <class G>
  void run(Index task, const G& g) const {
    failure_->run(task, thread_, g);
  }

  int thread_;
  StepBarrier* barrier_;  // null on one thread
  TaskFailure* failure_;
  mutable bool step_before_ = false;  // this thread has run a step: the next one waits for it
};

template <class F>
void parallel_steps(int n_threads, const F& f) {
  TaskFailure failure;
  if (WorkerTeam* const team = team_for(n_threads)) {
    StepBarrier barrier;
    barrier.set_threads(n_threads);  // the team has room for all of them (team_for)
    team->run(n_threads, [&](int thread) { f(Team(thread, &barrier, &failure)); });
  } else {
    f(Team(0, nullptr, &failure));
  }
  failure.rethrow();
}

// Makes sure the calling thread's WorkerTeam has the workers n_threads threads need (nothing
// without OpenMP, on one thread, or inside a parallel region, where forwards run on one thread).
inline void start_worker_team(int n_threads) {
#ifdef _OPENMP
  if (!omp_in_parallel()) (void)team_for(n_threads);
#else
  (void)n_threads;
#endif
}

// Columns [begin, end) of part `part` of n_parts near-equal parts of [0, n), with every boundary
// but n a multiple of `align` (so each part starts where a vectorized loop over [0, n) would
// have a packet boundary). Trailing parts may be empty.
struct ColumnRange {
  Index begin = 0, end = 0;
  Index size() const { return end - begin; }
};

inline ColumnRange column_part(Index n, Index part, Index n_parts, Index align) {
  const Index blocks = (n + align - 1) / align;  // blocks of `align` columns, the last short
  const Index per = blocks / n_parts, extra = blocks % n_parts;
  const Index first = part * per + std::min(part, extra);
  const Index count = per + (part < extra ? 1 : 0);
  return {std::min(n, first * align), std::min(n, (first + count) * align)};
}

}  // namespace gpt2::detail
