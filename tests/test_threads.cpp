// threads.hpp, parallel.hpp and detail/worker_team.hpp: the forwards give bitwise the same results
// on any number of threads, the task runner runs every task once and carries exceptions out, the
// workspace grows its per-thread scratch when the thread count grows, and the worker teams that
// decode steps run on start, wait, wake and survive fork() as they should.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/detail/parallel.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/models.hpp"
#include "support/sanitizers.hpp"
#include "support/thread_count.hpp"

namespace {
// Set in the forked children of WorkerTeam.AForkedChildRunsOnATeamOfItsOwn, which end through
// exit(): there LeakSanitizer (the asan build) would report the OpenMP runtime's state for the
// parent's threads, which do not exist in a child, as leaks.
std::atomic<bool> g_in_forked_child{false};
}  // namespace

// LeakSanitizer's hook: a non-zero return turns its check at exit off.
extern "C" int __lsan_is_turned_off() { return g_in_forked_child.load() ? 1 : 0; }

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::test::error_of;
using gpt2::test::Model;
using gpt2::test::random_input;
using gpt2::test::random_model;
using gpt2::test::ThreadCount;

// The thread counts a test compares: 1, 2 and 3 (more threads than this 2-core machine has, and
// an odd split of the columns) with OpenMP; 1 only without it.
std::vector<int> thread_counts() {
  if (!gpt2::kHasOpenMP) return {1};
  return {1, 2, 3};
}

template <class T>
class ThreadsTest : public ::testing::Test {};
TYPED_TEST_SUITE(ThreadsTest, gpt2::test::Scalars);

// Plain forward with probabilities, on shapes with several row tiles, a column count that does
// not split evenly and GPT-2 small's width.
TYPED_TEST(ThreadsTest, PlainForwardIsBitwiseTheSameOnAnyThreadCount) {
  using T = TypeParam;
  const ThreadCount restore;
  struct Case {
    Index C, n_head, T;
  };
  for (const Case c : {Case{8, 2, 5}, Case{96, 3, 130}, Case{768, 12, 200}}) {
    SCOPED_TRACE("C=" + std::to_string(c.C) + " T=" + std::to_string(c.T));
    const Model<T> m = random_model<T>(c.C, c.n_head, 11);
    const RowMatrix<T> x = random_input<T>(c.T, c.C, 12);
    RowMatrix<T> first_out, first_probs;
    for (const int n : thread_counts()) {
      SCOPED_TRACE("threads " + std::to_string(n));
      ASSERT_EQ(gpt2::set_num_threads(n), n);
      gpt2::Workspace<T> ws(m.config);
      RowMatrix<T> out(c.T, c.C), probs(c.n_head * c.T, c.T);
      gpt2::attention_forward<T>(m.weights(), x, ws, out, probs);
      EXPECT_GE(ws.thread_capacity(), n);
      if (first_out.size() == 0) {
        first_out = out;
        first_probs = probs;
        continue;
      }
      EXPECT_TRUE(out == first_out);
      EXPECT_TRUE(probs == first_probs);
    }
  }
}

// Prefill then decode through a cache, and a batched decode: same bits on any thread count.
TYPED_TEST(ThreadsTest, CachedAndBatchedForwardsAreBitwiseTheSameOnAnyThreadCount) {
  using T = TypeParam;
  const ThreadCount restore;
  const Index C = 128, n_head = 4, T_ = 70, prompt = 66, B = 3;
  const Model<T> m = random_model<T>(C, n_head, 13);
  const RowMatrix<T> x = random_input<T>(T_, C, 14);
  const RowMatrix<T> xb = random_input<T>(B, C, 15);
  RowMatrix<T> first_out, first_batch;
  for (const int n : thread_counts()) {
    SCOPED_TRACE("threads " + std::to_string(n));
    gpt2::set_num_threads(n);
    gpt2::KVCache<T> cache(m.config, T_);
    gpt2::Workspace<T> ws(m.config);
    RowMatrix<T> out(T_, C);
    gpt2::attention_forward<T>(m.weights(), x.topRows(prompt), cache, ws, out.topRows(prompt));
    for (Index t = prompt; t < T_; ++t)
      gpt2::attention_forward<T>(m.weights(), x.row(t), cache, ws, out.row(t));

    std::vector<gpt2::KVCache<T>> caches;
    for (Index b = 0; b < B; ++b) {
      caches.emplace_back(m.config, 8);
      const RowMatrix<T> past = random_input<T>(b + 1, C, 20 + static_cast<unsigned>(b));
      RowMatrix<T> ignored(b + 1, C);
      gpt2::attention_forward<T>(m.weights(), past, caches.back(), ws, ignored);
    }
    RowMatrix<T> batch_out(B, C);
    gpt2::attention_forward<T>(m.weights(), xb, gpt2::BatchLayout::full(B, 1), caches, ws, batch_out);

    if (first_out.size() == 0) {
      first_out = out;
      first_batch = batch_out;
      continue;
    }
    EXPECT_TRUE(out == first_out);
    EXPECT_TRUE(batch_out == first_batch);
  }
}

