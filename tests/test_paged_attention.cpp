// The forwards over block tables (paged_kv_cache.hpp's PagedSequence and PagedLayer, float, double
// and bf16 pools) against the contiguous KVCache forwards (sublayer.hpp, batch.hpp), bitwise at
// the level the run uses: chunked prefill and decode,
// fork trees sharing a prompt (copy-on-write inside the forwards), several layers on one table,
// batched decode of forked sequences with padding, exhaustion inside a batched step, and the
// checks; and forks of a prompt against PyTorch's past_key_values (the "past" fixtures of
// tests/reference/generate.py). ctest runs it at every kernel level.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/paged_kv_cache.hpp"
#include "support/accuracy.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/fixture.hpp"
#include "support/models.hpp"

namespace {

using gpt2::AttentionConfig;
using gpt2::BatchLayout;
using gpt2::Index;
using gpt2::KVBlockPool;
using gpt2::KVCache;
using gpt2::PagedSequence;
using gpt2::RowMatrix;
using gpt2::Workspace;
using gpt2::test::Contains;
using gpt2::test::error_of;

constexpr Index kC = 128, kHeads = 4;  // head_dim 32

// The forwards' scalar T and the caches' storage S (float, double, and bf16 and int8 caches of
// float forwards: KVBlockPool<bfloat16> against KVCache<bfloat16>, KVBlockPool<int8> against
// KVCache<int8>).
template <class T, class S>
struct Storage {
  using Scalar = T;
  using Stored = S;
};
template <class P>
class PagedAttentionTest : public ::testing::Test {};
using Storages = ::testing::Types<Storage<float, float>, Storage<double, double>,
                                  Storage<float, gpt2::bfloat16>, Storage<float, gpt2::int8>>;
TYPED_TEST_SUITE(PagedAttentionTest, Storages);

template <class T>
::testing::AssertionResult same_bits(const RowMatrix<T>& a, const RowMatrix<T>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols())
    return ::testing::AssertionFailure() << "shapes differ: [" << a.rows() << ", " << a.cols()
                                         << "] vs [" << b.rows() << ", " << b.cols() << "]";
  for (Index i = 0; i < a.size(); ++i)
    if (std::memcmp(a.data() + i, b.data() + i, sizeof(T)) != 0)
      return ::testing::AssertionFailure() << "element " << i << " (row " << i / a.cols()
                                           << ", col " << i % a.cols() << ") differs: " << a.data()[i]
                                           << " vs " << b.data()[i];
  return ::testing::AssertionSuccess();
}

// x [T, C] through the contiguous cache and the paged sequence in the same chunks: every chunk's
// output bitwise the same, and the cached keys and values too.
TYPED_TEST(PagedAttentionTest, ChunksEqualContiguousCache) {
  using T = typename TypeParam::Scalar;
  using S = typename TypeParam::Stored;
  using E = typename KVCache<S>::Element;
  const gpt2::test::Model<T> m = gpt2::test::random_model<T>(kC, kHeads, 1);
  const gpt2::AttentionWeights<T> w = m.weights();
  const RowMatrix<T> x = gpt2::test::random_input<T>(200, kC, 2);
  for (const std::vector<Index>& chunks :
       std::vector<std::vector<Index>>{{200}, {37, 1, 1, 1, 20, 64, 3, 73}, {16, 16, 1, 15, 152}}) {
    KVBlockPool<S> pool(w.config(), 13);
    PagedSequence<S> seq(pool);
    KVCache<S> cache(w.config(), 200);
    Workspace<T> ws(w.config()), ws_paged(w.config());
    RowMatrix<T> out(200, kC), out_paged(200, kC);
    Index pos = 0;
    for (const Index n : chunks) {
      gpt2::attention_forward<T>(w, x.middleRows(pos, n), cache, ws, out.middleRows(pos, n));
      gpt2::attention_forward<T>(w, x.middleRows(pos, n), seq, ws_paged, out_paged.middleRows(pos, n));
      pos += n;
      ASSERT_EQ(seq.length(), pos);
      ASSERT_TRUE(same_bits<T>(out_paged.topRows(pos), out.topRows(pos))) << "after " << pos;
    }
    for (Index h = 0; h < kHeads; ++h) {
      ASSERT_TRUE(same_bits<E>(seq.copy_keys(0, h), RowMatrix<E>(cache.keys(h))));
      ASSERT_TRUE(same_bits<E>(seq.copy_values(0, h), RowMatrix<E>(cache.values(h))));
    }
    EXPECT_EQ(pool.used_blocks(), 13);
  }
}

