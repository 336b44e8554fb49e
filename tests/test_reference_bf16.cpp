// bf16 weights (pack_weights(w, WeightDtype::bf16)) against PyTorch, at every kernel level the
// machine has (the others skipped with "skipped: the CPU has no ..."): for every fixture of kinds
// "whole" (one forward) and "past" (the fixture's chunks through a KVCache), our output's error
// against the float64 reference must be at most PyTorch's own bfloat16 error on the same case
// (metadata torch_bf16_err_out: the sublayer with weights and input in torch.bfloat16, every op in
// bf16, tests/reference/generate.py), and at most 5e-3 where PyTorch's is below that. The same for
// merged (the heads before c_proj) where the fixture has PyTorch's figure. The BF16Cache_ cases run
// the same fixtures through a KVCacheBF16 (keys and values in bf16).
//
// The fixtures also hold the exact answer on the bf16-rounded weights (out_bf16_weights, metadata
// bf16_weights_err_*: float64 math, nothing else rounded). At the levels that widen the bf16 weights
// and do float32 math (generic, avx2, avx512) ours must equal it to float32 accuracy (8x PyTorch
// float32's own error, test_reference's bar). Where that exact answer is itself further from the
// reference than PyTorch's bf16 run and the logits are in the thousands (big_logits_T33, which the
// weights' rounding moves by about 20), the error is which keys the saturated softmax picks, a
// draw from a wide spread (tests/reference/bf16_weight_rounding.py); there the bar is the exact
// answer's error plus the float32 tolerance, at every level (the levels that also round x land
// lower on this case: 1.83e-1), and the test prints that it was raised.
// Prints the table docs/bf16.md shows (lines starting with '|').
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "support/accuracy.hpp"
#include "support/compare.hpp"
#include "support/fixture.hpp"

