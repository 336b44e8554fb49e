// Numerical edge cases of the forwards (docs/hardening.md: "Numerical edge cases"):
//   T = 0              an empty output, not an error: plain, one-call, cached and batched paths
//   T = 8192           GPT-2 small shapes: works, memory reported (Workspace::bytes, KVCache::bytes),
//                      sampled rows match a double reference
//   NaN / Inf in row r rows before r are bit for bit the clean run's; nothing crashes
//   subnormal inputs   finite results that match a double reference (no flush to zero)
//   near the limit     inputs near the type's maximum, logits far beyond log(max) (exp would
//                      overflow without the max subtraction): finite, match a double reference
//   no visible key     a query row that sees no key (a padded row, a sequence of length 0) gives
//                      exact zeros, whatever its input holds
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "gpt2/attention.hpp"
#include "support/compare.hpp"
#include "support/sanitizers.hpp"
#include "support/models.hpp"
#include "support/reference.hpp"

namespace {

using gpt2::AttentionWeights;
using gpt2::BatchLayout;
using gpt2::Index;
using gpt2::KVCache;
using gpt2::RowMatrix;
using gpt2::Workspace;
using gpt2::test::Model;
using gpt2::test::Tolerance;

constexpr Index kC = 64;
constexpr Index kHeads = 4;  // head_dim 16
constexpr Index kT = 70;     // crosses the 64-row attention tile

template <class T>
class EdgeCases : public ::testing::Test {};
TYPED_TEST_SUITE(EdgeCases, gpt2::test::Scalars, );

// Rows 0 .. n - 1 of a and b are bitwise equal.
template <class T>
::testing::AssertionResult same_rows(const RowMatrix<T>& a, const RowMatrix<T>& b, Index n) {
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j < a.cols(); ++j)
      if (std::memcmp(&a(i, j), &b(i, j), sizeof(T)) != 0)
        return ::testing::AssertionFailure() << "row " << i << " col " << j << ": " << a(i, j)
                                             << " vs " << b(i, j);
  return ::testing::AssertionSuccess();
}

template <class T>
gpt2::test::NaiveAttention naive(const Model<T>& m, const RowMatrix<T>& x) {
  return gpt2::test::naive_attention(x, m.c_attn_w, m.c_attn_b, m.c_proj_w, m.c_proj_b,
                                     m.config.n_head);
}

// ---------------------------------------------------------------------------------------------
// T = 0
// ---------------------------------------------------------------------------------------------

TYPED_TEST(EdgeCases, EmptyInputGivesEmptyOutputOnEveryPath) {
  using T = TypeParam;
  const Model<T> model = gpt2::test::random_model<T>(kC, kHeads, 1);
  const AttentionWeights<T> w = model.weights();
  const RowMatrix<T> x(0, kC);

  // One call, with and without probabilities.
  RowMatrix<T> probs(3, 3);
  EXPECT_EQ(gpt2::attention(w, x).rows(), 0);
  const RowMatrix<T> y = gpt2::attention(w, x, probs);
  EXPECT_EQ(y.rows(), 0);
  EXPECT_EQ(y.cols(), kC);
  EXPECT_EQ(probs.rows(), 0);
  EXPECT_EQ(probs.cols(), 0);

  // attention_forward into [0, C], with a workspace of capacity 0.
  Workspace<T> ws(w.config());
  RowMatrix<T> out(0, kC), p(0, 0);
  gpt2::attention_forward<T>(w, x, ws, out);
  gpt2::attention_forward<T>(w, x, ws, out, p);
  EXPECT_EQ(ws.capacity(), 0);

  // Through a cache: 0 new tokens, into an empty cache, a cache with 2 positions, a full one and
  // one of capacity 0. Nothing is appended.
  const RowMatrix<T> x2 = gpt2::test::random_input<T>(2, kC, 2);
  for (const Index capacity : {Index(0), Index(2), Index(5)}) {
    KVCache<T> cache(w.config(), capacity);
    if (capacity >= 2) {
      RowMatrix<T> o2(2, kC);
      gpt2::attention_forward<T>(w, x2, cache, ws, o2);
    }
    const Index n_past = cache.n_past();
    RowMatrix<T> cp(0, n_past);
    gpt2::attention_forward<T>(w, x, cache, ws, out);
    gpt2::attention_forward<T>(w, x, cache, ws, out, cp);
    EXPECT_EQ(cache.n_past(), n_past) << "capacity " << capacity;
  }

  // Batches: B = 0; B = 3 with T = 0; B = 2 with T = 4 and every length 0 (all padding: zeros).
  const BatchLayout none = BatchLayout::full(0, 7), flat = BatchLayout::full(3, 0);
  gpt2::attention_forward<T>(w, x, none, ws, out);
  gpt2::attention_forward<T>(w, x, flat, ws, out);
  std::vector<KVCache<T>> no_caches;
  gpt2::attention_forward<T>(w, x, none, no_caches, ws, out);
  std::vector<KVCache<T>> caches;
  for (int b = 0; b < 3; ++b) caches.emplace_back(w.config(), 4);
  gpt2::attention_forward<T>(w, x, flat, caches, ws, out);
  for (const KVCache<T>& c : caches) EXPECT_EQ(c.n_past(), 0);

  const BatchLayout empty_rows = BatchLayout::right_padded(4, {0, 0});
  RowMatrix<T> xp(8, kC), op(8, kC);
  xp.setConstant(std::numeric_limits<T>::quiet_NaN());
  op.setConstant(T(7));
  gpt2::attention_forward<T>(w, xp, empty_rows, ws, op);
  EXPECT_TRUE((op.array() == T(0)).all());
}

