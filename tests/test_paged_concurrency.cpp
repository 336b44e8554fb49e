// The thread rules of the paged KV cache (paged_kv_cache.hpp, docs/paged-kv-cache.md), exercised
// by many std::threads on one pool: forks of one shared parent at once, grows with
// copy-on-write of the parent's shared partly filled block, writes, truncates and releases of
// different sequences at once, and paged decode forwards of sequences sharing a prompt's blocks,
// reading them while other threads copy, allocate and free blocks. Every result is checked
// against contiguous KVCaches (bitwise). The tsan preset runs this program under ThreadSanitizer
// (OpenMP off there); the ci and asan presets run it too.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/paged_kv_cache.hpp"
#include "gpt2/paged_kv_cache.hpp"
#include "support/models.hpp"

namespace {

using gpt2::Index;
using gpt2::KVBlockPool;
using gpt2::KVCache;
using gpt2::PagedSequence;
using gpt2::RowMatrix;

constexpr int kThreads = 8;
constexpr Index kC = 64, kHeads = 2, kLayers = 2;
constexpr Index kPrompt = 37;  // 2 full blocks and 5 positions of a shared partly filled third

bool same(const RowMatrix<float>& a, const RowMatrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0;
}

// The sequence holds, in every layer, what the layer's contiguous cache holds.
bool holds(const PagedSequence<float>& s, const std::vector<KVCache<float>>& caches) {
  for (Index l = 0; l < kLayers; ++l)
    for (Index h = 0; h < kHeads; ++h) {
      const KVCache<float>& c = caches[static_cast<std::size_t>(l)];
      if (s.length() != c.n_past() || !same(s.copy_keys(l, h), RowMatrix<float>(c.keys(h))) ||
          !same(s.copy_values(l, h), RowMatrix<float>(c.values(h))))
        return false;
    }
  return true;
}

std::vector<KVCache<float>> copies_of(const std::vector<KVCache<float>>& caches, Index capacity) {
  std::vector<KVCache<float>> out;
  for (const KVCache<float>& c : caches) {
    out.emplace_back(c.config(), capacity);
    out.back().copy_from(c);
  }
  return out;
}

// [n, C] of values from seed, without std::rand (not for threads).
RowMatrix<float> values(Index n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  RowMatrix<float> m(n, kC);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
  return m;
}

// n positions of every layer appended to s (one grow, then a write per layer) and to caches.
void append(PagedSequence<float>& s, std::vector<KVCache<float>>& caches, Index n, unsigned seed) {
  s.grow(n);
  for (Index l = 0; l < kLayers; ++l) {
    const RowMatrix<float> k = values(n, seed + 17 * static_cast<unsigned>(l));
    const RowMatrix<float> v = values(n, seed + 17 * static_cast<unsigned>(l) + 1);
    s.write_last(l, k, v);
    caches[static_cast<std::size_t>(l)].append(k, v);
  }
}

// Bookkeeping under contention: every thread forks the shared root (at once), grows its child
// across the root's shared partial block (copy-on-write racing with the other threads' copies of
// the same block), forks grandchildren, truncates and releases; the pool ends holding the root's
// blocks alone, and every sequence held what its contiguous twin held.
TEST(PagedConcurrency, ForkGrowReleaseOnManyThreads) {
  const gpt2::AttentionConfig config{kC, kHeads};
  KVBlockPool<float> pool(config, 4 + kThreads * 16, kLayers);
  PagedSequence<float> root(pool);
  std::vector<KVCache<float>> root_caches;
  for (Index l = 0; l < kLayers; ++l) root_caches.emplace_back(config, 400);
  append(root, root_caches, kPrompt, 1);
  const std::vector<std::int32_t> root_table = root.table();

  std::atomic<int> failures{0}, capacity_errors{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      for (int round = 0; round < 3; ++round) {
        const unsigned seed = 1000u * static_cast<unsigned>(t + 1) + 100u * static_cast<unsigned>(round);
        PagedSequence<float> child = root.fork();  // forks of one parent at once
        std::vector<KVCache<float>> caches = copies_of(root_caches, 400);
        append(child, caches, 1 + t % 3, seed);     // copy-on-write of the shared block
        append(child, caches, 20, seed + 1);
        if (!holds(child, caches)) ++failures;
        PagedSequence<float> grandchild = child.fork();
        std::vector<KVCache<float>> gcaches = copies_of(caches, 400);
        append(grandchild, gcaches, 3, seed + 2);
        append(child, caches, 2, seed + 3);
        child.truncate(kPrompt + 4);
        for (KVCache<float>& c : caches) c.truncate(kPrompt + 4);
        append(child, caches, 9, seed + 4);
        try {  // far more than the pool holds: refused, nothing changed
          child.grow(100000);
        } catch (const gpt2::CapacityError&) {
          ++capacity_errors;
        }
        if (!holds(child, caches) || !holds(grandchild, gcaches)) ++failures;
      }
    });
  go = true;
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(capacity_errors.load(), 3 * kThreads);
  EXPECT_EQ(root.table(), root_table);
  EXPECT_TRUE(holds(root, root_caches));
  EXPECT_EQ(pool.used_blocks(), static_cast<Index>(root_table.size()));
  for (const std::int32_t b : root_table) EXPECT_EQ(pool.references(b), 1);
}

