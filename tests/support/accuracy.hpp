// The accuracy bar against the PyTorch fixtures, shared by test_reference.cpp and
// test_reference_incremental.cpp:
//   float:  max|ours - ref| / max|ref| <= 8 x PyTorch float32's own error on the same case and
//           quantity (metadata torch32_err_<quantity>)
//   double: max|ours - ref| / max|ref| <= 1e-12
// Every check is recorded; at exit the program prints, per case, the output's float32 error (ours
// and PyTorch's), the worst float32 ratio over all quantities and the worst float64 error: the
// tables docs/accuracy.md shows (lines starting with '|').
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/compare.hpp"
#include "support/fixture.hpp"

namespace gpt2::test {

struct AccuracyRow {
  std::string case_name, dtype, quantity;
  double ours, torch32;
};

inline std::vector<AccuracyRow>& accuracy_rows() {
  static std::vector<AccuracyRow> rows;
  return rows;
}

class AccuracyTable : public ::testing::Environment {
 public:
  void TearDown() override {
    struct Summary {
      double f32_out = -1, torch_out = -1, worst_ratio = 0, f64_worst = -1;
    };
    std::vector<std::string> order;
    std::map<std::string, Summary> cases;
    for (const AccuracyRow& r : accuracy_rows()) {
      if (!cases.count(r.case_name)) order.push_back(r.case_name);
      Summary& s = cases[r.case_name];
      if (r.dtype == "float32") {
        if (r.quantity == "out") s.f32_out = r.ours, s.torch_out = r.torch32;
        if (r.torch32 > 0) s.worst_ratio = std::max(s.worst_ratio, r.ours / r.torch32);
      } else {
        s.f64_worst = std::max(s.f64_worst, r.ours);
      }
    }
    if (order.empty()) return;
    std::printf("\n| case | fp32 out error | PyTorch fp32 out error | worst fp32 ratio (all quantities) | worst fp64 error |\n");
    std::printf("|---|---|---|---|---|\n");
    for (const std::string& name : order) {
      const Summary& s = cases[name];
      std::printf("| %s | %.2e | %.2e | %.2f | %.1e |\n", name.c_str(), s.f32_out, s.torch_out,
                  s.worst_ratio, s.f64_worst);
    }
  }
};
inline const ::testing::Environment* const kAccuracyTable =
    ::testing::AddGlobalTestEnvironment(new AccuracyTable);

// Checks one quantity against the reference with the bar above and records it in the table.
template <class T, class A>
void expect_accurate(const Fixture& f, const std::string& quantity, const Eigen::MatrixBase<A>& ours,
                     const RowMatrix<double>& ref) {
  const double torch32 = f.number("torch32_err_" + quantity);
  const double bound = sizeof(T) == 4 ? 8 * torch32 : 1e-12;
  const MaxDiff d = max_diff(ours, ref);
  EXPECT_LE(d.relative(), bound) << f.name() << " " << quantity << ": max |diff| " << d.value
                                 << " at (" << d.row << ", " << d.col << "), max |ref| "
                                 << d.expected_max_abs << ", PyTorch fp32 error " << torch32;
  accuracy_rows().push_back(
      {f.name(), sizeof(T) == 4 ? "float32" : "float64", quantity, d.relative(), torch32});
}

// A case's inputs in T, or null for a real-weights case when GPT2_SMALL_WEIGHTS is not set.
template <class T>
std::unique_ptr<CaseInputs<T>> inputs_for(const Fixture& f) {
  if (!f.is_real()) return CaseInputs<T>::synthetic(f);
  const std::string path = real_weights_path();
  if (path.empty()) return nullptr;
  return CaseInputs<T>::real(f, path);
}

}  // namespace gpt2::test
