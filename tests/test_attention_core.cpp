// The fused attention core (kernels/attention_tile.hpp, avx2_attention.hpp, avx512_attention.hpp,
// and detail/pipeline.hpp's attend_rows / HeadPages):
// - each vector level bit for bit against the scalar emulation of the documented steps, over head
//   sizes with every tail, tile sizes, positions around the 64-key blocks, paged keys, sentinels;
// - avx2 == avx512 bit for bit;
// - avx512_bf16's core for bf16 weights (both products in bf16 pairs before a row's own key block)
//   bit for bit against the emulation of those steps, and row-exact like the float32 core;
// - at every level (generic too; float and double): a row gives the same bits alone, inside any
//   tile, split into any chunks, and through pages of 16 or 32 rows in shuffled order;
// - against a double reference (accuracy), and the special values: a NaN key poisons only the rows
//   that see it, an Inf value likewise, huge logits, tiny ones, all keys at -inf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/causal_attention.hpp"
#include "gpt2/kernels/dispatch.hpp"
#include "kernel_emulation.hpp"
#include "support/compare.hpp"
#include "support/models.hpp"

namespace {

using gpt2::Index;
using gpt2::Isa;
using gpt2::RowMatrix;
namespace emu = gpt2::test::emulation;

template <class T>
std::uint64_t bits_of(T v) {
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}

template <class T>
bool same_bits(const RowMatrix<T>& a, const RowMatrix<T>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  for (Index i = 0; i < a.rows(); ++i)
    for (Index j = 0; j < a.cols(); ++j)
      if (bits_of(a(i, j)) != bits_of(b(i, j))) return false;
  return true;
}

template <class T>
RowMatrix<T> random_matrix(Index rows, Index cols, std::uint32_t seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g(0.0, scale);
  RowMatrix<T> m(rows, cols);
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j) m(i, j) = static_cast<T>(g(rng));
  return m;
}

// Keys and values copied into pages of page_rows rows (stride `stride`), the pages in shuffled
// order in one pool: the HeadPages view of them. aligned64: the pool starts on a 64-byte boundary
// (with a stride of whole cache lines every row then does: the kernels read such value rows in
// place, others through an aligned copy).
template <class T>
struct Paged {
  std::vector<T> pool;
  std::vector<const T*> key_pages, value_pages;
  gpt2::HeadPages<T> view;

  Paged(const RowMatrix<T>& k, const RowMatrix<T>& v, Index page_rows, Index stride,
        std::uint32_t seed, bool aligned64 = false) {
    const Index n = k.rows(), hd = k.cols(), pages = (n + page_rows - 1) / page_rows;
    const Index line = 64 / static_cast<Index>(sizeof(T));
    pool.assign(static_cast<std::size_t>(2 * pages * page_rows * stride + line), T(-7777));
    T* base = pool.data();
    while (aligned64 && reinterpret_cast<std::uintptr_t>(base) % 64 != 0) ++base;
    std::vector<Index> slot(static_cast<std::size_t>(2 * pages));
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), std::mt19937(seed));
    for (Index p = 0; p < pages; ++p) {
      T* kp = base + slot[p] * page_rows * stride;
      T* vp = base + slot[pages + p] * page_rows * stride;
      for (Index r = 0; r < page_rows && p * page_rows + r < n; ++r)
        for (Index d = 0; d < hd; ++d) {
          kp[r * stride + d] = k(p * page_rows + r, d);
          vp[r * stride + d] = v(p * page_rows + r, d);
        }
      key_pages.push_back(kp);
      value_pages.push_back(vp);
    }
    view.key_pages = key_pages.data();
    view.value_pages = value_pages.data();
    view.page_rows = page_rows;
    view.row_stride = stride;
    view.n_keys = n;
    view.head_dim = hd;
  }
};

