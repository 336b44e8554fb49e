// The paged KV cache (paged_kv_cache.hpp): the block pool and paged sequences against contiguous
// KVCaches holding the same positions: appends in chunks, fork trees, copy-on-write of shared
// partly filled blocks, truncate and release, pool exhaustion (nothing changes), several layers
// on one block table. The paged forwards are tested in test_paged_attention.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/paged_kv_cache.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/models.hpp"

namespace {

using gpt2::AttentionConfig;
using gpt2::Index;
using gpt2::KVBlockPool;
using gpt2::KVCache;
using gpt2::PagedSequence;
using gpt2::RowMatrix;
using gpt2::test::Contains;
using gpt2::test::error_of;

constexpr Index kC = 64, kHeads = 4;  // head_dim 16

template <class T>
class PagedKVCacheTest : public ::testing::Test {};
TYPED_TEST_SUITE(PagedKVCacheTest, gpt2::test::Scalars);

// Bitwise equality, the first differing element reported.
template <class T>
::testing::AssertionResult same_bits(const RowMatrix<T>& a, const RowMatrix<T>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols())
    return ::testing::AssertionFailure() << "shapes differ: [" << a.rows() << ", " << a.cols()
                                         << "] vs [" << b.rows() << ", " << b.cols() << "]";
  for (Index i = 0; i < a.size(); ++i)
    if (std::memcmp(a.data() + i, b.data() + i, sizeof(T)) != 0)
      return ::testing::AssertionFailure() << "element " << i << " (row " << i / a.cols()
                                           << ") differs: " << a.data()[i] << " vs " << b.data()[i];
  return ::testing::AssertionSuccess();
}

// A paged sequence holds, in layer l, what the contiguous cache `cache` holds (every head).
template <class T>
::testing::AssertionResult same_as(const PagedSequence<T>& seq, Index layer, const KVCache<T>& cache) {
  if (seq.length() != cache.n_past())
    return ::testing::AssertionFailure() << "length " << seq.length() << " vs n_past " << cache.n_past();
  for (Index h = 0; h < cache.config().n_head; ++h) {
    const RowMatrix<T> k = cache.keys(h), v = cache.values(h);
    ::testing::AssertionResult rk = same_bits<T>(seq.copy_keys(layer, h), k);
    if (!rk) return rk << " (keys of head " << h << ", layer " << layer << ")";
    ::testing::AssertionResult rv = same_bits<T>(seq.copy_values(layer, h), v);
    if (!rv) return rv << " (values of head " << h << ", layer " << layer << ")";
  }
  return ::testing::AssertionSuccess();
}

// n positions of keys and values [n, C], distinct per seed.
template <class T>
RowMatrix<T> rows(Index n, unsigned seed) {
  return gpt2::test::random_input<T>(n, kC, seed);
}

// A sequence and its contiguous twin, each fed the same rows (one layer).
template <class T>
struct Twin {
  PagedSequence<T> seq;
  KVCache<T> cache;
  void append(Index n, unsigned seed) {
    const RowMatrix<T> k = rows<T>(n, seed), v = rows<T>(n, seed + 1000);
    seq.append(k, v);
    cache.append(k, v);
  }
  Twin fork(Index capacity) const {
    Twin t{seq.fork(), KVCache<T>(cache.config(), capacity)};
    t.cache.copy_from(cache);
    return t;
  }
};

TYPED_TEST(PagedKVCacheTest, PoolShapeAndErrors) {
  using T = TypeParam;
  const AttentionConfig config{kC, kHeads};
  const KVBlockPool<T> pool(config, 10, 3);
  EXPECT_EQ(pool.block_rows(), 16);
  EXPECT_EQ(pool.block_bytes(), 2 * 16 * kC * Index(sizeof(T)));
  EXPECT_EQ(pool.bytes(), 10 * 3 * pool.block_bytes());
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.free_blocks(), 10);
  EXPECT_EQ(pool.key_storage(2).rows(), 10 * kHeads * 16);
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { KVBlockPool<T>(config, 4, 1, 24); }),
                       "block_rows: expected a positive multiple of 16, got 24"));
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { KVBlockPool<T>(config, 4, 0); }),
                       "n_layers: expected a count of at least 1, got 0"));
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { KVBlockPool<T>(config, -1); }),
                       "n_blocks: expected a count in [0, "));
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { pool.key_storage(3); }),
                       "layer: expected an index in [0, 3), got 3"));
  EXPECT_THROW(KVBlockPool<T>(AttentionConfig{kC, 5}, 4), gpt2::ConfigError);
}

