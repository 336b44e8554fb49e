// The KV cache and padded batches against PyTorch (tests/reference/generate.py, Hugging Face
// GPT2Attention with past_key_values and attention_mask):
//   kind past:         one sequence fed in the fixture's chunks through a KVCache: out, the
//                      cache's keys and values (HF's `present`) and the probabilities
//   kind batch:        one padded batch through BatchLayout (padding rows: the fixture's garbage,
//                      then NaN: identical results)
//   kind batch_decode: batched generation with one KVCache per sequence: left-padded prompts, then
//                      one token per unfinished sequence per step
// Accuracy bar and table: support/accuracy.hpp (as test_reference.cpp). Padded output rows must be
// exactly 0.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <sstream>
#include <vector>

#include "gpt2/attention.hpp"
#include "support/accuracy.hpp"
#include "support/compare.hpp"
#include "support/det_random.hpp"
#include "support/fixture.hpp"

namespace {

using gpt2::BatchLayout;
using gpt2::Index;
using gpt2::KVCache;
using gpt2::RowMatrix;
using gpt2::test::CaseInputs;
using gpt2::test::expect_accurate;
using gpt2::test::Fixture;
using gpt2::test::inputs_for;

constexpr std::uint64_t kSeedOffsetPad = 5;  // padding garbage (generate.py SEED_OFFSET["pad"])

std::vector<Index> integers(const std::string& csv) {
  std::vector<Index> v;
  std::stringstream s(csv);
  for (std::string item; std::getline(s, item, ',');) v.push_back(std::stoll(item));
  return v;
}

// Rows that are zero in the reference (padding) must be exactly zero in ours.
template <class T>
void expect_padding_exactly_zero(const Fixture& f, const RowMatrix<T>& ours, const RowMatrix<double>& ref) {
  for (Index r = 0; r < ref.rows(); ++r)
    if ((ref.row(r).array() == 0.0).all()) {
      EXPECT_TRUE((ours.row(r).array() == T(0)).all()) << f.name() << ": padded row " << r;
    }
}

// ---------------------------------------------------------------------------------------------
// kind past
// ---------------------------------------------------------------------------------------------

template <class T>
void check_past(const std::string& name) {
  const Fixture f(name);
  ASSERT_EQ(f.meta("kind"), "past");
  const std::unique_ptr<CaseInputs<T>> in = inputs_for<T>(f);
  if (!in) GTEST_SKIP() << "GPT2_SMALL_WEIGHTS not set: skipping the real GPT-2 weights test " << name;
  const gpt2::AttentionWeights<T>& w = in->weights();
  const Index T_ = f.tokens(), C = f.n_embd(), H = f.n_head(), hd = f.head_dim();
  const std::vector<Index>& rows = f.rows();
  const Index R = static_cast<Index>(rows.size());
  const bool with_probs = f.has("probs");

  // Feed the chunks; keep every row's output and (when stored) its probabilities over T keys.
  KVCache<T> cache(w.config(), T_);
  gpt2::Workspace<T> ws(w.config());
  RowMatrix<T> out(T_, C), probs = RowMatrix<T>::Zero(H * T_, T_);
  Index pos = 0;
  for (const Index n : integers(f.meta("chunks"))) {
    if (with_probs) {
      RowMatrix<T> p(H * n, pos + n);
      gpt2::attention_forward<T>(w, in->x.middleRows(pos, n), cache, ws, out.middleRows(pos, n), p);
      for (Index h = 0; h < H; ++h) probs.block(h * T_ + pos, 0, n, pos + n) = p.middleRows(h * n, n);
    } else {
      gpt2::attention_forward<T>(w, in->x.middleRows(pos, n), cache, ws, out.middleRows(pos, n));
    }
    pos += n;
  }
  ASSERT_EQ(pos, T_);
  ASSERT_EQ(cache.n_past(), T_);

  RowMatrix<T> out_rows(R, C), k_rows(H * R, hd), v_rows(H * R, hd), p_rows(H * R, T_);
  RowMatrix<double> k_ref(H * R, hd), v_ref(H * R, hd), p_ref(H * R, T_);
  for (Index i = 0; i < R; ++i) out_rows.row(i) = out.row(rows[i]);
  for (Index h = 0; h < H; ++h) {
    k_ref.middleRows(h * R, R) = f.head("present_k", h);
    v_ref.middleRows(h * R, R) = f.head("present_v", h);
    if (with_probs) p_ref.middleRows(h * R, R) = f.head("probs", h);
    for (Index i = 0; i < R; ++i) {
      k_rows.row(h * R + i) = cache.keys(h).row(rows[i]);
      v_rows.row(h * R + i) = cache.values(h).row(rows[i]);
      p_rows.row(h * R + i) = probs.row(h * T_ + rows[i]);
    }
  }
  expect_accurate<T>(f, "out", out_rows, f.matrix("out"));
  expect_accurate<T>(f, "present_k", k_rows, k_ref);
  expect_accurate<T>(f, "present_v", v_rows, v_ref);
  if (with_probs) {
    expect_accurate<T>(f, "probs", p_rows, p_ref);
    for (Index r = 0; r < H * R; ++r)  // keys after the query: exactly 0, as in the reference
      for (Index j = 0; j < T_; ++j)
        if (p_ref(r, j) == 0.0) {
          ASSERT_EQ(p_rows(r, j), T(0)) << "probs row " << r << " key " << j;
        }
  }
}

// ---------------------------------------------------------------------------------------------
// kind batch
// ---------------------------------------------------------------------------------------------

template <class T>
void check_batch(const std::string& name) {
  const Fixture f(name);
  ASSERT_EQ(f.meta("kind"), "batch");
  const std::unique_ptr<CaseInputs<T>> in = CaseInputs<T>::synthetic(f);
  const Index B = f.integer("B"), T_ = f.tokens(), C = f.n_embd();
  const auto seed = static_cast<std::uint64_t>(f.integer("seed"));
  const BatchLayout layout(T_, integers(f.meta("starts")), integers(f.meta("lengths")));
  ASSERT_EQ(layout.batch(), B);

  // The fixture's inputs: real rows from seed S, padding rows from seed S + 5 (times scale_pad).
  const RowMatrix<T> real = gpt2::test::det_matrix<T>(seed + gpt2::test::kSeedOffsetX, B * T_, C, f.number("scale_x"));
  const RowMatrix<T> pad = gpt2::test::det_matrix<T>(seed + kSeedOffsetPad, B * T_, C, f.number("scale_pad"));
  RowMatrix<T> x = pad, x_nan = RowMatrix<T>::Constant(B * T_, C, std::numeric_limits<T>::quiet_NaN());
  for (Index b = 0; b < B; ++b) {
    x.middleRows(layout.first_row(b), layout.length(b)) = real.middleRows(layout.first_row(b), layout.length(b));
    x_nan.middleRows(layout.first_row(b), layout.length(b)) = real.middleRows(layout.first_row(b), layout.length(b));
  }

  gpt2::Workspace<T> ws(in->weights().config());
  RowMatrix<T> out(B * T_, C), out_nan(B * T_, C);
  gpt2::attention_forward<T>(in->weights(), x, layout, ws, out);
  gpt2::attention_forward<T>(in->weights(), x_nan, layout, ws, out_nan);
  const RowMatrix<double> ref = f.matrix("out");
  expect_accurate<T>(f, "out", out, ref);
  expect_padding_exactly_zero<T>(f, out, ref);
  EXPECT_TRUE(out_nan == out) << "NaN padding changed the result";
}

// ---------------------------------------------------------------------------------------------
// kind batch_decode
// ---------------------------------------------------------------------------------------------

template <class T>
void check_batch_decode(const std::string& name) {
  const Fixture f(name);
  ASSERT_EQ(f.meta("kind"), "batch_decode");
  const std::unique_ptr<CaseInputs<T>> in = CaseInputs<T>::synthetic(f);
  const gpt2::AttentionWeights<T>& w = in->weights();
  const Index B = f.integer("B"), L = f.integer("Lmax"), C = f.n_embd();
  const std::vector<Index> lengths = integers(f.meta("lengths")), prompts = integers(f.meta("prompts"));
  const auto seed = static_cast<std::uint64_t>(f.integer("seed"));
  const RowMatrix<T> tokens = gpt2::test::det_matrix<T>(seed + gpt2::test::kSeedOffsetX, B * L, C, f.number("scale_x"));
  const T nan = std::numeric_limits<T>::quiet_NaN();

  std::vector<KVCache<T>> caches;
  for (Index b = 0; b < B; ++b) caches.emplace_back(w.config(), L);
  gpt2::Workspace<T> ws(w.config());
  RowMatrix<T> out = RowMatrix<T>::Zero(B * L, C);

  // Step 0: the prompts, left-padded (NaN padding).
  Index P = 0;
  for (const Index p : prompts) P = std::max(P, p);
  const BatchLayout prefill = BatchLayout::left_padded(P, prompts);
  RowMatrix<T> x = RowMatrix<T>::Constant(B * P, C, nan), y(B * P, C);
  for (Index b = 0; b < B; ++b)
    x.middleRows(prefill.first_row(b), prompts[b]) = tokens.middleRows(b * L, prompts[b]);
  gpt2::attention_forward<T>(w, x, prefill, caches, ws, y);
  for (Index b = 0; b < B; ++b)
    EXPECT_TRUE((y.middleRows(b * P, P - prompts[b]).array() == T(0)).all()) << "left padding of " << b;
  for (Index b = 0; b < B; ++b)
    out.middleRows(b * L, prompts[b]) = y.middleRows(prefill.first_row(b), prompts[b]);

  // Then one token per unfinished sequence per step.
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
    gpt2::attention_forward<T>(w, x_step, step, caches, ws, y_step);
    for (Index b = 0; b < B; ++b) {
      if (step.length(b) == 1)
        out.row(b * L + caches[b].n_past() - 1) = y_step.row(b);
      else
        EXPECT_TRUE((y_step.row(b).array() == T(0)).all()) << "finished sequence " << b;
    }
  }
  for (Index b = 0; b < B; ++b) EXPECT_EQ(caches[b].n_past(), lengths[b]);
  const RowMatrix<double> ref = f.matrix("out");
  expect_accurate<T>(f, "out", out, ref);
}

