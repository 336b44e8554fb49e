// LayerNorm, as GPT-2 applies it before attention (ln_1). Not part of the attention sublayer, but
// what builds its input: x = ln_1(h) (and, for a position-only input to layer 0, h = wpe[:T]).
#pragma once

#include <cmath>
#include <type_traits>

#include "gpt2/error.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

namespace detail {

// A weight or bias vector of layer_norm: n entries, read by index. Any Eigen vector or vector
// expression of scalar T (a RowVector, a ConstVectorMap, an Eigen::VectorX, a row or column of a
// matrix, `2 * w`); a matrix with more than one row and column is a ShapeError naming it.
template <class T, class D>
void check_ln_vector(const char* what, Index C, const Eigen::MatrixBase<D>& v) {
  static_assert(std::is_same<typename D::Scalar, T>::value,
                "gpt2::layer_norm: weight and bias must have the input's scalar type");
  if (v.rows() != 1 && v.cols() != 1)
    check_shape(what, {C}, {v.rows(), v.cols()});
  check_shape(what, {C}, {v.size()});
}

// layer_norm's T: the one given (layer_norm<float>(...)), else the input's scalar type.
template <class T, class D>
using ln_scalar_t = std::conditional_t<std::is_void<T>::value, typename D::Scalar, T>;

}  // namespace detail

// out[t, :] = (in[t, :] - mean) / sqrt(var + eps) * weight + bias, with the biased variance.
//   in [T, C] (read; a row-major matrix or view), weight [C], bias [C] (read; any Eigen vector or
//   vector expression of T: RowVector, VectorX, ConstVectorMap, a matrix row, `2 * w`),
//   out [T, C] (written; may be the same storage as in: each row is read before it is written)
// PyTorch: F.layer_norm(in, (C,), weight, bias, eps)
// T is the input's scalar type (or the one given: layer_norm<float>(...)); eps may be of any
// arithmetic type and is converted to T first, so with float data 1e-5 and 1e-5f give the same
// result. Mean and variance are accumulated in double (two passes) for any T.
template <class T = void, class D, class DW, class DB, class Eps>
void layer_norm(const Eigen::MatrixBase<D>& in_, const Eigen::MatrixBase<DW>& weight_,
                const Eigen::MatrixBase<DB>& bias_, Eps eps_,
                MatrixRef<detail::ln_scalar_t<T, D>> out) {
  static_assert(std::is_arithmetic<Eps>::value, "gpt2::layer_norm: eps must be a number");
  using S = detail::ln_scalar_t<T, D>;
  const S eps = static_cast<S>(eps_);
  const ConstMatrixRef<S> in = detail::as_view<S>(in_);
  const Index T_ = in.rows(), C = in.cols();
  detail::check_ln_vector<S>("ln.weight", C, weight_);
  detail::check_ln_vector<S>("ln.bias", C, bias_);
  detail::check_shape("out", {T_, C}, {out.rows(), out.cols()});
  // A vector in memory is read in place; a costly expression (a product) is evaluated once here,
  // into a temporary (the only case that allocates), a cheap one (`2 * w`) read coefficient-wise.
  const typename Eigen::internal::nested_eval<DW, 2>::type weight = weight_.derived();
  const typename Eigen::internal::nested_eval<DB, 2>::type bias = bias_.derived();
  if (C == 0) return;
  for (Index t = 0; t < T_; ++t) {
    double mean = 0;
    for (Index c = 0; c < C; ++c) mean += static_cast<double>(in(t, c));
    mean /= static_cast<double>(C);
    double var = 0;
    for (Index c = 0; c < C; ++c) {
      const double d = static_cast<double>(in(t, c)) - mean;
      var += d * d;
    }
    var /= static_cast<double>(C);
    const double inv_std = 1.0 / std::sqrt(var + static_cast<double>(eps));
    for (Index c = 0; c < C; ++c)
      out(t, c) = static_cast<S>((static_cast<double>(in(t, c)) - mean) * inv_std *
                                     static_cast<double>(weight(c)) +
                                 static_cast<double>(bias(c)));
  }
}

}  // namespace gpt2
