// gpt2_plain_eigen: the sublayer on weights held in your own Eigen matrices, three ways: one call,
// a Workspace reused across calls, and step by step (qkv -> heads -> merge -> projection). Each is
// checked against the formula written out in plain Eigen. Exit status 1 on a mismatch.
#include <gpt2/attention.hpp>

#include <cmath>
#include <cstdio>

using gpt2::Index;
using Mat = gpt2::RowMatrix<double>;  // row-major, as the checkpoint and the library store it
using Vec = gpt2::RowVector<double>;

int main() {
  const Index T = 12, C = 96, n_head = 3, hd = C / n_head;  // head_dim 32
  const gpt2::AttentionConfig config{C, n_head};

  // Your matrices, in the checkpoint's (Conv1D) layout: y = x @ W + b, no transpose.
  const Mat c_attn_w = Mat::Random(C, 3 * C) * 0.2;  // [C, 3C]: q | k | v blocks of C columns
  const Vec c_attn_b = Vec::Random(3 * C) * 0.1;     // [3C]
  const Mat c_proj_w = Mat::Random(C, C) * 0.2;      // [C, C]
  const Vec c_proj_b = Vec::Random(C) * 0.1;         // [C]
  const Mat x = Mat::Random(T, C);                   // [T, C]

  // Views, not copies: the matrices above must outlive `w`. Shapes are checked here.
  const gpt2::AttentionWeights<double> w(config, gpt2::view(c_attn_w), gpt2::view(c_attn_b),
                                         gpt2::view(c_proj_w), gpt2::view(c_proj_b));

  // 1. One call: allocates its result [T, C] and its scratch.
  const Mat y1 = gpt2::attention(w, x);

  // 2. A Workspace sized once (<= 64 tokens) and caller-owned outputs: no allocation per call.
  gpt2::Workspace<double> ws(config, /*max_tokens=*/64);
  Mat y2(T, C), probs(n_head * T, T);  // probs: [n_head, T, T] as [n_head * T, T]
  gpt2::attention_forward<double>(w, x, ws, y2, probs);

  // 3. Step by step. qkv [T, 3C]; head h's q, k, v are [T, hd] views at columns h*hd, C + h*hd,
  //    2C + h*hd; each head writes its [T, hd] output straight into its slot of merged [T, C].
  Mat qkv(T, 3 * C), merged(T, C), y3(T, C);
  gpt2::qkv_projection<double>(w, x, qkv);
  gpt2::AttentionScratch<double> scratch;
  for (Index h = 0; h < n_head; ++h)
    gpt2::causal_attention_head<double>(gpt2::q_view(qkv, config, h), gpt2::k_view(qkv, config, h),
                                        gpt2::v_view(qkv, config, h),
                                        gpt2::head_slot(merged, config, h), scratch);
  gpt2::output_projection<double>(w, merged, y3);

  // The formula in plain Eigen: a [T, T] score matrix per head, masked, softmaxed.
  const Mat qkv_ref = (x * c_attn_w).rowwise() + c_attn_b;
  Mat merged_ref(T, C);
  for (Index h = 0; h < n_head; ++h) {
    Mat att = qkv_ref.middleCols(h * hd, hd) * qkv_ref.middleCols(C + h * hd, hd).transpose() /
              std::sqrt(static_cast<double>(hd));
    for (Index i = 0; i < T; ++i) {
      const double m = att.row(i).head(i + 1).maxCoeff();
      att.row(i).head(i + 1) = (att.row(i).head(i + 1).array() - m).exp().matrix();
      att.row(i).head(i + 1) /= att.row(i).head(i + 1).sum();
      att.row(i).tail(T - i - 1).setZero();  // causal: keys after i get nothing
    }
    if ((att - probs.middleRows(h * T, T)).cwiseAbs().maxCoeff() > 1e-12) return 1;
    merged_ref.middleCols(h * hd, hd) = att * qkv_ref.middleCols(2 * C + h * hd, hd);
  }
  const Mat y_ref = (merged_ref * c_proj_w).rowwise() + c_proj_b;

  const double e1 = (y1 - y_ref).cwiseAbs().maxCoeff(), e2 = (y2 - y_ref).cwiseAbs().maxCoeff(),
               e3 = (y3 - y_ref).cwiseAbs().maxCoeff();
  std::printf("y [%td, %td]; max |y - formula|: one call %.1e, workspace %.1e, steps %.1e\n",
              y1.rows(), y1.cols(), e1, e2, e3);
  return e1 < 1e-12 && e2 < 1e-12 && e3 < 1e-12 ? 0 : 1;
}
