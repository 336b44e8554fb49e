// WorkerTeam: the library's own threads, which run a forward's parallel work (parallel.hpp's
// parallel_tasks and parallel_steps) and are kept from one call to the next. Internal.
//
// Why not an OpenMP region per call: libgomp's region start and end each make a futex_wake system
// call and touch team structures that a decode step's 16 MB of streaming has pushed out of cache.
// In a 2-core KVM guest (AMD Zen 5, where a system call costs about 1 us) that was 10-20 us of a
// 120-140 us GPT-2 small decode step; the same step on a team whose worker spins between steps
// ran 1.1-1.2x faster (docs/speed.md, "Decode steps on the library's own threads").
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
// A team's workers are joined when its thread exits (at exit() for the main thread). After fork()
// a child's teams are abandoned (their threads do not exist there) and new ones are made.
#pragma once

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
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
  // std::system_error propagates.
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

  // f(thread) for every thread in [0, n_threads), 1 <= n_threads <= workers() + 1: thread 0 on the
  // caller, the others on workers 1 .. n_threads - 1, at once; returns when every call has
  // returned (their writes are then seen by the caller). f must not throw (std::terminate).
  template <class F>
  void run(int n_threads, const F& f) noexcept {
    n_threads = std::clamp(n_threads, 1, workers() + 1);
    if (n_threads == 1) {
      f(0);
      return;
    }
    job_ = [](const void* fn, int thread) { (*static_cast<const F*>(fn))(thread); };
    job_arg_ = &f;
    job_threads_ = n_threads;
    finished_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);  // publishes the job
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    f(0);
    // every worker checks in, those past n_threads without running f; the caller waits for its
    // own call's work, so it never sleeps (it yields once the wait grows long)
    const int workers_total = workers();
    const WaitPolicy caller{policy_.pause, policy_.total, false};
    WaitClock wait;
    while (finished_.load(std::memory_order_acquire) != workers_total) wait.poll(caller);
  }

  // The calling thread's team, with at least `workers` workers (made, or remade larger, here), or
  // null when the OS refuses threads or the thread is exiting (the caller then runs otherwise).
  static WorkerTeam* of_this_thread(int workers) {
    thread_local Holder holder;
    if (holder.exited) return nullptr;
    WorkerTeam* team = holder.team.get();
    if (team && team->made_before_fork()) {
      (void)holder.team.release();  // its threads do not exist in this process: leave it be
      team = nullptr;
    }
    if (team && team->workers() >= workers) return team;
    try {
      holder.team.reset();
      holder.team = std::make_unique<WorkerTeam>(workers);
    } catch (const std::system_error&) {
      return nullptr;
    }
    return holder.team.get();
  }

 private:
  struct Holder {
    std::unique_ptr<WorkerTeam> team;
    bool exited = false;
    ~Holder() {
      team.reset();
      exited = true;
    }
  };

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

  // Returns the generation of the next job (or of the stop) once it is past `seen`; polls first
  // as the policy says, unless `sleep_now` (a worker's first wait: no job is expected soon).
  unsigned wait_for_job(unsigned seen, bool sleep_now) {
    WaitClock wait;
    for (;;) {
      const unsigned g = generation_.load(std::memory_order_acquire);
      if (g != seen) return g;
      if (sleep_now || !wait.poll(policy_)) break;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    sleeping_.fetch_add(1, std::memory_order_seq_cst);
    wake_.wait(lock, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
    sleeping_.fetch_sub(1, std::memory_order_relaxed);
    return generation_.load(std::memory_order_acquire);
  }

  void work(int index) {
    unsigned seen = 0;
    for (bool first = true;; first = false) {
      seen = wait_for_job(seen, first);
      if (stop_.load(std::memory_order_acquire)) return;
      if (index < job_threads_) job_(job_arg_, index);
      finished_.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  void stop() {
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_seq_cst);
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
  std::vector<std::thread> threads_;
  void (*job_)(const void*, int) = nullptr;
  const void* job_arg_ = nullptr;
  int job_threads_ = 0;
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<unsigned> generation_{0};
  alignas(64) std::atomic<int> finished_{0};
  alignas(64) std::atomic<int> sleeping_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace gpt2::detail