// ---------------------------------------------------------------------------------------------
// T = 8192, GPT-2 small
// ---------------------------------------------------------------------------------------------

// Row r of the sublayer's output in double, from x and the weights: keys and values of rows
// 0 .. r (kv: [>= r + 1, 2C], x @ c_attn.weight[:, C:] + bias, in double), then plain loops.
template <class T>
std::vector<double> reference_row(const Model<T>& m, const RowMatrix<T>& x,
                                  const RowMatrix<double>& kv, Index r) {
  const Index C = m.config.n_embd, H = m.config.n_head, hd = C / H;
  std::vector<double> q(static_cast<std::size_t>(C)), merged(static_cast<std::size_t>(C), 0.0);
  for (Index j = 0; j < C; ++j) {
    double s = double(m.c_attn_b(j));
    for (Index c = 0; c < C; ++c) s += double(x(r, c)) * double(m.c_attn_w(c, j));
    q[static_cast<std::size_t>(j)] = s;
  }
  std::vector<double> att(static_cast<std::size_t>(r + 1));
  for (Index h = 0; h < H; ++h) {
    double max = -INFINITY;
    for (Index s = 0; s <= r; ++s) {
      double dot = 0;
      for (Index d = 0; d < hd; ++d) dot += q[static_cast<std::size_t>(h * hd + d)] * kv(s, h * hd + d);
      att[static_cast<std::size_t>(s)] = dot / std::sqrt(double(hd));
      max = std::max(max, att[static_cast<std::size_t>(s)]);
    }
    double sum = 0;
    for (double& a : att) sum += (a = std::exp(a - max));
    for (Index s = 0; s <= r; ++s)
      for (Index d = 0; d < hd; ++d)
        merged[static_cast<std::size_t>(h * hd + d)] +=
            att[static_cast<std::size_t>(s)] / sum * kv(s, C + h * hd + d);
  }
  std::vector<double> out(static_cast<std::size_t>(C));
  for (Index j = 0; j < C; ++j) {
    double s = double(m.c_proj_b(j));
    for (Index c = 0; c < C; ++c) s += merged[static_cast<std::size_t>(c)] * double(m.c_proj_w(c, j));
    out[static_cast<std::size_t>(j)] = s;
  }
  return out;
}

// T = 8192 in the normal builds. Under AddressSanitizer or ThreadSanitizer (about 20x slower here:
// over two minutes) the same test runs T = 2048: the same shapes and code paths, a quarter of the
// rows.
constexpr Index kLongTokens =
    gpt2::test::kAddressSanitizer || gpt2::test::kThreadSanitizer ? 2048 : 8192;

