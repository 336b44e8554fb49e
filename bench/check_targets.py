#!/usr/bin/python3
"""Measures the speed targets of issues 13 (fused core), 14 (bf16) and 44 (int8) on this machine, in one
interleaved run, and prints each with its figure and a verdict: met, short, or n/a and why.

    /usr/bin/python3 bench/check_targets.py [--bench build/rel/bench/gpt2_bench] \\
        [--twopass ../twopass/build/rel/bench/gpt2_bench] [--rounds 5] [--json run.json]
    /usr/bin/python3 bench/check_targets.py --from-json run.json    # verdicts of a saved run

Each round runs our binary (the plain build: no -march, the level it dispatches to), then, when
given or available: the two-pass core's binary (--twopass: a build of d82e5d5, issue 13's decode
baseline), PyTorch in bfloat16 (bench/torch_bench.py --tuned --dtype bf16) and ONNX Runtime
(bench/ort/ort_bench.mjs). Figures are medians over the rounds, and every target is a ratio inside
the run (absolute times move from run to run and machine to machine). Which bf16 targets apply
follows the level the binary dispatches to (amx, or avx512_bf16 without AMX). A target whose
figures are missing is n/a with the reason (what to install or pass); it never counts as met.
--json keeps every round's raw output; --from-json re-reads one (tests/bench/test_check_targets.py
checks the verdicts on made-up runs that way).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402  (run_json, parse_gbench, parse_ours_like, machine, ...)

DEFAULT_BENCH = os.path.join(compare.ROOT, "build/rel/bench/gpt2_bench")
OURS_FILTER = ("^stage_(attention|qkv)/T:1024/threads:1$|^prefill(_bf16)?/T:(64|1024|2048)/threads:2$"
               "|^peak_fma/threads:2$|^decode_model(_bf16)?/past:1023/threads:2$"
               "|^decode/past:1023/threads:2$|^stage_qkv_bf16/T:1024/threads:2$"
               "|^baseline_onednn_bf16/N:2304/T:1024/threads:2$"
               "|^prefill_int8/T:1024/threads:2$|^decode_model_int8/past:1023/threads:2$"
               "|^stage_qkv_int8/T:1024/threads:2$")
TWOPASS_FILTER = "^decode/past:1023/threads:2$"
TORCH_FILTER = "^prefill_bf16/T:64/threads:2$"
ORT_FILTER = "^prefill/T:64/threads:2$"


def time_of(results, name):
    return (results.get(name) or {}).get("ns")


def flops_of(results, name):
    return (results.get(name) or {}).get("flops")


def ratio(num, den):
    return None if num is None or den is None or den == 0 else num / den


def targets(run):
    """[(issue, target, figure or None, threshold, why n/a or None)] from a run's medians."""
    ours, twopass = run["ours"] or {}, run["twopass"]
    torch, ort = run["torch"], run["ort"]
    level = run["level"] or ""
    amx = level == "amx"
    out = []

    def add(issue, what, figure, threshold, missing):
        out.append((issue, what, figure, threshold, None if figure is not None else missing))

    add(13, "stage_attention / stage_qkv FLOP/s, T=1024, 1 thread",
        ratio(flops_of(ours, "stage_attention/T:1024/threads:1"),
              flops_of(ours, "stage_qkv/T:1024/threads:1")), 0.85, "no stage_* figures")
    for T, share in ((1024, 0.70), (2048, 0.65)):
        add(13, f"prefill T={T}, 2 threads: share of the FMA peak (peak_fma)",
            ratio(flops_of(ours, f"prefill/T:{T}/threads:2"), flops_of(ours, "peak_fma/threads:2")),
            share, "no prefill or peak_fma figures")
    add(13, "prefill T=64, 2 threads: ONNX Runtime time / ours (above 1: faster)",
        ratio(time_of(ort or {}, "prefill/T:64/threads:2"), time_of(ours, "prefill/T:64/threads:2")),
        1.0, run["why_no_ort"] or "no ONNX Runtime figure")
    add(13, "decode past 1023, 2 threads: two-pass core time / ours",
        ratio(time_of(twopass or {}, "decode/past:1023/threads:2"),
              time_of(ours, "decode/past:1023/threads:2")), 1.3,
        "no two-pass binary (--twopass: a Release build of d82e5d5's gpt2_bench)")

    fast = {"amx": (5.0, 3.0), "avx512_bf16": (1.6, 1.3)}.get(level)
    for T, k in ((1024, 0), (64, 1)):
        what = f"prefill_bf16 T={T}, 2 threads: prefill (float32) time / prefill_bf16"
        if fast is None:
            add(14, what, None, None, f"level {level or '?'}: neither amx nor avx512_bf16")
        else:
            add(14, what + f" ({level})",
                ratio(time_of(ours, f"prefill/T:{T}/threads:2"),
                      time_of(ours, f"prefill_bf16/T:{T}/threads:2")), fast[k], "no prefill figures")
    what = "prefill_bf16 T=64, 2 threads: PyTorch bf16 time / ours (AMX)"
    if amx:
        add(14, what, ratio(time_of(torch or {}, "prefill_bf16/T:64/threads:2"),
                            time_of(ours, "prefill_bf16/T:64/threads:2")), 1.5,
            run["why_no_torch"] or "no PyTorch bf16 figure")
    else:
        add(14, what, None, None, f"level {level or '?'}: the target is for AMX machines")
    add(14, "decode_model_bf16, past 1023, 2 threads: decode_model time / decode_model_bf16",
        ratio(time_of(ours, "decode_model/past:1023/threads:2"),
              time_of(ours, "decode_model_bf16/past:1023/threads:2")), 1.8,
        "no decode_model figures")
    what = "qkv product in bf16, T=1024, 2 threads: stage_qkv_bf16 / oneDNN AMX matmul FLOP/s"
    onednn = ratio(flops_of(ours, "stage_qkv_bf16/T:1024/threads:2"),
                   flops_of(ours, "baseline_onednn_bf16/N:2304/T:1024/threads:2"))
    if not amx:
        add(14, what, None, None, f"level {level or '?'}: the target is against oneDNN's AMX "
            "kernels" + ("" if onednn is None else f" (here, not on AMX: {onednn:.2f})"))
    else:
        add(14, what, onednn, 0.8, "no baseline_onednn_bf16 (apt-get install libdnnl-dev, "
            "then reconfigure: the benchmarks pick oneDNN up)")

    # issue 44: int8 weights (and an int8 KV cache in decode_model_int8), against bf16's
    add(44, "decode_model_int8, past 1023, 2 threads: decode_model_bf16 time / decode_model_int8",
        ratio(time_of(ours, "decode_model_bf16/past:1023/threads:2"),
              time_of(ours, "decode_model_int8/past:1023/threads:2")), 1.6,
        "no decode_model_int8 figures")
    int8_prefill = {"amx": 1.5, "avx512_bf16": 1.3}.get(level)
    what = "prefill_int8 T=1024, 2 threads: prefill_bf16 time / prefill_int8"
    if int8_prefill is None:
        add(44, what, None, None, f"level {level or '?'}: neither amx nor avx512_bf16")
    else:
        add(44, what + f" ({level})",
            ratio(time_of(ours, "prefill_bf16/T:1024/threads:2"),
                  time_of(ours, "prefill_int8/T:1024/threads:2")), int8_prefill,
            "no prefill_int8 figures")
    add(44, "qkv product T=1024, 2 threads: stage_qkv_bf16 time / stage_qkv_int8",
        ratio(time_of(ours, "stage_qkv_bf16/T:1024/threads:2"),
              time_of(ours, "stage_qkv_int8/T:1024/threads:2")), 1.5, "no stage_qkv_int8 figures")
    return out