// A forward called from inside an OpenMP parallel region runs on its caller's thread only, and
// still gives the same bits.
TEST(Threads, ForwardInsideAParallelRegionRunsOnOneThread) {
  if (gpt2::kHasOpenMP && gpt2::test::kThreadSanitizer)
    GTEST_SKIP() << "skipped under ThreadSanitizer: this test opens an OpenMP region, and libgomp "
                    "is not instrumented (its own synchronisation would be reported as races)";
  const Model<float> m = random_model<float>(64, 4, 16);
  const RowMatrix<float> x = random_input<float>(100, 64, 17);
  const RowMatrix<float> expected = gpt2::attention(m.weights(), x);
  std::vector<RowMatrix<float>> outs(2);
  std::vector<int> counts(2, -1);
#ifdef _OPENMP
#pragma omp parallel num_threads(2)
#endif
  {
#ifdef _OPENMP
    const int id = omp_get_thread_num();
#else
    const int id = 0;
#endif
    if (id < 2) {
      counts[static_cast<std::size_t>(id)] = gpt2::num_threads();
      outs[static_cast<std::size_t>(id)] = gpt2::attention(m.weights(), x);
    }
  }
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (counts[i] == -1) continue;  // without OpenMP only thread 0 ran
    EXPECT_EQ(counts[i], 1);
    EXPECT_TRUE(outs[i] == expected);
  }
}

TEST(Threads, SetNumThreadsRejectsZeroAndNegativeCounts) {
  const ThreadCount restore;
  EXPECT_EQ(error_of<gpt2::ConfigError>([] { gpt2::set_num_threads(0); }),
            "threads: expected a count of at least 1, got 0");
  EXPECT_EQ(error_of<gpt2::ConfigError>([] { gpt2::set_num_threads(-3); }),
            "threads: expected a count of at least 1, got -3");
  EXPECT_EQ(gpt2::set_num_threads(1), 1);
  EXPECT_EQ(gpt2::num_threads(), 1);
}

TEST(Threads, WorkspaceGrowsItsThreadSlotsWithTheThreadCount) {
  if (!gpt2::kHasOpenMP) GTEST_SKIP() << "built without OpenMP";
  const ThreadCount restore;
  const Model<float> m = random_model<float>(64, 4, 18);
  const RowMatrix<float> x = random_input<float>(10, 64, 19);
  RowMatrix<float> out(10, 64);
  gpt2::set_num_threads(1);
  gpt2::Workspace<float> ws(m.config, 10);
  EXPECT_EQ(ws.thread_capacity(), 1);
  gpt2::set_num_threads(3);
  gpt2::attention_forward<float>(m.weights(), x, ws, out);
  EXPECT_EQ(ws.thread_capacity(), 3);
  EXPECT_EQ(ws.capacity(), 10);
  gpt2::set_num_threads(2);  // fewer threads: the slots stay
  gpt2::attention_forward<float>(m.weights(), x, ws, out);
  EXPECT_EQ(ws.thread_capacity(), 3);
  EXPECT_EQ(error_of<gpt2::ConfigError>([&] { ws.reserve(10, 10, 0); }),
            "threads: expected a count of at least 1, got 0");
}

TEST(ParallelTasks, RunsEveryTaskOnceWithThreadIndicesInRange) {
  for (const int n_threads : {1, 2, 4}) {
    for (const Index n_tasks : {Index(0), Index(1), Index(3), Index(100)}) {
      std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n_tasks));
      std::atomic<int> bad_thread{0};
      gpt2::detail::parallel_tasks(n_tasks, n_threads, [&](Index task, int thread) {
        runs[static_cast<std::size_t>(task)]++;
        if (thread < 0 || thread >= n_threads) bad_thread++;
      });
      for (Index t = 0; t < n_tasks; ++t) EXPECT_EQ(runs[static_cast<std::size_t>(t)], 1);
      EXPECT_EQ(bad_thread, 0);
    }
  }
}