// out [T, hd] of q [T, hd] over k, v [n_keys, hd], tiles of `tile` rows; bf16: the tiles flagged
// as bf16 weights' (at avx512_bf16 both products in bf16 pairs before a row's own block).
template <class T>
RowMatrix<T> attend(const RowMatrix<T>& q, const RowMatrix<T>& k, const RowMatrix<T>& v,
                    Index tile = gpt2::kAttentionRowBlock, bool bf16 = false) {
  RowMatrix<T> out = RowMatrix<T>::Constant(q.rows(), q.cols(), T(-999));
  gpt2::AttentionScratch<T> scratch(k.rows(), q.cols());
  scratch.set_bf16_products(bf16);
  gpt2::ConstMatrixRef<T> qr = q;
  gpt2::MatrixRef<T> o = out;
  const T* pages[2];
  const gpt2::HeadPages<T> kv = gpt2::detail::one_page<T>(k, v, pages);
  for (Index r0 = 0; r0 < q.rows(); r0 += tile)
    gpt2::detail::attend_rows<T, T>(gpt2::kernels::table<T>(), qr, kv, r0,
                                    std::min(tile, q.rows() - r0), o, scratch);
  return out;
}

// Double reference of one row set: softmax(q k^T / sqrt(hd), causal) v.
RowMatrix<double> reference(const RowMatrix<double>& q, const RowMatrix<double>& k,
                            const RowMatrix<double>& v) {
  const Index T_ = q.rows(), n = k.rows(), past = n - T_;
  RowMatrix<double> out(T_, q.cols());
  for (Index i = 0; i < T_; ++i) {
    Eigen::VectorXd s = k.topRows(past + i + 1) * q.row(i).transpose() / std::sqrt(double(q.cols()));
    s = (s.array() - s.maxCoeff()).exp();
    s /= s.sum();
    out.row(i) = s.transpose() * v.topRows(past + i + 1);
  }
  return out;
}

#if GPT2_KERNELS_HAVE_AVX2 && GPT2_KERNELS_HAVE_AVX512

class CoreKernels : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!gpt2::isa_supported(GetParam()))
      GTEST_SKIP() << "skipped: the CPU has no " << gpt2::isa_name(GetParam());
  }
  const gpt2::kernels::Kernels<float>& k() const { return gpt2::kernels::table<float>(GetParam()); }
};

struct TileCase {
  Index rows, first_pos, head_dim, page_rows;
  bool aligned = false;     // key and value rows on 64-byte boundaries (else stride hd + 7)
  bool transposed = false;  // the keys in transposed blocks too (AttentionTile::keys_t)
};

