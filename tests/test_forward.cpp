// attention_forward and attention(): the whole sublayer against the naive double reference
// (small widths; the PyTorch fixtures in test_reference.cpp cover GPT-2 widths and T = 1024).
#include <gtest/gtest.h>

#include <cstdlib>

#include "gpt2/attention.hpp"
#include "support/compare.hpp"
#include "support/models.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::RowVector;
using gpt2::test::error_of;
using gpt2::test::near;
using gpt2::test::Tolerance;

using gpt2::test::Model;
using gpt2::test::random_input;
using gpt2::test::random_model;

template <class T>
class ForwardTest : public ::testing::Test {};
TYPED_TEST_SUITE(ForwardTest, gpt2::test::Scalars);

TYPED_TEST(ForwardTest, MatchesNaiveReference) {
  using T = TypeParam;
  struct Case {
    Index C, n_head, T;
  };
  for (const Case c : {Case{8, 2, 5}, Case{64, 4, 1}, Case{64, 4, 7}, Case{64, 4, 65},
                       Case{96, 3, 130}, Case{128, 2, 64}}) {
    SCOPED_TRACE("C=" + std::to_string(c.C) + " n_head=" + std::to_string(c.n_head) +
                 " T=" + std::to_string(c.T));
    const Model<T> m = random_model<T>(c.C, c.n_head, 1);
    const RowMatrix<T> x = random_input<T>(c.T, c.C, 2);
    const gpt2::test::NaiveAttention ref =
        gpt2::test::naive_attention(x, m.c_attn_w, m.c_attn_b, m.c_proj_w, m.c_proj_b, c.n_head);

    gpt2::Workspace<T> ws(m.config);
    RowMatrix<T> out(c.T, c.C), probs(c.n_head * c.T, c.T);
    gpt2::attention_forward<T>(m.weights(), x, ws, out, probs);
    EXPECT_TRUE(near(out, ref.out, Tolerance<T>::rel, Tolerance<T>::abs));
    EXPECT_TRUE(near(probs, ref.probs, Tolerance<T>::rel, Tolerance<T>::abs));
    EXPECT_TRUE(near(ws.qkv.topRows(c.T), ref.qkv, Tolerance<T>::rel, Tolerance<T>::abs));
    EXPECT_TRUE(near(ws.merged.topRows(c.T), ref.merged, Tolerance<T>::rel, Tolerance<T>::abs));

    EXPECT_TRUE(gpt2::attention(m.weights(), x) == out) << "front door and forward must agree";
  }
}

TYPED_TEST(ForwardTest, RepeatedCallsReuseTheWorkspaceAndGiveTheSameResult) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(64, 4, 3);
  const RowMatrix<T> x = random_input<T>(40, 64, 4);
  gpt2::Workspace<T> ws(m.config, 40);
  const T* qkv = ws.qkv.data();
  RowMatrix<T> a(40, 64), b(40, 64), c(10, 64);
  gpt2::attention_forward<T>(m.weights(), x, ws, a);
  gpt2::attention_forward<T>(m.weights(), x.topRows(10), ws, c);  // shorter T, same workspace
  gpt2::attention_forward<T>(m.weights(), x, ws, b);
  EXPECT_TRUE(a == b);
  EXPECT_EQ(ws.qkv.data(), qkv) << "the workspace must not be reallocated";
  EXPECT_TRUE(near(c, a.topRows(10), Tolerance<T>::rel, Tolerance<T>::abs))
      << "causal: the first rows do not depend on later tokens";
  gpt2::attention_forward<T>(m.weights(), x.topRows(1), ws, c.topRows(1));  // T = 1
  EXPECT_TRUE(near(c.topRows(1), a.topRows(1), Tolerance<T>::rel, Tolerance<T>::abs));
}

