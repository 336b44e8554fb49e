// bench/compile_time.py's baseline: a translation unit that includes Eigen alone and computes one
// matrix product (what any Eigen program pays before it uses a library of its own).
#include <Eigen/Dense>

#include <iostream>

int main() {
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const RowMatrix a = RowMatrix::Random(64, 64), b = RowMatrix::Random(64, 64);
  const RowMatrix c = a * b;
  std::cout << c.sum() << "\n";
  return c.allFinite() ? 0 : 1;
}