TEST(EdgeCasesLong, T8192Gpt2SmallWorksAndMatchesSampledRows) {
  constexpr Index T_ = kLongTokens, C = 768, H = 12;
  const Model<float> model = gpt2::test::random_model<float>(C, H, 3);
  const AttentionWeights<float> w = model.weights();
  const RowMatrix<float> x = gpt2::test::random_input<float>(T_, C, 4);

  Workspace<float> ws(w.config(), T_);
  RowMatrix<float> out(T_, C);
  const auto start = std::chrono::steady_clock::now();
  gpt2::attention_forward<float>(w, x, ws, out);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const KVCache<float> cache(w.config(), T_);
  std::printf("T = %td, C = %td, %td heads (float): forward %.2f s; Workspace::bytes() = %td "
              "(%.1f MiB); KVCache::bytes() for %td positions = %td (%.1f MiB); x and out %.1f MiB "
              "each\n",
              T_, C, H, seconds, ws.bytes(), ws.bytes() / 1048576.0, T_, cache.bytes(),
              cache.bytes() / 1048576.0, T_ * C * 4 / 1048576.0);
  ::testing::Test::RecordProperty("workspace_bytes", std::to_string(ws.bytes()));
  ::testing::Test::RecordProperty("kv_cache_bytes", std::to_string(cache.bytes()));
  ::testing::Test::RecordProperty("forward_seconds", std::to_string(seconds));
  EXPECT_TRUE(out.allFinite());

  // Keys and values of every row in double (Eigen's own product, not the library's GEMM).
  const RowMatrix<double> kv =
      (x.cast<double>() * model.c_attn_w.cast<double>().rightCols(2 * C)).rowwise() +
      model.c_attn_b.cast<double>().tail(2 * C);
  std::vector<Index> rows;  // tile edges, first and last rows
  for (const Index r : {Index(0), Index(1), Index(63), Index(64), Index(65), Index(1023),
                        Index(1024), Index(4095), Index(4096), Index(6000), T_ - 65, T_ - 64, T_ - 1})
    if (r < T_ && (rows.empty() || r > rows.back())) rows.push_back(r);
  RowMatrix<float> ours(static_cast<Index>(rows.size()), C);
  RowMatrix<double> ref(static_cast<Index>(rows.size()), C);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::vector<double> r = reference_row(model, x, kv, rows[i]);
    ours.row(static_cast<Index>(i)) = out.row(rows[i]);
    for (Index j = 0; j < C; ++j) ref(static_cast<Index>(i), j) = r[static_cast<std::size_t>(j)];
  }
  EXPECT_TRUE(gpt2::test::near(ours, ref, Tolerance<float>::rel, Tolerance<float>::abs));
}

// ---------------------------------------------------------------------------------------------
// NaN and Inf in one input row
// ---------------------------------------------------------------------------------------------

template <class T>
struct Poison {
  const char* what;
  T value;
  bool whole_row;
};

template <class T>
std::vector<Poison<T>> poisons() {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  return {{"NaN row", nan, true}, {"one NaN", nan, false}, {"one +Inf", inf, false},
          {"one -Inf", -inf, false}, {"+Inf row", inf, true}};
}

template <class T>
RowMatrix<T> poisoned(const RowMatrix<T>& x, Index r, const Poison<T>& p) {
  RowMatrix<T> bad = x;
  if (p.whole_row)
    bad.row(r).setConstant(p.value);
  else
    bad(r, 5) = p.value;
  return bad;
}

const std::vector<Index> kPoisonRows = {0, 1, 30, 63, 64, 69};

// Through a KV cache one token at a time (a decode loop): row r's NaN reaches rows r.. only, and
// rows before r are bit for bit the clean run's (outputs and probabilities).
TYPED_TEST(EdgeCases, NaNOrInfInOneRowStaysInLaterRowsWhenDecoding) {
  using T = TypeParam;
  const Model<T> model = gpt2::test::random_model<T>(kC, kHeads, 5);
  const AttentionWeights<T> w = model.weights();
  const RowMatrix<T> x = gpt2::test::random_input<T>(kT, kC, 6);
  const auto decode = [&](const RowMatrix<T>& in, RowMatrix<T>& out) {
    KVCache<T> cache(w.config(), kT);
    Workspace<T> ws(w.config(), 1, kT);
    out.resize(kT, kC);
    for (Index t = 0; t < kT; ++t) gpt2::attention_forward<T>(w, in.row(t), cache, ws, out.row(t));
  };
  RowMatrix<T> clean;
  decode(x, clean);
  ASSERT_TRUE(clean.allFinite());
  for (const Poison<T>& p : poisons<T>())
    for (const Index r : kPoisonRows) {
      RowMatrix<T> out;
      decode(poisoned(x, r, p), out);
      EXPECT_TRUE(same_rows(out, clean, r)) << p.what << " in row " << r;
    }
}