// Appends in chunks of many sizes (crossing and filling blocks) give what a KVCache holds, with
// blocks of 16 and of 32 positions; the table has one block per block_rows positions.
TYPED_TEST(PagedKVCacheTest, AppendsEqualContiguousCache) {
  using T = TypeParam;
  for (const Index block_rows : {16, 32}) {
    KVBlockPool<T> pool({kC, kHeads}, 20, 1, block_rows);
    Twin<T> t{PagedSequence<T>(pool), KVCache<T>({kC, kHeads}, 200)};
    unsigned seed = 1;
    for (const Index n : {1, 15, 16, 17, 0, 31, 1, 32, 40, 3}) {
      t.append(n, seed++);
      ASSERT_TRUE(same_as(t.seq, 0, t.cache)) << "block_rows " << block_rows << ", after " << n;
    }
    EXPECT_EQ(t.seq.length(), 156);
    EXPECT_EQ(static_cast<Index>(t.seq.table().size()), (156 + block_rows - 1) / block_rows);
    EXPECT_EQ(pool.used_blocks(), static_cast<Index>(t.seq.table().size()));
    EXPECT_EQ(pool.used_bytes(), pool.used_blocks() * pool.block_bytes());
    // positions are where the header says: block table[p / block_rows], row p % block_rows
    const Index p = 77, h = 2;
    const T* expected = pool.key_storage(0).data() +
                        ((t.seq.table()[p / block_rows] * kHeads + h) * block_rows + p % block_rows) * (kC / kHeads);
    EXPECT_EQ(t.seq.key_row(0, h, p), expected);
    EXPECT_EQ(*t.seq.key_row(0, h, p), t.cache.keys(h)(p, 0));
  }
}

// A fork tree: every node appends its own rows; each matches its contiguous twin (a KVCache
// copied from its parent's, then appended to), and no append changes another node. Shared blocks
// are counted once.
TYPED_TEST(PagedKVCacheTest, ForkTreeEqualsContiguousCaches) {
  using T = TypeParam;
  KVBlockPool<T> pool({kC, kHeads}, 64);
  const Index cap = 400;
  Twin<T> root{PagedSequence<T>(pool), KVCache<T>({kC, kHeads}, cap)};
  root.append(37, 1);  // 2 full blocks + 5 positions of a third
  EXPECT_EQ(pool.used_blocks(), 3);
  std::vector<Twin<T>> nodes;
  nodes.push_back(root.fork(cap));  // a: shares all 3 blocks
  nodes.push_back(root.fork(cap));  // b
  EXPECT_EQ(pool.used_blocks(), 3);  // nothing copied
  for (const std::int32_t b : root.seq.table()) EXPECT_EQ(pool.references(b), 3);
  nodes[0].append(1, 10);            // a copies the shared partial block, then writes in it
  EXPECT_EQ(pool.used_blocks(), 4);
  EXPECT_NE(nodes[0].seq.table()[2], root.seq.table()[2]);
  EXPECT_EQ(nodes[0].seq.table()[0], root.seq.table()[0]);  // full blocks stay shared
  nodes.push_back(nodes[0].fork(cap));  // a1: child of a at 38 positions
  nodes[1].append(30, 20);              // b: copy + 2 new blocks
  nodes[2].append(5, 30);               // a1 copies a's partial block
  nodes[0].append(11, 40);              // a fills its block to 48... and in place (a1 has its copy)
  nodes.push_back(nodes[1].fork(cap));  // b1 at 67 positions
  nodes.push_back(nodes[1].fork(cap));  // b2
  nodes[3].append(64, 50);
  nodes[4].append(1, 60);
  root.append(2, 70);  // a and b copied the root's partial block: it holds it alone, in place
  ASSERT_TRUE(same_as(root.seq, 0, root.cache));
  for (std::size_t i = 0; i < nodes.size(); ++i)
    ASSERT_TRUE(same_as(nodes[i].seq, 0, nodes[i].cache)) << "node " << i;
  // Blocks in use = distinct ids over all tables.
  std::vector<bool> seen(64, false);
  Index distinct = 0;
  const auto count = [&](const PagedSequence<T>& s) {
    for (const std::int32_t b : s.table())
      if (!seen[static_cast<std::size_t>(b)]) seen[static_cast<std::size_t>(b)] = true, ++distinct;
  };
  count(root.seq);
  for (const Twin<T>& n : nodes) count(n.seq);
  EXPECT_EQ(pool.used_blocks(), distinct);
  // Releasing every node but the root gives back all blocks the root does not hold.
  nodes.clear();
  EXPECT_EQ(pool.used_blocks(), 3);
  for (const std::int32_t b : root.seq.table()) EXPECT_EQ(pool.references(b), 1);
  ASSERT_TRUE(same_as(root.seq, 0, root.cache));
}

