// The sublayer against PyTorch (tests/reference/generate.py, Hugging Face GPT2Attention
// semantics): q/k/v per head, per-head outputs (merged), probabilities and final outputs, for every
// case, in float and double. Accuracy bar:
//   float:  max|ours - ref| / max|ref| <= 8 x PyTorch float32's own error on the same case
//   double: max|ours - ref| / max|ref| <= 1e-12
// At the end it prints the accuracy table that docs/accuracy.md shows (lines starting with '|').
#include <gtest/gtest.h>

#include <cstdio>
#include <iomanip>
#include <limits>
#include <sstream>

#include "gpt2/attention.hpp"
#include "support/accuracy.hpp"
#include "support/compare.hpp"
#include "support/fixture.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::test::CaseInputs;
using gpt2::test::expect_accurate;
using gpt2::test::Fixture;
using gpt2::test::inputs_for;

// Our results for every stored row of a case.
template <class T>
struct Results {
  RowMatrix<T> out, probs;  // out [T, C], probs [n_head * T, T]
  gpt2::Workspace<T> ws;    // holds qkv and merged of the last forward
};

template <class T>
void check_case(const std::string& name) {
  const Fixture f(name);
  const std::unique_ptr<CaseInputs<T>> in = inputs_for<T>(f);
  if (!in) GTEST_SKIP() << "GPT2_SMALL_WEIGHTS not set: skipping the real GPT-2 weights test " << name;
  const gpt2::AttentionWeights<T>& w = in->weights();
  const Index T_ = f.tokens(), C = f.n_embd(), H = f.n_head(), hd = f.head_dim();
  const std::vector<Index>& rows = f.rows();
  const Index R = static_cast<Index>(rows.size());

  gpt2::Workspace<T> ws(w.config(), T_);
  RowMatrix<T> out(T_, C), probs(H * T_, T_);
  gpt2::attention_forward<T>(w, in->x, ws, out, probs);

  // Gather the stored rows: out, merged [R, C]; per head probs [R, T], q/k/v [R, hd].
  RowMatrix<T> out_rows(R, C), merged_rows(R, C);
  for (Index i = 0; i < R; ++i) {
    out_rows.row(i) = out.row(rows[i]);
    merged_rows.row(i) = ws.merged.map().row(rows[i]);
  }
  expect_accurate<T>(f, "out", out_rows, f.matrix("out"));
  expect_accurate<T>(f, "merged", merged_rows, f.matrix("merged"));

  RowMatrix<T> probs_rows(H * R, T_);
  RowMatrix<double> probs_ref(H * R, T_);
  for (Index h = 0; h < H; ++h) {
    probs_ref.middleRows(h * R, R) = f.head("probs", h);
    for (Index i = 0; i < R; ++i) probs_rows.row(h * R + i) = probs.row(h * T_ + rows[i]);
  }
  expect_accurate<T>(f, "probs", probs_rows, probs_ref);

  // q | k | v: the library's head views against PyTorch's own split (view + permute).
  if (f.has("q")) {
    const gpt2::ConstMatrixRef<T> qkv = ws.qkv.topRows(T_);
    for (const char* part : {"q", "k", "v"}) {
      RowMatrix<T> ours(H * R, hd);
      RowMatrix<double> ref(H * R, hd);
      for (Index h = 0; h < H; ++h) {
        const gpt2::ConstMatrixRef<T> view =
            part[0] == 'q' ? gpt2::q_view(qkv, w.config(), h)
                           : part[0] == 'k' ? gpt2::k_view(qkv, w.config(), h) : gpt2::v_view(qkv, w.config(), h);
        for (Index i = 0; i < R; ++i) ours.row(h * R + i) = view.row(rows[i]);
        ref.middleRows(h * R, R) = f.head(part, h);
      }
      expect_accurate<T>(f, part, ours, ref);
    }
  }

  // Structure of every probability row: causal zeros (exact) and rows summing to 1.
  for (Index h = 0; h < H; ++h)
    for (Index t = 0; t < T_; ++t) {
      const auto row = probs.row(h * T_ + t);
      ASSERT_TRUE((row.tail(T_ - t - 1).array() == T(0)).all()) << "head " << h << " row " << t;
      ASSERT_NEAR(static_cast<double>(row.head(t + 1).sum()), 1.0, 64 * std::numeric_limits<T>::epsilon())
          << "head " << h << " row " << t;
    }
  ASSERT_TRUE(out.allFinite());
}

