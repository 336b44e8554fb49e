// tensor_parallel.hpp, run by ctest under `mpiexec -n 2` and `mpiexec -n 3` (every rank runs every
// test, in the same order; only rank 0 prints the progress, every rank prints its failures):
//   - the PyTorch reference cases (plain forward with probabilities, KV cache in the fixtures'
//     chunks, padded batches, batched decode) with the accuracy bar of support/accuracy.hpp
//     (float: 8 x PyTorch float32's error; double: 1e-12), and against the single-process forward
//     (float: the same bar; double: 1e-12 relative)
//   - every rank's out is bitwise the same
//   - uneven head splits: 25 heads (xl), 4 heads over 3 ranks, a 5-head config over 2 and 3 ranks
//   - a rank's cache holds its heads only
//   - errors: more ranks than heads; ranks whose configs or weights differ; one rank's bad input;
//     each throws on every rank (no hang) with a message naming the rank and the problem
//   - a decode step (one sequence, and a batch) allocates nothing once the workspace is sized: no
//     Eigen heap allocation (EIGEN_RUNTIME_NO_MALLOC: one would fail Eigen's assertion) and no
//     operator new (counted); MPI's own C allocations are not ours to count
#define EIGEN_RUNTIME_NO_MALLOC
// This file compiles its own forwards (detail/compiled_mode.hpp), so that the check above sees them.
#ifndef GPT2_ATTENTION_NO_EXTERN_FORWARDS
#define GPT2_ATTENTION_NO_EXTERN_FORWARDS
#endif

#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <new>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/paged_kv_cache.hpp"
#include "gpt2/tensor_parallel.hpp"
#include "support/accuracy.hpp"
#include "support/compare.hpp"
#include "support/det_random.hpp"
#include "support/fixture.hpp"

#include "support/new_counter.hpp"  // g_new_calls: this program's operator new calls

namespace {

using gpt2::BatchLayout;
using gpt2::Index;
using gpt2::KVCache;
using gpt2::RowMatrix;
using gpt2::TensorParallelAttention;
using gpt2::test::CaseInputs;
using gpt2::test::expect_accurate;
using gpt2::test::Fixture;
using gpt2::test::inputs_for;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

std::vector<Index> integers(const std::string& csv) {
  std::vector<Index> v;
  std::stringstream s(csv);
  for (std::string item; std::getline(s, item, ',');) v.push_back(std::stoll(item));
  return v;
}

// Every rank's m is bitwise rank 0's (a collective).
template <class T>
bool same_on_every_rank(const RowMatrix<T>& m) {
  RowMatrix<T> root = m;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), gpt2::detail::mpi_datatype<T>(), 0,
            MPI_COMM_WORLD);
  int same = root == m ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return same == 1;
}

// ours against the single-process result: float within the case's bar (8 x PyTorch float32's
// error, relative to max |PyTorch's|), double within 1e-12 relative.
template <class T>
void expect_near_single(const Fixture& f, const std::string& quantity, const RowMatrix<T>& ours,
                        const RowMatrix<T>& single) {
  const double bar = sizeof(T) == 4 ? 8 * f.number("torch32_err_" + quantity) : 1e-12;
  EXPECT_TRUE(gpt2::test::near(ours, single, bar)) << f.name() << " " << quantity
                                                   << ": tensor parallel vs single process";
}

bool fits(const Fixture& f) { return world_size() <= f.n_head(); }

// ---------------------------------------------------------------------------------------------
// Plain forward on the reference cases, with probabilities gathered on rank 0.
// ---------------------------------------------------------------------------------------------
template <class T>
void check_case(const std::string& name) {
  const Fixture f(name);
  if (!fits(f)) GTEST_SKIP() << name << ": " << f.n_head() << " heads, fewer than the ranks";
  const std::unique_ptr<CaseInputs<T>> in = inputs_for<T>(f);
  if (!in) GTEST_SKIP() << "GPT2_SMALL_WEIGHTS not set: skipping the real GPT-2 weights test " << name;
  const gpt2::AttentionWeights<T>& w = in->weights();
  const Index T_ = f.tokens(), C = f.n_embd(), H = f.n_head();

  const TensorParallelAttention<T> tp(w, MPI_COMM_WORLD);
  const Index H_r = tp.heads().count;
  gpt2::Workspace<T> ws = tp.workspace(T_);
  RowMatrix<T> out(T_, C), local_probs(H_r * T_, T_), probs(H * T_, T_);
  gpt2::attention_forward<T>(tp, in->x, ws, out, local_probs);
  gpt2::MatrixRef<T> probs_ref = probs;
  tp.gather_heads(local_probs, T_, &probs_ref);
  EXPECT_TRUE(same_on_every_rank(out)) << name << ": the ranks' outputs differ";

  gpt2::Workspace<T> ws1(w.config(), T_);
  RowMatrix<T> single(T_, C), single_probs(H * T_, T_);
  gpt2::attention_forward<T>(w, in->x, ws1, single, single_probs);
  expect_near_single<T>(f, "out", out, single);

  const std::vector<Index>& rows = f.rows();
  const Index R = static_cast<Index>(rows.size());
  RowMatrix<T> out_rows(R, C);
  for (Index i = 0; i < R; ++i) out_rows.row(i) = out.row(rows[i]);
  expect_accurate<T>(f, "out", out_rows, f.matrix("out"));
  if (tp.rank() == 0) {  // the gathered probabilities, head by head
    expect_near_single<T>(f, "probs", probs, single_probs);
    RowMatrix<T> p_rows(H * R, T_);
    RowMatrix<double> p_ref(H * R, T_);
    for (Index h = 0; h < H; ++h) {
      p_ref.middleRows(h * R, R) = f.head("probs", h);
      for (Index i = 0; i < R; ++i) p_rows.row(h * R + i) = probs.row(h * T_ + rows[i]);
    }
    expect_accurate<T>(f, "probs", p_rows, p_ref);
  }
}