// Copy-on-write: a shared partly filled block is copied by the sequence that appends to it
// (only its filled rows matter), the others keep reading the original; a full shared block is
// never copied; the last holder writes in place.
TYPED_TEST(PagedKVCacheTest, CopyOnWrite) {
  using T = TypeParam;
  KVBlockPool<T> pool({kC, kHeads}, 8);
  Twin<T> root{PagedSequence<T>(pool), KVCache<T>({kC, kHeads}, 64)};
  root.append(10, 1);
  const std::int32_t original = root.seq.table()[0];
  Twin<T> child = root.fork(64);
  EXPECT_EQ(pool.references(original), 2);
  child.append(1, 2);
  EXPECT_NE(child.seq.table()[0], original);
  EXPECT_EQ(pool.references(original), 1);
  EXPECT_EQ(pool.references(child.seq.table()[0]), 1);
  root.append(3, 3);  // alone in its block again: in place
  EXPECT_EQ(root.seq.table()[0], original);
  EXPECT_EQ(pool.used_blocks(), 2);
  ASSERT_TRUE(same_as(root.seq, 0, root.cache));
  ASSERT_TRUE(same_as(child.seq, 0, child.cache));

  // A full block: the fork's append takes a new block, the full one stays shared.
  Twin<T> full{PagedSequence<T>(pool), KVCache<T>({kC, kHeads}, 64)};
  full.append(16, 4);
  Twin<T> full_child = full.fork(64);
  full_child.append(1, 5);
  EXPECT_EQ(full_child.seq.table()[0], full.seq.table()[0]);
  EXPECT_EQ(pool.references(full.seq.table()[0]), 2);
  ASSERT_TRUE(same_as(full.seq, 0, full.cache));
  ASSERT_TRUE(same_as(full_child.seq, 0, full_child.cache));

  // Truncating into a shared block and appending copies it too (the sibling's rows survive).
  Twin<T> a = full.fork(64);
  a.seq.truncate(9);
  a.cache.truncate(9);
  a.append(4, 6);
  EXPECT_NE(a.seq.table()[0], full.seq.table()[0]);
  ASSERT_TRUE(same_as(a.seq, 0, a.cache));
  ASSERT_TRUE(same_as(full.seq, 0, full.cache));
  ASSERT_TRUE(same_as(full_child.seq, 0, full_child.cache));
}

// One batched grow of several sequences sharing one partial block copies it once per sequence
// but the last holder, which writes in place: a pool with exactly the blocks that needs suffices.
TYPED_TEST(PagedKVCacheTest, BatchedGrowCountsCopiesExactly) {
  using T = TypeParam;
  KVBlockPool<T> pool({kC, kHeads}, 3);
  PagedSequence<T> a(pool);
  a.append(rows<T>(5, 1), rows<T>(5, 2));
  PagedSequence<T> b = a.fork(), c = a.fork();
  a.release();  // b and c hold the block: growing both needs one copy, not two
  EXPECT_EQ(pool.references(b.table()[0]), 2);
  PagedSequence<T>* both[] = {&b, &c};
  const Index one[] = {1, 1};
  pool.grow(both, one, 2);
  EXPECT_NE(b.table()[0], c.table()[0]);
  EXPECT_EQ(pool.used_blocks(), 2);
  // Now 1 block is free. b and c at 6 positions each, alone in their blocks; a fork of each
  // shares a partial block: growing b, c, b's fork and c's fork by 1 needs 2 copies: 1 free
  // block is not enough, and nothing changes.
  PagedSequence<T> bf = b.fork(), cf = c.fork();
  const std::vector<std::int32_t> tables[] = {b.table(), c.table(), bf.table(), cf.table()};
  PagedSequence<T>* four[] = {&b, &c, &bf, &cf};
  const Index ones[] = {1, 1, 1, 1};
  const std::string e = error_of<gpt2::CapacityError>([&] { pool.grow(four, ones, 4); });
  EXPECT_TRUE(Contains(e, "KV block pool: growing 4 sequences needs 2 free blocks, 1 of 3 are free"));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(four[i]->table(), tables[i]) << i;
    EXPECT_EQ(four[i]->length(), 6) << i;
  }
  EXPECT_EQ(pool.used_blocks(), 2);
  EXPECT_EQ(pool.references(b.table()[0]), 2);
  PagedSequence<T>* two[] = {&b, &bf};
  pool.grow(two, one, 2);  // one copy: fits
  EXPECT_EQ(pool.free_blocks(), 0);
}

