// kernels/dispatch.hpp, kernels/cpu.hpp, kernels/pack.hpp, pack_weights: the level chosen and
// forced, its errors, the CPU features against the compiler's own cpuid reader, the panel layout,
// and forwards on packed weights against the views (bitwise) and across levels.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/models.hpp"

namespace {

using gpt2::Index;
using gpt2::Isa;
using gpt2::RowMatrix;

// Restores the level the environment chose when a test ends.
struct LevelGuard {
  ~LevelGuard() { gpt2::reset_isa(); }
};

bool has(const std::vector<Isa>& levels, Isa isa) {
  for (Isa l : levels)
    if (l == isa) return true;
  return false;
}

std::vector<Isa> vector_levels() {
  std::vector<Isa> levels;
  for (Isa isa : gpt2::available_isas())
    if (isa != Isa::generic) levels.push_back(isa);
  return levels;
}

TEST(KernelDispatch, CpuFeaturesAgreeWithTheCompilersCpuidReader) {
#if GPT2_ATTENTION_X86
  const gpt2::kernels::CpuFeatures& f = gpt2::kernels::cpu_features();
  // __builtin_cpu_supports reads cpuid (and, for the AVX families, the OS's XCR0) on its own.
  EXPECT_EQ(f.avx2, bool(__builtin_cpu_supports("avx2")));
  EXPECT_EQ(f.fma, bool(__builtin_cpu_supports("fma")));
  EXPECT_EQ(f.avx512f, bool(__builtin_cpu_supports("avx512f")));
  EXPECT_EQ(f.avx512bw, bool(__builtin_cpu_supports("avx512bw")));
  EXPECT_EQ(f.avx512dq, bool(__builtin_cpu_supports("avx512dq")));
  EXPECT_EQ(f.avx512vl, bool(__builtin_cpu_supports("avx512vl")));
  EXPECT_FALSE(f.vendor.empty());
#else
  GTEST_SKIP() << "skipped: not an x86 build (generic level only)";
#endif
}

TEST(KernelDispatch, LevelsAreListedLowestFirstAndTheBestIsChosen) {
  const std::vector<Isa> levels = gpt2::available_isas();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), Isa::generic);
  for (std::size_t i = 1; i < levels.size(); ++i)
    EXPECT_LT(static_cast<int>(levels[i - 1]), static_cast<int>(levels[i]));
  EXPECT_EQ(gpt2::best_isa(), levels.back());
  EXPECT_EQ(has(levels, Isa::avx512), gpt2::isa_supported(Isa::avx512));
  EXPECT_EQ(has(levels, Isa::avx2), gpt2::isa_supported(Isa::avx2));
  for (Isa isa : gpt2::kAllIsas) {
    // A level needs its features: avx512 implies avx2 here too (every AVX-512 CPU has it).
    if (isa == Isa::avx512 && gpt2::isa_supported(isa)) {
      EXPECT_TRUE(gpt2::kernels::cpu_features().avx512f);
      EXPECT_TRUE(gpt2::kernels::cpu_features().fma);
    }
    if (isa == Isa::avx2 && gpt2::isa_supported(isa)) {
      EXPECT_TRUE(gpt2::kernels::cpu_features().avx2);
    }
  }
}

TEST(KernelDispatch, SetIsaForcesEveryAvailableLevelAndKernelInfoSaysSo) {
  const LevelGuard guard;
  for (Isa isa : gpt2::available_isas()) {
    gpt2::set_isa(isa);
    EXPECT_EQ(gpt2::active_isa(), isa);
    const gpt2::KernelInfo info = gpt2::kernel_info();
    EXPECT_EQ(info.isa, isa);
    EXPECT_EQ(info.level, gpt2::isa_name(isa));
    EXPECT_EQ(info.chosen_by, "set_isa");
    EXPECT_EQ(info.cpu, gpt2::kernels::cpu_features().names());
    EXPECT_EQ(info.summary(), info.level + "; cpu: " + info.cpu);
    // every level has a complete table of its own (generic's included), the active one's
    const gpt2::kernels::Kernels<float>& k = gpt2::kernels::table<float>();
    EXPECT_EQ(k.isa, isa);
    EXPECT_EQ(&k, &gpt2::kernels::table<float>(isa));
    EXPECT_EQ(k.row_exact, isa != Isa::generic);
    EXPECT_TRUE(k.project && k.gemm && k.row_times_transposed && k.softmax_row &&
                k.attention_tile && k.row_partials && k.merge_row_partials && k.tile_rows);
    EXPECT_EQ(gpt2::kernels::table<double>().isa, Isa::generic);  // double: generic everywhere
    gpt2::set_isa(std::string(gpt2::isa_name(isa)));  // by name
    EXPECT_EQ(gpt2::active_isa(), isa);
  }
  gpt2::reset_isa();
  EXPECT_NE(gpt2::kernel_info().chosen_by, "set_isa");
}