// The probabilities too: every chunk's maps through the paged sequence are bitwise the contiguous
// cache's (scores key by key over the 16-position pages, bf16 keys widened a block at a time), and
// asking for them changes no output.
TYPED_TEST(PagedAttentionTest, ProbabilitiesEqualContiguousCache) {
  using T = typename TypeParam::Scalar;
  using S = typename TypeParam::Stored;
  const gpt2::test::Model<T> m = gpt2::test::random_model<T>(kC, kHeads, 31);
  const gpt2::AttentionWeights<T> w = m.weights();
  const RowMatrix<T> x = gpt2::test::random_input<T>(90, kC, 32);
  KVBlockPool<S> pool(w.config(), 6);
  PagedSequence<S> seq(pool);
  KVCache<S> cache(w.config(), 90);
  Workspace<T> ws(w.config()), ws_paged(w.config());
  Index pos = 0;
  for (const Index n : {37, 1, 20, 1, 31}) {
    RowMatrix<T> y(n, kC), y_paged(n, kC), p(kHeads * n, pos + n), p_paged(kHeads * n, pos + n);
    gpt2::attention_forward<T>(w, x.middleRows(pos, n), cache, ws, y, p);
    gpt2::attention_forward<T>(w, x.middleRows(pos, n), seq, ws_paged, y_paged, p_paged);
    pos += n;
    ASSERT_TRUE(same_bits<T>(y_paged, y)) << "out after " << pos;
    ASSERT_TRUE(same_bits<T>(p_paged, p)) << "probs after " << pos;
  }
}

// A prompt prefilled once, then a tree of forks, each decoding its own tokens (the forks write
// into copies of the shared partly filled block): each node's outputs bitwise equal those of a
// contiguous cache copied from its parent's; the prompt's blocks stay shared.
TYPED_TEST(PagedAttentionTest, ForkTreeEqualsContiguousCaches) {
  using T = typename TypeParam::Scalar;
  using S = typename TypeParam::Stored;
  using E = typename KVCache<S>::Element;
  const gpt2::test::Model<T> m = gpt2::test::random_model<T>(kC, kHeads, 3);
  const gpt2::AttentionWeights<T> w = m.weights();
  const Index prompt = 45, cap = 120;
  const RowMatrix<T> p = gpt2::test::random_input<T>(prompt, kC, 4);
  KVBlockPool<S> pool(w.config(), 40);
  PagedSequence<S> root(pool);
  KVCache<S> root_cache(w.config(), cap);
  Workspace<T> ws(w.config()), ws_paged(w.config());
  RowMatrix<T> out(prompt, kC), out_paged(prompt, kC);
  gpt2::attention_forward<T>(w, p, root_cache, ws, out);
  gpt2::attention_forward<T>(w, p, root, ws_paged, out_paged);
  ASSERT_TRUE(same_bits<T>(out_paged, out));

  struct Node {
    PagedSequence<S> seq;
    KVCache<S> cache;
  };
  std::vector<Node> nodes;
  const auto fork_of = [&](const PagedSequence<S>& s, const KVCache<S>& c) {
    Node n{s.fork(), KVCache<S>(w.config(), cap)};
    n.cache.copy_from(c);
    return n;
  };
  unsigned seed = 10;
  const auto decode = [&](Node& n, Index steps) {
    for (Index i = 0; i < steps; ++i) {
      const RowMatrix<T> x = gpt2::test::random_input<T>(1 + (seed % 3 == 0 ? 4 : 0), kC, seed);
      ++seed;
      RowMatrix<T> y(x.rows(), kC), y_paged(x.rows(), kC);
      gpt2::attention_forward<T>(w, x, n.cache, ws, y);
      gpt2::attention_forward<T>(w, x, n.seq, ws_paged, y_paged);
      ASSERT_TRUE(same_bits<T>(y_paged, y)) << "at length " << n.seq.length();
    }
  };
  for (int i = 0; i < 3; ++i) nodes.push_back(fork_of(root, root_cache));
  decode(nodes[0], 6);
  decode(nodes[1], 3);
  nodes.push_back(fork_of(nodes[0].seq, nodes[0].cache));
  nodes.push_back(fork_of(nodes[0].seq, nodes[0].cache));
  decode(nodes[3], 20);
  decode(nodes[0], 2);
  decode(nodes[4], 9);
  decode(nodes[2], 1);
  for (Index b = 0; b + 1 < static_cast<Index>(root.table().size()); ++b)  // full prompt blocks
    EXPECT_EQ(pool.references(root.table()[static_cast<std::size_t>(b)]), 6);
  for (Node& n : nodes)
    for (Index h = 0; h < kHeads; ++h)
      ASSERT_TRUE(same_bits<E>(n.seq.copy_keys(0, h), RowMatrix<E>(n.cache.keys(h))));
}