// ---------------------------------------------------------------------------------------------
// KV cache: the fixture's chunks through a cache of this rank's heads.
// ---------------------------------------------------------------------------------------------
template <class T>
void check_past(const std::string& name) {
  const Fixture f(name);
  if (!fits(f)) GTEST_SKIP() << name << ": " << f.n_head() << " heads, fewer than the ranks";
  const std::unique_ptr<CaseInputs<T>> in = inputs_for<T>(f);
  if (!in) GTEST_SKIP() << "GPT2_SMALL_WEIGHTS not set: skipping the real GPT-2 weights test " << name;
  const gpt2::AttentionWeights<T>& w = in->weights();
  const Index T_ = f.tokens(), C = f.n_embd(), H = f.n_head(), hd = f.head_dim();

  const TensorParallelAttention<T> tp(w, MPI_COMM_WORLD);
  const gpt2::HeadRange heads = tp.heads();
  KVCache<T> cache = tp.cache(T_);
  const KVCache<T> full_cache(w.config(), T_);
  EXPECT_EQ(cache.bytes() * H, full_cache.bytes() * heads.count) << "a cache of this rank's heads only";
  gpt2::Workspace<T> ws = tp.workspace();
  RowMatrix<T> out(T_, C), probs = RowMatrix<T>::Zero(heads.count * T_, T_);
  Index pos = 0;
  for (const Index n : integers(f.meta("chunks"))) {
    RowMatrix<T> p(heads.count * n, pos + n);
    gpt2::attention_forward<T>(tp, in->x.middleRows(pos, n), cache, ws, out.middleRows(pos, n), p);
    for (Index h = 0; h < heads.count; ++h)
      probs.block(h * T_ + pos, 0, n, pos + n) = p.middleRows(h * n, n);
    pos += n;
  }
  EXPECT_EQ(cache.n_past(), T_);
  EXPECT_TRUE(same_on_every_rank(out)) << name << ": the ranks' outputs differ";

  KVCache<T> cache1(w.config(), T_);
  gpt2::Workspace<T> ws1(w.config());
  RowMatrix<T> single(T_, C);
  pos = 0;
  for (const Index n : integers(f.meta("chunks"))) {
    gpt2::attention_forward<T>(w, in->x.middleRows(pos, n), cache1, ws1, single.middleRows(pos, n));
    pos += n;
  }
  expect_near_single<T>(f, "out", out, single);

  const std::vector<Index>& rows = f.rows();
  const Index R = static_cast<Index>(rows.size());
  RowMatrix<T> out_rows(R, C), k_rows(heads.count * R, hd), v_rows(heads.count * R, hd);
  RowMatrix<double> k_ref(heads.count * R, hd), v_ref(heads.count * R, hd);
  for (Index i = 0; i < R; ++i) out_rows.row(i) = out.row(rows[i]);
  for (Index h = 0; h < heads.count; ++h) {  // this rank's heads are the full model's heads.begin + h
    k_ref.middleRows(h * R, R) = f.head("present_k", heads.begin + h);
    v_ref.middleRows(h * R, R) = f.head("present_v", heads.begin + h);
    for (Index i = 0; i < R; ++i) {
      k_rows.row(h * R + i) = cache.keys(h).row(rows[i]);
      v_rows.row(h * R + i) = cache.values(h).row(rows[i]);
    }
  }
  expect_accurate<T>(f, "out", out_rows, f.matrix("out"));
  expect_accurate<T>(f, "present_k", k_rows, k_ref);
  expect_accurate<T>(f, "present_v", v_rows, v_ref);
  if (f.has("probs")) {
    RowMatrix<T> p_rows(heads.count * R, T_);
    RowMatrix<double> p_ref(heads.count * R, T_);
    for (Index h = 0; h < heads.count; ++h) {
      p_ref.middleRows(h * R, R) = f.head("probs", heads.begin + h);
      for (Index i = 0; i < R; ++i) p_rows.row(h * R + i) = probs.row(h * T_ + rows[i]);
    }
    expect_accurate<T>(f, "probs", p_rows, p_ref);
  }
}