TEST(KernelDispatch, UnknownOrUnavailableLevelsAreErrorsThatNameTheAvailableOnes) {
  const LevelGuard guard;
  const Isa before = gpt2::active_isa();
  const std::string unknown =
      gpt2::test::error_of<gpt2::ConfigError>([] { gpt2::set_isa(std::string("avx9")); });
  EXPECT_TRUE(gpt2::test::Contains(unknown, "set_isa: unknown kernel level 'avx9'"));
  EXPECT_TRUE(gpt2::test::Contains(unknown, "expected one of generic, avx2, avx512"));
  EXPECT_TRUE(gpt2::test::Contains(unknown, "available here: generic"));
  EXPECT_EQ(gpt2::active_isa(), before) << "a refused level must change nothing";
  EXPECT_TRUE(gpt2::test::Contains(
      gpt2::test::error_of<gpt2::ConfigError>([] { gpt2::set_isa(std::string("")); }),
      "unknown kernel level ''"));
  EXPECT_TRUE(gpt2::test::Contains(
      gpt2::test::error_of<gpt2::ConfigError>([] { gpt2::set_isa(std::string("AVX512")); }),
      "unknown kernel level 'AVX512'"));  // names are exact
  EXPECT_TRUE(gpt2::test::Contains(
      gpt2::test::error_of<gpt2::ConfigError>([] { gpt2::set_isa(static_cast<Isa>(7)); }),
      "set_isa: unknown kernel level 7"));
  EXPECT_EQ(gpt2::active_isa(), before);
  bool refused_one = false;
  for (Isa isa : gpt2::kAllIsas) {
    if (gpt2::isa_supported(isa)) continue;
    refused_one = true;
    const std::string message = gpt2::test::error_of<gpt2::ConfigError>([isa] { gpt2::set_isa(isa); });
    EXPECT_TRUE(gpt2::test::Contains(message, std::string("set_isa: the CPU has no ") + gpt2::isa_name(isa)));
    EXPECT_TRUE(gpt2::test::Contains(message, "levels available here: generic"));
    EXPECT_EQ(gpt2::active_isa(), before);
  }
  if (!refused_one) std::printf("(this machine has every level: no unavailable one to refuse)\n");
}

TEST(PackedMatrix, HoldsTheDocumentedPanelLayoutWithZerosPastN) {
  for (const Index K : {1, 3, 64})
    for (const Index N : {1, 31, 32, 33, 100}) {
      SCOPED_TRACE("K=" + std::to_string(K) + " N=" + std::to_string(N));
      const RowMatrix<float> store = RowMatrix<float>::Random(K + 2, N + 5);
      const gpt2::PackedMatrix p(store.block(1, 2, K, N));  // strided rows
      ASSERT_EQ(p.rows(), K);
      ASSERT_EQ(p.cols(), N);
      const Index panels = (N + 31) / 32;
      ASSERT_EQ(p.bytes(), panels * K * 32 * Index(sizeof(float)));
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.data()) % 64, 0u);
      for (Index k = 0; k < K; ++k)
        for (Index j = 0; j < panels * 32; ++j) {
          const float got = p.data()[(j / 32) * K * 32 + k * 32 + j % 32];
          ASSERT_EQ(got, j < N ? store(1 + k, 2 + j) : 0.0f) << "k=" << k << " j=" << j;
        }
      if (N > 32) {
        EXPECT_EQ(p.panels_from(32), p.data() + K * 32);
      }
      EXPECT_TRUE(gpt2::test::Contains(
          gpt2::test::error_of<gpt2::ShapeError>([&] { p.panels_from(5); }),
          "a multiple of 32, got 5"));
    }
  const gpt2::PackedMatrix empty(RowMatrix<float>(0, 8));
  EXPECT_EQ(empty.bytes(), 0);
}

