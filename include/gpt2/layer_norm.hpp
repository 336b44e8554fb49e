// LayerNorm, as GPT-2 applies it before attention (ln_1). Not part of the attention sublayer, but
// what builds its input: x = ln_1(h) (and, for a position-only input to layer 0, h = wpe[:T]).
#pragma once

#include <cmath>

#include "gpt2/error.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// out[t, :] = (in[t, :] - mean) / sqrt(var + eps) * weight + bias, with the biased variance.
//   in [T, C] (read; a row-major matrix or view), weight [C], bias [C],
//   out [T, C] (written; may be the same storage as in: each row is read before it is written)
// PyTorch: F.layer_norm(in, (C,), weight, bias, eps)
// Mean and variance are accumulated in double (two passes) for any T.
template <class T, class D>
void layer_norm(const Eigen::MatrixBase<D>& in_, const ConstVectorMap<T>& weight,
                const ConstVectorMap<T>& bias, T eps, MatrixRef<T> out) {
  const ConstMatrixRef<T> in = detail::as_view<T>(in_);
  const Index T_ = in.rows(), C = in.cols();
  detail::check_shape("ln.weight", {C}, {weight.size()});
  detail::check_shape("ln.bias", {C}, {bias.size()});
  detail::check_shape("out", {T_, C}, {out.rows(), out.cols()});
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
      out(t, c) = static_cast<T>((static_cast<double>(in(t, c)) - mean) * inv_std *
                                     static_cast<double>(weight(c)) +
                                 static_cast<double>(bias(c)));
  }
}

}  // namespace gpt2
