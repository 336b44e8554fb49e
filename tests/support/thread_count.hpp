// ThreadCount: restores the calling thread's gpt2 thread count (gpt2::num_threads) when it goes out
// of scope, so a test that sets its own count leaves the next test the one it found, on every exit
// path (a failed ASSERT returns early).
#pragma once

#include "gpt2/threads.hpp"

namespace gpt2::test {

class ThreadCount {
 public:
  ThreadCount() : saved_(gpt2::num_threads()) {}
  ~ThreadCount() { gpt2::set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
};

}  // namespace gpt2::test