def verdict(figure, threshold, missing):
    if missing is not None:
        return "n/a: " + missing
    return "met" if figure >= threshold else "short"


def table(run):
    lines = [f"machine: {run['machine'].get('cpu', '?')} ({run['machine'].get('family_model', '?')}), "
             f"{run['machine'].get('nproc', '?')} CPUs; level: {run['level']}; "
             f"commit {run['machine'].get('commit', '?')}; medians over {run['rounds']} rounds",
             "", "| issue | target | measured | needed | verdict |", "|---|---|---|---|---|"]
    for issue, what, figure, threshold, missing in targets(run):
        fig = "n/a" if figure is None else f"{figure:.3f}"
        need = "" if threshold is None else f">= {threshold:g}"
        lines.append(f"| {issue} | {what} | {fig} | {need} | {verdict(figure, threshold, missing)} |")
    return "\n".join(lines)


def medians(rounds):
    """Per name, the median of each numeric field over the rounds that have it."""
    rounds = [r for r in rounds if r]
    if not rounds:
        return None
    names = set().union(*rounds)
    return {n: compare.median_dicts([r[n] for r in rounds if n in r]) for n in names}


def family_model():
    fam = mod = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "cpu family" and fam is None:
                    fam = value.strip()
                elif key.strip() == "model" and mod is None:
                    mod = value.strip()
    except OSError:
        pass
    return f"family {fam}, model {mod}"