TEST(ParallelTasks, RethrowsTheFirstExceptionAfterAllThreadsStop) {
  for (const int n_threads : {1, 2}) {
    std::atomic<int> started{0};
    EXPECT_THROW(gpt2::detail::parallel_tasks(1000, n_threads,
                                              [&](Index task, int) {
                                                started++;
                                                if (task == 3) throw std::runtime_error("task 3");
                                              }),
                 std::runtime_error);
    // On one thread the tasks after the failure never start. On several, how many others start
    // before the failure is seen is a matter of timing (they are skipped from then on), so only
    // the rethrow, after every thread has stopped, is certain.
    if (n_threads == 1) {
      EXPECT_EQ(started, 4);
    }
  }
}

// The steps of one region follow one another: every task of a step sees every task of the
// earlier steps done (here each task of step 2 sums all of step 1's writes).
TEST(ParallelSteps, RunEveryTaskOnceStepAfterStep) {
  for (const int n_threads : {1, 2, 4}) {
    const Index n = 37;
    std::vector<std::atomic<int>> first(static_cast<std::size_t>(n)), second(static_cast<std::size_t>(n));
    std::vector<int> sums(static_cast<std::size_t>(n), -1);
    std::atomic<int> bad_thread{0};
    std::vector<std::atomic<int>> ran(static_cast<std::size_t>(n_threads));
    gpt2::detail::parallel_steps(n_threads, [&](const gpt2::detail::Team& team) {
      team.tasks(n, [&](Index task, int thread) {
        // slow tasks: every thread takes some, and a missing barrier lets step 2 start early
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        first[static_cast<std::size_t>(task)] += static_cast<int>(task);
        if (thread < 0 || thread >= n_threads) bad_thread++;
        else ran[static_cast<std::size_t>(thread)]++;
      });
      team.tasks(n, [&](Index task, int thread) {
        int sum = 0;
        for (const std::atomic<int>& f : first) sum += f;
        sums[static_cast<std::size_t>(task)] = sum;
        second[static_cast<std::size_t>(task)]++;
        if (thread != team.thread()) bad_thread++;
      });
    });
    for (Index t = 0; t < n; ++t) {
      EXPECT_EQ(first[static_cast<std::size_t>(t)], t);
      EXPECT_EQ(second[static_cast<std::size_t>(t)], 1);
      EXPECT_EQ(sums[static_cast<std::size_t>(t)], n * (n - 1) / 2);
    }
    EXPECT_EQ(bad_thread, 0);
    int threads_that_ran = 0;
    for (const std::atomic<int>& r : ran) threads_that_ran += r > 0;
#ifdef _OPENMP
    if (n_threads > 1 && omp_get_thread_limit() > 1) {
      EXPECT_GE(threads_that_ran, 2) << n_threads;
    }
#endif
  }
}

// The team's own barrier over many steps, on more threads than the machine has cores (waiters
// then yield the CPU): every task of a step sees every task of the step before it done, and each
// task runs once per step (the task counter starts again from 0 after each barrier). At most 4
// threads: a team of 8 after smaller ones leaves 5760 bytes of clang's libomp for LeakSanitizer
// to report (the asan stage).
TEST(ParallelSteps, ManyStepsOnMoreThreadsThanCores) {
  for (const int n_threads : {2, 3, 4}) {
    const Index n = 5;
    const int steps = 300;
    std::vector<std::atomic<int>> done(static_cast<std::size_t>(n));
    std::atomic<int> early{0};
    gpt2::detail::parallel_steps(n_threads, [&](const gpt2::detail::Team& team) {
      for (int step = 0; step < steps; ++step)
        team.tasks(n, [&](Index task, int) {
          for (const std::atomic<int>& d : done) early += d.load() < step;
          done[static_cast<std::size_t>(task)]++;
        });
    });
    for (const std::atomic<int>& d : done) EXPECT_EQ(d.load(), steps) << n_threads << " threads";
    EXPECT_EQ(early.load(), 0) << n_threads << " threads";
  }
}