// ---------------------------------------------------------------------------------------------
// Padded batches (NaN padding) and batched decode.
// ---------------------------------------------------------------------------------------------
template <class T>
void check_batch(const std::string& name) {
  const Fixture f(name);
  if (!fits(f)) GTEST_SKIP() << name << ": " << f.n_head() << " heads, fewer than the ranks";
  const std::unique_ptr<CaseInputs<T>> in = CaseInputs<T>::synthetic(f);
  const Index B = f.integer("B"), T_ = f.tokens(), C = f.n_embd();
  const auto seed = static_cast<std::uint64_t>(f.integer("seed"));
  const BatchLayout layout(T_, integers(f.meta("starts")), integers(f.meta("lengths")));
  const RowMatrix<T> real =
      gpt2::test::det_matrix<T>(seed + gpt2::test::kSeedOffsetX, B * T_, C, f.number("scale_x"));
  RowMatrix<T> x = RowMatrix<T>::Constant(B * T_, C, std::numeric_limits<T>::quiet_NaN());
  for (Index b = 0; b < B; ++b)
    x.middleRows(layout.first_row(b), layout.length(b)) =
        real.middleRows(layout.first_row(b), layout.length(b));

  const TensorParallelAttention<T> tp(in->weights(), MPI_COMM_WORLD);
  gpt2::Workspace<T> ws = tp.workspace();
  RowMatrix<T> out(B * T_, C);
  gpt2::attention_forward<T>(tp, x, layout, ws, out);
  EXPECT_TRUE(same_on_every_rank(out)) << name << ": the ranks' outputs differ";

  gpt2::Workspace<T> ws1(in->weights().config());
  RowMatrix<T> single(B * T_, C);
  gpt2::attention_forward<T>(in->weights(), x, layout, ws1, single);
  expect_near_single<T>(f, "out", out, single);
  const RowMatrix<double> ref = f.matrix("out");
  expect_accurate<T>(f, "out", out, ref);
  for (Index r = 0; r < ref.rows(); ++r)
    if ((ref.row(r).array() == 0.0).all()) {
      EXPECT_TRUE((out.row(r).array() == T(0)).all()) << name << ": padded row " << r;
    }
}

template <class T>
void check_batch_decode(const std::string& name) {
  const Fixture f(name);
  if (!fits(f)) GTEST_SKIP() << name << ": " << f.n_head() << " heads, fewer than the ranks";
  const std::unique_ptr<CaseInputs<T>> in = CaseInputs<T>::synthetic(f);
  const gpt2::AttentionWeights<T>& w = in->weights();
  const Index B = f.integer("B"), L = f.integer("Lmax"), C = f.n_embd();
  const std::vector<Index> lengths = integers(f.meta("lengths")), prompts = integers(f.meta("prompts"));
  const auto seed = static_cast<std::uint64_t>(f.integer("seed"));
  const RowMatrix<T> tokens =
      gpt2::test::det_matrix<T>(seed + gpt2::test::kSeedOffsetX, B * L, C, f.number("scale_x"));
  const T nan = std::numeric_limits<T>::quiet_NaN();

  const TensorParallelAttention<T> tp(w, MPI_COMM_WORLD);
  std::vector<KVCache<T>> caches;
  for (Index b = 0; b < B; ++b) caches.push_back(tp.cache(L));
  gpt2::Workspace<T> ws = tp.workspace();
  RowMatrix<T> out = RowMatrix<T>::Zero(B * L, C);
  Index P = 0;
  for (const Index p : prompts) P = std::max(P, p);
  const BatchLayout prefill = BatchLayout::left_padded(P, prompts);
  RowMatrix<T> x = RowMatrix<T>::Constant(B * P, C, nan), y(B * P, C);
  for (Index b = 0; b < B; ++b)
    x.middleRows(prefill.first_row(b), prompts[b]) = tokens.middleRows(b * L, prompts[b]);
  gpt2::attention_forward<T>(tp, x, prefill, caches, ws, y);
  for (Index b = 0; b < B; ++b) {
    EXPECT_TRUE((y.middleRows(b * P, P - prompts[b]).array() == T(0)).all()) << "left padding of " << b;
    out.middleRows(b * L, prompts[b]) = y.middleRows(prefill.first_row(b), prompts[b]);
  }
  BatchLayout step = BatchLayout::full(B, 1);
  RowMatrix<T> x_step(B, C), y_step(B, C);
  for (;;) {
    bool any = false;
    for (Index b = 0; b < B; ++b) {
      const Index next = caches[b].n_past();
      step.set(b, 0, next < lengths[b] ? 1 : 0);
      if (next < lengths[b])
        x_step.row(b) = tokens.row(b * L + next);
      else
        x_step.row(b).setConstant(nan);
      any = any || next < lengths[b];
    }
    if (!any) break;
    gpt2::attention_forward<T>(tp, x_step, step, caches, ws, y_step);
    for (Index b = 0; b < B; ++b)
      if (step.length(b) == 1) out.row(b * L + caches[b].n_past() - 1) = y_step.row(b);
  }
  for (Index b = 0; b < B; ++b) EXPECT_EQ(caches[b].n_past(), lengths[b]);
  EXPECT_TRUE(same_on_every_rank(out)) << name << ": the ranks' outputs differ";
  expect_accurate<T>(f, "out", out, f.matrix("out"));
}

