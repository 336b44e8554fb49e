// WorkerTeam: the library's own threads, which run a forward's parallel work (parallel.hpp's
// parallel_tasks and parallel_steps) and are kept from one call to the next. Internal.
//
// Why not an OpenMP region per call: libgomp's region start and end each make a futex_wake system
// call and touch team structures that a decode step's streaming has pushed out of cache: a large
// share of a decode step in a virtual machine, which a team whose workers spin between calls does
// not pay (bench/results/history-speed.md, "Decode steps on the library's own threads").
//
// Each thread that runs forwards has a team of its own (WorkerTeam::of_this_thread), made on its
// first use with num_threads() - 1 workers (Workspace::reserve makes it, so that the forwards
// themselves allocate nothing) and remade larger when a later call wants more workers; the caller
// is always thread 0 and works too. New workers sleep until the first call. Between calls they
// wait as OMP_WAIT_POLICY says, as libgomp's threads do (WaitPolicy): by default they poll with a
// CPU pause for 100 us, then yield the CPU between polls until 2 ms, then sleep until a call wakes
// them; PASSIVE: they sleep at once; ACTIVE: they never sleep. A call that finds no worker asleep
// makes no system call. OMP_PROC_BIND and OMP_PLACES do not apply to them.
//
// A call for fewer threads than the team has leaves the other workers alone (the call's thread
// count travels with its number in one atomic word). If the OS refuses a thread, or a team's own
// thread asks for a team (a parallel call inside a task), of_this_thread gives none and the work
// runs on the calling thread. A team's workers are joined when its thread exits (at exit() for the
// main thread). After fork() a child's teams are abandoned, never stopped (their threads, and
// anything waiting on their condition variables, do not exist there), and new ones are made.
#pragma once

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

namespace gpt2::detail {

// How a waiting thread waits: spin with a CPU pause between polls for `pause`, then yield the CPU
// between polls until `total`, then (if `sleep`) block until woken.
struct WaitPolicy {
  std::chrono::microseconds pause{100};
  std::chrono::microseconds total{2000};
  bool sleep = true;

  // OMP_WAIT_POLICY's: unset (the default above), ACTIVE (never sleep), PASSIVE (sleep at once).
  static WaitPolicy from_environment() {
    WaitPolicy p;
    const char* env = std::getenv("OMP_WAIT_POLICY");
    std::string v = env ? env : "";
    for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (v == "passive") {
      p.pause = p.total = std::chrono::microseconds(0);
    } else if (v == "active") {
      p.sleep = false;
    }
    return p;
  }
};

inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Increases in a child process after every fork(): a team made before it has no threads there.
inline std::atomic<unsigned>& fork_generation() {
  static std::atomic<unsigned> generation{0};
#if defined(__unix__) || defined(__APPLE__)
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { fork_generation().fetch_add(1); });
    return true;
  }();
  (void)registered;
#endif
  return generation;
}

class WorkerTeam {
 public:
  // Starts `workers` threads (none if 0). If the OS refuses one, the ones started are stopped and
  // the exception (std::system_error) propagates.
  explicit WorkerTeam(int workers, WaitPolicy policy = WaitPolicy::from_environment())
      : policy_(policy), fork_generation_(fork_generation().load()) {
    threads_.reserve(static_cast<std::size_t>(std::max(workers, 0)));
    try {
      for (int i = 1; i <= workers; ++i) threads_.emplace_back([this, i] { work(i); });
    } catch (...) {
      stop();
      throw;
    }
  }
  WorkerTeam(const WorkerTeam&) = delete;
  WorkerTeam& operator=(const WorkerTeam&) = delete;
  ~WorkerTeam() { stop(); }

  int workers() const { return static_cast<int>(threads_.size()); }
  bool made_before_fork() const { return fork_generation_ != fork_generation().load(); }

  // f(thread) for every thread in [0, n_threads), 1 <= n_threads <= workers() + 1 (checked by the
  // caller): thread 0 on the caller, the others on workers 1 .. n_threads - 1, at once; returns
  // when every call has returned (their writes are then seen by the caller). Workers from
  // n_threads on take no part: they neither run f nor are waited for. f must not throw
  // (std::terminate).
  template <class F>
  void run(int n_threads, const F& f) noexcept {
    if (n_threads <= 1) {
      f(0);
      return;
    }
    InsideTeam inside;
    job_ = [](const void* fn, int thread) { (*static_cast<const F*>(fn))(thread); };
    job_arg_ = &f;
    finished_.store(0, std::memory_order_relaxed);
    publish(static_cast<std::uint64_t>(n_threads));  // the job, with its thread count
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    f(0);
    // the caller waits for its own call's work, so it never sleeps (it yields once the wait grows
    // long)
    const WaitPolicy caller{policy_.pause, policy_.total, false};
    WaitClock wait;
    while (finished_.load(std::memory_order_acquire) != n_threads - 1) wait.poll(caller);
  }

