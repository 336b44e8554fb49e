#!/usr/bin/python3
"""Peak memory PyTorch takes for one prefill of the GPT-2 small attention sublayer (fp32).

    /usr/bin/python3 bench/memory.py [--T 1024 8192] [--variants hf,baddbmm] [--json]

Each (T, variant) runs in a fresh process: weights and input are allocated first, then ru_maxrss is
read before and after one forward under torch.inference_mode(); the difference is the extra peak
resident memory of the forward (its output, T x 768 floats, included). The eager forward
materialises the [12, T, T] scores, 12 T^2 * 4 bytes (3.2 GB at T = 8192), and more than one copy of
them (scores, masked scores, softmax) may be live at once.
"""
import argparse
import json
import os
import resource
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def child(T, variant):
    sys.path.insert(0, HERE)
    import torch
    import torch_bench as tb

    torch.set_num_threads(1)
    w = tb.Weights()
    x = tb.inputs(T)
    fn = tb.Prefill(w, variant)
    fn.masks(T, x.dtype)  # the module's mask buffers exist before the forward, as in HF
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.inference_mode():
        out = fn(x)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"T": T, "variant": variant, "peak_delta_bytes": (after - before) * 1024,
                      "rss_before_bytes": before * 1024, "out_bytes": out.numel() * 4,
                      "scores_bytes": 12 * T * T * 4}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--variants", default="hf,baddbmm")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1])
        return
    results = []
    for T in args.T:
        for variant in args.variants.split(","):
            r = subprocess.run([sys.executable, __file__, "--child", str(T), variant],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"T={T} {variant}: failed ({r.returncode}): {r.stderr.strip()[-300:]}", file=sys.stderr)
                continue
            res = json.loads(r.stdout)
            results.append(res)
            print(f"prefill T={T:<5} {variant:8} peak +{res['peak_delta_bytes'] / 2**20:8.0f} MiB "
                  f"(one [12, T, T] score tensor: {res['scores_bytes'] / 2**20:.0f} MiB)", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