template <class T>
class TensorParallelReference : public ::testing::Test {};
TYPED_TEST_SUITE(TensorParallelReference, gpt2::test::Scalars);

TYPED_TEST(TensorParallelReference, Tiny_TwoHeads) { check_case<TypeParam>("tiny_T5"); }
TYPED_TEST(TensorParallelReference, Small_T1) { check_case<TypeParam>("small_T1"); }
TYPED_TEST(TensorParallelReference, Small_T7) { check_case<TypeParam>("small_T7"); }
TYPED_TEST(TensorParallelReference, Medium_16Heads) { check_case<TypeParam>("medium_T13"); }
TYPED_TEST(TensorParallelReference, Large_20Heads) { check_case<TypeParam>("large_T6"); }
TYPED_TEST(TensorParallelReference, XL_25HeadsUnevenSplit) { check_case<TypeParam>("xl_T9"); }
TYPED_TEST(TensorParallelReference, BigLogits) { check_case<TypeParam>("big_logits_T33"); }
TYPED_TEST(TensorParallelReference, RealGpt2Layer0_T64) { check_case<TypeParam>("gpt2_layer0_T64"); }
TYPED_TEST(TensorParallelReference, Past_Tiny_UnevenChunks) { check_past<TypeParam>("past_tiny"); }
TYPED_TEST(TensorParallelReference, Past_Small_T40) { check_past<TypeParam>("past_small_T40"); }
TYPED_TEST(TensorParallelReference, Past_Small_DecodeWith1023Cached) { check_past<TypeParam>("past_small_T1024"); }
TYPED_TEST(TensorParallelReference, Past_RealGpt2Layer0) { check_past<TypeParam>("past_gpt2_layer0_T64"); }
TYPED_TEST(TensorParallelReference, Batch_RightPadding) { check_batch<TypeParam>("batch_right_pad"); }
TYPED_TEST(TensorParallelReference, Batch_LeftPadding) { check_batch<TypeParam>("batch_left_pad"); }
TYPED_TEST(TensorParallelReference, Batch_MixedWithAnEmptySequence) { check_batch<TypeParam>("batch_mixed"); }
TYPED_TEST(TensorParallelReference, Batch_Small) { check_batch<TypeParam>("batch_small"); }
TYPED_TEST(TensorParallelReference, BatchDecode_Tiny) { check_batch_decode<TypeParam>("batch_decode_tiny"); }
TYPED_TEST(TensorParallelReference, BatchDecode_Small) { check_batch_decode<TypeParam>("batch_decode_small"); }

// ---------------------------------------------------------------------------------------------
// A 5-head config (C = 40, head_dim 8): 3 + 2 heads on 2 ranks, 2 + 2 + 1 on 3. No PyTorch case:
// the reference is the single-process forward in double; float's bar is twice the single-process
// float error plus a floor of 16 ulp of the output's scale.
// ---------------------------------------------------------------------------------------------
template <class T>
struct Model {
  gpt2::AttentionConfig config;
  RowMatrix<T> c_attn_w, c_proj_w;
  gpt2::RowVector<T> c_attn_b, c_proj_b;
  gpt2::AttentionWeights<T> weights() const {
    return {config, gpt2::view(c_attn_w), gpt2::view(c_attn_b), gpt2::view(c_proj_w), gpt2::view(c_proj_b)};
  }
};

