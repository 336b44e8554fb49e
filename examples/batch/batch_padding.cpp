// gpt2_batch_padding: prompts of different lengths padded into one [B, T, C] batch, a forward over
// all of them in one call, then a batched decode step through one KV cache per sequence. Each
// sequence gets exactly what it gets alone; padding (NaN here) reaches nothing. Exit status 1 if not.
#include <gpt2/attention.hpp>

#include <cstdio>
#include <limits>
#include <vector>

using gpt2::Index;
using Mat = gpt2::RowMatrix<float>;

int main() {
  const gpt2::AttentionConfig config{64, 4};  // C = 64, 4 heads of 16
  const Mat c_attn_w = Mat::Random(64, 192) * 0.2f, c_proj_w = Mat::Random(64, 64) * 0.2f;
  const gpt2::RowVector<float> c_attn_b = gpt2::RowVector<float>::Random(192) * 0.1f;
  const gpt2::RowVector<float> c_proj_b = gpt2::RowVector<float>::Random(64) * 0.1f;
  const gpt2::AttentionWeights<float> views(config, gpt2::view(c_attn_w), gpt2::view(c_attn_b),
                                            gpt2::view(c_proj_w), gpt2::view(c_proj_b));
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(views);  // packed once (kernels/pack.hpp)

  // Three prompts of 6, 2 and 4 tokens, left-padded to T = 6 (as generation pads them):
  // x [B * T, C] is the row-major [B, T, C]; sequence b's real rows are b*T + start .. b*T + T - 1.
  const Index B = 3, T = 6, C = 64;
  const gpt2::BatchLayout prompts = gpt2::BatchLayout::left_padded(T, {6, 2, 4});  // starts 0, 4, 2
  Mat x = Mat::Constant(B * T, C, std::numeric_limits<float>::quiet_NaN());     // padding: NaN
  for (Index b = 0; b < B; ++b)
    x.middleRows(prompts.first_row(b), prompts.length(b)).setRandom();

  // One call for the whole batch. out [B * T, C]: padded rows exactly 0.
  gpt2::Workspace<float> ws(config, /*max_tokens=*/T, /*max_keys=*/T + 1);
  Mat out(B * T, C);
  gpt2::attention_forward<float>(w, x, prompts, ws, out);

  bool ok = out.allFinite();
  for (Index b = 0; b < B; ++b) {
    const Index first = prompts.first_row(b), l = prompts.length(b);
    const Mat alone = gpt2::attention(w, x.middleRows(first, l));  // [l, C], this sequence only
    ok = ok && (out.middleRows(first, l) - alone).cwiseAbs().maxCoeff() <= 1e-5f;
    ok = ok && out.middleRows(b * T, prompts.start(b)).isZero(0);  // its padded rows
  }

  // Decoding: one KV cache per sequence ([n_head][capacity][head_dim] keys and values each), the
  // prompts prefilled in one batched call, then one new token per sequence: x_step [B, C].
  std::vector<gpt2::KVCache<float>> caches;
  for (Index b = 0; b < B; ++b) caches.emplace_back(config, /*max_tokens=*/T + 1);
  Mat prefill_out(B * T, C), x_step = Mat::Random(B, C), out_step(B, C);
  gpt2::attention_forward<float>(w, x, prompts, caches, ws, prefill_out);
  gpt2::attention_forward<float>(w, x_step, gpt2::BatchLayout::full(B, 1), caches, ws, out_step);

  for (Index b = 0; b < B; ++b) {  // the new token attends to its own prompt only
    const Index first = prompts.first_row(b), l = prompts.length(b);
    Mat seq(l + 1, C);
    seq << x.middleRows(first, l), x_step.row(b);
    const Mat alone = gpt2::attention(w, seq);  // [l + 1, C]
    ok = ok && (out_step.row(b) - alone.row(l)).cwiseAbs().maxCoeff() <= 1e-5f;
    ok = ok && caches[static_cast<std::size_t>(b)].n_past() == l + 1;
  }
  std::printf("batch [%td, %td, %td], lengths 6, 2, 4 (left-padded with NaN); then one decode step: "
              "cached %td, %td, %td positions; every sequence as computed alone: %s\n",
              B, T, C, caches[0].n_past(), caches[1].n_past(), caches[2].n_past(), ok ? "yes" : "NO");
  return ok ? 0 : 1;
}
