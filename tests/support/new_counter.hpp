// Counts the calls of the global operator new (plain and aligned) in a test program: include it in
// exactly one translation unit of the program, and read g_new_calls around the code that must not
// allocate. (Eigen's own allocations are caught separately, with EIGEN_RUNTIME_NO_MALLOC.)
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>

inline std::atomic<long> g_new_calls{0};

// GCC 12 flags free() in a replaced global operator delete as a mismatched deallocation; it is not.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  g_new_calls.fetch_add(1);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// The aligned forms (the kernels' 64-byte aligned packing buffers and packed weights use them).
void* operator new(std::size_t n, std::align_val_t a) {
  g_new_calls.fetch_add(1);
  const std::size_t align = static_cast<std::size_t>(a);
  const std::size_t size = (n + align - 1) / align * align;  // aligned_alloc wants a multiple
  if (void* p = std::aligned_alloc(align, size ? size : align)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