template <class T>
class ReferenceIncremental : public ::testing::Test {};
TYPED_TEST_SUITE(ReferenceIncremental, gpt2::test::Scalars);

TYPED_TEST(ReferenceIncremental, Past_Tiny_UnevenChunks) { check_past<TypeParam>("past_tiny"); }
TYPED_TEST(ReferenceIncremental, Past_Small_T40) { check_past<TypeParam>("past_small_T40"); }
TYPED_TEST(ReferenceIncremental, Past_Small_DecodeWith1023Cached) { check_past<TypeParam>("past_small_T1024"); }
TYPED_TEST(ReferenceIncremental, Past_RealGpt2Layer0_PrefillThenDecode) { check_past<TypeParam>("past_gpt2_layer0_T64"); }
TYPED_TEST(ReferenceIncremental, Batch_RightPadding) { check_batch<TypeParam>("batch_right_pad"); }
TYPED_TEST(ReferenceIncremental, Batch_LeftPadding) { check_batch<TypeParam>("batch_left_pad"); }
TYPED_TEST(ReferenceIncremental, Batch_MixedWithAnEmptySequence) { check_batch<TypeParam>("batch_mixed"); }
TYPED_TEST(ReferenceIncremental, Batch_Small) { check_batch<TypeParam>("batch_small"); }
TYPED_TEST(ReferenceIncremental, BatchDecode_Tiny) { check_batch_decode<TypeParam>("batch_decode_tiny"); }
TYPED_TEST(ReferenceIncremental, BatchDecode_Small) { check_batch_decode<TypeParam>("batch_decode_small"); }

}  // namespace
