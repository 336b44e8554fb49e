#!/usr/bin/env python3
"""How much of a bf16 error is the weights' rounding alone, and how much is chance.

For each case of kind "whole" (generate.py's CASES) this prints, against the float64 reference:
- PyTorch's own bf16 error (every op in bf16, as the fixtures' torch_bf16_err_out);
- the exact answer on the weights rounded to nearest-even bf16 (float64 math, x and biases as in
  float32): what our widening levels (generic, avx2, avx512) compute, to float32 rounding;
- the same with x rounded to bf16 too, as avx512_bf16 and amx round it for their products;
- the spread over N draws of weights w + s (bf16(w) - w) with random signs s = +-1 per value: the
  same rounding errors, value by value, in random directions (float64 math, as the exact answer).
  With logits in the thousands (big_logits_T33) the error is whatever the softmax then picks, and
  this spread shows where a single figure falls by chance;
- the same draws with x rounded to bf16 too (PyTorch's run rounds x, and more: q, k, v, the logits
  and probabilities, which no draw here moves).
Errors are over the rows the fixture stores (its metadata `rows`), as the fixtures' own figures.

    /usr/bin/python3 tests/reference/bf16_weight_rounding.py [--draws 40] [--only big_logits_T33]

Needs torch and numpy (Debian's /usr/bin/python3). The real-weights cases need --weights or
$GPT2_SMALL_WEIGHTS (else they are skipped). About 2 s per draw of the T = 1024 cases on one core.
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate as g  # noqa: E402


def flipped_bf16_error(w32, rng):
    """float32 tensor -> float64 tensor w + s (bf16(w) - w), s = +-1 at random per value."""
    w = w32.double()
    e = w32.to(torch.bfloat16).double() - w
    s = torch.from_numpy(rng.integers(0, 2, size=tuple(w.shape)).astype(np.float64) * 2 - 1)
    return w + s * e


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=40, help="draws of random signs per case")
    parser.add_argument("--only", default=None, help="comma-separated case names")
    parser.add_argument("--weights", default=None, help="gpt2-small-h0-attention.safetensors")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)

    weights_path = args.weights or os.environ.get("GPT2_SMALL_WEIGHTS") or g.DEFAULT_WEIGHTS
    weights = g.read_safetensors(weights_path)[0] if os.path.isfile(weights_path) else None
    only = set(args.only.split(",")) if args.only else None
    rng = np.random.default_rng(args.seed)

    print(f"error on out against the float64 reference; {args.draws} draws of random signs per case")
    print("| case | PyTorch bf16 | exact on bf16 weights | same, x in bf16 too "
          "| errors of random sign: min / median / max | draws at or below PyTorch's | at or below the exact "
          "answer's | the same draws with x in bf16: median | at or below PyTorch's |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in g.CASES:
        if spec.get("kind") or (only and spec["case"] not in only):
            continue
        if spec.get("real") and weights is None:
            print(f"skip {spec['case']}: no weights file", file=sys.stderr)
            continue
        n_head = spec["n_head"]
        x64, w64, x32, w32 = g._case_inputs(spec, weights)
        xbf, wbf = g.bf16_inputs(x32, w32)
        xbw, wbw = g.bf16_weights_inputs(x64, w32)
        rows = torch.tensor(spec.get("rows", list(range(spec["T"]))), dtype=torch.long)

        def out(x, w):  # float64 numpy, the fixture's stored rows
            return g.as_f64(g.torch_attention(x, w, n_head)["out"][rows])

        with torch.no_grad():
            ref = out(x64, w64)
            torch_err = g.rel_err(out(xbf, wbf), ref)
            exact = g.rel_err(out(xbw, wbw), ref)
            x_bf16 = torch.from_numpy(g.as_f64(xbf))
            exact_x = g.rel_err(out(x_bf16, wbw), ref)
            draws, draws_x = [], []
            for _ in range(args.draws):
                w = dict(wbw)
                for name in ("c_attn.weight", "c_proj.weight"):
                    w[name] = flipped_bf16_error(w32[name], rng)
                draws.append(g.rel_err(out(xbw, w), ref))
                draws_x.append(g.rel_err(out(x_bf16, w), ref))
        d, dx = np.array(draws), np.array(draws_x)
        print(f"| {spec['case']} | {torch_err:.3e} | {exact:.3e} | {exact_x:.3e} "
              f"| {d.min():.3e} / {np.median(d):.3e} / {d.max():.3e} "
              f"| {int((d <= torch_err).sum())} of {len(d)} | {int((d <= exact).sum())} of {len(d)} "
              f"| {np.median(dx):.3e} | {int((dx <= torch_err).sum())} of {len(dx)} |", flush=True)


if __name__ == "__main__":
    main()