// A model of 2 layers on one block table per sequence: one grow per step, then each layer; the
// second layer's input is the first's output. Bitwise what 2 KVCaches per sequence give.
TYPED_TEST(PagedAttentionTest, LayersOnOneTable) {
  using T = typename TypeParam::Scalar;
  using S = typename TypeParam::Stored;
  using E = typename KVCache<S>::Element;
  const gpt2::test::Model<T> m0 = gpt2::test::random_model<T>(kC, kHeads, 5);
  const gpt2::test::Model<T> m1 = gpt2::test::random_model<T>(kC, kHeads, 6);
  const gpt2::AttentionWeights<T> w[] = {m0.weights(), m1.weights()};
  KVBlockPool<S> pool(w[0].config(), 20, 2);
  PagedSequence<S> root(pool);
  std::vector<KVCache<S>> caches;
  for (int l = 0; l < 2; ++l) caches.emplace_back(w[0].config(), 100);
  Workspace<T> ws(w[0].config()), ws_paged(w[0].config());
  const auto step = [&](PagedSequence<S>& seq, std::vector<KVCache<S>>& cs, const RowMatrix<T>& x) {
    seq.grow(x.rows());
    RowMatrix<T> a = x, b = x, a_out(x.rows(), kC), b_out(x.rows(), kC);
    for (Index l = 0; l < 2; ++l) {
      gpt2::attention_forward<T>(w[l], a, cs[static_cast<std::size_t>(l)], ws, a_out);
      gpt2::attention_forward<T>(w[l], b, seq, l, ws_paged, b_out);
      a = a_out;
      b = b_out;
    }
    return same_bits<T>(b, a);
  };
  ASSERT_TRUE(step(root, caches, gpt2::test::random_input<T>(21, kC, 7)));
  PagedSequence<S> child = root.fork();
  std::vector<KVCache<S>> child_caches;
  for (int l = 0; l < 2; ++l) {
    child_caches.emplace_back(w[0].config(), 100);
    child_caches.back().copy_from(caches[static_cast<std::size_t>(l)]);
  }
  for (unsigned i = 0; i < 5; ++i) {
    ASSERT_TRUE(step(child, child_caches, gpt2::test::random_input<T>(1, kC, 20 + i))) << i;
    ASSERT_TRUE(step(root, caches, gpt2::test::random_input<T>(2, kC, 40 + i))) << i;
  }
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] {
                         RowMatrix<T> y(30, kC);
                         gpt2::attention_forward<T>(w[0], gpt2::test::random_input<T>(30, kC, 1), child, 0, ws_paged, y);
                       }),
                       "x: expected at most 26 rows (the sequence's positions: grow() it first), got 30"));
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] {
                         RowMatrix<T> y(1, kC);
                         gpt2::attention_forward<T>(w[0], gpt2::test::random_input<T>(1, kC, 1), child, 2, ws_paged, y);
                       }),
                       "layer: expected an index in [0, 2) (the pool's layers), got 2"));
  EXPECT_TRUE(Contains(error_of<gpt2::ConfigError>([&] {
                         RowMatrix<T> y(1, kC);
                         gpt2::attention_forward<T>(w[0], gpt2::test::random_input<T>(1, kC, 1), child, ws_paged, y);
                       }),
                       "sequence: expected a one-layer pool, got 2 layers"));

  // A fork between grow() and the layers' forwards: refused before anything is written, alone
  // and in a batch (the other sequence's rows untouched too).
  child.grow(1);
  root.grow(1);
  const PagedSequence<S> early = child.fork();
  const RowMatrix<E> root_keys = root.copy_keys(0, 0);
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] {
                         RowMatrix<T> y(1, kC);
                         gpt2::attention_forward<T>(w[0], gpt2::test::random_input<T>(1, kC, 1), child, 0, ws_paged, y);
                       }),
                       "paged sequence: positions 26 .. 26 lie in block"));
  PagedSequence<S>* both[] = {&root, &child};
  RowMatrix<T> ys = RowMatrix<T>::Zero(2, kC);
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] {
                         gpt2::attention_forward<T>(w[0], gpt2::test::random_input<T>(2, kC, 1),
                                                    BatchLayout::full(2, 1), both, 0, ws_paged, ys);
                       }),
                       "batch sequence 1: paged sequence: positions 26 .. 26 lie in block"));
  EXPECT_TRUE(same_bits<E>(root.copy_keys(0, 0), root_keys));
  EXPECT_TRUE(ys.isZero(0));
}

