// Paged decode steps allocate nothing once the pool, the sequences' tables (reserve) and the
// workspace are sized: neither Eigen (EIGEN_RUNTIME_NO_MALLOC) nor the C++ heap (operator new
// counted), across block boundaries, copies-on-write and blocks given back by truncate. The
// detectors themselves are shown to work by test_no_alloc's control.
#include <atomic>
#include <type_traits>
#include <vector>

static std::atomic<int> g_eigen_assert_failures{0};
#define eigen_assert(x) ((x) ? (void)0 : (void)g_eigen_assert_failures.fetch_add(1))
#define EIGEN_RUNTIME_NO_MALLOC
// This file compiles its own forwards (detail/compiled_mode.hpp), so that the check above sees them.
#ifndef GPT2_ATTENTION_NO_EXTERN_FORWARDS
#define GPT2_ATTENTION_NO_EXTERN_FORWARDS
#endif

#include <gtest/gtest.h>

#include "gpt2/attention.hpp"
#include "gpt2/paged_kv_cache.hpp"
#include "support/compare.hpp"  // Scalars
#include "support/models.hpp"
#include "support/new_counter.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;

// The forwards' scalar T and the pool's storage S: float, double, and int8 (float forwards,
// whose decode steps dequantize into the workspace's scratch).
template <class T, class S>
struct Storage {
  using Scalar = T;
  using Stored = S;
};
template <class P>
class PagedNoAllocTest : public ::testing::Test {};
using Storages =
    ::testing::Types<Storage<float, float>, Storage<double, double>, Storage<float, gpt2::int8>>;
TYPED_TEST_SUITE(PagedNoAllocTest, Storages);

TYPED_TEST(PagedNoAllocTest, DecodeStepsAllocateNothing) {
  using T = typename TypeParam::Scalar;
  using S = typename TypeParam::Stored;
  const gpt2::test::Model<T> m = gpt2::test::random_model<T>(256, 4, 3);
  // float: float32 and bf16 weights (bf16 products: an int8 pool's decode steps dequantize the
  // blocks before a row's own to bf16)
  std::vector<gpt2::AttentionWeights<T>> weights;
  weights.push_back(m.weights());
  if constexpr (std::is_same<T, float>::value)
    weights.push_back(gpt2::pack_weights(m.weights(), gpt2::WeightDtype::bf16));
  for (const gpt2::AttentionWeights<T>& w : weights) {
    SCOPED_TRACE(gpt2::dtype_name(w.weight_dtype()));
    const Index B = 3, prompt = 37, steps = 40, max_tokens = prompt + steps + 1;
    const RowMatrix<T> x = gpt2::test::random_input<T>(prompt + B * steps, 256, 4);
    gpt2::KVBlockPool<S> pool(m.config, 3 + (B + 1) * 4);
    gpt2::PagedSequence<S> root(pool, max_tokens);
    gpt2::Workspace<T> ws(m.config, prompt, max_tokens);
    // zeroed: the steps of `root` alone write one row of their B (the others must not hold NaN garbage)
    RowMatrix<T> out = RowMatrix<T>::Zero(prompt + B * steps, 256);
    gpt2::attention_forward<T>(w, x.topRows(prompt), root, ws, out.topRows(prompt));
    std::vector<gpt2::PagedSequence<S>> seqs;
    for (Index b = 0; b < B; ++b) seqs.push_back(root.fork());
    for (gpt2::PagedSequence<S>& s : seqs) s.reserve(max_tokens);
    gpt2::PagedSequence<S>* ptrs[] = {&seqs[0], &seqs[1], &seqs[2]};
    gpt2::BatchLayout step = gpt2::BatchLayout::full(B, 1);
    {
      g_eigen_assert_failures = 0;
      g_new_calls = 0;
      Eigen::internal::set_is_malloc_allowed(false);
      for (Index t = 0; t < steps; ++t) {
        const Index row = prompt + B * t;
        if (t % 3 == 0) {  // one sequence alone (its first step copies the shared partial block)
          gpt2::attention_forward<T>(w, x.row(row), root, ws, out.row(row));
        } else {
          step.set(1, 0, t % 2);  // sequence 1 sits out every other step
          gpt2::attention_forward<T>(w, x.middleRows(row, B), step, ptrs, ws, out.middleRows(row, B));
        }
        if (t == 20) seqs[2].truncate(prompt + 3);  // blocks go back, then are taken again
      }
      Eigen::internal::set_is_malloc_allowed(true);
      EXPECT_EQ(g_eigen_assert_failures.load(), 0) << "Eigen heap allocations during decoding";
      EXPECT_EQ(g_new_calls.load(), 0) << "operator new calls during decoding";
    }
    EXPECT_GT(seqs[0].length(), prompt + 16);  // crossed a block boundary
    EXPECT_TRUE(out.allFinite());
  }
}

}  // namespace