// The workspace's qkv and merged: 64-byte aligned, rows an odd number of cache lines apart (and
// at least their width), seen through views with that stride; bytes() counts the padding. A
// forward through it gives the bits of one through dense buffers (the public steps).
TYPED_TEST(ForwardTest, WorkspaceRowsAreAnOddNumberOfCacheLinesApart) {
  using T = TypeParam;
  const Index line = 64 / static_cast<Index>(sizeof(T));
  for (const Index C : {64, 768, 40}) {
    const gpt2::AttentionConfig config{C, C == 40 ? 5 : 4};
    gpt2::Workspace<T> ws(config, 9);
    for (const auto* m : {&ws.qkv, &ws.merged}) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(m->data()) % 64, 0u);
      EXPECT_GE(m->outerStride(), m->cols());
      EXPECT_LT(m->outerStride(), m->cols() + 2 * line);
      EXPECT_EQ(m->outerStride() % line, 0) << "C " << C;
      EXPECT_EQ(m->outerStride() / line % 2, 1) << "C " << C;
      EXPECT_EQ(m->storage_size(), m->rows() * m->outerStride());
    }
    EXPECT_EQ(ws.qkv.map().outerStride(), ws.qkv.outerStride());
    EXPECT_EQ(&ws.qkv.topRows(9)(1, 0), ws.qkv.data() + ws.qkv.outerStride());
    EXPECT_GE(ws.bytes(), (ws.qkv.storage_size() + ws.merged.storage_size()) * Index(sizeof(T)));
  }
  EXPECT_EQ((gpt2::detail::AlignedMatrix<float>::stride_for(2304, gpt2::detail::RowStride::odd_lines)), 2320);
  EXPECT_EQ((gpt2::detail::AlignedMatrix<float>::stride_for(768, gpt2::detail::RowStride::odd_lines)), 784);
  EXPECT_EQ((gpt2::detail::AlignedMatrix<float>::stride_for(2320, gpt2::detail::RowStride::odd_lines)), 2320);
  EXPECT_EQ((gpt2::detail::AlignedMatrix<float>::stride_for(768, gpt2::detail::RowStride::dense)), 768);

  const Model<T> m = random_model<T>(64, 4, 5);
  const RowMatrix<T> x = random_input<T>(70, 64, 6);
  gpt2::Workspace<T> ws(m.config, 70);
  RowMatrix<T> out(70, 64);
  gpt2::attention_forward<T>(m.weights(), x, ws, out);
  RowMatrix<T> qkv(70, 3 * 64), merged(70, 64), want(70, 64);
  gpt2::qkv_projection<T>(m.weights(), x, qkv);
  gpt2::AttentionScratch<T> scratch;
  for (Index h = 0; h < m.config.n_head; ++h)
    gpt2::causal_attention_head<T>(gpt2::q_view(qkv, m.config, h), gpt2::k_view(qkv, m.config, h),
                                   gpt2::v_view(qkv, m.config, h),
                                   gpt2::head_slot(merged, m.config, h), scratch);
  gpt2::output_projection<T>(m.weights(), merged, want);
  EXPECT_TRUE(near(out, want, Tolerance<T>::rel, Tolerance<T>::abs));
  EXPECT_TRUE(RowMatrix<T>(ws.merged.topRows(70)) == merged) << "the attention's bits";
}

// A forward over other inputs in the same workspace (the same qkv storage, so the same key
// pointers) must not reuse anything derived from the previous call's keys (e.g. the transposed
// keys the AVX-512 path packs per head), on the plain and the cached paths. With one head, a
// thread's last head of one call is its first of the next.
TYPED_TEST(ForwardTest, NothingFromAPreviousCallLeaksIntoTheNext) {
  using T = TypeParam;
  for (const Index n_head : {1, 4}) {
    SCOPED_TRACE("n_head " + std::to_string(n_head));
    const Model<T> m = random_model<T>(64, n_head, 5);
    const RowMatrix<T> x1 = random_input<T>(100, 64, 6), x2 = random_input<T>(100, 64, 7);
    gpt2::Workspace<T> shared(m.config, 100);
    RowMatrix<T> first(100, 64), second(100, 64), fresh(100, 64);
    gpt2::attention_forward<T>(m.weights(), x1, shared, first);
    gpt2::attention_forward<T>(m.weights(), x2, shared, second);
    gpt2::Workspace<T> own(m.config, 100);
    gpt2::attention_forward<T>(m.weights(), x2, own, fresh);
    EXPECT_TRUE(second == fresh);

    gpt2::KVCache<T> cache(m.config, 100);
    gpt2::attention_forward<T>(m.weights(), x1.topRows(60), cache, shared, first.topRows(60));
    cache.truncate(20);  // same positions, other contents
    gpt2::attention_forward<T>(m.weights(), x2.middleRows(20, 40), cache, shared,
                               second.topRows(40));
    gpt2::KVCache<T> clean(m.config, 100);
    gpt2::attention_forward<T>(m.weights(), x1.topRows(20), clean, own, fresh.topRows(20));
    gpt2::attention_forward<T>(m.weights(), x2.middleRows(20, 40), clean, own,
                               fresh.topRows(40));
    EXPECT_TRUE(second.topRows(40) == fresh.topRows(40));
  }
}