namespace {

using gpt2::Index;
using gpt2::Isa;
using gpt2::RowMatrix;
using gpt2::test::CaseInputs;
using gpt2::test::Fixture;
using gpt2::test::inputs_for;

struct Row {
  std::string case_name, level;
  double ours, torch_bf16, exact_bf16_weights;
};
std::vector<Row>& table() {
  static std::vector<Row> rows;
  return rows;
}

class Bf16Table : public ::testing::Environment {
 public:
  void TearDown() override {
    if (table().empty()) return;
    std::vector<std::string> levels, cases;
    std::map<std::pair<std::string, std::string>, double> ours;
    std::map<std::string, double> torch, exact;
    for (const Row& r : table()) {
      if (std::find(levels.begin(), levels.end(), r.level) == levels.end()) levels.push_back(r.level);
      if (std::find(cases.begin(), cases.end(), r.case_name) == cases.end()) cases.push_back(r.case_name);
      ours[{r.case_name, r.level}] = r.ours;
      torch[r.case_name] = r.torch_bf16;
      exact[r.case_name] = r.exact_bf16_weights;
    }
    std::printf("\n| case | PyTorch bf16 out error | exact on bf16 weights |");
    for (const std::string& l : levels) std::printf(" ours at %s |", l.c_str());
    std::printf("\n|---|---|---|");
    for (std::size_t i = 0; i < levels.size(); ++i) std::printf("---|");
    std::printf("\n");
    for (const std::string& c : cases) {
      std::printf("| %s | %.2e | %.2e |", c.c_str(), torch[c], exact[c]);
      for (const std::string& l : levels) {
        const auto it = ours.find({c, l});
        if (it == ours.end())
          std::printf(" - |");
        else
          std::printf(" %.2e |", it->second);
      }
      std::printf("\n");
    }
  }
};
[[maybe_unused]] ::testing::Environment* const kTable =
    ::testing::AddGlobalTestEnvironment(new Bf16Table);

std::vector<Index> integers(const std::string& csv) {
  std::vector<Index> v;
  std::stringstream in(csv);
  for (std::string item; std::getline(in, item, ',');) v.push_back(std::stoll(item));
  return v;
}

// ours' error on `quantity` within the bar of PyTorch's bf16 error (metadata torch_bf16_err_*),
// raised to the exact answer on bf16 weights (bf16_weights_err_*) plus float32's tolerance where
// that exact answer is itself further off than PyTorch's.
void expect_within_torch_bf16(const Fixture& f, const std::string& quantity,
                              const RowMatrix<float>& ours, const RowMatrix<double>& ref,
                              const std::string& label = "") {
  const std::string key = "torch_bf16_err_" + quantity;
  ASSERT_TRUE(f.has_meta(key)) << f.name() << " has no " << key;
  ASSERT_TRUE(f.has_meta("bf16_weights_err_" + quantity)) << f.name() << " has no bf16_weights_err_" << quantity;
  const double torch_err = f.number(key);
  const double exact_err = f.number("bf16_weights_err_" + quantity);
  const double tol32 = 8 * f.number("torch32_err_" + quantity);
  const double err = gpt2::test::max_diff(ours, ref).relative();
  double bar = torch_err;
  // Only in the saturated-softmax regime, where the error is which keys win (max |logit| above
  // 1000: big_logits_T33); anywhere else an exact answer above PyTorch's figure fails the test.
  if (exact_err > torch_err && f.number("max_abs_logit") > 1000) {
    bar = exact_err + tol32;
    std::printf("%s %s: the exact answer on bf16 weights is %.3e from the reference, PyTorch's bf16 "
                "run %.3e: bar raised to %.3e (issue 14's bar is PyTorch's figure; on this case the "
                "error is a draw, tests/reference/bf16_weight_rounding.py)\n",
                f.name().c_str(), quantity.c_str(), exact_err, torch_err, bar);
  }
  EXPECT_LE(err, bar) << f.name() << " " << quantity << ": ours " << err
                      << " against PyTorch bf16's " << torch_err << " (exact on bf16 weights "
                      << exact_err << ")";
  if (torch_err < 5e-3) {
    EXPECT_LE(err, 5e-3) << f.name() << " " << quantity;
  }
  if (quantity == "out")
    table().push_back({f.name() + label, gpt2::isa_name(gpt2::active_isa()), err, torch_err, exact_err});
}

// At the levels whose bf16 products widen the weights and do float32 math, ours is the exact
// answer on bf16 weights (out_bf16_weights) up to float32 rounding.
void expect_exact_on_bf16_weights(const Fixture& f, const RowMatrix<float>& ours) {
  const Isa level = gpt2::active_isa();
  if (level != Isa::generic && level != Isa::avx2 && level != Isa::avx512) return;
  const double tol32 = 8 * f.number("torch32_err_out");
  // Relative to the reference's largest value, as the other errors here.
  const double d = gpt2::test::max_diff(ours, f.matrix_f32("out_bf16_weights")).value /
                   f.matrix("out").cwiseAbs().maxCoeff();
  EXPECT_LE(d, tol32) << f.name() << ": ours against the exact answer on bf16 weights, at "
                      << gpt2::isa_name(level);
  std::printf("%s at %s: %.3e from the exact answer on bf16 weights (tolerance %.3e)\n", f.name().c_str(),
              gpt2::isa_name(level), d, tol32);
}

RowMatrix<float> stored_rows(const Fixture& f, const RowMatrix<float>& all) {
  const std::vector<Index>& rows = f.rows();
  RowMatrix<float> r(static_cast<Index>(rows.size()), all.cols());
  for (std::size_t i = 0; i < rows.size(); ++i) r.row(static_cast<Index>(i)) = all.row(rows[i]);
  return r;
}

class ReferenceBf16 : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!gpt2::isa_supported(GetParam()))
      GTEST_SKIP() << "skipped: the CPU has no " << gpt2::isa_missing(GetParam());
    gpt2::set_isa(GetParam());
  }
  void TearDown() override { gpt2::reset_isa(); }

  // One forward (kind whole) or the fixture's chunks through a KVCache (kind past); with
  // bf16_cache, through a KVCacheBF16 (kind whole: in one chunk).
  void check(const std::string& name, bool bf16_cache = false) {
    const Fixture f(name);
    const std::unique_ptr<CaseInputs<float>> in = inputs_for<float>(f);
    if (!in) GTEST_SKIP() << "GPT2_SMALL_WEIGHTS not set: skipping the real GPT-2 weights test " << name;
    const gpt2::AttentionWeights<float> w = gpt2::pack_weights(in->weights(), gpt2::WeightDtype::bf16);
    ASSERT_EQ(w.weight_dtype(), gpt2::WeightDtype::bf16);
    const Index T_ = f.tokens(), C = f.n_embd();
    RowMatrix<float> out(T_, C);
    gpt2::Workspace<float> ws(w.config(), T_);
    const bool past = f.has_meta("kind") && f.meta("kind") == "past";
    if (bf16_cache) {
      gpt2::KVCacheBF16 cache(w.config(), T_);
      Index pos = 0;
      for (const Index n : past ? integers(f.meta("chunks")) : std::vector<Index>{T_}) {
        gpt2::attention_forward<float>(w, in->x.middleRows(pos, n), cache, ws, out.middleRows(pos, n));
        pos += n;
      }
      ASSERT_EQ(pos, T_);
      ASSERT_TRUE(out.allFinite());
      expect_within_torch_bf16(f, "out", stored_rows(f, out), f.matrix("out"), " (bf16 KV cache)");
      return;
    }
    if (past) {
      gpt2::KVCache<float> cache(w.config(), T_);
      Index pos = 0;
      for (const Index n : integers(f.meta("chunks"))) {
        gpt2::attention_forward<float>(w, in->x.middleRows(pos, n), cache, ws, out.middleRows(pos, n));
        pos += n;
      }
      ASSERT_EQ(pos, T_);
    } else {
      gpt2::attention_forward<float>(w, in->x, ws, out);
    }
    ASSERT_TRUE(out.allFinite());
    expect_exact_on_bf16_weights(f, stored_rows(f, out));
    expect_within_torch_bf16(f, "out", stored_rows(f, out), f.matrix("out"));
    if (!past && f.has_meta("torch_bf16_err_merged"))
      expect_within_torch_bf16(f, "merged", stored_rows(f, ws.merged.topRows(T_)), f.matrix("merged"));
  }
};