// Exhaustion: a grow that does not fit is a CapacityError naming the need and what is free, and
// leaves every sequence (table, length, data) and the pool as they were; what fits still works.
TYPED_TEST(PagedKVCacheTest, ExhaustionChangesNothing) {
  using T = TypeParam;
  KVBlockPool<T> pool({kC, kHeads}, 5);
  Twin<T> root{PagedSequence<T>(pool), KVCache<T>({kC, kHeads}, 200)};
  root.append(40, 1);  // 3 blocks
  Twin<T> child = root.fork(200);
  const std::vector<std::int32_t> root_table = root.seq.table(), child_table = child.seq.table();
  // child + 40 positions: copy of block 2 and 2 new blocks: 3 > 2 free
  const std::string e = error_of<gpt2::CapacityError>([&] { child.seq.append(rows<T>(40, 2), rows<T>(40, 3)); });
  EXPECT_TRUE(Contains(e, "KV block pool: growing a sequence of 40 positions by 40 needs 3 free blocks, 2 of 5 are free (blocks of 16 positions)"));
  EXPECT_EQ(child.seq.table(), child_table);
  EXPECT_EQ(root.seq.table(), root_table);
  EXPECT_EQ(pool.used_blocks(), 3);
  for (const std::int32_t b : root_table) EXPECT_EQ(pool.references(b), 2);
  ASSERT_TRUE(same_as(root.seq, 0, root.cache));
  ASSERT_TRUE(same_as(child.seq, 0, child.cache));
  child.append(24, 4);  // copy + 1 block: fits exactly
  EXPECT_EQ(pool.free_blocks(), 0);
  // The root holds its partial block alone now (the child copied it): 9 positions need a block,
  // 8 fit in place.
  EXPECT_THROW(root.seq.grow(9), gpt2::CapacityError);
  ASSERT_TRUE(same_as(root.seq, 0, root.cache));
  root.append(8, 5);
  ASSERT_TRUE(same_as(root.seq, 0, root.cache));
  ASSERT_TRUE(same_as(child.seq, 0, child.cache));
}

TYPED_TEST(PagedKVCacheTest, GrowInPlaceNeedsNoFreeBlock) {
  using T = TypeParam;
  KVBlockPool<T> pool({kC, kHeads}, 1);
  Twin<T> t{PagedSequence<T>(pool), KVCache<T>({kC, kHeads}, 20)};
  t.append(10, 1);
  t.append(6, 2);  // in place up to 16
  EXPECT_EQ(pool.free_blocks(), 0);
  EXPECT_THROW(t.append(1, 3), gpt2::CapacityError);
  ASSERT_TRUE(same_as(t.seq, 0, t.cache));
  t.seq.truncate(15);
  t.cache.truncate(15);
  t.append(1, 4);
  ASSERT_TRUE(same_as(t.seq, 0, t.cache));
}

// truncate gives back whole blocks past the new length; release and destruction give back all.
TYPED_TEST(PagedKVCacheTest, TruncateReleaseAndMove) {
  using T = TypeParam;
  KVBlockPool<T> pool({kC, kHeads}, 10);
  {
    PagedSequence<T> s(pool, 100);
    s.append(rows<T>(50, 1), rows<T>(50, 2));
    EXPECT_EQ(pool.used_blocks(), 4);
    s.truncate(33);
    EXPECT_EQ(pool.used_blocks(), 3);
    s.truncate(32);
    EXPECT_EQ(pool.used_blocks(), 2);
    EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { s.truncate(33); }),
                         "truncate: expected a length in [0, 32] (the positions held), got 33"));
    PagedSequence<T> moved(std::move(s));
    EXPECT_EQ(s.length(), 0);
    EXPECT_TRUE(s.table().empty());
    EXPECT_EQ(moved.length(), 32);
    EXPECT_EQ(pool.used_blocks(), 2);
    PagedSequence<T> other(pool);
    other.append(rows<T>(3, 3), rows<T>(3, 4));
    EXPECT_EQ(pool.used_blocks(), 3);
    other = std::move(moved);  // other's own block goes back
    EXPECT_EQ(pool.used_blocks(), 2);
    PagedSequence<T> f = other.fork();
    other.release();
    EXPECT_EQ(other.length(), 0);
    EXPECT_EQ(pool.used_blocks(), 2);  // f holds them
    s.append(rows<T>(1, 5), rows<T>(1, 6));  // a moved-from sequence is usable
    EXPECT_EQ(pool.used_blocks(), 3);
  }
  EXPECT_EQ(pool.used_blocks(), 0);
}