TYPED_TEST(ForwardTest, MovedFromWorkspaceIsEmptyAndGrowsAgain) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(64, 4, 3);
  const RowMatrix<T> x = random_input<T>(12, 64, 4);
  gpt2::Workspace<T> ws(m.config, 12, 30);
  RowMatrix<T> a(12, 64), b(12, 64), c(12, 64);
  gpt2::attention_forward<T>(m.weights(), x, ws, a);
  gpt2::Workspace<T> moved = std::move(ws);
  EXPECT_EQ(moved.capacity(), 12);
  EXPECT_EQ(moved.key_capacity(), 30);
  EXPECT_EQ(ws.capacity(), 0);      // NOLINT(bugprone-use-after-move): documented state
  EXPECT_EQ(ws.key_capacity(), 0);  // NOLINT(bugprone-use-after-move)
  gpt2::attention_forward<T>(m.weights(), x, ws, b);  // grows again
  gpt2::attention_forward<T>(m.weights(), x, moved, c);
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(a == c);
  ws = std::move(moved);
  EXPECT_EQ(ws.key_capacity(), 30);
  EXPECT_EQ(moved.capacity(), 0);  // NOLINT(bugprone-use-after-move)
}

TYPED_TEST(ForwardTest, WorkspaceKeyCapacityIsChecked) {
  using T = TypeParam;
  const gpt2::AttentionConfig config{64, 4};
  EXPECT_EQ(gpt2::test::error_of<gpt2::ShapeError>([&] { gpt2::Workspace<T>(config, 4, -5); }),
            "max_keys: expected a non-negative count (or -1: max_tokens), got -5");
  EXPECT_EQ(gpt2::test::error_of<gpt2::ShapeError>([&] { gpt2::Workspace<T>(config, 4, 3); }),
            "max_keys: expected at least max_tokens (4), got 3");
  gpt2::Workspace<T> ws(config, 4);
  EXPECT_EQ(ws.key_capacity(), 4);
  ws.reserve(2, 10);  // more keys, fewer tokens: tokens stay
  EXPECT_EQ(ws.capacity(), 4);
  EXPECT_EQ(ws.key_capacity(), 10);
}

TYPED_TEST(ForwardTest, FailedGrowthLeavesTheWorkspaceUsable) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(64, 4, 12);
  const RowMatrix<T> x = random_input<T>(16, 64, 13);
  gpt2::Workspace<T> ws(m.config, 16);
  RowMatrix<T> before(16, 64), after(16, 64);
  gpt2::attention_forward<T>(m.weights(), x, ws, before);
  // 2^40 tokens: about 10^16 bytes of qkv, which no allocator grants.
  EXPECT_THROW(ws.reserve(Index(1) << 40), std::bad_alloc);
  EXPECT_EQ(ws.capacity(), 16);
  EXPECT_EQ(ws.qkv.rows(), 16);
  EXPECT_EQ(ws.merged.rows(), 16);
  gpt2::attention_forward<T>(m.weights(), x, ws, after);
  EXPECT_TRUE(after == before);
}