// out of the level's kernel and of the emulation, for one tile (q stride hd + 3, out stride hd + 5
// with sentinels around).
void check_tile(const gpt2::kernels::Kernels<float>& kern, const TileCase& c, std::uint32_t seed,
                double scale = 1.0, bool bf16 = false) {
  const Index n_keys = c.first_pos + c.rows, hd = c.head_dim;
  const RowMatrix<float> q = random_matrix<float>(c.rows, hd + 3, seed, scale);
  const RowMatrix<float> k = random_matrix<float>(n_keys, hd, seed + 1, scale);
  const RowMatrix<float> v = random_matrix<float>(n_keys, hd, seed + 2);
  const Index page_rows = c.page_rows > 0 ? c.page_rows : std::max<Index>(1, n_keys);
  const Index stride = c.aligned ? (hd + 15) / 16 * 16 + 16 : hd + 7;
  Paged<float> paged(k, v, page_rows, stride, seed + 3, c.aligned);
  std::vector<float> scratch_store(
      static_cast<std::size_t>(gpt2::kernels::attention_scratch_size<float>(hd) + 16));
  float* scratch = scratch_store.data();
  while (reinterpret_cast<std::uintptr_t>(scratch) % 64 != 0) ++scratch;
  const Index ldo = hd + 5;
  std::vector<float> got(static_cast<std::size_t>(c.rows * ldo + 8), -12345.5f), want = got;
  gpt2::kernels::AttentionTile<float> t;
  t.rows = c.rows;
  t.first_pos = c.first_pos;
  t.head_dim = hd;
  t.q = q.data();
  t.ldq = q.outerStride();
  t.key_pages = paged.key_pages.data();
  t.value_pages = paged.value_pages.data();
  t.page_rows = page_rows;
  t.key_stride = stride;
  t.value_stride = stride;
  t.scale = 1.0f / std::sqrt(float(hd));
  t.out = got.data();
  t.ldo = ldo;
  t.scratch = scratch;
  t.bf16 = bf16;
  std::vector<float> keys_t;  // block b's (d, j) at [(b hd + d) 64 + j]; lanes past n_keys junk
  if (c.transposed) {
    const Index blocks = (n_keys + 63) / 64;
    keys_t.assign(static_cast<std::size_t>(blocks * hd * 64 + 16), 31.0f);
    float* kt = keys_t.data();
    while (reinterpret_cast<std::uintptr_t>(kt) % 64 != 0) ++kt;
    for (Index j = 0; j < n_keys; ++j)
      for (Index d = 0; d < hd; ++d) kt[((j / 64) * hd + d) * 64 + j % 64] = k(j, d);
    t.keys_t = kt;
  }
  kern.attention_tile(t);
  std::vector<const float*> krow(static_cast<std::size_t>(n_keys)), vrow(krow.size());
  for (Index j = 0; j < n_keys; ++j) {
    krow[j] = paged.key_pages[j / page_rows] + (j % page_rows) * stride;
    vrow[j] = paged.value_pages[j / page_rows] + (j % page_rows) * stride;
  }
  emu::attention_tile(c.rows, c.first_pos, hd, q.data(), q.outerStride(), krow.data(), vrow.data(),
                      t.scale, want.data(), ldo, bf16 && kern.isa == Isa::avx512_bf16);
  const std::string where = std::string(bf16 ? "bf16 tile, " : "") + "rows " +
                            std::to_string(c.rows) + " first_pos " +
                            std::to_string(c.first_pos) + " head_dim " + std::to_string(hd) +
                            " page_rows " + std::to_string(c.page_rows) +
                            (c.aligned ? " aligned" : "") + (c.transposed ? " keys_t" : "");
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(bits_of(got[i]), bits_of(want[i]))
        << where << ": element " << i << " (row " << Index(i) / ldo << ", col " << Index(i) % ldo
        << ") got " << got[i] << " want " << want[i];
}

// Every tile shape of the tests below, float32 or flagged bf16 (bf16 weights: at avx512_bf16 both
// products in bf16 pairs before a row's own block; at the other levels the same float32 core).
void check_tiles(const gpt2::kernels::Kernels<float>& kern, bool bf16) {
  std::uint32_t seed = 100;
  for (Index hd : {64, 1, 5, 8, 15, 16, 17, 31, 33, 48, 63, 65, 100, 128, 130})
    for (Index rows : {1, 2, 3, 4, 5, 6, 7, 13, 64})
      for (Index first_pos : {0, 1, 63, 64, 65, 130}) check_tile(kern, {rows, first_pos, hd, 0}, seed++, 1.0, bf16);
  for (Index first_pos : {127, 191, 255, 256, 300, 511, 700, 1023})  // decode: blocks in groups
    check_tile(kern, {1, first_pos, 64, 0}, seed++, 1.0, bf16);
  check_tile(kern, {1, 700, 33, 0}, seed++, 1.0, bf16);
  check_tile(kern, {1, 700, 100, 32}, seed++, 1.0, bf16);
  for (Index page_rows : {16, 32, 48})
    for (Index first_pos : {0, 15, 16, 200})
      for (Index rows : {1, 7, 64}) check_tile(kern, {rows, first_pos, 64, page_rows}, seed++, 1.0, bf16);
  // rows on cache lines (p v reads the values in place), with a tail and in pages
  for (Index hd : {64, 48, 100})
    for (Index rows : {16, 40, 64})
      for (Index first_pos : {0, 65, 130})
        for (Index page_rows : {0, 32}) check_tile(kern, {rows, first_pos, hd, page_rows, true}, seed++, 1.0, bf16);
  // decode steps over keys kept in transposed blocks (a cache's), head sizes odd and even
  for (Index hd : {64, 33, 17, 100})
    for (Index first_pos : {63, 64, 200, 700})
      check_tile(kern, {1, first_pos, hd, 0, false, true}, seed++, 1.0, bf16);
  // logits in the hundreds: the block maxima differ a lot, the merge factors underflow
  for (Index first_pos : {0, 100}) check_tile(kern, {64, first_pos, 64, 0}, seed++, 6.0, bf16);
}