// A task that throws: the later steps' tasks never start, and the exception comes out of
// parallel_steps once every thread has stopped.
TEST(ParallelSteps, RethrowTheFirstExceptionAndSkipTheLaterSteps) {
  for (const int n_threads : {1, 2}) {
    std::atomic<int> later{0};
    EXPECT_THROW(gpt2::detail::parallel_steps(n_threads,
                                              [&](const gpt2::detail::Team& team) {
                                                team.tasks(100, [&](Index task, int) {
                                                  if (task == 3) throw std::runtime_error("task 3");
                                                });
                                                team.tasks(100, [&](Index, int) { later++; });
                                              }),
                 std::runtime_error);
    EXPECT_EQ(later, 0);
  }
}

// ---- WorkerTeam (detail/worker_team.hpp): the threads parallel_steps runs a decode step on ----

using gpt2::detail::WaitPolicy;
using gpt2::detail::WorkerTeam;
using Microseconds = std::chrono::microseconds;

// The ways a team's workers wait between calls: sleeping at once (OMP_WAIT_POLICY=PASSIVE, which
// the ctest presets set), spinning then yielding then sleeping (the default, with times short
// enough that the gaps between calls below cross each phase), and never sleeping (ACTIVE).
std::vector<WaitPolicy> wait_policies() {
  return {WaitPolicy{Microseconds(0), Microseconds(0), true},
          WaitPolicy{Microseconds(50), Microseconds(500), true},
          WaitPolicy{Microseconds(50), Microseconds(500), false}};
}

// run(n, f) calls f once on each of threads 0 .. n - 1 and no other, thread 0 on the caller and
// the others each on a thread of its own, whether the workers were spinning, yielding or asleep
// when it came (gaps of 0, 0.2 and 3 ms between calls), and with fewer threads than the team has.
// f's plain writes are seen by the caller once run returns.
TEST(WorkerTeam, RunsEachThreadOnceWithTheCallerAsThreadZero) {
  for (const WaitPolicy& policy : wait_policies()) {
    WorkerTeam team(3, policy);
    ASSERT_EQ(team.workers(), 3);
    for (int n = 1; n <= 4; ++n)
      for (const int gap_us : {0, 200, 3000}) {
        std::vector<int> ran(4, 0);
        std::vector<std::thread::id> who(4);
        team.run(n, [&](int thread) {
          ran[static_cast<std::size_t>(thread)]++;
          who[static_cast<std::size_t>(thread)] = std::this_thread::get_id();
        });
        for (int t = 0; t < 4; ++t)
          EXPECT_EQ(ran[static_cast<std::size_t>(t)], t < n ? 1 : 0)
              << "thread " << t << " of " << n << ", gap " << gap_us << " us";
        EXPECT_EQ(who[0], std::this_thread::get_id());
        const std::set<std::thread::id> distinct(who.begin(), who.begin() + n);
        EXPECT_EQ(distinct.size(), static_cast<std::size_t>(n)) << n << " threads";
        std::this_thread::sleep_for(Microseconds(gap_us));
      }
  }
}

// The n calls of one run are under way at the same time (each waits for all to have started):
// a team that ran them one after another would time out here.
TEST(WorkerTeam, ItsThreadsRunAtOnce) {
  for (const WaitPolicy& policy : wait_policies()) {
    WorkerTeam team(2, policy);
    std::atomic<int> started{0}, timed_out{0};
    team.run(3, [&](int) {
      started++;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (started.load() < 3) {
        if (std::chrono::steady_clock::now() > deadline) {
          timed_out++;
          return;
        }
        std::this_thread::yield();
      }
    });
    EXPECT_EQ(timed_out.load(), 0);
  }
}

// Each calling thread has a team of its own, kept between calls and remade larger when a call
// wants more workers than it has.
TEST(WorkerTeam, EachCallingThreadHasItsOwnTeamGrownOnDemand) {
  WorkerTeam* const a = WorkerTeam::of_this_thread(1);
  ASSERT_NE(a, nullptr);
  const int had = a->workers();
  EXPECT_GE(had, 1);
  EXPECT_EQ(WorkerTeam::of_this_thread(1), a);
  WorkerTeam* const b = WorkerTeam::of_this_thread(had + 2);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->workers(), had + 2);
  EXPECT_EQ(WorkerTeam::of_this_thread(had), b);
  std::atomic<int> others_own{0};
  std::thread other([&] {
    WorkerTeam* const c = WorkerTeam::of_this_thread(1);
    others_own = c != nullptr && c != b && c == WorkerTeam::of_this_thread(1);
  });
  other.join();
  EXPECT_EQ(others_own.load(), 1);
}

