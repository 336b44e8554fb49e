// A forward with a big-enough Workspace allocates nothing: neither Eigen (checked with
// EIGEN_RUNTIME_NO_MALLOC, every Eigen heap allocation goes through its check) nor the C++ heap
// (checked by counting operator new). The detectors are shown to work on a control.
#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

// Count failed Eigen assertions instead of aborting, so the test can report them.
static std::atomic<int> g_eigen_assert_failures{0};
#define eigen_assert(x) ((x) ? (void)0 : (void)g_eigen_assert_failures.fetch_add(1))
#define EIGEN_RUNTIME_NO_MALLOC
// This file compiles its own forwards (detail/compiled_mode.hpp), so that the check above sees them.
#ifndef GPT2_ATTENTION_NO_EXTERN_FORWARDS
#define GPT2_ATTENTION_NO_EXTERN_FORWARDS
#endif

#include <gtest/gtest.h>

#include "gpt2/attention.hpp"
#include "support/compare.hpp"  // Scalars
#include "support/models.hpp"

#include "support/new_counter.hpp"  // g_new_calls: this program's operator new calls

namespace {

using gpt2::RowMatrix;
using gpt2::RowVector;

// Counts allocations (Eigen's and operator new's) made while it is alive.
class AllocationWatch {
 public:
  AllocationWatch() {
    g_eigen_assert_failures = 0;
    g_new_calls = 0;
    Eigen::internal::set_is_malloc_allowed(false);
  }
  ~AllocationWatch() { Eigen::internal::set_is_malloc_allowed(true); }
  int eigen() const { return g_eigen_assert_failures.load(); }
  long cxx() const { return g_new_calls.load(); }
};

template <class T>
class NoAllocTest : public ::testing::Test {};
TYPED_TEST_SUITE(NoAllocTest, gpt2::test::Scalars);

TYPED_TEST(NoAllocTest, ForwardWithReservedWorkspaceAllocatesNothing) {
  using T = TypeParam;
  const gpt2::test::Model<T> m = gpt2::test::random_model<T>(256, 4, 1);
  const gpt2::AttentionConfig& config = m.config;
  const gpt2::AttentionWeights<T> w = m.weights();
  const RowMatrix<T> x = gpt2::test::random_input<T>(200, 256, 2);
  RowMatrix<T> out(200, 256), probs(4 * 200, 200), out_small(37, 256), probs_small(4 * 37, 37);
  gpt2::Workspace<T> ws(config, 200);
  ws.reserve_probabilities();  // the score tiles of the forwards with probabilities
  {
    AllocationWatch watch;
    gpt2::attention_forward<T>(w, x, ws, out);
    gpt2::attention_forward<T>(w, x, ws, out, probs);
    gpt2::attention_forward<T>(w, x.topRows(37), ws, out_small, probs_small);  // shorter T
    gpt2::attention_forward<T>(w, x.topRows(1), ws, out_small.topRows(1));     // T = 1
    const int eigen_allocations = watch.eigen();
    const long new_calls = watch.cxx();
    EXPECT_EQ(eigen_allocations, 0) << "Eigen heap allocations during the forward";
    EXPECT_EQ(new_calls, 0) << "operator new calls during the forward";
  }
  EXPECT_TRUE(out.allFinite());
}

// The decode step: one new token through a KV cache, after the cache and the workspace exist.
// Also the prefill chunk (up to the workspace's token capacity) and a batched decode step.
TYPED_TEST(NoAllocTest, DecodeStepsThroughAKVCacheAllocateNothing) {
  using T = TypeParam;
  const gpt2::test::Model<T> m = gpt2::test::random_model<T>(256, 4, 3);
  const gpt2::AttentionWeights<T> w = m.weights();
  const RowMatrix<T> x = gpt2::test::random_input<T>(300, 256, 4);
  gpt2::KVCache<T> cache(m.config, 300);
  std::vector<gpt2::KVCache<T>> caches;
  caches.emplace_back(m.config, 100);
  caches.emplace_back(m.config, 100);
  gpt2::Workspace<T> ws(m.config, 40, cache.capacity());
  ws.reserve_probabilities();
  RowMatrix<T> out(300, 256), probs(4, 300);
  gpt2::BatchLayout step = gpt2::BatchLayout::full(2, 1);
  {
    AllocationWatch watch;
    gpt2::attention_forward<T>(w, x.topRows(40), cache, ws, out.topRows(40));  // prefill
    for (gpt2::Index t = 40; t < 299; ++t)
      gpt2::attention_forward<T>(w, x.row(t), cache, ws, out.row(t));
    gpt2::attention_forward<T>(w, x.row(299), cache, ws, out.row(299), probs);  // with probs
    for (gpt2::Index t = 0; t < 50; ++t) {
      step.set(1, 0, t % 2);  // sequence 1 sits out every other step
      gpt2::attention_forward<T>(w, x.middleRows(2 * t, 2), step, caches, ws, out.middleRows(2 * t, 2));
    }
    EXPECT_EQ(watch.eigen(), 0) << "Eigen heap allocations during decoding";
    EXPECT_EQ(watch.cxx(), 0) << "operator new calls during decoding";
  }
  EXPECT_EQ(cache.n_past(), 300);
  EXPECT_EQ(caches[1].n_past(), 25);
  EXPECT_TRUE(out.allFinite());
}

// bf16 weights: after one forward (at the amx level it grows every thread's tile buffer, once, to
// the AMX attention core's, whichever threads its tiles ran on), prefills and decode steps
// through a KV cache allocate nothing either.
TEST(NoAllocBf16, ForwardsOnBf16WeightsAllocateNothingAfterTheFirst) {
  const gpt2::test::Model<float> m = gpt2::test::random_model<float>(256, 4, 5);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(m.weights(), gpt2::WeightDtype::bf16);
  const RowMatrix<float> x = gpt2::test::random_input<float>(300, 256, 6);
  gpt2::KVCache<float> cache(m.config, 300);
  gpt2::Workspace<float> ws(m.config, 200, cache.capacity());
  RowMatrix<float> out(300, 256);
  gpt2::attention_forward<float>(w, x.topRows(200), ws, out.topRows(200));  // the first
  {
    AllocationWatch watch;
    gpt2::attention_forward<float>(w, x.topRows(200), ws, out.topRows(200));
    gpt2::attention_forward<float>(w, x.topRows(100), cache, ws, out.topRows(100));  // prefill
    for (gpt2::Index t = 100; t < 300; ++t)
      gpt2::attention_forward<float>(w, x.row(t), cache, ws, out.row(t));
    EXPECT_EQ(watch.eigen(), 0) << "Eigen heap allocations";
    EXPECT_EQ(watch.cxx(), 0) << "operator new calls";
  }
  EXPECT_TRUE(out.allFinite());
}

struct KVCacheBF16Fixture {
  KVCacheBF16Fixture(const gpt2::AttentionConfig& config, gpt2::Index capacity)
      : cache(config, capacity), ws(config) {}
  gpt2::KVCacheBF16 cache;
  gpt2::Workspace<float> ws;
};

// A bf16 KV cache: the first forward sizes the workspace (and its widening buffers); later
// prefill chunks and decode steps allocate nothing, with float32 and bf16 weights.
TEST(NoAllocBf16, ForwardsThroughABf16KVCacheAllocateNothingAfterTheFirst) {
  const gpt2::test::Model<float> m = gpt2::test::random_model<float>(256, 4, 7);
  const RowMatrix<float> x = gpt2::test::random_input<float>(300, 256, 8);
  for (const gpt2::WeightDtype dtype : {gpt2::WeightDtype::float32, gpt2::WeightDtype::bf16}) {
    SCOPED_TRACE(gpt2::dtype_name(dtype));
    const gpt2::AttentionWeights<float> w = gpt2::pack_weights(m.weights(), dtype);
    gpt2::KVCacheBF16 cache(m.config, 300);
    gpt2::Workspace<float> ws(m.config);
    RowMatrix<float> out(300, 256);
    gpt2::attention_forward<float>(w, x.topRows(64), cache, ws, out.topRows(64));  // the first
    {
      AllocationWatch watch;
      gpt2::attention_forward<float>(w, x.middleRows(64, 36), cache, ws, out.middleRows(64, 36));
      for (gpt2::Index t = 100; t < 300; ++t)
        gpt2::attention_forward<float>(w, x.row(t), cache, ws, out.row(t));
      EXPECT_EQ(watch.eigen(), 0) << "Eigen heap allocations";
      EXPECT_EQ(watch.cxx(), 0) << "operator new calls";
    }
    EXPECT_EQ(cache.n_past(), 300);
    EXPECT_TRUE(out.allFinite());
    // a cache shorter than one widening run (256 keys): a prefill first, then decode steps
    KVCacheBF16Fixture short_run(m.config, 40);
    gpt2::attention_forward<float>(w, x.topRows(30), short_run.cache, short_run.ws, out.topRows(30));
    {
      AllocationWatch watch;
      for (gpt2::Index t = 30; t < 40; ++t)
        gpt2::attention_forward<float>(w, x.row(t), short_run.cache, short_run.ws, out.row(t));
      EXPECT_EQ(watch.eigen(), 0) << "Eigen heap allocations (short cache)";
      EXPECT_EQ(watch.cxx(), 0) << "operator new calls (short cache)";
    }
  }
}

// An int8 KV cache: the first forward sizes the workspace (every thread's room for the cache's
// capacity in dequantized keys and values); later prefill chunks, decode steps (dequantized a chunk
// of key blocks at a time), a step with probabilities and batched decode steps allocate nothing.
TEST(NoAllocInt8, ForwardsThroughAnInt8KVCacheAllocateNothingAfterTheFirst) {
  const gpt2::test::Model<float> m = gpt2::test::random_model<float>(256, 4, 9);
  const RowMatrix<float> x = gpt2::test::random_input<float>(300, 256, 10);
  for (const gpt2::WeightDtype dtype : {gpt2::WeightDtype::float32, gpt2::WeightDtype::bf16}) {
    SCOPED_TRACE(gpt2::dtype_name(dtype));
    const gpt2::AttentionWeights<float> w = gpt2::pack_weights(m.weights(), dtype);
    gpt2::KVCacheInt8 cache(m.config, 300);
    std::vector<gpt2::KVCacheInt8> caches;
    caches.emplace_back(m.config, 100);
    caches.emplace_back(m.config, 100);
    gpt2::Workspace<float> ws(m.config);
    ws.reserve_probabilities();
    RowMatrix<float> out(300, 256), probs(4, 300);
    gpt2::BatchLayout step = gpt2::BatchLayout::full(2, 1);
    gpt2::attention_forward<float>(w, x.topRows(64), cache, ws, out.topRows(64));  // the first
    {
      AllocationWatch watch;
      gpt2::attention_forward<float>(w, x.middleRows(64, 36), cache, ws, out.middleRows(64, 36));
      for (gpt2::Index t = 100; t < 299; ++t)
        gpt2::attention_forward<float>(w, x.row(t), cache, ws, out.row(t));
      gpt2::attention_forward<float>(w, x.row(299), cache, ws, out.row(299), probs);
      for (gpt2::Index t = 0; t < 50; ++t) {
        step.set(1, 0, t % 2);
        gpt2::attention_forward<float>(w, x.middleRows(2 * t, 2), step, caches, ws,
                                       out.middleRows(2 * t, 2));
      }
      EXPECT_EQ(watch.eigen(), 0) << "Eigen heap allocations";
      EXPECT_EQ(watch.cxx(), 0) << "operator new calls";
    }
    EXPECT_EQ(cache.n_past(), 300);
    EXPECT_TRUE(out.allFinite());
  }
}

TEST(NoAllocControl, DetectorsSeeAllocations) {
  RowMatrix<float> a = RowMatrix<float>::Random(64, 64), b = RowMatrix<float>::Random(64, 64);
  int eigen_allocations = 0;
  long new_calls = 0;
  {
    AllocationWatch watch;
    RowMatrix<float> c = a * b;  // a temporary and Eigen's GEMM packing buffers
    std::vector<int>* v = new std::vector<int>(3);
    delete v;
    eigen_allocations = watch.eigen();
    new_calls = watch.cxx();
  }
  EXPECT_GT(eigen_allocations, 0);
  EXPECT_GT(new_calls, 0);
}

}  // namespace