TEST_P(CoreKernels, TileMatchesEmulation) { check_tiles(k(), false); }

TEST_P(CoreKernels, Bf16TileMatchesEmulation) { check_tiles(k(), true); }

INSTANTIATE_TEST_SUITE_P(Levels, CoreKernels,
                         ::testing::Values(Isa::avx2, Isa::avx512, Isa::avx512_bf16),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(gpt2::isa_name(info.param));
                         });

TEST(CoreLevels, Avx2AndAvx512GiveTheSameBits) {
  if (!gpt2::isa_supported(Isa::avx512)) GTEST_SKIP() << "skipped: the CPU has no avx512";
  const RowMatrix<float> q = random_matrix<float>(300, 64, 1), k = random_matrix<float>(400, 64, 2),
                         v = random_matrix<float>(400, 64, 3);
  gpt2::set_isa(Isa::avx2);
  const RowMatrix<float> a = attend<float>(q, k, v);
  gpt2::set_isa(Isa::avx512);
  const RowMatrix<float> b = attend<float>(q, k, v);
  gpt2::reset_isa();
  EXPECT_TRUE(same_bits(a, b));
}

#endif

// ---- bf16 pages: the tile reads them widened, exactly ------------------------------------------

// At every level, a tile over keys and values held as bf16 bits (a bf16 cache's pages) gives the
// bits of the same tile over float32 pages holding the widened values: for one row and many, in
// one page and in pages of 16, with and without the keys' transposed blocks, with float32 and bf16
// products; and a one-row tile's partials too.
class Bf16Pages : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!gpt2::isa_supported(GetParam()))
      GTEST_SKIP() << "skipped: the CPU has no " << gpt2::isa_name(GetParam());
  }
};