// Several layers on one table: the same block ids, each layer's data its own; a copy-on-write
// copies the block in every layer.
TYPED_TEST(PagedKVCacheTest, LayersShareOneTable) {
  using T = TypeParam;
  const Index L = 3;
  KVBlockPool<T> pool({kC, kHeads}, 12, L);
  PagedSequence<T> root(pool);
  std::vector<KVCache<T>> root_caches, child_caches;
  for (Index l = 0; l < L; ++l) root_caches.emplace_back(AttentionConfig{kC, kHeads}, 100);
  root.grow(21);
  for (Index l = 0; l < L; ++l) {
    const RowMatrix<T> k = rows<T>(21, 10 + l), v = rows<T>(21, 20 + l);
    root.write_last(l, k, v);
    root_caches[l].append(k, v);
  }
  PagedSequence<T> child = root.fork();
  for (Index l = 0; l < L; ++l) {
    child_caches.emplace_back(AttentionConfig{kC, kHeads}, 100);
    child_caches.back().copy_from(root_caches[l]);
  }
  EXPECT_EQ(pool.used_blocks(), 2);  // one table: 2 blocks for every layer
  child.grow(30);                    // copy of block 1 in every layer + 2 blocks
  EXPECT_EQ(pool.used_blocks(), 5);
  for (Index l = 0; l < L; ++l) {
    const RowMatrix<T> k = rows<T>(30, 30 + l), v = rows<T>(30, 40 + l);
    child.write_last(l, k, v);
    child_caches[l].append(k, v);
  }
  EXPECT_EQ(pool.used_bytes(), 5 * L * pool.block_bytes());
  for (Index l = 0; l < L; ++l) {
    ASSERT_TRUE(same_as(root, l, root_caches[l])) << "layer " << l;
    ASSERT_TRUE(same_as(child, l, child_caches[l])) << "layer " << l;
  }
  EXPECT_TRUE(Contains(error_of<gpt2::ConfigError>([&] { child.append(rows<T>(1, 1), rows<T>(1, 2)); }),
                       "append: expected a one-layer pool, got 3 layers"));
}

// Writes are checked: shapes, rows beyond the length, a layer out of range, and a write into a
// block shared with another sequence (a fork between grow and the write) are refused, and change
// nothing.
TYPED_TEST(PagedKVCacheTest, WriteChecks) {
  using T = TypeParam;
  KVBlockPool<T> pool({kC, kHeads}, 4, 2);
  PagedSequence<T> s(pool);
  s.grow(5);
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { s.write_last(0, rows<T>(6, 1), rows<T>(6, 2)); }),
                       "k: expected at most 5 rows (the positions held; grow() first), got 6"));
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] {
                         s.write_last(0, rows<T>(2, 1), RowMatrix<T>(RowMatrix<T>::Zero(2, kC - 1)));
                       }),
                       "v: expected shape [2, 64], got [2, 63]"));
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { s.write_last(2, rows<T>(1, 1), rows<T>(1, 2)); }),
                       "layer: expected an index in [0, 2), got 2"));
  s.write_last(0, rows<T>(5, 1), rows<T>(5, 2));
  s.write_last(1, rows<T>(5, 3), rows<T>(5, 4));
  s.grow(1);
  PagedSequence<T> early = s.fork();  // between grow and the layers' writes
  const RowMatrix<T> before = s.copy_keys(0, 0);
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { s.write_last(0, rows<T>(1, 5), rows<T>(1, 6)); }),
                       "paged sequence: positions 5 .. 5 lie in block 0, shared by 2 sequences"));
  EXPECT_TRUE(same_bits<T>(s.copy_keys(0, 0), before));
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { s.key_row(0, 0, 6); }),
                       "position: expected an index in [0, 6) (the positions held), got 6"));
  EXPECT_TRUE(Contains(error_of<gpt2::ShapeError>([&] { s.copy_keys(0, kHeads); }),
                       "head: expected an index in [0, 4), got 4"));
  KVBlockPool<T> other({kC, kHeads}, 4);
  PagedSequence<T> stranger(other);
  PagedSequence<T>* seqs[] = {&stranger};
  const Index n[] = {1};
  EXPECT_TRUE(Contains(error_of<gpt2::ConfigError>([&] { pool.grow(seqs, n, 1); }),
                       "grow: sequence 0 belongs to another pool"));
}

}  // namespace
