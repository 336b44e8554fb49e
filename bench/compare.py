#!/usr/bin/python3
"""Runs the benchmark suite beside PyTorch and ONNX Runtime on the same shapes and prints a ratio table.

    /usr/bin/python3 bench/compare.py [build/release/bench/gpt2_bench] [--rounds 3] [--filter REGEX]
    /usr/bin/python3 bench/compare.py --quick            # smoke run: a few shapes, one short round

Each round runs, one after the other, our binary (Google Benchmark JSON), bench/torch_bench.py in
PyTorch's tuned environment (torch_bench.TUNED_ENV) and bench/ort/ort_bench.mjs; the table holds the
median over rounds of each figure, so load that drifts during a run falls on all three alike.

Writes, under --out-dir (default bench/results):
    table.md             the markdown table printed at the end
    prefill_vs_T.png     prefill time against T, log-log, 2 threads solid and 1 thread dashed (--plot)
    run.json             every raw JSON of the run, with the machine and commit, so the table can be
                         traced back to it
PyTorch or ONNX Runtime missing (no torch module, no node, no bench/ort/node_modules) gives "n/a"
columns, not an error. ONNX models are exported by torch_bench.py into bench/ort/ when absent.

The tables in the documentation come from table.md, never typed in by hand:
    docs/speed.md   the whole table, between <!-- speed-table:begin --> and <!-- speed-table:end -->
    README.md       a summary (SUMMARY_ROWS x SUMMARY_COLUMNS of it), between <!-- speed-summary:... -->
--update-docs (with a run) rewrites both from the new table; --docs update rewrites them from the
table.md already in --out-dir, without running anything; --docs check (ctest docs_speed_tables)
fails unless both hold exactly what table.md says.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ORT_DIR = os.path.join(HERE, "ort")
# Debian's python, with torch 1.13 and numpy (the python3 first on PATH may lack them).
PYTHON = os.environ.get("GPT2_BENCH_PYTHON", "/usr/bin/python3")

PREFILL_T = [64, 128, 256, 512, 1024, 2048]
DECODE_PAST = [0, 127, 1023]
THREADS = [1, 2]
QUICK = r"T:(64|1024)/|past:1023/|peak_fma|bandwidth"
# The names the table reads from our binary (stage_* are left out unless --filter asks for them).
OURS_DEFAULT = r"^(prefill|decode|decode_model|baseline_eigen|baseline_eigen_decode|peak_fma|bandwidth)/"
# Targets of issue 4: PyTorch (tuned) time / ours.
TARGETS = {"prefill/T:1024": 1.6, "prefill/T:64": 1.3, "decode/past:1023": 5.0}

UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}

# The README's short table: these rows (case, threads) and columns of table.md's table.
SUMMARY_ROWS = [("prefill T=64", "2"), ("prefill T=1024", "1"), ("prefill T=1024", "2"),
                ("decode past=1023", "1"), ("decode past=1023", "2")]
SUMMARY_COLUMNS = ["case", "threads", "ours (ms)", "PyTorch (ms)", "ORT (ms)", "PyTorch / ours",
                   "ORT / ours"]
DOCS = {  # file: (begin marker, end marker, what goes between them)
    "docs/speed.md": ("<!-- speed-table:begin -->", "<!-- speed-table:end -->", "table"),
    "README.md": ("<!-- speed-summary:begin -->", "<!-- speed-summary:end -->", "summary"),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def canonical(name):
    """Google Benchmark appends /real_time (UseRealTime) and may put /threads:n after it."""
    return re.sub(r"/(real_time|manual_time|process_time)(?=/|$)", "", name)


def parse_gbench(doc):
    """{name: {"ns": real time, counters...}} from Google Benchmark JSON (medians over repetitions)."""
    runs = {}
    for b in doc.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        entry = {k: v for k, v in b.items() if isinstance(v, (int, float)) and k not in
                 ("family_index", "per_family_instance_index", "repetitions", "repetition_index",
                  "threads", "iterations", "real_time", "cpu_time")}
        entry["ns"] = b["real_time"] * UNIT_NS[b.get("time_unit", "ns")]
        runs.setdefault(canonical(b["name"]), []).append(entry)
    return {name: median_dicts(entries) for name, entries in runs.items()}


def parse_ours_like(doc):
    """{name: {"ns": median, "min_ns": min, "variant": ...}} from torch_bench / ort_bench JSON."""
    return {b["name"]: {"ns": b["real_time_ns"], "min_ns": b["min_ns"], "variant": b.get("variant")}
            for b in doc.get("benchmarks", [])}


def median_dicts(entries):
    """Per-key median of numeric fields over a list of dicts; other fields from the first one."""
    out = dict(entries[0])
    for k in entries[0]:
        vals = [e[k] for e in entries if isinstance(e.get(k), (int, float))]
        if vals and len(vals) == len(entries):
            out[k] = statistics.median(vals)
    if "variant" in out:  # the variant chosen most often
        variants = [e.get("variant") for e in entries]
        out["variant"] = max(set(variants), key=variants.count)
    return out


def run_json(cmd, env=None, cwd=ROOT, timeout=3600):
    log("$ " + " ".join(cmd))
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        if "{out}" in cmd:
            cmd = [path if c == "{out}" else c for c in cmd]
            r = subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, stdout=sys.stderr)
            text = open(path).read() if r.returncode == 0 else ""
        else:
            r = subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, stdout=subprocess.PIPE)
            text = r.stdout.decode()
        if r.returncode != 0:
            log(f"  exit status {r.returncode}: column left n/a for this round")
            return None
        return json.loads(text)
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        log(f"  failed ({e}): column left n/a for this round")
        return None
    finally:
        os.unlink(path)


def torch_available():
    return subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode == 0


def ort_available(args):
    node = shutil.which("node")
    if not node:
        return "node not found"
    if not os.path.isdir(os.path.join(ORT_DIR, "node_modules", "onnxruntime-node")):
        return "bench/ort/node_modules missing (cd bench/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci)"
    models = [os.path.join(ORT_DIR, m) for m in ("prefill.onnx", "decode.onnx")]
    if not all(os.path.exists(m) for m in models) or args.export_onnx:
        if not torch_available():
            return "no torch to export the ONNX models"
        r = subprocess.run([PYTHON, os.path.join(HERE, "torch_bench.py"), "--export-onnx", ORT_DIR],
                           cwd=ROOT, stdout=sys.stderr)
        if r.returncode != 0:
            return "torch.onnx.export failed"
    return None


# ---------------------------------------------------------------------------------------------

def fmt_ms(ns):
    if ns is None:
        return "n/a"
    ms = ns / 1e6
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def fmt_ratio(num, den):
    return "n/a" if num is None or den is None else f"{num / den:.2f}x"


def rows():
    for n in THREADS:
        for T in PREFILL_T:
            yield "prefill", f"T:{T}", n
        for p in DECODE_PAST:
            yield "decode", f"past:{p}", n
        yield "decode_model", "past:1023", n


def build_table(ours, torch, ort):
    get = lambda d, name, key="ns": (d.get(name) or {}).get(key) if d is not None else None
    lines = [
        "| case | threads | ours (ms) | Eigen baseline (ms) | PyTorch (ms) | ORT (ms) "
        "| PyTorch / ours | ORT / ours | baseline / ours | ours vs bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for kind, arg, n in rows():
        name = f"{kind}/{arg}/threads:{n}"
        t_ours = get(ours, name)
        if t_ours is None:
            continue
        baseline_name = {"prefill": f"baseline_eigen/{arg}/threads:{n}",
                         "decode": f"baseline_eigen_decode/{arg}/threads:{n}"}.get(kind)
        t_base = get(ours, baseline_name) if baseline_name else None
        same = name if kind != "decode_model" else None  # PyTorch/ORT time the sublayer, not the model
        t_torch, t_ort = get(torch, same), get(ort, same)
        bound = ""
        if kind == "prefill":
            flops, peak = get(ours, name, "flops"), get(ours, f"peak_fma/threads:{n}", "flops")
            if flops and peak:
                bound = f"{100 * flops / peak:.0f}% of FMA peak"
        elif kind == "decode_model":
            nbytes, bw = get(ours, name, "bytes"), get(ours, f"bandwidth/threads:{n}", "bytes_per_second")
            if nbytes and bw:
                bound = f"{100 * (nbytes / bw * 1e9) / t_ours:.0f}% of bandwidth bound"
        case = {"prefill": f"prefill T={arg[2:]}", "decode": f"decode past={arg[5:]}",
                "decode_model": f"decode_model past={arg[5:]} (per layer)"}[kind]
        lines.append(f"| {case} | {n} | {fmt_ms(t_ours)} | {fmt_ms(t_base)} | {fmt_ms(t_torch)} "
                     f"| {fmt_ms(t_ort)} | {fmt_ratio(t_torch, t_ours)} | {fmt_ratio(t_ort, t_ours)} "
                     f"| {fmt_ratio(t_base, t_ours)} | {bound} |")
        if get(torch, same, "variant"):
            notes.append((get(torch, same, "variant"), f"{arg}/{n}"))
    targets = []
    for case, want in TARGETS.items():
        for n in THREADS:
            name = f"{case}/threads:{n}"
            t_ours, t_torch = get(ours, name), get(torch, name)
            if t_ours and t_torch:
                got = t_torch / t_ours
                targets.append(f"{name}: PyTorch / ours = {got:.2f}x (target {want}x) "
                               f"{'met' if got >= want else 'NOT met'}")
    by_variant = {}
    for variant, row in notes:
        by_variant.setdefault(variant, []).append(row)
    notes = [f"{v}: {', '.join(r)}" for v, r in sorted(by_variant.items(), key=lambda kv: -len(kv[1]))]
    return lines, notes, targets


def plot(path, ours, torch, ort):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing (Debian: python3-matplotlib): no plot")
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    series = [("ours", ours, "prefill", "C0"), ("Eigen baseline", ours, "baseline_eigen", "C7"),
              ("PyTorch (tuned)", torch, "prefill", "C3"), ("ONNX Runtime", ort, "prefill", "C2")]
    for label, data, prefix, color in series:
        if not data:
            continue
        for n, style in ((2, "-"), (1, "--")):
            pts = [(T, data[f"{prefix}/T:{T}/threads:{n}"]["ns"] / 1e6) for T in PREFILL_T
                   if f"{prefix}/T:{T}/threads:{n}" in data]
            if pts:
                ax.plot(*zip(*pts), style, color=color, marker="o", markersize=3,
                        label=f"{label}, {n} thread{'s' if n > 1 else ''}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(PREFILL_T)
    ax.set_xticklabels([str(T) for T in PREFILL_T])
    ax.set_xlabel("T (tokens)")
    ax.set_ylabel("time (ms)")
    ax.set_title("GPT-2 small attention sublayer, fp32 prefill")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def machine():
    info = {"platform": platform.platform(), "nproc": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        info["commit"] = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                                        capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    return info


def table_rows(text):
    """The markdown table of a table.md text: its lines starting with '|'."""
    return [line for line in text.splitlines() if line.startswith("|")]


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def summary_rows(table):
    """SUMMARY_ROWS x SUMMARY_COLUMNS of the table (its lines), as markdown lines."""
    header = cells(table[0])
    index = [header.index(c) for c in SUMMARY_COLUMNS]
    rows = {tuple(cells(line)[:2]): cells(line) for line in table[2:]}
    out = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    for key in SUMMARY_ROWS:
        if key not in rows:
            raise SystemExit(f"table.md has no row {key}: SUMMARY_ROWS names it")
        out.append("| " + " | ".join(rows[key][i] for i in index) + " |")
    return out


def docs_blocks(table_text):
    """{path: new text of the block between its markers}."""
    table = table_rows(table_text)
    content = {"table": table, "summary": summary_rows(table)}
    return {path: "\n".join(content[kind]) + "\n" for path, (_, _, kind) in DOCS.items()}


def docs(mode, table_text):
    """mode "check": 0 when every block equals what table_text gives, else 1 (saying which);
    mode "update": rewrites the blocks."""
    stale = []
    for path, block in docs_blocks(table_text).items():
        begin, end, _ = DOCS[path]
        full = os.path.join(ROOT, path)
        text = open(full).read()
        if begin not in text or end not in text:
            raise SystemExit(f"{path}: no {begin} ... {end} markers")
        a = text.index(begin) + len(begin) + 1
        b = text.index(end)
        if text[a:b] == block:
            continue
        if mode == "update":
            with open(full, "w") as f:
                f.write(text[:a] + block + text[b:])
            log(f"{path}: speed table updated")
        else:
            stale.append(f"{path} holds:\n{text[a:b]}\nexpected (from table.md):\n{block}")
    if stale:
        log("stale speed tables (/usr/bin/python3 bench/compare.py --docs update rewrites them):\n"
            + "\n".join(stale))
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench", nargs="?", default=os.path.join(ROOT, "build/release/bench/gpt2_bench"),
                    help="our benchmark binary (default build/release/bench/gpt2_bench)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--filter", help="regex on benchmark names, for all three (default: every table row)")
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per benchmark, in each tool")
    ap.add_argument("--quick", action="store_true", help="smoke run: T=64 and 1024, past 1023, one short round")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--torch-blas", metavar="DIR", help="torch_bench.py --blas DIR (which libblas.so.3 torch loads)")
    ap.add_argument("--export-onnx", action="store_true", help="re-export the ONNX models even if present")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--plot", help="PNG path (default OUT_DIR/prefill_vs_T.png)")
    ap.add_argument("--update-docs", action="store_true",
                    help="after the run, rewrite the tables of docs/speed.md and README.md")
    ap.add_argument("--docs", choices=["check", "update"],
                    help="run nothing: check (or rewrite) the docs' tables against OUT_DIR/table.md")
    args = ap.parse_args()
    if args.docs:
        with open(os.path.join(args.out_dir, "table.md")) as f:
            sys.exit(docs(args.docs, f.read()))
    if args.quick:
        args.rounds, args.min_time = 1, min(args.min_time, 0.05)
        args.filter = args.filter or QUICK

    if not os.access(args.bench, os.X_OK):
        sys.exit(f"{args.bench}: no such executable (cmake --build --preset release --target gpt2_bench)")
    ours_filter = f"({args.filter})|^(peak_fma|bandwidth)/" if args.filter else OURS_DEFAULT
    other_filter = args.filter or "."

    use_torch = not args.no_torch and torch_available()
    why_no_ort = "--no-ort" if args.no_ort else ort_available(args)
    if not use_torch:
        log("PyTorch: n/a" + (" (--no-torch)" if args.no_torch else f" ({PYTHON} cannot import torch)"))
    if why_no_ort:
        log(f"ONNX Runtime: n/a ({why_no_ort})")

    raw = {"started": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine(),
           "args": vars(args), "loadavg_start": os.getloadavg(), "rounds": []}
    per_round = {"ours": [], "torch": [], "ort": []}
    for r in range(args.rounds):
        log(f"--- round {r + 1}/{args.rounds}")
        entry = {}
        doc = run_json([args.bench, "--benchmark_format=json", f"--benchmark_filter={ours_filter}",
                        f"--benchmark_min_time={args.min_time}"])
        entry["ours"] = doc
        if doc:
            per_round["ours"].append(parse_gbench(doc))
        if use_torch:
            cmd = [PYTHON, os.path.join(HERE, "torch_bench.py"), "--tuned", "--filter", other_filter,
                   "--min-time", str(args.min_time), "--min-reps", "5", "--out", "{out}"]
            if args.torch_blas:
                cmd += ["--blas", args.torch_blas]
            doc = run_json(cmd)
            entry["torch"] = doc
            if doc:
                per_round["torch"].append(parse_ours_like(doc))
        if not why_no_ort:
            doc = run_json(["node", os.path.join(ORT_DIR, "ort_bench.mjs"), "--filter", other_filter,
                            "--min-time", str(args.min_time), "--min-reps", "5", "--out", "{out}"])
            entry["ort"] = doc
            if doc:
                per_round["ort"].append(parse_ours_like(doc))
        raw["rounds"].append(entry)
    raw["loadavg_end"] = os.getloadavg()

    def over_rounds(rounds):
        if not rounds:
            return None
        names = set().union(*rounds)
        return {n: median_dicts([rd[n] for rd in rounds if n in rd]) for n in names}

    ours, torch, ort = (over_rounds(per_round[k]) for k in ("ours", "torch", "ort"))
    if not ours:
        sys.exit("our benchmark produced no results")

    lines, notes, targets = build_table(ours, torch, ort)
    torch_ctx = next((e["torch"]["context"] for e in raw["rounds"] if e.get("torch")), {})
    ort_ctx = next((e["ort"]["context"] for e in raw["rounds"] if e.get("ort")), {})
    ours_ctx = next((e["ours"]["context"] for e in raw["rounds"] if e.get("ours")), {})
    blas = [os.path.basename(os.path.dirname(p)) + "/" + os.path.basename(p)
            for p in torch_ctx.get("libraries", []) if "libblas" in p]
    md = [
        f"fp32, GPT-2 small (C = 768, 12 heads); medians over {args.rounds} interleaved round(s), "
        f"{args.min_time} s per benchmark; {raw['machine'].get('cpu', '?')}, {raw['machine']['nproc']} cores; "
        f"commit {raw['machine'].get('commit', '?')}; {raw['started']}; load average "
        f"{raw['loadavg_start'][0]:.1f} at start, {raw['loadavg_end'][0]:.1f} at end.",
        "",
        *lines,
        "",
        "PyTorch: " + (f"{torch_ctx.get('version')}, eager, torch.inference_mode(), "
                       f"env {torch_ctx.get('env')}, BLAS {', '.join(blas) or '?'}; the fastest of "
                       "the variants in bench/torch_bench.py per row (variant: rows as T or past / threads; "
                       + "; ".join(notes) + ")."
                       if torch else "n/a."),
        "ONNX Runtime: " + (f"onnxruntime-node {ort_ctx.get('version')}, CPU execution provider, "
                            "graph exported by torch_bench.py --export-onnx, all graph optimisations; "
                            "intra-op spinning on or off, whichever is faster per row." if ort
                            else f"n/a ({why_no_ort or 'failed'})."),
        "Eigen baseline: the straightforward implementation in bench/baseline.hpp. ours vs bound: "
        "prefill FLOP/s as a share of peak_fma at the same thread count; decode_model, the time "
        "to stream its bytes at the measured bandwidth as a share of the measured time.",
    ]
    if targets:
        md += ["", "Targets (issue 4):", *[f"- {t}" for t in targets]]
    text = "\n".join(md) + "\n"
    print(text)

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "table.md"), "w") as f:
        f.write(text)
    raw["summary"] = {"ours": ours, "torch": torch, "ort": ort, "ours_context": ours_ctx}
    with open(os.path.join(args.out_dir, "run.json"), "w") as f:
        json.dump(raw, f, indent=1)
        f.write("\n")
    png = args.plot or os.path.join(args.out_dir, "prefill_vs_T.png")
    if plot(png, ours, torch, ort):
        log(f"wrote {png}")
    log(f"wrote {os.path.join(args.out_dir, 'table.md')}, {os.path.join(args.out_dir, 'run.json')}")
    if args.update_docs:
        docs("update", text)


if __name__ == "__main__":
    main()