template <class T>
class ReferenceTest : public ::testing::Test {};
TYPED_TEST_SUITE(ReferenceTest, gpt2::test::Scalars);

TYPED_TEST(ReferenceTest, Tiny_C8_T5) { check_case<TypeParam>("tiny_T5"); }
TYPED_TEST(ReferenceTest, Small_T1) { check_case<TypeParam>("small_T1"); }
TYPED_TEST(ReferenceTest, Small_T7_OddLength) { check_case<TypeParam>("small_T7"); }
TYPED_TEST(ReferenceTest, Small_T1024) { check_case<TypeParam>("small_T1024"); }
TYPED_TEST(ReferenceTest, Medium_C1024_T13) { check_case<TypeParam>("medium_T13"); }
TYPED_TEST(ReferenceTest, Large_C1280_T6) { check_case<TypeParam>("large_T6"); }
TYPED_TEST(ReferenceTest, XL_C1600_T9) { check_case<TypeParam>("xl_T9"); }
TYPED_TEST(ReferenceTest, LogitsInTheThousands_T33) { check_case<TypeParam>("big_logits_T33"); }
TYPED_TEST(ReferenceTest, RealGpt2Layer0_T64) { check_case<TypeParam>("gpt2_layer0_T64"); }
TYPED_TEST(ReferenceTest, RealGpt2Layer0_T1024) { check_case<TypeParam>("gpt2_layer0_T1024"); }

TEST(ReferenceFixtures, LogitCaseReallyHasLogitsInTheThousands) {
  EXPECT_GT(Fixture("big_logits_T33").number("max_abs_logit"), 1000.0);
}

// The fixtures pin down the layout: reading qkv as n_head interleaved [q k v] chunks, or reading
// c_attn.weight as nn.Linear's [out, in] (a transposed weight), does NOT reproduce PyTorch.
class LayoutMistakes : public ::testing::Test {
 protected:
  LayoutMistakes() : f("small_T7"), in(CaseInputs<double>::synthetic(f)) {}
  // Relative error of head h's q (or k, v: part 0, 1, 2) under a given column offset function.
  template <class Offset>
  double head_error(const RowMatrix<double>& qkv, int part, Offset offset) const {
    double worst = 0;
    for (Index h = 0; h < f.n_head(); ++h) {
      const RowMatrix<double> ours = qkv.middleCols(offset(part, h), f.head_dim());
      const RowMatrix<double> ref = f.head(part == 0 ? "q" : part == 1 ? "k" : "v", h);
      worst = std::max(worst, gpt2::test::max_diff(ours, ref).relative());
    }
    return worst;
  }
  Fixture f;
  std::unique_ptr<CaseInputs<double>> in;
};

TEST_F(LayoutMistakes, CorrectSplitMatchesButInterleavedSplitFails) {
  const Index C = f.n_embd(), hd = f.head_dim();
  RowMatrix<double> qkv(f.tokens(), 3 * C);
  gpt2::qkv_projection<double>(in->weights(), in->x, qkv);
  auto blocks = [&](int part, Index h) { return part * C + h * hd; };           // q | k | v
  auto interleaved = [&](int part, Index h) { return h * 3 * hd + part * hd; };  // [q k v] per head
  for (int part = 0; part < 3; ++part) {
    EXPECT_LE(head_error(qkv, part, blocks), 1e-12) << "part " << part;
    EXPECT_GT(head_error(qkv, part, interleaved), 0.1) << "part " << part;
  }
}

TEST_F(LayoutMistakes, TransposedWeightFails) {
  const Index C = f.n_embd(), hd = f.head_dim();
  // The same buffer read as nn.Linear's weight [3C, C]: qkv = x @ W^T.
  const gpt2::ConstMatrixMap<double> linear(in->weights().c_attn_weight().data(), 3 * C, C);
  RowMatrix<double> qkv = in->x * linear.transpose();
  qkv.rowwise() += in->weights().c_attn_bias();
  EXPECT_GT(head_error(qkv, 0, [&](int part, Index h) { return part * C + h * hd; }), 0.1);
}

}  // namespace