  // The calling thread's team, with at least `workers` workers (made, or remade larger, here), or
  // null when it should run on its own: the OS refused threads, the thread is exiting, or it is a
  // team's thread inside a call already (a forward nested in a task runs on one thread).
  static WorkerTeam* of_this_thread(int workers) {
    thread_local Holder holder;
    if (exited() || inside_team()) return nullptr;
    WorkerTeam* team = holder.team.get();
    if (team && team->made_before_fork()) {
      abandon(holder.team.release());  // its threads do not exist in this process
      team = nullptr;
    }
    if (team && team->workers() >= workers) return team;
    try {
      std::unique_ptr<WorkerTeam> grown = std::make_unique<WorkerTeam>(workers);
      holder.team = std::move(grown);  // the old team, if any, stopped and joined here
    } catch (...) {
      return nullptr;  // the old team, if any, still serves calls that need no more workers
    }
    return holder.team.get();
  }

 private:
  static constexpr int kCountBits = 16;  // state_: (call number << 16) | the call's threads
  static constexpr std::uint64_t kStopThreads = (std::uint64_t(1) << kCountBits) - 1;
  static int threads_of(std::uint64_t state) {
    return static_cast<int>(state & kStopThreads);
  }
  // The next call number, with `threads` (a call's thread count, or kStopThreads), published to
  // the workers (only the team's calling thread writes state_).
  void publish(std::uint64_t threads) {
    const std::uint64_t next = ((state_.load(std::memory_order_relaxed) >> kCountBits) + 1)
                               << kCountBits;
    state_.store(next | threads, std::memory_order_seq_cst);
  }

  // Set on a team's threads, and on a caller while its run() is under way.
  static bool& inside_team() {
    thread_local bool inside = false;
    return inside;
  }
  struct InsideTeam {
    bool was = inside_team();
    InsideTeam() { inside_team() = true; }
    ~InsideTeam() { inside_team() = was; }
  };

  // Whether this thread's Holder is gone (a plain flag, readable after the Holder's destruction).
  static bool& exited() {
    thread_local bool gone = false;
    return gone;
  }
  struct Holder {
    std::unique_ptr<WorkerTeam> team;
    ~Holder() {
      if (team && team->made_before_fork()) abandon(team.release());
      team.reset();
      exited() = true;
    }
  };

  // A team made before fork(), in the child: neither stopped nor destroyed (its threads, and any
  // thread waiting on its condition variable, do not exist here), kept reachable in a list that
  // is never freed.
  static void abandon(WorkerTeam* team) {
    static std::atomic<WorkerTeam*> head{nullptr};
    team->next_abandoned_ = head.load(std::memory_order_relaxed);
    while (!head.compare_exchange_weak(team->next_abandoned_, team, std::memory_order_release,
                                       std::memory_order_relaxed)) {
    }
  }

  // Polls as the policy says: pause for policy.pause, then yield until policy.total (the clock is
  // read every 64 polls).
  class WaitClock {
   public:
    // Returns false once the policy's time to poll is over (then the caller sleeps, if it may).
    bool poll(const WaitPolicy& policy) {
      if ((++polls_ & 63) == 0) elapsed_ = std::chrono::steady_clock::now() - start_;
      if (elapsed_ < policy.pause) {
        cpu_pause();
        return true;
      }
      if (!policy.sleep || elapsed_ < policy.total) {
        std::this_thread::yield();
        return true;
      }
      return false;
    }

   private:
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
    std::chrono::steady_clock::duration elapsed_{0};
    unsigned polls_ = 0;
  };

  // Returns the state of the next call that worker `index` takes part in (or of the stop), once
  // it is past `seen`; calls for fewer threads are passed over without touching the call's plain
  // fields (the waiting goes on: its clock keeps running). Polls as the policy says first, unless
  // `sleep_now` (a worker's first wait: no call is expected soon).
  std::uint64_t wait_for_job(int index, std::uint64_t seen, bool sleep_now) {
    WaitClock wait;
    for (;;) {
      const std::uint64_t state = state_.load(std::memory_order_acquire);
      if (state != seen) {
        if (threads_of(state) > index) return state;
        seen = state;
        continue;
      }
      if (!sleep_now && wait.poll(policy_)) continue;
      std::unique_lock<std::mutex> lock(mutex_);
      sleeping_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, [&] { return state_.load(std::memory_order_seq_cst) != seen; });
      sleeping_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  void work(int index) {
    inside_team() = true;
    std::uint64_t seen = 0;
    for (bool first = true;; first = false) {
      seen = wait_for_job(index, seen, first);
      if (stop_.load(std::memory_order_acquire)) return;
      job_(job_arg_, index);
      finished_.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  void stop() {
    stop_.store(true, std::memory_order_release);
    publish(kStopThreads);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

  WaitPolicy policy_;
  unsigned fork_generation_;
  WorkerTeam* next_abandoned_ = nullptr;
  std::vector<std::thread> threads_;
  void (*job_)(const void*, int) = nullptr;
  const void* job_arg_ = nullptr;
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<std::uint64_t> state_{0};
  alignas(64) std::atomic<int> finished_{0};
  alignas(64) std::atomic<int> sleeping_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace gpt2::detail
