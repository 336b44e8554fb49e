#!/usr/bin/env python3
"""Runs several builds / kernel levels of the benchmark suite interleaved, round by round, and
prints the median (or --stat min) time of each benchmark per variant, with ratios against the
first variant.

  bench/compare_levels.py --rounds 3 --filter 'prefill/T:(64|1024)/|decode/past:1023/' \\
      plain=build/release/bench/gpt2_bench \\
      native=build/release/bench/gpt2_bench_native \\
      avx2=build/release/bench/gpt2_bench@avx2 \\
      old=/path/to/old/gpt2_bench

A variant is NAME=BINARY or NAME=BINARY@LEVEL (LEVEL sets GPT2_ATTENTION_ISA for that binary).
Times are Google Benchmark's real_time (wall clock). Absolute times move from run to run and
machine to machine: read the ratios, which come from one interleaved run. --json FILE keeps
every round's raw output.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(binary, level, flt, min_time):
    env = dict(os.environ)
    if level:
        env["GPT2_ATTENTION_ISA"] = level
    out = subprocess.run(
        [binary, f"--benchmark_filter={flt}", f"--benchmark_min_time={min_time}",
         "--benchmark_format=json"],
        env=env, check=True, capture_output=True, text=True).stdout
    data = json.loads(out)
    return {b["name"]: b for b in data["benchmarks"] if "error_occurred" not in b}, data["context"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", help="NAME=BINARY[@LEVEL]")
    ap.add_argument("--filter", required=True, help="--benchmark_filter regex")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", default="0.3")
    ap.add_argument("--json", help="write every round's results here")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="per benchmark and variant, over the rounds (min: on a VM whose "
                         "neighbours only ever slow a round down, the least disturbed one)")
    args = ap.parse_args()
    variants = []
    for v in args.variants:
        name, _, target = v.partition("=")
        binary, _, level = target.partition("@")
        variants.append((name, binary, level))
    times = {name: {} for name, _, _ in variants}
    counters = {name: {} for name, _, _ in variants}
    raw = []
    contexts = {}
    for r in range(args.rounds):
        for name, binary, level in variants:
            results, context = run(binary, level, args.filter, args.min_time)
            contexts[name] = {k: context.get(k) for k in ("kernels", "cpu_features", "host_name")}
            raw.append({"round": r, "variant": name, "results": results})
            for bench, b in results.items():
                scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
                times[name].setdefault(bench, []).append(b["real_time"] * scale)
                if "flops" in b:
                    counters[name].setdefault(bench, []).append(b["flops"])
    base = variants[0][0]
    names = [n for n, _, _ in variants]
    benches = sorted({b for n in names for b in times[n]}, key=lambda b: (b.split("/")[0], b))
    print("kernels: " + ", ".join(f"{n}={contexts[n]['kernels']}" for n in names))
    print("cpu: " + str(contexts[base]["cpu_features"]))
    print(f"{args.stat} over {args.rounds} rounds")
    header = "| benchmark | " + " | ".join(f"{n} (ms)" for n in names) + " | " + \
             " | ".join(f"speed {n} vs {base}" for n in names[1:]) + " |"
    print(header)
    print("|" + "---|" * (1 + 2 * len(names) - 1))
    for bench in benches:
        stat = statistics.median if args.stat == "median" else min
        med = {n: stat(times[n][bench]) if bench in times[n] else None for n in names}
        cells = [f"{med[n]:.4g}" if med[n] is not None else "n/a" for n in names]
        # speed of n relative to the first variant: t_base / t_n (above 1: n is faster)
        ratios = [f"{med[base] / med[n]:.2f}x" if med[n] and med[base] else "n/a" for n in names[1:]]
        print(f"| {bench} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"contexts": contexts, "rounds": raw}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
