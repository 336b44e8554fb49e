#!/usr/bin/env python3
"""What rounding the attention core's products to bf16 would cost in accuracy, before writing it.

The avx512_bf16 level (AMD Zen 4 and Zen 5: VDPBF16PS at about twice the float32 FMA rate) ran
its projections in bf16 but its attention core in float32; since c865492 it runs the variant
all_bf16_offdiag below (kernels/avx512_bf16_attention.hpp). This emulates, for every case of kind
`whole` of generate.py, the level's rounding points with the attention core's two products changed,
and prints the error on `out` and on `merged` (the heads' outputs before c_proj) against the
float64 reference (max |ours - ref| / max |ref| over the rows the case keeps: the measure of
test_reference_bf16, which checks both) beside PyTorch's own bf16 error:

  f32             today's level: x and merged rounded to bf16 for the projections (float32
                  accumulation), the attention core in float32
  pv_bf16         as f32, with p and v rounded to bf16 for p v (as PyTorch's bf16 run does)
  pv_bf16_l       as pv_bf16, with the softmax's sum l taken over the rounded p
  pv_bf16_offdiag as pv_bf16 for the 64-key blocks before a row's own; its own block in float32
  qk_split        as pv_bf16, with k rounded to bf16 and q split into two bf16 parts (q_hi + q_lo)
                  for q k^T (two VDPBF16PS per pair: no faster than float32 there)
  all_bf16        as pv_bf16, with q and k each rounded to bf16 for q k^T
  all_bf16_offdiag  both products in bf16 (q, k, p and v rounded) for the 64-key blocks before a
                  row's own; its own block in float32 (so cases of T <= 64 are f32's)

What it showed (docs/bf16.md; the runs: bench/results/history-bf16.md): pv_bf16 and pv_bf16_l put
`merged` past PyTorch's error on small_T7 (5.33e-3 against 4.69e-3) and gpt2_layer0_T64 (3.48e-3
against 2.98e-3); pv_bf16_offdiag keeps every case within the bars. (A kernel of pv_bf16_offdiag was
built, bitwise against its emulation, and measured no faster on AMD Zen 5: commit b2c3196,
reverted.) all_bf16 puts large_T6's `merged` past the bar (7.03e-3 against 5.17e-3);
all_bf16_offdiag keeps every case within the bars, and is what the level runs now
(test_reference_bf16 measured gpt2_layer0_T1024 at 2.14e-3 on `out`, this emulation 2.19e-3).

The emulation is float64 arithmetic with the roundings where the kernels would do them (every
product's result rounded to float32), not the kernels' bits: read the columns against each other.
test_reference_bf16's bars are: at most PyTorch's error, and at most 5e-3 where PyTorch's is below.

  /usr/bin/python3 tests/reference/bf16_attention_options.py [--weights gpt2-small-h0-attention.safetensors]
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate as g  # noqa: E402  (the cases and their inputs)


def bf16(a):
    """a rounded to bfloat16 (nearest even), as float64."""
    return torch.from_numpy(np.asarray(a, dtype=np.float32)).to(torch.bfloat16).double().numpy()


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def emulate(x, w, n_head, variant):
    """out [T, C] of the avx512_bf16 level with the attention core's products as `variant` says."""
    T, C = x.shape
    hd = C // n_head
    qkv = f32(bf16(x) @ bf16(w["c_attn.weight"]) + w["c_attn.bias"])
    merged = np.zeros((T, C))
    causal = np.tril(np.ones((T, T), dtype=bool))
    for h in range(n_head):
        q = qkv[:, h * hd:(h + 1) * hd]
        k = qkv[:, C + h * hd:C + (h + 1) * hd]
        v = qkv[:, 2 * C + h * hd:2 * C + (h + 1) * hd]
        qs = f32(q / np.sqrt(hd))
        block = np.arange(T) // 64
        diag = block[:, None] == block[None, :]
        if variant == "qk_split":
            hi = bf16(qs)
            s = (hi + bf16(qs - hi)) @ bf16(k).T
        elif variant == "all_bf16":
            s = bf16(qs) @ bf16(k).T
        elif variant == "all_bf16_offdiag":
            s = np.where(diag, qs @ k.T, bf16(qs) @ bf16(k).T)
        else:
            s = qs @ k.T
        s = f32(s)
        s[~causal] = -np.inf
        p = f32(np.exp(s - s.max(axis=1, keepdims=True)))
        l = (bf16(p) if variant == "pv_bf16_l" else p).sum(axis=1, keepdims=True)
        if variant in ("pv_bf16_offdiag", "all_bf16_offdiag"):  # a row's own 64-key block in float32
            o = np.where(diag, p, 0) @ v + bf16(np.where(diag, 0, p)) @ bf16(v)
        else:
            o = p @ v if variant == "f32" else bf16(p) @ bf16(v)
        merged[:, h * hd:(h + 1) * hd] = f32(o / l)
    return f32(bf16(merged) @ bf16(w["c_proj.weight"]) + w["c_proj.bias"]), merged


VARIANTS = ["f32", "pv_bf16", "pv_bf16_l", "pv_bf16_offdiag", "qk_split", "all_bf16",
            "all_bf16_offdiag"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=os.environ.get("GPT2_SMALL_WEIGHTS"),
                    help="gpt2-small-h0-attention.safetensors (default: $GPT2_SMALL_WEIGHTS; without "
                         "it the real-weights cases are left out)")
    args = ap.parse_args()
    weights = g.read_safetensors(args.weights)[0] if args.weights else None

    print("| case | of | PyTorch bf16 | " + " | ".join(VARIANTS) + " |")
    print("|---|---|---|" + "---|" * len(VARIANTS))
    for spec in g.CASES:
        if spec.get("kind", "whole") != "whole" or (spec.get("real") and weights is None):
            continue
        if spec.get("real"):
            x64, w64, x32, w32 = g.real_inputs(spec, weights)
        else:
            x64, w64, x32, w32 = g.random_inputs(spec)
        with torch.no_grad():
            ref = g.torch_attention(x64, w64, spec["n_head"])
            xbf, wbf = g.bf16_inputs(x32, w32)
            torch_bf16 = g.torch_attention(xbf, wbf, spec["n_head"])
        w = {name: t.double().numpy() for name, t in w32.items()}
        rows = spec.get("rows", list(range(spec["T"])))  # the rows the fixtures keep and the test reads
        ours = [emulate(x32.double().numpy(), w, spec["n_head"], v) for v in VARIANTS]
        for i, name in enumerate(["out", "merged"]):
            want = ref[name].numpy()[rows]
            errs = [g.rel_err(g.as_f64(torch_bf16[name])[rows], want)]
            errs += [g.rel_err(o[i][rows], want) for o in ours]
            print(f"| {spec['case']} | {name} | " + " | ".join(f"{e:.2e}" for e in errs) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