def measure(args):
    if not os.access(args.bench, os.X_OK):
        sys.exit(f"{args.bench}: no such executable (cmake --build build/rel --target gpt2_bench)")
    if args.twopass and not os.access(args.twopass, os.X_OK):
        sys.exit(f"--twopass {args.twopass}: no such executable")
    why_no_torch = "--no-peers" if args.no_peers else (
        None if compare.torch_available() else f"{compare.PYTHON} cannot import torch (python3-torch)")
    if args.no_peers:
        why_no_ort = "--no-peers"
    else:
        why_no_ort = compare.ort_available(argparse.Namespace(export_onnx=False))
    raw = {"machine": dict(compare.machine(), family_model=family_model()), "rounds": [],
           "why_no_torch": why_no_torch, "why_no_ort": why_no_ort}
    mt = str(args.min_time)
    for r in range(args.rounds):
        compare.log(f"--- round {r + 1}/{args.rounds}")
        entry = {"ours": compare.run_json([args.bench, "--benchmark_format=json",
                                           f"--benchmark_filter={OURS_FILTER}",
                                           f"--benchmark_min_time={mt}"])}
        if args.twopass:
            entry["twopass"] = compare.run_json([args.twopass, "--benchmark_format=json",
                                                 f"--benchmark_filter={TWOPASS_FILTER}",
                                                 f"--benchmark_min_time={mt}"])
        if not why_no_torch:
            entry["torch"] = compare.run_json(
                [compare.PYTHON, os.path.join(HERE, "torch_bench.py"), "--tuned", "--dtype", "bf16",
                 "--filter", TORCH_FILTER, "--min-time", mt, "--min-reps", "5", "--out", "{out}"])
        if not why_no_ort:
            entry["ort"] = compare.run_json(
                ["node", os.path.join(compare.ORT_DIR, "ort_bench.mjs"), "--filter", ORT_FILTER,
                 "--min-time", mt, "--min-reps", "5", "--out", "{out}"])
        raw["rounds"].append(entry)
    return raw


def summarize(raw):
    """The medians and the context a verdict needs, from a raw run (measure's or --json's)."""
    rounds = raw["rounds"]
    ours_docs = [e.get("ours") for e in rounds if e.get("ours")]
    if not ours_docs:
        sys.exit("our benchmark produced no results")
    level = (ours_docs[0].get("context") or {}).get("kernels")
    pick = lambda key, parse: medians([parse(e[key]) for e in rounds if e.get(key)])
    return {
        "machine": raw.get("machine", {}), "rounds": len(rounds), "level": level,
        "ours": pick("ours", compare.parse_gbench),
        "twopass": pick("twopass", compare.parse_gbench),
        "torch": pick("torch", compare.parse_ours_like),
        "ort": pick("ort", compare.parse_ours_like),
        "why_no_torch": raw.get("why_no_torch"), "why_no_ort": raw.get("why_no_ort"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=DEFAULT_BENCH, help="our gpt2_bench (a plain Release build)")
    ap.add_argument("--twopass", help="gpt2_bench of the two-pass core (d82e5d5), issue 13's decode baseline")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per benchmark, in each tool")
    ap.add_argument("--no-peers", action="store_true", help="leave out PyTorch and ONNX Runtime")
    ap.add_argument("--json", help="write every round's raw output here")
    ap.add_argument("--from-json", help="no run: the verdicts of a run saved with --json")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            raw = json.load(f)
    else:
        raw = measure(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(raw, f, indent=1)
    print(table(summarize(raw)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