TYPED_TEST(ForwardTest, OutputMayOverwriteTheInput) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(64, 4, 5);
  RowMatrix<T> x = random_input<T>(9, 64, 6);
  const RowMatrix<T> expected = gpt2::attention(m.weights(), x);
  gpt2::Workspace<T> ws(m.config);
  gpt2::attention_forward<T>(m.weights(), x, ws, x);
  EXPECT_TRUE(x == expected);
}

TYPED_TEST(ForwardTest, FrontDoorTakesAnyEigenExpression) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(32, 2, 7);
  const RowMatrix<T> x = random_input<T>(6, 32, 8);
  const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> x_col_major = x;  // other storage order
  RowMatrix<T> probs;
  const RowMatrix<T> y1 = gpt2::attention(m.weights(), x);
  const RowMatrix<T> y2 = gpt2::attention(m.weights(), x_col_major, probs);
  const RowMatrix<T> y3 = gpt2::attention(m.weights(), x * T(1));
  EXPECT_TRUE(y1 == y2);
  EXPECT_TRUE(y1 == y3);
  EXPECT_EQ(probs.rows(), 2 * 6);
  EXPECT_EQ(probs.cols(), 6);
}

TYPED_TEST(ForwardTest, EmptySequenceGivesEmptyOutput) {
  using T = TypeParam;
  const Model<T> m = random_model<T>(16, 2, 9);
  const RowMatrix<T> x(0, 16);
  const RowMatrix<T> y = gpt2::attention(m.weights(), x);
  EXPECT_EQ(y.rows(), 0);
  EXPECT_EQ(y.cols(), 16);
}

TEST(ForwardErrors, ShapesAreNamed) {
  const Model<float> m = random_model<float>(64, 4, 10);
  gpt2::Workspace<float> ws(m.config);
  gpt2::Workspace<float> other(gpt2::AttentionConfig{64, 8});
  const RowMatrix<float> x = random_input<float>(5, 64, 11), x_bad = random_input<float>(5, 60, 11);
  RowMatrix<float> out(5, 64), out_bad(4, 64), probs_bad(5, 5);
  EXPECT_EQ(error_of<gpt2::Error>(
                [&] { gpt2::attention_forward<float>(m.weights(), x_bad, ws, out); }),
            "x: expected shape [5, 64], got [5, 60]");
  EXPECT_EQ(error_of<gpt2::Error>(
                [&] { gpt2::attention_forward<float>(m.weights(), x, ws, out_bad); }),
            "out: expected shape [5, 64], got [4, 64]");
  EXPECT_EQ(error_of<gpt2::Error>(
                [&] { gpt2::attention_forward<float>(m.weights(), x, ws, out, probs_bad); }),
            "probs: expected shape [20, 5], got [5, 5]");
  EXPECT_EQ(error_of<gpt2::Error>(
                [&] { gpt2::attention_forward<float>(m.weights(), x, other, out); }),
            "workspace: expected n_embd 64, n_head 4 (the weights'), got n_embd 64, n_head 8");
  RowMatrix<float> buf(20, 64);  // out and probs carved from one buffer, overlapping
  EXPECT_EQ(error_of<gpt2::Error>([&] {
              gpt2::attention_forward<float>(m.weights(), x, ws, buf.topRows(5), buf.leftCols(5));
            }),
            "probs: must not overlap out or the workspace");
  ws.reserve(20);
  EXPECT_EQ(error_of<gpt2::Error>([&] {
              gpt2::attention_forward<float>(m.weights(), x, ws, out,
                                             ws.qkv.topRows(20).middleCols(64, 5));
            }),
            "probs: must not overlap out or the workspace");
  EXPECT_EQ(error_of<gpt2::Error>([&] {
              gpt2::attention_forward<float>(m.weights(), x, ws, ws.merged.topRows(5));
            }),
            "out: must not overlap the workspace");
  EXPECT_EQ(error_of<gpt2::Error>([&] { (void)gpt2::attention(m.weights(), x_bad); }),
            "x: expected shape [5, 64], got [5, 60]");
}

}  // namespace