TEST_P(Bf16Pages, TilesGiveTheBitsOfTheWidenedFloatPages) {
  const gpt2::kernels::Kernels<float>& kern = gpt2::kernels::table<float>(GetParam());
  std::uint32_t seed = 900;
  for (const bool bf16_products : {false, true})
    for (const Index hd : {64, 33})
      for (const Index rows : {1, 7, 16, 64})
        for (const Index first_pos : {0, 63, 130, 700})
          for (const Index page_rows : {16, 0})
            for (const bool transposed : {false, true}) {
              if (transposed && rows != 1) continue;
              const Index n_keys = first_pos + rows, pr = page_rows > 0 ? page_rows : n_keys;
              const RowMatrix<float> q = random_matrix<float>(rows, hd, seed++);
              RowMatrix<float> k = random_matrix<float>(n_keys, hd, seed++),
                               v = random_matrix<float>(n_keys, hd, seed++);
              using Bits = Eigen::Matrix<std::uint16_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
              Bits kb(n_keys, hd), vb(n_keys, hd);
              for (Index j = 0; j < n_keys; ++j)
                for (Index d = 0; d < hd; ++d) {  // the bits, and the floats they widen to
                  kb(j, d) = gpt2::kernels::round_to_bf16(k(j, d));
                  vb(j, d) = gpt2::kernels::round_to_bf16(v(j, d));
                  k(j, d) = gpt2::kernels::bf16_to_float(kb(j, d));
                  v(j, d) = gpt2::kernels::bf16_to_float(vb(j, d));
                }
              std::vector<const float*> fk, fv;
              std::vector<const std::uint16_t*> bk, bv;
              for (Index j = 0; j < n_keys; j += pr) {
                fk.push_back(k.data() + j * hd);
                fv.push_back(v.data() + j * hd);
                bk.push_back(kb.data() + j * hd);
                bv.push_back(vb.data() + j * hd);
              }
              // the keys' transposed blocks, floats and bits
              const Index blocks = (n_keys + 63) / 64;
              std::vector<float> kt(static_cast<std::size_t>(blocks * hd * 64), 0.0f);
              std::vector<std::uint16_t> ktb(kt.size(), 0);
              for (Index j = 0; j < n_keys; ++j)
                for (Index d = 0; d < hd; ++d) {
                  kt[((j / 64) * hd + d) * 64 + j % 64] = k(j, d);
                  ktb[((j / 64) * hd + d) * 64 + j % 64] = kb(j, d);
                }
              gpt2::AttentionScratch<float> scratch;
              scratch.set_bf16_products(bf16_products);
              scratch.reserve_tile(hd);
              RowMatrix<float> want = RowMatrix<float>::Constant(rows, hd, -1.0f), got = want;
              gpt2::kernels::AttentionTile<float> t;
              t.rows = rows;
              t.first_pos = first_pos;
              t.head_dim = hd;
              t.q = q.data();
              t.ldq = hd;
              t.page_rows = pr;
              t.key_stride = t.value_stride = hd;
              t.scale = 0.125f;
              t.ldo = hd;
              t.scratch = scratch.tile();
              t.bf16 = bf16_products;
              gpt2::kernels::AttentionTile<float> tb = t;
              t.key_pages = fk.data();
              t.value_pages = fv.data();
              t.keys_t = transposed ? kt.data() : nullptr;
              t.out = want.data();
              tb.key_pages_bf16 = bk.data();
              tb.value_pages_bf16 = bv.data();
              tb.keys_t_bf16 = transposed ? ktb.data() : nullptr;
              tb.out = got.data();
              kern.attention_tile(t);
              kern.attention_tile(tb);
              const std::string where = "bf16 products " + std::to_string(bf16_products) +
                                        " head_dim " + std::to_string(hd) + " rows " +
                                        std::to_string(rows) + " first_pos " +
                                        std::to_string(first_pos) + " page_rows " +
                                        std::to_string(page_rows) + (transposed ? " keys_t" : "");
              ASSERT_TRUE(same_bits(want, got)) << where;
              if (rows != 1) continue;
              const Index stride = gpt2::kernels::partial_stride(hd), n_blocks = first_pos / 64 + 1;
              std::vector<float> pw(static_cast<std::size_t>(n_blocks * stride + 16)),
                  pg(pw.size());
              float* a = pw.data();
              float* b = pg.data();
              while (reinterpret_cast<std::uintptr_t>(a) % 64 != 0) ++a;
              while (reinterpret_cast<std::uintptr_t>(b) % 64 != 0) ++b;
              kern.row_partials(t, 0, n_blocks, a);
              kern.row_partials(tb, 0, n_blocks, b);
              for (Index i = 0; i < n_blocks; ++i)
                for (Index j = 0; j < 3 + hd; ++j) {
                  const Index at = i * stride + (j < 3 ? j : gpt2::kernels::kPartialHeader + j - 3);
                  ASSERT_EQ(bits_of(a[at]), bits_of(b[at])) << where << ": partial " << i;
                }
            }
}

INSTANTIATE_TEST_SUITE_P(EveryLevel, Bf16Pages,
                         ::testing::Values(Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512_bf16,
                                           Isa::amx),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(gpt2::isa_name(info.param));
                         });

// ---- every level, float and double -----------------------------------------------------------

template <class T>
class CoreRows : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CoreRows, Scalars);