// Batched: sequences forked from one prompt, a padded first step of different lengths, then decode
// steps where some sit out; bitwise the batched forward over contiguous caches copied from the
// prompt's. Then a step the pool cannot hold: CapacityError and no sequence changed.
TYPED_TEST(PagedAttentionTest, BatchedDecodeEqualsContiguousCaches) {
  using T = typename TypeParam::Scalar;
  using S = typename TypeParam::Stored;
  const gpt2::test::Model<T> m = gpt2::test::random_model<T>(kC, kHeads, 8);
  const gpt2::AttentionWeights<T> w = m.weights();
  const Index B = 5, prompt = 35, cap = 80, Tb = 7;
  KVBlockPool<S> pool(w.config(), 3 + B * 3);
  PagedSequence<S> root(pool);
  KVCache<S> root_cache(w.config(), cap);
  Workspace<T> ws(w.config()), ws_paged(w.config());
  {
    const RowMatrix<T> p = gpt2::test::random_input<T>(prompt, kC, 9);
    RowMatrix<T> y(prompt, kC);
    gpt2::attention_forward<T>(w, p, root_cache, ws, y);
    gpt2::attention_forward<T>(w, p, root, ws_paged, y);
  }
  std::vector<PagedSequence<S>> seqs;
  std::vector<KVCache<S>> caches;
  for (Index b = 0; b < B; ++b) {
    seqs.push_back(root.fork());
    caches.emplace_back(w.config(), cap);
    caches.back().copy_from(root_cache);
  }
  std::vector<PagedSequence<S>*> ptrs;
  for (PagedSequence<S>& s : seqs) ptrs.push_back(&s);

  // first step: padded [B, Tb, C], left and right padding, one sequence sitting out; NaN padding
  RowMatrix<T> x = gpt2::test::random_input<T>(B * Tb, kC, 11);
  const BatchLayout first(Tb, {0, 2, 0, 4, 0}, {3, 5, 0, 2, 7});
  for (Index b = 0; b < B; ++b) {
    for (Index r = 0; r < first.start(b); ++r) x.row(b * Tb + r).setConstant(std::nan(""));
    for (Index r = first.start(b) + first.length(b); r < Tb; ++r) x.row(b * Tb + r).setConstant(std::nan(""));
  }
  RowMatrix<T> out(B * Tb, kC), out_paged(B * Tb, kC);
  gpt2::attention_forward<T>(w, x, first, caches, ws, out);
  gpt2::attention_forward<T>(w, x, first, ptrs, ws_paged, out_paged);
  ASSERT_TRUE(same_bits<T>(out_paged, out));
  for (Index step = 0; step < 12; ++step) {
    BatchLayout layout = BatchLayout::full(B, 1);
    layout.set(step % B, 0, 0);  // one sequence sits the step out
    const RowMatrix<T> xs = gpt2::test::random_input<T>(B, kC, 100 + static_cast<unsigned>(step));
    RowMatrix<T> ys(B, kC), ys_paged(B, kC);
    gpt2::attention_forward<T>(w, xs, layout, caches, ws, ys);
    gpt2::attention_forward<T>(w, xs, layout, ptrs, ws_paged, ys_paged);
    ASSERT_TRUE(same_bits<T>(ys_paged, ys)) << "step " << step;
  }
  for (Index b = 0; b < B; ++b) ASSERT_EQ(seqs[static_cast<std::size_t>(b)].length(), caches[static_cast<std::size_t>(b)].n_past());

  // Exhaustion inside a batched step: 30 more positions each do not fit; nothing changes.
  std::vector<std::vector<std::int32_t>> tables;
  for (const PagedSequence<S>& s : seqs) tables.push_back(s.table());
  const Index used = pool.used_blocks();
  const RowMatrix<T> big = gpt2::test::random_input<T>(B * 30, kC, 200);
  RowMatrix<T> big_out(B * 30, kC);
  const std::string e = error_of<gpt2::CapacityError>([&] {
    gpt2::attention_forward<T>(w, big, BatchLayout::full(B, 30), ptrs, ws_paged, big_out);
  });
  EXPECT_TRUE(Contains(e, "KV block pool: growing 5 sequences needs"));
  EXPECT_EQ(pool.used_blocks(), used);
  for (Index b = 0; b < B; ++b) {
    EXPECT_EQ(seqs[static_cast<std::size_t>(b)].table(), tables[static_cast<std::size_t>(b)]);
    EXPECT_EQ(seqs[static_cast<std::size_t>(b)].length(), caches[static_cast<std::size_t>(b)].n_past());
  }
  // ... and the next step still gives the contiguous result
  const RowMatrix<T> xs = gpt2::test::random_input<T>(B, kC, 300);
  RowMatrix<T> ys(B, kC), ys_paged(B, kC);
  gpt2::attention_forward<T>(w, xs, BatchLayout::full(B, 1), caches, ws, ys);
  gpt2::attention_forward<T>(w, xs, BatchLayout::full(B, 1), ptrs, ws_paged, ys_paged);
  ASSERT_TRUE(same_bits<T>(ys_paged, ys));

  // the same sequence twice, a null entry, a count that is not B
  std::vector<PagedSequence<S>*> twice = ptrs;
  twice[3] = twice[1];
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] {
                         gpt2::attention_forward<T>(w, xs, BatchLayout::full(B, 1), twice, ws_paged, ys_paged);
                       }),
                       "sequences: entries 1 and 3 are the same paged sequence"));
  twice[3] = nullptr;
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] {
                         gpt2::attention_forward<T>(w, xs, BatchLayout::full(B, 1), twice, ws_paged, ys_paged);
                       }),
                       "sequences: entry 3 is null"));
  twice.pop_back();
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] {
                         gpt2::attention_forward<T>(w, xs, BatchLayout::full(B, 1), twice, ws_paged, ys_paged);
                       }),
                       "sequences: expected one paged sequence per sequence of the batch (5), got 4"));
}