TEST(PackWeights, CopiesTheTwoWeightMatricesOnceAndKeepsTheViews) {
  const gpt2::test::Model<float> model = gpt2::test::random_model<float>(96, 3, 5);
  const gpt2::AttentionWeights<float> w = model.weights();
  EXPECT_FALSE(w.is_packed());
  EXPECT_EQ(w.packed_c_attn_weight(), nullptr);
  const gpt2::AttentionWeights<float> p = gpt2::pack_weights(w);
  ASSERT_TRUE(p.is_packed());
  EXPECT_EQ(p.packed_bytes(), (96 * 288 + 96 * 96) * Index(sizeof(float)));
  EXPECT_EQ(p.c_attn_weight().data(), w.c_attn_weight().data()) << "the views stay the caller's";
  EXPECT_EQ(p.packed_c_attn_weight()->cols(), 288);
  const gpt2::AttentionWeights<float> copy = p;  // copies share the packed data
  EXPECT_EQ(copy.packed_c_attn_weight(), p.packed_c_attn_weight());
}

// gemm_accumulate_columns checks its column range and its packed copy at every level (the
// generic level, which reads the view, included).
TEST(PackWeights, ColumnProductsCheckTheirArgumentsAtEveryLevel) {
  const LevelGuard guard;
  const RowMatrix<float> a = RowMatrix<float>::Random(4, 8), b = RowMatrix<float>::Random(8, 64);
  const gpt2::PackedMatrix packed(b), other(RowMatrix<float>::Random(8, 32));
  gpt2::GemmScratch<float> scratch;
  for (Isa isa : gpt2::available_isas()) {
    gpt2::set_isa(isa);
    SCOPED_TRACE(gpt2::isa_name(isa));
    RowMatrix<float> c = RowMatrix<float>::Zero(4, 32);
    EXPECT_TRUE(gpt2::test::Contains(gpt2::test::error_of<gpt2::ShapeError>([&] {
                  gpt2::gemm_accumulate_columns<float>(a, b, &packed, 48, 32, c, scratch);
                }),
                "gemm: columns [48, 80) outside B's 64"));
    EXPECT_TRUE(gpt2::test::Contains(gpt2::test::error_of<gpt2::ShapeError>([&] {
                  gpt2::gemm_accumulate_columns<float>(a, b, nullptr, 48, 32, c, scratch);
                }),
                "gemm: columns [48, 80) outside B's 64"));
    EXPECT_TRUE(gpt2::test::Contains(gpt2::test::error_of<gpt2::ShapeError>([&] {
                  gpt2::gemm_accumulate_columns<float>(a, b, &other, 0, 32, c, scratch);
                }),
                "packed weight: expected shape [8, 64], got [8, 32]"));
    RowMatrix<float> c16 = RowMatrix<float>::Zero(4, 16);
    EXPECT_TRUE(gpt2::test::Contains(gpt2::test::error_of<gpt2::ShapeError>([&] {
                  gpt2::gemm_accumulate_columns<float>(a, b, &packed, 16, 16, c16, scratch);
                }),
                "a multiple of 32, got 16"));
    gpt2::gemm_accumulate_columns<float>(a, b, &packed, 32, 32, c, scratch);
    EXPECT_TRUE(gpt2::test::near(c, (a * b.rightCols(32)).eval(), 1e-6, 1e-6));
  }
}