// Decoding under contention: one prompt prefilled once, every thread decodes its own forks of it
// through the paged forward (single and batched), with the shared weights, while the other
// threads do the same: each thread's outputs bitwise equal the contiguous forwards' computed on
// one thread beforehand.
TEST(PagedConcurrency, DecodeForksOfOnePromptOnManyThreads) {
  const gpt2::test::Model<float> m = gpt2::test::random_model<float>(kC, kHeads, 7);
  const gpt2::AttentionWeights<float> w = m.weights();
  const RowMatrix<float> prompt = gpt2::test::random_input<float>(kPrompt, kC, 8);
  constexpr Index kSteps = 12, kForks = 2;
  // thread t, fork f: kSteps tokens tokens[t * kForks + f] [kSteps, C], made here (std::rand is
  // not for threads)
  std::vector<RowMatrix<float>> tokens;
  for (int t = 0; t < kThreads; ++t)
    for (Index f = 0; f < kForks; ++f)
      tokens.push_back(gpt2::test::random_input<float>(kSteps, kC, 50u + 10u * static_cast<unsigned>(t) + static_cast<unsigned>(f)));
  const auto tokens_of = [&](int t, Index f) -> const RowMatrix<float>& {
    return tokens[static_cast<std::size_t>(t * kForks + f)];
  };
  // The expected outputs, on this thread, through contiguous caches.
  KVCache<float> prompt_cache(w.config(), kPrompt + kSteps);
  gpt2::Workspace<float> ws(w.config());
  RowMatrix<float> prompt_out(kPrompt, kC);
  gpt2::attention_forward<float>(w, prompt, prompt_cache, ws, prompt_out);
  std::vector<RowMatrix<float>> expected;  // [thread * kForks + f]: [kSteps, C]
  for (int t = 0; t < kThreads; ++t)
    for (Index f = 0; f < kForks; ++f) {
      KVCache<float> c = prompt_cache.copy();
      const RowMatrix<float>& x = tokens_of(t, f);
      RowMatrix<float> y(kSteps, kC);
      for (Index i = 0; i < kSteps; ++i)
        gpt2::attention_forward<float>(w, x.row(i), c, ws, y.row(i));
      expected.push_back(y);
    }

  KVBlockPool<float> pool(w.config(), 3 + kThreads * kForks * 2);
  PagedSequence<float> root(pool);
  {
    RowMatrix<float> y(kPrompt, kC);
    gpt2::attention_forward<float>(w, prompt, root, ws, y);
  }
  std::atomic<int> failures{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      gpt2::Workspace<float> tws(w.config(), kForks, kPrompt + kSteps);
      while (!go.load()) std::this_thread::yield();
      std::vector<PagedSequence<float>> forks;
      for (Index f = 0; f < kForks; ++f) forks.push_back(root.fork());
      std::vector<PagedSequence<float>*> ptrs;
      for (PagedSequence<float>& s : forks) ptrs.push_back(&s);
      std::vector<RowMatrix<float>> x, y;
      for (Index f = 0; f < kForks; ++f) x.push_back(tokens_of(t, f)), y.emplace_back(kSteps, kC);
      RowMatrix<float> xs(kForks, kC), ys(kForks, kC);
      const gpt2::BatchLayout step = gpt2::BatchLayout::full(kForks, 1);
      for (Index i = 0; i < kSteps; ++i) {
        if (i % 2 == 0) {  // one sequence at a time
          for (Index f = 0; f < kForks; ++f)
            gpt2::attention_forward<float>(w, x[static_cast<std::size_t>(f)].row(i), forks[static_cast<std::size_t>(f)], tws,
                                           y[static_cast<std::size_t>(f)].row(i));
        } else {  // batched
          for (Index f = 0; f < kForks; ++f) xs.row(f) = x[static_cast<std::size_t>(f)].row(i);
          gpt2::attention_forward<float>(w, xs, step, ptrs, tws, ys);
          for (Index f = 0; f < kForks; ++f) y[static_cast<std::size_t>(f)].row(i) = ys.row(f);
        }
      }
      for (Index f = 0; f < kForks; ++f)
        if (!same(y[static_cast<std::size_t>(f)], expected[static_cast<std::size_t>(t * kForks + f)])) ++failures;
    });
  go = true;
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(pool.used_blocks(), 3);
}

}  // namespace