// Padded batches: a poisoned row of one sequence never reaches another sequence, and within its
// own sequence only its later rows (batched decode, one token per step).
TYPED_TEST(EdgeCases, NaNOrInfInOneSequenceStaysInItsSequence) {
  using T = TypeParam;
  const Model<T> model = gpt2::test::random_model<T>(kC, kHeads, 7);
  const AttentionWeights<T> w = model.weights();
  constexpr Index B = 3, BT = 12;
  const RowMatrix<T> x = gpt2::test::random_input<T>(B * BT, kC, 8);
  const BatchLayout layout = BatchLayout::right_padded(BT, {BT, 9, 5});
  Workspace<T> ws(w.config(), BT);
  RowMatrix<T> clean(B * BT, kC);
  gpt2::attention_forward<T>(w, x, layout, ws, clean);
  for (const Poison<T>& p : poisons<T>()) {
    const RowMatrix<T> bad = poisoned(x, BT + 3, p);  // sequence 1, its row 3
    RowMatrix<T> out(B * BT, kC);
    gpt2::attention_forward<T>(w, bad, layout, ws, out);
    EXPECT_TRUE(same_rows(out, clean, BT)) << p.what << ": sequence 0";
    const RowMatrix<T> tail_out = out.bottomRows(BT), tail_clean = clean.bottomRows(BT);
    EXPECT_TRUE(same_rows(tail_out, tail_clean, BT)) << p.what << ": sequence 2";
    EXPECT_TRUE((out.middleRows(BT + 9, BT - 9).array() == T(0)).all()) << p.what << ": padding";
  }
}

// The plain (prefill) forward: rows before r must be the clean run's. (A tile of up to 64 query
// rows once multiplied its whole score block by the tile's values, so a NaN or Inf in value row r
// reached the tile's earlier rows through 0 * NaN; a tile whose own values are not all finite now
// multiplies each row only by the values it can see.) Bit for bit at the vector levels (float),
// whose sums are one chain per element whatever the split; Eigen's GEMM orders the split sums
// differently, so there rows r0 .. r - 1 of r's tile agree to rounding (and stay finite).
TYPED_TEST(EdgeCases, NaNOrInfInOneRowStaysInLaterRowsInOneForward) {
  using T = TypeParam;
  const Model<T> model = gpt2::test::random_model<T>(kC, kHeads, 9);
  const AttentionWeights<T> w = model.weights();
  const RowMatrix<T> x = gpt2::test::random_input<T>(kT, kC, 10);
  Workspace<T> ws(w.config(), kT);
  RowMatrix<T> clean(kT, kC), clean_probs(kHeads * kT, kT);
  gpt2::attention_forward<T>(w, x, ws, clean, clean_probs);
  for (const Poison<T>& p : poisons<T>())
    for (const Index r : kPoisonRows) {
      RowMatrix<T> out(kT, kC), probs(kHeads * kT, kT);
      gpt2::attention_forward<T>(w, poisoned(x, r, p), ws, out, probs);
      const bool bitwise = gpt2::kernels::table<T>().isa != gpt2::Isa::generic;
      const Index tile_start = r / gpt2::kAttentionRowBlock * gpt2::kAttentionRowBlock;
      EXPECT_TRUE(same_rows(out, clean, bitwise ? r : tile_start)) << p.what << " in row " << r;
      EXPECT_TRUE(out.topRows(r).allFinite()) << p.what << " in row " << r;
      EXPECT_TRUE(gpt2::test::near(out.topRows(r), clean.topRows(r), Tolerance<T>::rel,
                                   Tolerance<T>::abs))
          << p.what << " in row " << r;
      for (Index h = 0; h < kHeads; ++h) {
        const RowMatrix<T> ph = probs.middleRows(h * kT, kT), ch = clean_probs.middleRows(h * kT, kT);
        EXPECT_TRUE(same_rows(ph, ch, r)) << p.what << " in row " << r << ", probs of head " << h;
      }
    }
}

// ---------------------------------------------------------------------------------------------
// Subnormal inputs
// ---------------------------------------------------------------------------------------------

