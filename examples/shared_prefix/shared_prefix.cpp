// gpt2_shared_prefix: one system prompt, many requests forked from it in a paged KV cache
// (paged_kv_cache.hpp, batch.hpp). The prompt goes through the sublayer once; each
// request forks it (sharing its blocks: nothing copied), adds its own question, then decodes a few
// tokens, the requests batched step by step. It prints the memory the pool holds against what one
// KVCache per request would hold, and checks every request's outputs bitwise against the same
// request run alone through a contiguous KVCache. Exit status 1 if they differ.
//
// The rows fed in stand for the embeddings of the tokens (this is one attention sublayer, not a
// model: the "decoded" tokens are given, not sampled).
#include <gpt2/attention.hpp>
#include <gpt2/paged_kv_cache.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

using gpt2::Index;
using Mat = gpt2::RowMatrix<float>;

int main() {
  const Index C = 768, n_head = 12;  // GPT-2 small's shape, random weights
  const gpt2::AttentionConfig config{C, n_head};
  const Mat c_attn_w = Mat::Random(C, 3 * C) * 0.05f, c_proj_w = Mat::Random(C, C) * 0.05f;
  const gpt2::RowVector<float> c_attn_b = gpt2::RowVector<float>::Random(3 * C) * 0.1f;
  const gpt2::RowVector<float> c_proj_b = gpt2::RowVector<float>::Random(C) * 0.1f;
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(gpt2::AttentionWeights<float>(
      config, gpt2::view(c_attn_w), gpt2::view(c_attn_b), gpt2::view(c_proj_w), gpt2::view(c_proj_b)));

  const Index prompt_len = 300, R = 16, steps = 8;  // a system prompt, 16 requests, 8 tokens each
  const Mat prompt = Mat::Random(prompt_len, C);
  std::vector<Mat> questions, answers;  // request r: its question [q_r, C], its tokens [steps, C]
  for (Index r = 0; r < R; ++r) {
    questions.push_back(Mat::Random(3 + r % 5, C));
    answers.push_back(Mat::Random(steps, C));
  }

  // The pool: blocks of 16 positions; the prompt's, and for each request its copy of the
  // prompt's partly filled last block and the blocks of its own tokens.
  const Index br = gpt2::kKVBlockRows, own = 7 + steps;  // own positions per request, at most
  gpt2::KVBlockPool<float> pool(config, (prompt_len + br - 1) / br + R * ((own + br - 1) / br + 1));
  gpt2::PagedSequence<float> system(pool);
  gpt2::Workspace<float> ws(config, prompt_len, prompt_len + own);
  Mat prompt_out(prompt_len, C);
  gpt2::attention_forward<float>(w, prompt, system, ws, prompt_out);

  // Each request: fork, its question, then batched decode steps of every request.
  std::vector<gpt2::PagedSequence<float>> requests;
  std::vector<gpt2::PagedSequence<float>*> ptrs;
  std::vector<Mat> outputs;  // request r: [q_r + steps, C]
  for (Index r = 0; r < R; ++r) {
    requests.push_back(system.fork());
    const Mat& q = questions[static_cast<std::size_t>(r)];
    outputs.emplace_back(q.rows() + steps, C);
    gpt2::attention_forward<float>(w, q, requests.back(), ws,
                                   outputs.back().topRows(q.rows()));
  }
  for (gpt2::PagedSequence<float>& s : requests) ptrs.push_back(&s);
  const gpt2::BatchLayout step = gpt2::BatchLayout::full(R, 1);
  Mat x_step(R, C), out_step(R, C);
  for (Index t = 0; t < steps; ++t) {
    for (Index r = 0; r < R; ++r) x_step.row(r) = answers[static_cast<std::size_t>(r)].row(t);
    gpt2::attention_forward<float>(w, x_step, step, ptrs, ws, out_step);
    for (Index r = 0; r < R; ++r)
      outputs[static_cast<std::size_t>(r)].row(questions[static_cast<std::size_t>(r)].rows() + t) =
          out_step.row(r);
  }
  const Index paged = pool.used_bytes();
  Index separate = 0;
  for (const gpt2::PagedSequence<float>& s : requests)
    separate += gpt2::KVCache<float>(config, s.length()).bytes();

  // Check: each request alone through its own contiguous cache (the prompt recomputed).
  bool ok = true;
  for (Index r = 0; r < R && ok; ++r) {
    const Mat& q = questions[static_cast<std::size_t>(r)];
    gpt2::KVCache<float> cache(config, prompt_len + q.rows() + steps);
    Mat p_out(prompt_len, C), q_out(q.rows(), C), y(steps, C);
    gpt2::attention_forward<float>(w, prompt, cache, ws, p_out);
    gpt2::attention_forward<float>(w, q, cache, ws, q_out);
    for (Index t = 0; t < steps; ++t)
      gpt2::attention_forward<float>(w, answers[static_cast<std::size_t>(r)].row(t), cache, ws, y.row(t));
    const Mat& got = outputs[static_cast<std::size_t>(r)];
    ok = std::memcmp(got.topRows(q.rows()).eval().data(), q_out.data(), sizeof(float) * q_out.size()) == 0 &&
         std::memcmp(got.bottomRows(steps).eval().data(), y.data(), sizeof(float) * y.size()) == 0 &&
         std::memcmp(p_out.data(), prompt_out.data(), sizeof(float) * p_out.size()) == 0;
    if (!ok) std::printf("request %td differs from the contiguous run\n", r);
  }
  std::printf("system prompt of %td tokens, %td requests of 3-7 question tokens + %td decoded each\n"
              "paged KV cache: %.2f MB in %td blocks of %td positions; %td separate KVCaches: %.2f MB "
              "(%.1f%%)\nevery request bitwise as run alone through a KVCache: %s\n",
              prompt_len, R, steps, paged / 1e6, pool.used_blocks(), br, R, separate / 1e6,
              100.0 * static_cast<double>(paged) / static_cast<double>(separate), ok ? "yes" : "NO");
  return ok ? 0 : 1;
}
