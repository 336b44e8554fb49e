// The usage text of gpt2-attention (printed on stdout by help, --help, -h).
#pragma once

#include <string>

#include "demo_command.hpp"
#include "head_analysis.hpp"

namespace gpt2::cli {

inline std::string usage_text() {
  return strprintf(
      "usage: gpt2-attention run --weights FILE.safetensors [--layer L] --input X.npy --output Y.npy\n"
      "                          [--n-head N] [--dtype f32|f64] [--probs P.npy]\n"
      "       gpt2-attention demo [--weights FILE.safetensors] [--layer L] [--tokens T] [--n-head N]\n"
      "       gpt2-attention help | --help | -h\n"
      "\n"
      "GPT-2's multi-head causal self-attention sublayer, one layer:\n"
      "  q|k|v = x @ c_attn.weight + c_attn.bias;  y_h = softmax(q_h k_h^T / sqrt(head_dim), causal) v_h;\n"
      "  out = [y_0 | ... | y_{n_head-1}] @ c_proj.weight + c_proj.bias\n"
      "\n"
      "run: computes layer L's attention sublayer for X [T, C] and writes Y [T, C].\n"
      "  --weights FILE   safetensors checkpoint holding h.L.attn.c_attn.{weight,bias} and\n"
      "                   h.L.attn.c_proj.{weight,bias} (or transformer.h.L.attn.*), Hugging Face layout\n"
      "  --layer L        layer index (default 0)\n"
      "  --input X.npy    X [T, C], a 2-D float32 or float64 .npy; T = 0 gives an empty [0, C] output;\n"
      "                   T is not capped (the sublayer has no position limit; GPT-2's wpe has 1024)\n"
      "  --output Y.npy   Y [T, C]\n"
      "  --n-head N       number of heads (default C / 64, as in every GPT-2 size)\n"
      "  --dtype f32|f64  f32 (default): compute in float, write float32; f64: convert weights and\n"
      "                   input to double, compute in double, write float64\n"
      "  --probs P.npy    also write the attention probabilities [n_head, T, T], same dtype\n"
      "  Everything is computed before anything is written, and the outputs appear together or not\n"
      "  at all (written beside their targets, then renamed). --output may name the --input file;\n"
      "  no output may name --weights, nor --probs the input or --output. An output that is a\n"
      "  symbolic link stays one (the file it points to is replaced); an existing output keeps its\n"
      "  permissions; one that is not a regular file (a directory, FIFO, device) is refused.\n"
      "\n"
      "demo: what each head attends to, and the speed of the forward pass.\n"
      "  (no --weights)   an embedded model built in code, C = %td, %td heads of %td (GPT-2 small's\n"
      "                   shape) on a sinusoidal position code x_t; heads 0-3, 4-7, 8-11 were built to\n"
      "                   follow the previous token, the first token, the token itself, and to spread\n"
      "                   evenly (sharp, sharp, softer). v = x and c_proj = identity: each head copies\n"
      "                   its own 64 input channels from the keys it attends to.\n"
      "  --weights FILE   layer L of a checkpoint instead, on x = ln_1(wpe[:T]) (wpe.weight and\n"
      "                   h.L.ln_1.{weight,bias}, eps 1e-5; also under transformer.)\n"
      "  --layer L        layer index (default 0)\n"
      "  --tokens T       sequence length, %td..%td (default %td)\n"
      "  --n-head N       number of heads (default C / 64)\n"
      "  Per head, averaged over query rows t = %td..T-1: prev, first, self = attention on keys t-1,\n"
      "  0, t; mean dist = sum_s P[t,s] (t - s); evenness = entropy of row t / log(t + 1).\n"
      "  job: the first rule that holds: previous-token, first-token, self if that share >= %.2f;\n"
      "  even if evenness >= %.2f; local if mean dist <= %.1f; otherwise mixed.\n"
      "  Time: median of at least %d forward runs (and %.2f s) after %d warm-up runs, in float;\n"
      "  GFLOP/s with FLOP = 2*T*C*3C + 2*T*C*C + 2*2*n_head*head_dim*T*(T+1)/2.\n"
      "\n"
      "Flags may be written --flag VALUE or --flag=VALUE, each at most once.\n"
      "Errors: one line on stderr, starting with 'gpt2-attention: '. Exit status: 0 success;\n"
      "  2 the command line is wrong by itself (missing or unknown command, unknown, missing or\n"
      "    repeated flag, flag without value, bad or out-of-range number, unknown dtype, stray\n"
      "    argument, two flags naming the same file);\n"
      "  1 the data are wrong (missing or malformed file, missing tensors for the layer, bad shapes,\n"
      "    n_head not dividing n_embd, T beyond wpe, a file that cannot be written, stdout lost).\n",
      kDemoEmbd, kDemoHeads, kDemoHeadDim, kFirstAnalysedRow + 1, kDemoMaxTokens, kDemoDefaultTokens,
      kFirstAnalysedRow, kDominant, kEven, kLocalDistance, kMinTimedRuns, kMinTimedSeconds, kWarmupRuns);
}

}  // namespace gpt2::cli