// OMP_WAIT_POLICY sets how a team's workers wait, as it does for OpenMP's threads.
TEST(WorkerTeam, FollowsOmpWaitPolicy) {
  const char* was = std::getenv("OMP_WAIT_POLICY");
  const std::string saved = was ? was : "";
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  const WaitPolicy passive = WaitPolicy::from_environment();
  EXPECT_TRUE(passive.sleep);
  EXPECT_EQ(passive.total.count(), 0);
  ::setenv("OMP_WAIT_POLICY", "active", 1);
  EXPECT_FALSE(WaitPolicy::from_environment().sleep);
  ::unsetenv("OMP_WAIT_POLICY");
  const WaitPolicy fallback = WaitPolicy::from_environment();
  EXPECT_TRUE(fallback.sleep);
  EXPECT_GT(fallback.pause.count(), 0);
  EXPECT_GT(fallback.total, fallback.pause);
  if (was) ::setenv("OMP_WAIT_POLICY", saved.c_str(), 1);
}

// After fork() the child's calling thread has no workers (they are the parent's threads): its
// multi-threaded steps run on a new team of its own instead of waiting forever for the old one.
TEST(WorkerTeam, AForkedChildRunsOnATeamOfItsOwn) {
  if (!gpt2::kHasOpenMP) GTEST_SKIP() << "built without OpenMP: parallel_steps runs on one thread";
  if (gpt2::test::kThreadSanitizer)
    GTEST_SKIP() << "skipped under ThreadSanitizer: it does not support starting threads in the "
                    "child of a multi-threaded process";
  std::atomic<int> ran{0};
  const auto count_tasks = [&](const gpt2::detail::Team& team) {
    team.tasks(16, [&](Index, int) { ran++; });
  };
  gpt2::detail::parallel_steps(2, count_tasks);  // the parent's team, used
  ASSERT_EQ(ran.load(), 16);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // its worker may sleep by now
  // Two children: one runs a step, one runs nothing; both end through exit(), which destroys the
  // calling thread's team holder (a child that stopped the parent's team there would wait forever
  // for threads it does not have).
  for (const bool step : {true, false}) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) {
      ::alarm(30);  // a child stuck on the parent's team dies of SIGALRM
      g_in_forked_child = true;
      ran = 0;
      if (step) gpt2::detail::parallel_steps(2, count_tasks);
      std::exit(!step || ran.load() == 16 ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << (step ? "a child that ran a step: " : "a child that ran nothing: ")
        << (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                : "exit status " + std::to_string(WEXITSTATUS(status)));
  }
}

// A task that itself calls the task runner (no forward does; a caller's code might) runs the
// inner tasks on its own thread instead of handing them to the team it is part of.
TEST(WorkerTeam, AParallelCallInsideATaskRunsOnItsThread) {
  std::atomic<int> inner{0}, outer{0};
  gpt2::detail::parallel_tasks(4, 2, [&](Index, int) {
    outer++;
    gpt2::detail::parallel_tasks(8, 2, [&](Index, int thread) { inner += thread == 0; });
  });
  EXPECT_EQ(outer.load(), 4);
  EXPECT_EQ(inner.load(), 32);
}

TEST(ColumnPart, CoversTheRangeWithAlignedBoundaries) {
  for (const Index n : {Index(0), Index(1), Index(24), Index(768), Index(2304), Index(1000)})
    for (const Index parts : {Index(1), Index(2), Index(3), Index(7)}) {
      Index next = 0;
      for (Index p = 0; p < parts; ++p) {
        const gpt2::detail::ColumnRange r = gpt2::detail::column_part(n, p, parts, 64);
        EXPECT_EQ(r.begin, next) << "n " << n << " parts " << parts << " part " << p;
        EXPECT_TRUE(r.begin % 64 == 0 || r.begin == n);
        EXPECT_GE(r.size(), 0);
        next = r.end;
      }
      EXPECT_EQ(next, n);
    }
}

}  // namespace
