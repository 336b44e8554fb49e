// The embedded demo model: one attention sublayer of GPT-2 small's shape (C = 768, 12 heads of
// 64) built in code, whose heads do recognisable jobs on a position code.
//
// Input: x_t [768] for positions t = 0 .. T-1. Head h owns the 64 channels 64h .. 64h+63, that is
// 32 (cos, sin) pairs with its own frequencies w_{h,j}, j = 0 .. 31:
//   x_t[64h + 2j] = sqrt(2) cos(w_{h,j} t),   x_t[64h + 2j + 1] = sqrt(2) sin(w_{h,j} t)
// (mean square 1 per row, like a LayerNorm output). The frequencies spread over (0, pi) with a
// golden-ratio jitter, so that no two heads share one and no lag is an exact period:
//   w_{h,j} = pi (j + 0.5 + 0.5 (frac((12 j + h + 1) phi) - 0.5)) / 32,   phi = (sqrt(5) - 1) / 2
// Then x_a . x_b over one head's channels = 2 S(a - b) with S(d) = sum_j cos(w_{h,j} d): S(0) = 32,
// and |S(d)| <= 11 for 0 < |d| < 64, so the dot product peaks sharply at a = b.
//
// Head h, with gain g = 2 sqrt(sigma) and the channels of its own block only:
//   k_s = g x_s                       (c_attn's k block: g * identity)
//   q_t = g x_{target(t)}, so the score q_t . k_s / sqrt(64) = sigma S(target(t) - s) peaks at
//   s = target(t):
//     previous-token  target t-1:  q_t = g R x_t, R rotating each (cos, sin) pair by -w_{h,j}
//     self            target t:    q_t = g x_t
//     first-token     target 0:    q_t = g x_0, a constant: W_q = 0, the bias sqrt(2) g on the
//                                  cos channels
//     even                         q_t = 0: every visible key scores 0, the softmax is uniform
// Heads 0..3, 4..7 and 8..11 do these four jobs in this order, with sigma = 1, 0.5 and 0.25: the
// third group is visibly softer. (At T = 64 the softmax margin is sigma * (32 - 11) >= 5 per
// competing key.)
//   v_s = x_s (identity on the head's block) and c_proj = identity, biases 0 (except the
//   first-token queries): output channel block h is the average of the head's own input channels
//   over the keys it attends to, e.g. out_t = x_{t-1} on a previous-token head's block.
#pragma once

#include <array>
#include <cmath>
#include <string>

#include "gpt2/attention.hpp"
#include "head_analysis.hpp"

namespace gpt2::cli {

inline constexpr Index kDemoEmbd = 768;
inline constexpr Index kDemoHeads = 12;
inline constexpr Index kDemoHeadDim = 64;
inline constexpr Index kDemoPairs = kDemoHeadDim / 2;  // (cos, sin) pairs per head

// The job head h of the embedded model was built for.
inline Job demo_designed_job(Index h) {
  static constexpr std::array<Job, 4> jobs = {Job::previous_token, Job::first_token, Job::self,
                                              Job::even};
  return jobs[static_cast<std::size_t>(h % 4)];
}

// sigma of head h: the peak score is 32 sigma above the mean.
inline double demo_score_scale(Index h) {
  static constexpr std::array<double, 3> sigma = {1.0, 0.5, 0.25};
  return sigma[static_cast<std::size_t>(h / 4)];
}

// w_{h,j} in (0, pi), see the top of this header.
inline double demo_frequency(Index h, Index j) {
  const double pi = std::acos(-1.0);
  const double phi = (std::sqrt(5.0) - 1.0) / 2.0;
  const double n = static_cast<double>(kDemoHeads * j + h + 1);
  const double jitter = 0.5 * ((n * phi - std::floor(n * phi)) - 0.5);
  return pi * (static_cast<double>(j) + 0.5 + jitter) / static_cast<double>(kDemoPairs);
}

// The position code x [T, 768] (see the top of this header).
inline RowMatrix<float> demo_input(Index T) {
  RowMatrix<float> x(T, kDemoEmbd);
  for (Index t = 0; t < T; ++t)
    for (Index h = 0; h < kDemoHeads; ++h)
      for (Index j = 0; j < kDemoPairs; ++j) {
        const double angle = demo_frequency(h, j) * static_cast<double>(t);
        x(t, h * kDemoHeadDim + 2 * j) = static_cast<float>(std::sqrt(2.0) * std::cos(angle));
        x(t, h * kDemoHeadDim + 2 * j + 1) = static_cast<float>(std::sqrt(2.0) * std::sin(angle));
      }
  return x;
}

// The four tensors of the embedded model, owned; weights() views them (keep this object alive).
struct DemoModel {
  RowMatrix<float> c_attn_weight = RowMatrix<float>::Zero(kDemoEmbd, 3 * kDemoEmbd);  // [C, 3C]
  RowVector<float> c_attn_bias = RowVector<float>::Zero(3 * kDemoEmbd);                // [3C]
  RowMatrix<float> c_proj_weight = RowMatrix<float>::Identity(kDemoEmbd, kDemoEmbd);   // [C, C]
  RowVector<float> c_proj_bias = RowVector<float>::Zero(kDemoEmbd);                    // [C]

  // Views with n_head heads (12 as designed; any divisor of 768 is accepted).
  AttentionWeights<float> weights(Index n_head = kDemoHeads) const {
    return AttentionWeights<float>(make_config(kDemoEmbd, n_head), view(c_attn_weight),
                                   view(c_attn_bias), view(c_proj_weight), view(c_proj_bias));
  }
};

// Head h's query columns: q_t = g x_{target(t)} over its block (c_attn columns 64h .. 64h+63).
inline void set_demo_queries(DemoModel& m, Index h, double g) {
  const Index base = h * kDemoHeadDim;
  for (Index j = 0; j < kDemoPairs; ++j) {
    const Index c = base + 2 * j, s = c + 1;  // the cos and sin channels of pair j
    switch (demo_designed_job(h)) {
      case Job::previous_token: {  // (q_c, q_s) = g R(-w) (x_c, x_s): x_t's phase moved back by w
        const double w = demo_frequency(h, j);
        m.c_attn_weight(c, c) = static_cast<float>(g * std::cos(w));
        m.c_attn_weight(s, c) = static_cast<float>(g * std::sin(w));
        m.c_attn_weight(c, s) = static_cast<float>(-g * std::sin(w));
        m.c_attn_weight(s, s) = static_cast<float>(g * std::cos(w));
        break;
      }
      case Job::self:
        m.c_attn_weight(c, c) = static_cast<float>(g);
        m.c_attn_weight(s, s) = static_cast<float>(g);
        break;
      case Job::first_token:  // q = g x_0 = g sqrt(2) (1, 0, 1, 0, ...), from the bias alone
        m.c_attn_bias(c) = static_cast<float>(g * std::sqrt(2.0));
        break;
      default:  // even: q = 0
        break;
    }
  }
}

// The embedded model (see the top of this header).
inline DemoModel make_demo_model() {
  DemoModel m;
  for (Index h = 0; h < kDemoHeads; ++h) {
    const double g = 2.0 * std::sqrt(demo_score_scale(h));
    set_demo_queries(m, h, g);
    for (Index i = h * kDemoHeadDim; i < (h + 1) * kDemoHeadDim; ++i) {
      m.c_attn_weight(i, kDemoEmbd + i) = static_cast<float>(g);  // k_s = g x_s
      m.c_attn_weight(i, 2 * kDemoEmbd + i) = 1.0f;               // v_s = x_s
    }
  }
  return m;
}

}  // namespace gpt2::cli