// Every x entry subnormal (x ~ U(-1, 1) * 2^-127 in float, 2^-1025 in double), c_attn scaled up by
// 2^126 (2^1023) so that q, k, v are normal: the products of subnormals must be exact IEEE
// arithmetic (no flush to zero), and the result matches the double reference.
TYPED_TEST(EdgeCases, SubnormalInputsScaledUpMatchTheReference) {
  using T = TypeParam;
  const int down = std::is_same<T, float>::value ? -127 : -1025;
  const int up = std::is_same<T, float>::value ? 126 : 1023;
  Model<T> model = gpt2::test::random_model<T>(kC, kHeads, 11);
  model.c_attn_w *= std::ldexp(T(1), up);
  RowMatrix<T> x = gpt2::test::random_input<T>(kT, kC, 12);
  x *= std::ldexp(T(1), down);
  ASSERT_LT(x.cwiseAbs().maxCoeff(), std::numeric_limits<T>::min());  // all subnormal (or 0)
  ASSERT_GT(x.cwiseAbs().maxCoeff(), T(0));
  const RowMatrix<T> out = gpt2::attention(model.weights(), x);
  ASSERT_TRUE(out.allFinite());
  const gpt2::test::NaiveAttention ref = naive(model, x);
  EXPECT_TRUE(gpt2::test::near(out, ref.out, Tolerance<T>::rel, Tolerance<T>::abs));
  // Flushing x to zero would leave only the biases: far from the reference.
  const RowMatrix<T> flushed = gpt2::attention(model.weights(), RowMatrix<T>::Zero(kT, kC).eval());
  EXPECT_FALSE(gpt2::test::near(flushed, ref.out, 1e-3));
}

// Everything subnormal: x subnormal, biases zero, weights of normal size. q, k, v and the output
// are subnormal too, the logits underflow to zero (uniform attention): the result is finite and
// within a few units of the smallest subnormal per operation of the double reference.
TYPED_TEST(EdgeCases, AllSubnormalStaysFiniteAndMatchesTheReference) {
  using T = TypeParam;
  const int down = std::is_same<T, float>::value ? -128 : -1024;
  Model<T> model = gpt2::test::random_model<T>(kC, kHeads, 13);
  model.c_attn_b.setZero();
  model.c_proj_b.setZero();
  RowMatrix<T> x = gpt2::test::random_input<T>(kT, kC, 14);
  x *= std::ldexp(T(1), down);
  ASSERT_LT(x.cwiseAbs().maxCoeff(), std::numeric_limits<T>::min());
  Workspace<T> ws(model.config, kT);
  RowMatrix<T> out(kT, kC), probs(kHeads * kT, kT);
  gpt2::attention_forward<T>(model.weights(), x, ws, out, probs);
  ASSERT_TRUE(out.allFinite());
  ASSERT_TRUE(probs.allFinite());
  const gpt2::test::NaiveAttention ref = naive(model, x);
  // Each product and sum in the subnormal range rounds to a multiple of denorm_min: the absolute
  // error is at most about (C + T) * denorm_min per output through the three products.
  const double floor = 4.0 * double(kC + kT) * double(std::numeric_limits<T>::denorm_min());
  EXPECT_TRUE(gpt2::test::near(out, ref.out, 1e-3, floor));
  EXPECT_TRUE(gpt2::test::near(probs, ref.probs, Tolerance<T>::rel, Tolerance<T>::abs));
}

// ---------------------------------------------------------------------------------------------
// Inputs near the type's maximum; logits that would overflow exp without the max subtraction
// ---------------------------------------------------------------------------------------------