TEST_P(ReferenceBf16, Tiny_C8_T5) { check("tiny_T5"); }
TEST_P(ReferenceBf16, Small_T1) { check("small_T1"); }
TEST_P(ReferenceBf16, Small_T7) { check("small_T7"); }
TEST_P(ReferenceBf16, Small_T1024) { check("small_T1024"); }
TEST_P(ReferenceBf16, Medium_C1024_T13) { check("medium_T13"); }
TEST_P(ReferenceBf16, Large_C1280_T6) { check("large_T6"); }
TEST_P(ReferenceBf16, XL_C1600_T9) { check("xl_T9"); }
TEST_P(ReferenceBf16, LogitsInTheThousands_T33) { check("big_logits_T33"); }
TEST_P(ReferenceBf16, RealGpt2Layer0_T64) { check("gpt2_layer0_T64"); }
TEST_P(ReferenceBf16, RealGpt2Layer0_T1024) { check("gpt2_layer0_T1024"); }
TEST_P(ReferenceBf16, Past_Tiny) { check("past_tiny"); }
TEST_P(ReferenceBf16, Past_Small_T40) { check("past_small_T40"); }
TEST_P(ReferenceBf16, Past_Small_DecodeWith1023Cached) { check("past_small_T1024"); }
TEST_P(ReferenceBf16, Past_RealGpt2Layer0) { check("past_gpt2_layer0_T64"); }
// The same cases through a bf16 KV cache (KVCacheBF16): its rounding of k and v is PyTorch's too.
TEST_P(ReferenceBf16, BF16Cache_Small_T1024) { check("small_T1024", true); }
TEST_P(ReferenceBf16, BF16Cache_RealGpt2Layer0_T1024) { check("gpt2_layer0_T1024", true); }
TEST_P(ReferenceBf16, BF16Cache_Past_Tiny) { check("past_tiny", true); }
TEST_P(ReferenceBf16, BF16Cache_Past_Small_T40) { check("past_small_T40", true); }
TEST_P(ReferenceBf16, BF16Cache_Past_Small_DecodeWith1023Cached) { check("past_small_T1024", true); }
TEST_P(ReferenceBf16, BF16Cache_Past_RealGpt2Layer0) { check("past_gpt2_layer0_T64", true); }

INSTANTIATE_TEST_SUITE_P(Levels, ReferenceBf16,
                         ::testing::Values(Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512_bf16,
                                           Isa::amx),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(gpt2::isa_name(info.param));
                         });

}  // namespace
