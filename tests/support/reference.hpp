// The simple, obviously correct reference implementation of the sublayer, in double precision,
// with plain loops (no Eigen products, no tiling). Slow: for small T and widths.
// Independent of the library's code paths; the PyTorch fixtures check both.
#pragma once

#include <cmath>
#include <vector>

#include "gpt2/types.hpp"

namespace gpt2::test {

struct NaiveAttention {
  RowMatrix<double> qkv;     // [T, 3C]
  RowMatrix<double> merged;  // [T, C]
  RowMatrix<double> out;     // [T, C]
  RowMatrix<double> probs;   // [n_head * T_q, n_keys]
};

// out = c_proj(merge(softmax(q k^T / sqrt(hd), causal) v)) with qkv = x W + b.
//   x [T, C], c_attn_w [C, 3C], c_attn_b [3C], c_proj_w [C, C], c_proj_b [C]
template <class M, class V>
NaiveAttention naive_attention(const M& x, const M& c_attn_w, const V& c_attn_b, const M& c_proj_w,
                               const V& c_proj_b, Index n_head) {
  const Index T = x.rows(), C = x.cols(), hd = C / n_head;
  NaiveAttention r;
  r.qkv.resize(T, 3 * C);
  for (Index t = 0; t < T; ++t)
    for (Index j = 0; j < 3 * C; ++j) {
      double s = static_cast<double>(c_attn_b(j));
      for (Index c = 0; c < C; ++c) s += static_cast<double>(x(t, c)) * static_cast<double>(c_attn_w(c, j));
      r.qkv(t, j) = s;
    }
  r.merged.setZero(T, C);
  r.probs.setZero(n_head * T, T);
  for (Index h = 0; h < n_head; ++h)
    for (Index t = 0; t < T; ++t) {
      std::vector<double> att(static_cast<std::size_t>(t + 1));
      double max = -INFINITY;
      for (Index s = 0; s <= t; ++s) {
        double dot = 0;
        for (Index d = 0; d < hd; ++d) dot += r.qkv(t, h * hd + d) * r.qkv(s, C + h * hd + d);
        att[static_cast<std::size_t>(s)] = dot / std::sqrt(static_cast<double>(hd));
        max = std::max(max, att[static_cast<std::size_t>(s)]);
      }
      double sum = 0;
      for (double& a : att) sum += (a = std::exp(a - max));
      for (Index s = 0; s <= t; ++s) {
        const double p = att[static_cast<std::size_t>(s)] / sum;
        r.probs(h * T + t, s) = p;
        for (Index d = 0; d < hd; ++d) r.merged(t, h * hd + d) += p * r.qkv(s, 2 * C + h * hd + d);
      }
    }
  r.out.resize(T, C);
  for (Index t = 0; t < T; ++t)
    for (Index j = 0; j < C; ++j) {
      double s = static_cast<double>(c_proj_b(j));
      for (Index c = 0; c < C; ++c) s += r.merged(t, c) * static_cast<double>(c_proj_w(c, j));
      r.out(t, j) = s;
    }
  return r;
}

// One head with a past: q [T, hd], k, v [n_past + T, hd]; row i sees keys 0 .. n_past + i.
//   returns y [T, hd]; probs (if given) [T, n_past + T]
template <class M>
RowMatrix<double> naive_head(const M& q, const M& k, const M& v, RowMatrix<double>* probs = nullptr) {
  const Index T = q.rows(), S = k.rows(), hd = q.cols(), n_past = S - T;
  RowMatrix<double> y = RowMatrix<double>::Zero(T, hd);
  if (probs) probs->setZero(T, S);
  for (Index i = 0; i < T; ++i) {
    const Index n = n_past + i + 1;
    std::vector<double> att(static_cast<std::size_t>(n));
    double max = -INFINITY;
    for (Index s = 0; s < n; ++s) {
      double dot = 0;
      for (Index d = 0; d < hd; ++d) dot += static_cast<double>(q(i, d)) * static_cast<double>(k(s, d));
      att[static_cast<std::size_t>(s)] = dot / std::sqrt(static_cast<double>(hd));
      max = std::max(max, att[static_cast<std::size_t>(s)]);
    }
    double sum = 0;
    for (double& a : att) sum += (a = std::exp(a - max));
    for (Index s = 0; s < n; ++s) {
      const double p = att[static_cast<std::size_t>(s)] / sum;
      if (probs) (*probs)(i, s) = p;
      for (Index d = 0; d < hd; ++d) y(i, d) += p * static_cast<double>(v(s, d));
    }
  }
  return y;
}

}  // namespace gpt2::test