// x ~ U(-1, 1) * max / 4, c_attn scaled so that q and k are about sqrt(max) * 1e-4: qkv is finite,
// and the logits q.k / sqrt(head_dim) reach about 1e-8 * max (float ~1e30, double ~1e300), far
// beyond log(max) (88.7, 709.8) where exp overflows. With the running max subtracted the softmax
// is exact (one-hot: the gaps are huge), the result finite and equal to the double reference's.
TYPED_TEST(EdgeCases, HugeInputsAndLogitsMatchTheReference) {
  using T = TypeParam;
  const double max = double(std::numeric_limits<T>::max());
  Model<T> model = gpt2::test::random_model<T>(kC, kHeads, 15);
  RowMatrix<T> x = gpt2::test::random_input<T>(kT, kC, 16);
  x *= T(max / 4);
  // |q| ~ |x| * |w| * sqrt(C) / 3 (uniform entries); aim for sqrt(max) * 1e-4.
  const double target_q = std::sqrt(max) * 1e-4;
  const double w_scale = target_q * 3 / std::sqrt(double(kC)) / (max / 4);  // no overflow
  model.c_attn_w = (model.c_attn_w.template cast<double>() / model.c_attn_w.cwiseAbs().maxCoeff() *
                    w_scale)
                       .template cast<T>();
  ASSERT_TRUE(x.allFinite());
  const gpt2::test::NaiveAttention ref = naive(model, x);
  ASSERT_TRUE(ref.qkv.allFinite());
  ASSERT_LT(ref.qkv.cwiseAbs().maxCoeff(), max);  // representable in T

  double max_logit = 0;  // over every visible (query, key) pair of head 0
  const Index hd = kC / kHeads;
  for (Index t = 0; t < kT; ++t)
    for (Index s = 0; s <= t; ++s)
      max_logit = std::max(max_logit, (ref.qkv.row(t).head(hd).dot(ref.qkv.row(s).segment(kC, hd))) /
                                          std::sqrt(double(hd)));
  EXPECT_GT(max_logit, 1e20 * std::log(max))
      << "the logits must overflow exp without the max; max |qkv| " << ref.qkv.cwiseAbs().maxCoeff()
      << ", max |x| " << x.cwiseAbs().maxCoeff() << ", max |w| " << model.c_attn_w.cwiseAbs().maxCoeff();
  EXPECT_LT(max_logit, max / 1e3);
  std::printf("huge inputs (%s): max |x| %.3g, max |qkv| %.3g, largest logit %.3g (exp overflows "
              "above %.1f)\n",
              sizeof(T) == 4 ? "float" : "double", double(x.cwiseAbs().maxCoeff()),
              ref.qkv.cwiseAbs().maxCoeff(), max_logit, std::log(max));

  Workspace<T> ws(model.config, kT);
  RowMatrix<T> out(kT, kC), probs(kHeads * kT, kT);
  gpt2::attention_forward<T>(model.weights(), x, ws, out, probs);
  ASSERT_TRUE(out.allFinite());
  ASSERT_TRUE(probs.allFinite());
  EXPECT_TRUE(gpt2::test::near(probs, ref.probs, Tolerance<T>::rel, Tolerance<T>::abs));
  EXPECT_TRUE(gpt2::test::near(out, ref.out, Tolerance<T>::rel));
}

// ---------------------------------------------------------------------------------------------
// A query row with no visible key
// ---------------------------------------------------------------------------------------------

// In a padded batch a padded row is a query that sees no key: its output is exactly +0, whatever
// its input holds (NaN, Inf, huge), on the plain and the cached batched paths; a sequence of length
// 0 is all such rows.
TYPED_TEST(EdgeCases, QueryRowsWithNoVisibleKeyGiveZeros) {
  using T = TypeParam;
  const Model<T> model = gpt2::test::random_model<T>(kC, kHeads, 17);
  const AttentionWeights<T> w = model.weights();
  constexpr Index B = 3, BT = 6;
  RowMatrix<T> x = gpt2::test::random_input<T>(B * BT, kC, 18);
  const BatchLayout layout(BT, {2, 0, 0}, {4, 0, 3});  // left-padded by 2, empty, right-padded
  const T inf = std::numeric_limits<T>::infinity();
  x.topRows(2).setConstant(std::numeric_limits<T>::quiet_NaN());
  x.middleRows(BT, BT).setConstant(inf);
  x.middleRows(2 * BT + 3, 3).setConstant(std::numeric_limits<T>::max());
  const auto expect_zero_padding = [&](const RowMatrix<T>& out, const char* path) {
    for (const Index r : {Index(0), Index(1), Index(6), Index(7), Index(8), Index(9), Index(10),
                          Index(11), Index(15), Index(16), Index(17)})
      for (Index j = 0; j < kC; ++j) {
        const T v = out(r, j);
        EXPECT_TRUE(v == T(0) && !std::signbit(v)) << path << ": row " << r << " col " << j << " = " << v;
      }
    EXPECT_TRUE(out.middleRows(2, 4).allFinite()) << path;
    EXPECT_TRUE(out.middleRows(2 * BT, 3).allFinite()) << path;
  };
  Workspace<T> ws(w.config(), BT);
  RowMatrix<T> out = RowMatrix<T>::Constant(B * BT, kC, T(9));
  gpt2::attention_forward<T>(w, x, layout, ws, out);
  expect_zero_padding(out, "batched forward");

  std::vector<KVCache<T>> caches;
  for (Index b = 0; b < B; ++b) caches.emplace_back(w.config(), BT);
  RowMatrix<T> cached = RowMatrix<T>::Constant(B * BT, kC, T(9));
  gpt2::attention_forward<T>(w, x, layout, caches, ws, cached);
  expect_zero_padding(cached, "batched cached forward");
  EXPECT_EQ(caches[1].n_past(), 0);
}

}  // namespace