// A row gives the same bits in every tile size and as a chunk of its own (a decode step: q is one
// row, the keys end at its position).
template <class T>
void check_rows_in_tiles_and_chunks(bool bf16) {
  constexpr Index kRows = gpt2::kAttentionRowBlock;
  for (Index hd : {64, 7}) {
    const Index n = 203;
    const RowMatrix<T> q = random_matrix<T>(n, hd, 11), k = random_matrix<T>(n, hd, 12),
                       v = random_matrix<T>(n, hd, 13);
    const RowMatrix<T> whole = attend<T>(q, k, v, kRows, bf16);
    for (Index tile : {1, 5, 17, 64}) {
      const RowMatrix<T> tiled = attend<T>(q, k, v, tile, bf16);
      ASSERT_TRUE(same_bits(whole, tiled)) << "tile " << tile << " head_dim " << hd;
    }
    std::mt19937 rng(hd);
    for (int trial = 0; trial < 6; ++trial) {  // random chunks: rows a .. b over keys 0 .. b
      const Index b = 1 + static_cast<Index>(rng() % n), a = static_cast<Index>(rng() % b);
      const RowMatrix<T> chunk =
          attend<T>(q.middleRows(a, b - a), k.topRows(b), v.topRows(b), kRows, bf16);
      ASSERT_TRUE(same_bits(chunk, RowMatrix<T>(whole.middleRows(a, b - a))))
          << "chunk " << a << " .. " << b << " head_dim " << hd;
    }
  }
}

TYPED_TEST(CoreRows, ARowIsTheSameInEveryTileAndChunk) {
  check_rows_in_tiles_and_chunks<TypeParam>(false);
}

// The same for bf16 weights' tiles (at avx512_bf16 both products in bf16 pairs before a row's own
// block). Not at amx, whose tiles of 16 rows or more run the AMX core and shorter ones the float32
// core (docs/bf16.md: there chunks agree to about 2e-4; test_bf16 covers it).
TEST(CoreRowsBf16Products, ARowIsTheSameInEveryTileAndChunk) {
  if (gpt2::active_isa() == Isa::amx)
    GTEST_SKIP() << "skipped at amx: its bf16 tiles of 16 rows or more run the AMX core, exact only "
                    "among such tiles (docs/bf16.md)";
  check_rows_in_tiles_and_chunks<float>(true);
}

TYPED_TEST(CoreRows, PagesGiveTheContiguousBits) {
  using T = TypeParam;
  const Index n = 150, hd = 64;
  const RowMatrix<T> q = random_matrix<T>(40, hd, 21), k = random_matrix<T>(n, hd, 22),
                     v = random_matrix<T>(n, hd, 23);
  const RowMatrix<T> want = attend<T>(q, k, v);
  for (Index page_rows : {16, 32, 160}) {
    Paged<T> paged(k, v, page_rows, hd + 16, 24);
    RowMatrix<T> got = RowMatrix<T>::Constant(40, hd, T(-1));
    gpt2::AttentionScratch<T> scratch;
    gpt2::causal_attention_head<T>(q, paged.view, got, scratch);
    EXPECT_TRUE(same_bits(want, got)) << "page_rows " << page_rows;
  }
}

TYPED_TEST(CoreRows, MatchesTheDoubleReference) {
  using T = TypeParam;
  const double tol = std::is_same<T, float>::value ? 2e-5 : 1e-12;
  for (Index past : {0, 5, 64, 200})
    for (Index T_ : {1, 3, 64, 100}) {
      const RowMatrix<double> q = random_matrix<double>(T_, 64, 31, 2.0),
                              k = random_matrix<double>(past + T_, 64, 32, 2.0),
                              v = random_matrix<double>(past + T_, 64, 33);
      const RowMatrix<T> got =
          attend<T>(q.cast<T>().eval(), k.cast<T>().eval(), v.cast<T>().eval());
      const RowMatrix<double> want = reference(q.cast<T>().template cast<double>(),
                                               k.cast<T>().template cast<double>(),
                                               v.cast<T>().template cast<double>());
      const double err = (got.template cast<double>() - want).cwiseAbs().maxCoeff();
      EXPECT_LT(err, tol) << "past " << past << " T " << T_;
    }
}