// Checks before anything changes: weights of another shape, out overlapping the pool, a pool too
// small for a single forward.
TYPED_TEST(PagedAttentionTest, Checks) {
  using T = typename TypeParam::Scalar;
  using S = typename TypeParam::Stored;
  using E = typename KVCache<S>::Element;
  const gpt2::test::Model<T> m = gpt2::test::random_model<T>(kC, kHeads, 12);
  const gpt2::test::Model<T> other = gpt2::test::random_model<T>(kC, 2, 13);
  const gpt2::AttentionWeights<T> w = m.weights();
  KVBlockPool<S> pool(w.config(), 2);
  PagedSequence<S> seq(pool);
  Workspace<T> ws(w.config()), ws_other(other.config);
  const RowMatrix<T> x = gpt2::test::random_input<T>(20, kC, 14);
  RowMatrix<T> y(20, kC);
  EXPECT_TRUE(Contains(error_of<gpt2::ConfigError>([&] {
                         gpt2::attention_forward<T>(other.weights(), x, seq, ws_other, y);
                       }),
                       "sequence: expected n_embd 128, n_head 2 (the weights'), got n_embd 128, n_head 4"));
  gpt2::attention_forward<T>(w, x, seq, ws, y);
  // out placed inside the pool's storage (a float view over its first bytes)
  T* storage = reinterpret_cast<T*>(const_cast<E*>(pool.key_storage(0).data()));
  Eigen::Map<RowMatrix<T>> in_pool(storage, 1, kC);
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] {
                         gpt2::attention_forward<T>(w, x.topRows(1), seq, ws, in_pool);
                       }),
                       "out: must not overlap the KV block pool"));
  EXPECT_EQ(seq.length(), 20);
  EXPECT_TRUE(Contains(error_of<gpt2::CapacityError>([&] {
                         gpt2::attention_forward<T>(w, x, seq, ws, y);
                       }),
                       "KV block pool: growing a sequence of 20 positions by 20 needs 1 free blocks, 0 of 2 are free"));
  EXPECT_EQ(seq.length(), 20);
}