template <class T>
Model<T> model(Index C, Index H, std::uint64_t seed) {
  using gpt2::test::det_matrix;
  using gpt2::test::det_vector;
  return {gpt2::AttentionConfig{C, H}, det_matrix<T>(seed, C, 3 * C, 0.3), det_matrix<T>(seed + 1, C, C, 0.3),
          det_vector<T>(seed + 2, 3 * C, 0.1), det_vector<T>(seed + 3, C, 0.1)};
}

template <class T>
void expect_close_to(const RowMatrix<T>& ours, const RowMatrix<T>& single, const RowMatrix<double>& exact,
                     const char* what) {
  if (sizeof(T) == 8) {
    EXPECT_TRUE(gpt2::test::near(ours, exact, 1e-12)) << what;
    return;
  }
  const gpt2::test::MaxDiff d = gpt2::test::max_diff(single, exact);
  const double floor = 16 * std::numeric_limits<float>::epsilon() * d.expected_max_abs;
  EXPECT_TRUE(gpt2::test::near(ours, exact, 0, 2 * d.value + floor)) << what;
}

template <class T>
class TensorParallelFiveHeads : public ::testing::Test {};
TYPED_TEST_SUITE(TensorParallelFiveHeads, gpt2::test::Scalars);

TYPED_TEST(TensorParallelFiveHeads, PlainCachedAndBatched) {
  using T = TypeParam;
  const Index C = 40, H = 5, T_ = 11;
  const Model<T> m = model<T>(C, H, 41);
  const Model<double> m64 = model<double>(C, H, 41);
  const RowMatrix<T> x = gpt2::test::det_matrix<T>(47, T_, C, 1.0);
  const RowMatrix<double> x64 = gpt2::test::det_matrix<double>(47, T_, C, 1.0);
  const TensorParallelAttention<T> tp(m.weights(), MPI_COMM_WORLD);
  const gpt2::HeadRange expected = gpt2::heads_of_rank(H, world_rank(), world_size());
  EXPECT_EQ(tp.heads().begin, expected.begin);
  EXPECT_EQ(tp.heads().count, world_size() == 2 ? (world_rank() == 0 ? 3 : 2) : (world_rank() < 2 ? 2 : 1));
  EXPECT_EQ(tp.shard_config().n_embd, tp.heads().count * 8);

  const RowMatrix<double> exact = gpt2::attention<double>(m64.weights(), x64);
  const RowMatrix<T> single = gpt2::attention<T>(m.weights(), x);

  gpt2::Workspace<T> ws = tp.workspace(T_);
  RowMatrix<T> out(T_, C);
  gpt2::attention_forward<T>(tp, x, ws, out);
  expect_close_to<T>(out, single, exact, "plain");
  EXPECT_TRUE(same_on_every_rank(out));

  // Through the cache: 4 tokens, then one at a time; out may be x itself.
  KVCache<T> cache = tp.cache(T_);
  RowMatrix<T> inout = x;
  gpt2::attention_forward<T>(tp, inout.topRows(4), cache, ws, inout.topRows(4));
  for (Index t = 4; t < T_; ++t)
    gpt2::attention_forward<T>(tp, inout.middleRows(t, 1), cache, ws, inout.middleRows(t, 1));
  expect_close_to<T>(inout, single, exact, "cached, in place");

  // A batch of the sequence twice: right-padded to 13 and left-padded.
  const Index Tp = 13;
  const BatchLayout layout(Tp, std::vector<Index>{0, Tp - T_}, std::vector<Index>{T_, T_});
  RowMatrix<T> xb = RowMatrix<T>::Constant(2 * Tp, C, std::numeric_limits<T>::quiet_NaN()), yb(2 * Tp, C);
  xb.topRows(T_) = x;
  xb.bottomRows(T_) = x;
  gpt2::attention_forward<T>(tp, xb, layout, ws, yb);
  expect_close_to<T>(RowMatrix<T>(yb.topRows(T_)), single, exact, "batch, right padding");
  expect_close_to<T>(RowMatrix<T>(yb.bottomRows(T_)), single, exact, "batch, left padding");
  EXPECT_TRUE((yb.middleRows(T_, Tp - T_ + Tp - T_).array() == T(0)).all()) << "padded rows";
}

// ---------------------------------------------------------------------------------------------
// The shard is a sublayer like the whole weights, so every forward composes with it: bf16 weights
// (the shard packs its copies as the given weights are packed), bf16 KV caches, paged sequences of
// float and bf16 pools (forks sharing a prompt, batched decode), each against the same forward on
// one process. Both use the same weights and caches, so what differs is only the order in which
// the ranks' partial outputs are summed: float within 1e-5 relative.
// ---------------------------------------------------------------------------------------------