// bf16: bf16 weights' tiles, whose products round q, k, p and v to bf16 at avx512_bf16 before a
// row's own block (the means within bf16's rounding then).
template <class T>
void check_special_values(bool bf16) {
  constexpr Index kRows = gpt2::kAttentionRowBlock;
  const T mean_tol = bf16 ? T(1e-2) : T(1e-5), range_tol = bf16 ? T(1e-2) : T(1e-4);
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const Index n = 150, hd = 16;
  RowMatrix<T> q = random_matrix<T>(n, hd, 41), k = random_matrix<T>(n, hd, 42),
               v = random_matrix<T>(n, hd, 43);
  // A NaN in key 100: rows before it are finite and unchanged, rows from it on are NaN.
  const RowMatrix<T> clean = attend<T>(q, k, v, kRows, bf16);
  RowMatrix<T> kn = k;
  kn(100, 3) = nan;
  const RowMatrix<T> with_nan = attend<T>(q, kn, v, kRows, bf16);
  ASSERT_TRUE(same_bits(RowMatrix<T>(with_nan.topRows(100)), RowMatrix<T>(clean.topRows(100))));
  for (Index i = 100; i < n; ++i) EXPECT_TRUE(with_nan.row(i).array().isNaN().all()) << i;
  // An Inf value in row 70: rows before it unchanged.
  RowMatrix<T> vi = v;
  vi(70, 0) = inf;
  const RowMatrix<T> with_inf = attend<T>(q, k, vi, kRows, bf16);
  ASSERT_TRUE(same_bits(RowMatrix<T>(with_inf.topRows(70)), RowMatrix<T>(clean.topRows(70))));
  EXPECT_FALSE(std::isfinite(with_inf(70, 0)));
  // An Inf value in row 71, whose key pairs with key 70 (bf16 pairs): rows before it unchanged.
  RowMatrix<T> vo = v;
  vo(71, 2) = -inf;
  const RowMatrix<T> with_odd_inf = attend<T>(q, k, vo, kRows, bf16);
  ASSERT_TRUE(same_bits(RowMatrix<T>(with_odd_inf.topRows(71)), RowMatrix<T>(clean.topRows(71))));
  EXPECT_FALSE(std::isfinite(with_odd_inf(71, 2)));
  for (Index i = 128; i < n; ++i) EXPECT_FALSE(std::isfinite(with_odd_inf(i, 2))) << i;
  // Logits in the thousands: finite, and a weighted mean of the values (within their range).
  const RowMatrix<T> big = attend<T>(RowMatrix<T>(q * T(300)), k, v, kRows, bf16);
  ASSERT_TRUE(big.allFinite());
  for (Index i = 0; i < n; ++i)
    for (Index d = 0; d < hd; ++d) {
      EXPECT_LE(big(i, d), v.topRows(i + 1).col(d).maxCoeff() + range_tol);
      EXPECT_GE(big(i, d), v.topRows(i + 1).col(d).minCoeff() - range_tol);
    }
  // Tiny inputs (subnormal products): the mean of the values seen.
  const RowMatrix<T> tiny = attend<T>(RowMatrix<T>(q * T(1e-30)), RowMatrix<T>(k * T(1e-30)), v, kRows,
                                     bf16);
  for (Index i : {0, 1, 77, 149}) {
    const Eigen::Matrix<T, 1, Eigen::Dynamic> mean = v.topRows(i + 1).colwise().mean();
    EXPECT_LT((tiny.row(i) - mean).cwiseAbs().maxCoeff(), mean_tol) << i;
  }
  // A key at -inf (q . k = -inf): that key gets weight 0.
  RowMatrix<T> km = k, qm = q;
  qm.col(0).setConstant(T(1));
  km(5, 0) = -inf;
  const RowMatrix<T> masked = attend<T>(qm, km, v, kRows, bf16);
  EXPECT_TRUE(masked.allFinite());
}

TYPED_TEST(CoreRows, SpecialValuesStayInTheirRows) { check_special_values<TypeParam>(false); }

TEST(CoreRowsBf16Products, SpecialValuesStayInTheirRows) {
  if (gpt2::active_isa() == Isa::amx)
    GTEST_SKIP() << "skipped at amx: its AMX core sums a block holding an infinite value in float32, "
                    "so the other rows of that tile change bits (docs/bf16.md)";
  check_special_values<float>(true);
}