// A "past" fixture (HF GPT2Attention fed the fixture's chunks with past_key_values): its first
// chunk prefilled once, then two forks of it each fed the remaining chunks (copying the shared
// partly filled block). Both forks' outputs and cached keys and values (HF's `present`) against
// PyTorch, at the accuracy bar of test_reference_incremental; the two forks bitwise alike.
template <class T>
void check_past_forks(const std::string& name) {
  const gpt2::test::Fixture f(name);
  ASSERT_EQ(f.meta("kind"), "past");
  const std::unique_ptr<gpt2::test::CaseInputs<T>> in = gpt2::test::inputs_for<T>(f);
  if (!in) GTEST_SKIP() << "GPT2_SMALL_WEIGHTS not set: skipping the real GPT-2 weights test " << name;
  const gpt2::AttentionWeights<T>& w = in->weights();
  const Index T_ = f.tokens(), C = f.n_embd(), H = f.n_head(), hd = f.head_dim();
  std::vector<Index> chunks;
  {
    std::stringstream csv(f.meta("chunks"));
    for (std::string item; std::getline(csv, item, ',');) chunks.push_back(std::stoll(item));
  }
  const Index br = gpt2::kKVBlockRows;
  KVBlockPool<T> pool(w.config(), 3 * ((T_ + br - 1) / br) + 2);
  PagedSequence<T> root(pool);
  Workspace<T> ws(w.config());
  RowMatrix<T> first_out(chunks[0], C);
  gpt2::attention_forward<T>(w, in->x.topRows(chunks[0]), root, ws, first_out);
  std::vector<PagedSequence<T>> forks;
  forks.push_back(root.fork());
  forks.push_back(root.fork());
  std::vector<RowMatrix<T>> outs(2, RowMatrix<T>(T_, C));
  for (std::size_t i = 0; i < 2; ++i) {
    outs[i].topRows(chunks[0]) = first_out;
    Index pos = chunks[0];
    for (std::size_t c = 1; c < chunks.size(); ++c) {
      gpt2::attention_forward<T>(w, in->x.middleRows(pos, chunks[c]), forks[i], ws,
                                 outs[i].middleRows(pos, chunks[c]));
      pos += chunks[c];
    }
    ASSERT_EQ(pos, T_);
  }
  ASSERT_TRUE(same_bits<T>(outs[1], outs[0]));
  const std::vector<Index>& rows = f.rows();
  const Index R = static_cast<Index>(rows.size());
  for (std::size_t i = 0; i < 2; ++i) {
    RowMatrix<T> out_rows(R, C), k_rows(H * R, hd), v_rows(H * R, hd);
    RowMatrix<double> k_ref(H * R, hd), v_ref(H * R, hd);
    for (Index r = 0; r < R; ++r) out_rows.row(r) = outs[i].row(rows[static_cast<std::size_t>(r)]);
    for (Index h = 0; h < H; ++h) {
      k_ref.middleRows(h * R, R) = f.head("present_k", h);
      v_ref.middleRows(h * R, R) = f.head("present_v", h);
      const RowMatrix<T> k = forks[i].copy_keys(0, h), v = forks[i].copy_values(0, h);
      for (Index r = 0; r < R; ++r) {
        k_rows.row(h * R + r) = k.row(rows[static_cast<std::size_t>(r)]);
        v_rows.row(h * R + r) = v.row(rows[static_cast<std::size_t>(r)]);
      }
    }
    gpt2::test::expect_accurate<T>(f, "out", out_rows, f.matrix("out"));
    gpt2::test::expect_accurate<T>(f, "present_k", k_rows, k_ref);
    gpt2::test::expect_accurate<T>(f, "present_v", v_rows, v_ref);
  }
}

// (float and double pools: a bf16 or int8 pool's keys and values are not PyTorch's float32 ones;
// those pools are held to the KVCache of their storage above, bitwise)
template <class P>
void check_past_forks_of(const std::string& name) {
  if constexpr (std::is_same<typename P::Scalar, typename P::Stored>::value)
    check_past_forks<typename P::Scalar>(name);
  else
    GTEST_SKIP() << "a bf16 or int8 pool: held bitwise to its KVCache by the tests above";
}
TYPED_TEST(PagedAttentionTest, ForksAgainstPyTorch_Tiny) { check_past_forks_of<TypeParam>("past_tiny"); }
TYPED_TEST(PagedAttentionTest, ForksAgainstPyTorch_Small_T40) {
  check_past_forks_of<TypeParam>("past_small_T40");
}
TYPED_TEST(PagedAttentionTest, ForksAgainstPyTorch_RealGpt2Layer0) {
  check_past_forks_of<TypeParam>("past_gpt2_layer0_T64");
}

}  // namespace