constexpr double kShardSumTol = 1e-5;

// x [T, C] through `make()`'s cache in chunks: a prefill of `first` rows, then one row at a time.
template <class S, class Cache, class MakeCache>
RowMatrix<float> through_cache(const S& sublayer, const RowMatrix<float>& x, Index first,
                               gpt2::Workspace<float>& ws, const MakeCache& make) {
  Cache cache = make();
  RowMatrix<float> out(x.rows(), x.cols());
  gpt2::attention_forward<float>(sublayer, x.topRows(first), cache, ws, out.topRows(first));
  for (Index t = first; t < x.rows(); ++t)
    gpt2::attention_forward<float>(sublayer, x.middleRows(t, 1), cache, ws, out.middleRows(t, 1));
  return out;
}

TEST(TensorParallelComposes, Bf16WeightsBf16AndInt8CachesAndPagedSequences) {
  const Index C = 128, H = 8, T_ = 70;  // 8 heads of 16: 4 + 4, and 3 + 3 + 2
  const Model<float> m = model<float>(C, H, 71);
  const RowMatrix<float> x = gpt2::test::det_matrix<float>(73, T_, C, 1.0);
  for (const gpt2::WeightDtype dtype : {gpt2::WeightDtype::float32, gpt2::WeightDtype::bf16}) {
    SCOPED_TRACE(gpt2::dtype_name(dtype));
    const gpt2::AttentionWeights<float> w = gpt2::pack_weights(m.weights(), dtype);
    const TensorParallelAttention<float> tp(w, MPI_COMM_WORLD);
    EXPECT_EQ(tp.weight_dtype(), dtype);
    gpt2::Workspace<float> ws = tp.workspace(T_, T_), ws1(w.config(), T_, T_);

    RowMatrix<float> out(T_, C), single(T_, C);  // no cache
    gpt2::attention_forward<float>(tp, x, ws, out);
    gpt2::attention_forward<float>(w, x, ws1, single);
    EXPECT_TRUE(gpt2::test::near(out, single, kShardSumTol)) << "plain";
    EXPECT_TRUE(same_on_every_rank(out));

    // a bf16 cache of this rank's heads
    using Bf16Cache = KVCache<gpt2::bfloat16>;
    const RowMatrix<float> bf16_tp = through_cache<TensorParallelAttention<float>, Bf16Cache>(
        tp, x, 40, ws, [&] { return tp.cache<gpt2::bfloat16>(T_); });
    const RowMatrix<float> bf16_single = through_cache<gpt2::AttentionWeights<float>, Bf16Cache>(
        w, x, 40, ws1, [&] { return Bf16Cache(w.config(), T_); });
    EXPECT_TRUE(gpt2::test::near(bf16_tp, bf16_single, kShardSumTol)) << "bf16 cache";
    EXPECT_TRUE(same_on_every_rank(bf16_tp));

    // an int8 cache of this rank's heads (each head's rows quantized alone: the same values as
    // on one process)
    using Int8Cache = gpt2::KVCacheInt8;
    const RowMatrix<float> int8_tp = through_cache<TensorParallelAttention<float>, Int8Cache>(
        tp, x, 40, ws, [&] { return tp.cache<gpt2::int8>(T_); });
    const RowMatrix<float> int8_single = through_cache<gpt2::AttentionWeights<float>, Int8Cache>(
        w, x, 40, ws1, [&] { return Int8Cache(w.config(), T_); });
    EXPECT_TRUE(gpt2::test::near(int8_tp, int8_single, kShardSumTol)) << "int8 cache";
    EXPECT_TRUE(same_on_every_rank(int8_tp));

    // paged sequences of a pool over this rank's heads (float, bf16, int8 blocks): a prompt, two
    // forks decoding together in a batch, against the same on one process
    const auto paged = [&](const auto& sublayer, const gpt2::AttentionConfig& heads, auto storage,
                           gpt2::Workspace<float>& wsp) {
      using Stored = decltype(storage);
      gpt2::KVBlockPool<Stored> pool(heads, 32);
      gpt2::PagedSequence<Stored> root(pool);
      RowMatrix<float> y(T_ + 2 * 6, C);
      gpt2::attention_forward<float>(sublayer, x.topRows(T_), root, wsp, y.topRows(T_));
      gpt2::PagedSequence<Stored> a = root.fork(), b = root.fork();
      std::vector<gpt2::PagedSequence<Stored>*> seqs = {&a, &b};
      const BatchLayout step = BatchLayout::full(2, 1);
      for (Index i = 0; i < 6; ++i) {
        const RowMatrix<float> xs = gpt2::test::det_matrix<float>(80 + i, 2, C, 1.0);
        RowMatrix<float> ys(2, C);
        gpt2::attention_forward<float>(sublayer, xs, step, seqs, wsp, ys);
        y.middleRows(T_ + 2 * i, 2) = ys;
      }
      return y;
    };
    for (const int blocks : {0, 1, 2}) {
      SCOPED_TRACE(blocks == 0 ? "float pool" : blocks == 1 ? "bf16 pool" : "int8 pool");
      const RowMatrix<float> y_tp = blocks == 0   ? paged(tp, tp.shard_config(), float{}, ws)
                                    : blocks == 1 ? paged(tp, tp.shard_config(), gpt2::bfloat16{}, ws)
                                                  : paged(tp, tp.shard_config(), gpt2::int8{}, ws);
      const RowMatrix<float> y1 = blocks == 0   ? paged(w, w.config(), float{}, ws1)
                                  : blocks == 1 ? paged(w, w.config(), gpt2::bfloat16{}, ws1)
                                                : paged(w, w.config(), gpt2::int8{}, ws1);
      EXPECT_TRUE(gpt2::test::near(y_tp, y1, kShardSumTol));
      EXPECT_TRUE(same_on_every_rank(y_tp));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Decode steps allocate nothing once sized.
// ---------------------------------------------------------------------------------------------

TEST(TensorParallelNoAlloc, DecodeSteps) {
  const Index C = 64, H = 4, L = 12, B = 3;
  const Model<float> m = model<float>(C, H, 5);
  const TensorParallelAttention<float> tp(m.weights(), MPI_COMM_WORLD);
  const RowMatrix<float> x = gpt2::test::det_matrix<float>(6, L, C, 1.0);
  gpt2::Workspace<float> ws = tp.workspace(std::max<Index>(4, B), L);
  KVCache<float> cache = tp.cache(L);
  std::vector<KVCache<float>> caches;
  for (Index b = 0; b < B; ++b) caches.push_back(tp.cache(L));
  RowMatrix<float> out(L, C), x_step(B, C), y_step(B, C);
  const BatchLayout step = BatchLayout::full(B, 1);
  gpt2::attention_forward<float>(tp, x.topRows(4), cache, ws, out.topRows(4));  // sizes everything
  for (Index b = 0; b < B; ++b) x_step.row(b) = x.row(b);
  gpt2::attention_forward<float>(tp, x_step, step, caches, ws, y_step);

  g_new_calls = 0;
  Eigen::internal::set_is_malloc_allowed(false);
  for (Index t = 4; t < L; ++t) {
    gpt2::attention_forward<float>(tp, x.middleRows(t, 1), cache, ws, out.middleRows(t, 1));
    gpt2::attention_forward<float>(tp, x_step, step, caches, ws, y_step);
  }
  Eigen::internal::set_is_malloc_allowed(true);
  const long news = g_new_calls.load();
  EXPECT_EQ(news, 0) << "operator new calls during the decode steps";
  EXPECT_EQ(cache.n_past(), L);
  EXPECT_TRUE(gpt2::test::near(out, gpt2::attention<float>(m.weights(), x), 1e-5));
}

// ---------------------------------------------------------------------------------------------
// Errors: thrown on every rank, the message naming the rank and the problem.
// ---------------------------------------------------------------------------------------------

// Runs f on this rank; returns the message it threw (the test fails unless it threw E).
template <class E, class F>
std::string thrown(const F& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another type: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(TensorParallelErrors, MoreRanksThanHeads) {
  const Index H = world_size() - 1;  // 1 head on 2 ranks, 2 heads on 3
  const Model<float> m = model<float>(8 * H, H, 3);
  const std::string msg = thrown<gpt2::ConfigError>([&] { TensorParallelAttention<float> tp(m.weights(), MPI_COMM_WORLD); });
  EXPECT_TRUE(contains(msg, std::to_string(world_size()) + " ranks but n_head = " + std::to_string(H))) << msg;
}

TEST(TensorParallelErrors, RanksWithDifferentConfigs) {
  const Index H = world_rank() == 1 ? 4 : 8;  // rank 1 has another n_head
  const Model<float> m = model<float>(64, H, 3);
  const std::string msg = thrown<gpt2::ShapeError>([&] { TensorParallelAttention<float> tp(m.weights(), MPI_COMM_WORLD); });
  EXPECT_TRUE(contains(msg, "ranks disagree on n_head: from 4 to 8")) << msg;
}

TEST(TensorParallelErrors, RanksWithDifferentWeights) {
  Model<float> m = model<float>(64, 8, 3);
  if (world_rank() == world_size() - 1) m.c_proj_w(5, 7) += 1e-3f;
  const std::string msg = thrown<gpt2::ShapeError>([&] { TensorParallelAttention<float> tp(m.weights(), MPI_COMM_WORLD); });
  EXPECT_TRUE(contains(msg, "ranks disagree on the weights' values")) << msg;
}

TEST(TensorParallelErrors, OneRanksBadInputThrowsOnEveryRank) {
  const Model<float> m = model<float>(64, 8, 3);
  const TensorParallelAttention<float> tp(m.weights(), MPI_COMM_WORLD);
  gpt2::Workspace<float> ws = tp.workspace(4);
  const int bad = world_size() - 1;
  // The last rank's x has 60 columns: its ShapeError, with its rank, on every rank.
  const RowMatrix<float> x = RowMatrix<float>::Ones(4, world_rank() == bad ? 60 : 64);
  RowMatrix<float> out(4, 64);
  std::string msg = thrown<gpt2::ShapeError>([&] { gpt2::attention_forward<float>(tp, x, ws, out); });
  EXPECT_EQ(msg, "tensor parallel rank " + std::to_string(bad) + " of " + std::to_string(world_size()) +
                     ": x: expected shape [4, 64], got [4, 60]");
  // Rank 0 has 3 tokens, the others 4: the ranks disagree on T.
  const RowMatrix<float> x3 = RowMatrix<float>::Ones(world_rank() == 0 ? 3 : 4, 64);
  RowMatrix<float> out3(x3.rows(), 64);
  msg = thrown<gpt2::ShapeError>([&] { gpt2::attention_forward<float>(tp, x3, ws, out3); });
  EXPECT_TRUE(contains(msg, "ranks disagree on x's rows (T): from 3 to 4")) << msg;
  // One rank's cache is full: its CapacityError everywhere, and no cache changes.
  KVCache<float> cache = tp.cache(world_rank() == bad ? 2 : 8);
  const RowMatrix<float> x4 = RowMatrix<float>::Ones(4, 64);
  msg = thrown<gpt2::CapacityError>([&] { gpt2::attention_forward<float>(tp, x4, cache, ws, out); });
  EXPECT_TRUE(contains(msg, "rank " + std::to_string(bad) + " of")) << msg;
  EXPECT_TRUE(contains(msg, "exceed its capacity of 2 tokens")) << msg;
  EXPECT_EQ(cache.n_past(), 0);
  // A workspace of the full model instead of the shard.
  gpt2::Workspace<float> full_ws(m.config);
  msg = thrown<gpt2::ConfigError>([&] { gpt2::attention_forward<float>(tp, x4, full_ws, out); });
  EXPECT_TRUE(contains(msg, "workspace: expected this rank's shard")) << msg;
  // And the object still works afterwards.
  gpt2::attention_forward<float>(tp, x4, ws, out);
  EXPECT_TRUE(gpt2::test::near(out, gpt2::attention<float>(m.weights(), x4), 1e-5));
}

TEST(TensorParallelErrors, MpiErrorsBecomeExceptions) {
  const Model<float> m = model<float>(64, 8, 3);
  const TensorParallelAttention<float> tp(m.weights(), MPI_COMM_WORLD);
  const std::string msg = thrown<gpt2::MpiError>(
      [&] { gpt2::detail::mpi_check(MPI_ERR_COUNT, "MPI_Allreduce", tp.rank(), tp.n_ranks()); });
  EXPECT_TRUE(contains(msg, "tensor parallel rank " + std::to_string(tp.rank()) + " of")) << msg;
  EXPECT_TRUE(contains(msg, "MPI_Allreduce failed")) << msg;
  // The communicator in use returns errors (the caller's is left alone).
  MPI_Errhandler handler;
  MPI_Comm_get_errhandler(tp.comm(), &handler);
  EXPECT_TRUE(handler == MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&handler);
  // A real failing call: a gather to a root that does not exist is refused before any message.
  const RowMatrix<float> local(tp.heads().count * 2, 2);
  RowMatrix<float> full(8 * 2, 2);
  gpt2::MatrixRef<float> full_ref = full;
  const std::string msg2 = thrown<gpt2::MpiError>([&] { tp.gather_heads(local, 2, &full_ref, tp.n_ranks() + 5); });
  EXPECT_TRUE(contains(msg2, "MPI_Gatherv failed")) << msg2;
}

// Progress from rank 0 only; every rank reports its own failures.
class FailurePrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", world_rank(), r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (world_rank() != 0) {  // their failures on stderr; nothing on stdout (the accuracy table)
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter);
    if (!std::freopen("/dev/null", "w", stdout)) return 1;
  }
  if (world_rank() == 0) std::printf("tensor parallel tests on %d ranks\n", world_size());
  const int status = RUN_ALL_TESTS();
  int worst = status;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