// Every forward on packed weights gives bitwise what the views give, at every level: the packed
// GEMM runs the same chains of multiply-adds (and the generic level reads the views).
TEST(PackWeights, ForwardsOnPackedWeightsAreBitwiseThoseOnTheViewsAtEveryLevel) {
  const LevelGuard guard;
  const Index C = 192, n_head = 3, T = 70;  // qkv: 576 columns, 18 panels; T spans two row tiles
  const gpt2::test::Model<float> model = gpt2::test::random_model<float>(C, n_head, 6);
  const gpt2::AttentionWeights<float> views = model.weights();
  const gpt2::AttentionWeights<float> packed = gpt2::pack_weights(views);
  const RowMatrix<float> x = gpt2::test::random_input<float>(T, C, 7);
  for (Isa isa : gpt2::available_isas()) {
    gpt2::set_isa(isa);
    SCOPED_TRACE(gpt2::isa_name(isa));
    gpt2::Workspace<float> ws(views.config(), T);
    RowMatrix<float> a(T, C), b(T, C);
    gpt2::attention_forward<float>(views, x, ws, a);
    gpt2::attention_forward<float>(packed, x, ws, b);
    EXPECT_TRUE(a == b) << "prefill";
    // decode through a cache: one-row products (row_times_packed)
    gpt2::KVCache<float> ca(views.config(), T), cb(views.config(), T);
    gpt2::Workspace<float> ws1(views.config(), 8, T);
    RowMatrix<float> da(T, C), db(T, C);
    gpt2::attention_forward<float>(views, x.topRows(8), ca, ws1, da.topRows(8));
    gpt2::attention_forward<float>(packed, x.topRows(8), cb, ws1, db.topRows(8));
    for (Index t = 8; t < T; ++t) {
      gpt2::attention_forward<float>(views, x.row(t), ca, ws1, da.row(t));
      gpt2::attention_forward<float>(packed, x.row(t), cb, ws1, db.row(t));
    }
    EXPECT_TRUE(da == db) << "decode";
    // the step functions on their own
    RowMatrix<float> qa(T, 3 * C), qb(T, 3 * C);
    gpt2::qkv_projection<float>(views, x, qa);
    gpt2::qkv_projection<float>(packed, x, qb);
    EXPECT_TRUE(qa == qb) << "qkv_projection";
    RowMatrix<float> oa(T, C), ob(T, C);
    gpt2::output_projection<float>(views, x, oa);
    gpt2::output_projection<float>(packed, x, ob);
    EXPECT_TRUE(oa == ob) << "output_projection";
  }
}

// Across levels the results agree within the float32 bar (the vector levels' own sums against
// Eigen's); the avx2 and avx512 levels run the same documented orders, so they agree bitwise.
TEST(KernelLevels, ForwardsAgreeAcrossLevels) {
  const LevelGuard guard;
  const Index C = 256, n_head = 4, T = 100;
  const gpt2::test::Model<float> model = gpt2::test::random_model<float>(C, n_head, 8);
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(model.weights());
  const RowMatrix<float> x = gpt2::test::random_input<float>(T, C, 9);
  gpt2::set_isa(Isa::generic);
  const RowMatrix<float> generic = gpt2::attention(w, x);
  std::vector<RowMatrix<float>> outs;
  for (Isa isa : vector_levels()) {
    gpt2::set_isa(isa);
    outs.push_back(gpt2::attention(w, x));
    EXPECT_TRUE(gpt2::test::near(outs.back(), generic, gpt2::test::Tolerance<float>::rel,
                                 gpt2::test::Tolerance<float>::abs))
        << gpt2::isa_name(isa) << " against generic";
  }
  if (outs.size() < 2) {
    std::printf("(fewer than two vector levels here: the bitwise avx2 == avx512 check is skipped)\n");
    return;
  }
  EXPECT_TRUE(outs[0] == outs[1]) << "avx2 and avx512 run the same orders";
}

}  // namespace

// kernel_info().unavailable names exactly the levels this machine cannot run (with the reason for
// amx when the OS refused the tile data), and the bf16 levels exist only where the CPU has them.
TEST(KernelDispatchBf16, UnavailableLevelsAreNamedWithTheirReason) {
  const gpt2::KernelInfo info = gpt2::kernel_info();
  const gpt2::kernels::CpuFeatures& f = gpt2::kernels::cpu_features();
  for (const Isa isa : gpt2::kAllIsas) {
    const bool listed = info.unavailable.find(gpt2::isa_missing(isa).empty() ? std::string("\x01")
                                                                              : gpt2::isa_missing(isa)) !=
                        std::string::npos;
    EXPECT_EQ(listed, !gpt2::isa_supported(isa)) << gpt2::isa_name(isa) << ": " << info.unavailable;
  }
  if (!f.avx512_bf16) {
    EXPECT_FALSE(gpt2::isa_supported(Isa::avx512_bf16));
  }
  if (!f.amx_bf16 || !f.amx_tile) {
    EXPECT_FALSE(gpt2::isa_supported(Isa::amx));
  }
  if (gpt2::isa_supported(Isa::amx)) {
    EXPECT_TRUE(gpt2::kernels::amx_permission().granted);
    EXPECT_TRUE(gpt2::kernels::amx_permission().reason.empty());
    EXPECT_TRUE(gpt2::isa_supported(Isa::avx512_bf16)) << "amx implies avx512_bf16";
  } else if (f.amx_bf16 && f.amx_tile) {
    EXPECT_NE(gpt2::isa_missing(Isa::amx).find("arch_prctl"), std::string::npos)
        << "an AMX CPU whose tile data the kernel refused must say so: " << gpt2::isa_missing(Isa::amx);
  }
}