// A decode row's keys in per-block partials, split in any way and merged in block order: the
// row's bits.
template <class T>
void check_partials(bool bf16) {
  for (Index hd : {64, 33}) {
    for (Index n : {1, 64, 65, 300, 1000}) {
      const RowMatrix<T> q = random_matrix<T>(1, hd, 51), k = random_matrix<T>(n, hd, 52),
                         v = random_matrix<T>(n, hd, 53);
      const RowMatrix<T> want = attend<T>(q, k, v, gpt2::kAttentionRowBlock, bf16);
      Paged<T> paged(k, v, 32, hd + 3, 54);
      const Index blocks = (n + 63) / 64, stride = gpt2::kernels::partial_stride(hd);
      std::vector<T> store(static_cast<std::size_t>(blocks * stride + 16));
      T* parts = store.data();
      while (reinterpret_cast<std::uintptr_t>(parts) % 64 != 0) ++parts;
      gpt2::AttentionScratch<T> scratch;
      scratch.set_bf16_products(bf16);
      std::mt19937 rng(static_cast<unsigned>(n));
      for (int trial = 0; trial < 3; ++trial) {
        for (Index b = 0; b < blocks;) {  // random chunks of blocks
          const Index e = std::min(blocks, b + 1 + static_cast<Index>(rng() % 4));
          gpt2::detail::row_partials<T>(gpt2::kernels::table<T>(), q, paged.view, b, e,
                                        parts + b * stride, scratch);
          b = e;
        }
        RowMatrix<T> got = RowMatrix<T>::Constant(1, hd, T(-1));
        gpt2::detail::merge_row_partials<T>(gpt2::kernels::table<T>(), hd, n, parts, got.data(),
                                            scratch);
        ASSERT_TRUE(same_bits(want, got)) << "n " << n << " head_dim " << hd;
      }
    }
  }
}

TYPED_TEST(CoreRows, PartialsMergedInOrderGiveTheRowsBits) { check_partials<TypeParam>(false); }

TEST(CoreRowsBf16Products, PartialsMergedInOrderGiveTheRowsBits) { check_partials<float>(true); }

// A decode step with fewer heads than threads splits its keys over the threads: every thread
// count gives the same bits, and (row-exact projections) the bits of one prefill.
TYPED_TEST(CoreRows, SplitDecodeStepsAreBitwiseOnAnyThreadCount) {
  using T = TypeParam;
  const gpt2::test::Model<T> m = gpt2::test::random_model<T>(64, 2, 61);  // 2 heads of 32
  const gpt2::AttentionWeights<T> w = m.weights();
  const Index T_ = 700;
  const RowMatrix<T> x = gpt2::test::random_input<T>(T_, 64, 62);
  std::vector<RowMatrix<T>> outs;
  const int before = gpt2::num_threads();
  for (int threads : {1, 2, 3, 4}) {  // (as test_threads: libomp keeps no team of more)
    gpt2::set_num_threads(threads);
    gpt2::KVCache<T> cache(m.config, T_);
    gpt2::Workspace<T> ws(m.config, 600, T_);
    RowMatrix<T> out(T_, 64);
    gpt2::attention_forward<T>(w, x.topRows(600), cache, ws, out.topRows(600));
    for (Index t = 600; t < T_; ++t) gpt2::attention_forward<T>(w, x.row(t), cache, ws, out.row(t));
    outs.push_back(out);
  }
  gpt2::set_num_threads(before);
  for (std::size_t i = 1; i < outs.size(); ++i)
    EXPECT_TRUE(same_bits(outs[0], outs[i])) << "thread count #" << i;
  if (gpt2::kernels::table<T>().row_exact) {
    RowMatrix<T> whole(T_, 64);
    gpt2::Workspace<T> ws(m.config, T_);
    gpt2::attention_forward<T>(w, x, ws, whole);
    EXPECT_TRUE(same_bits(whole, outs[0]));
  }
}

}  // namespace
