#!/usr/bin/env python3
"""Compile time of files that use the library, against a file that includes Eigen alone.

usage: bench/compile_time.py [--cxx g++] [--rounds 3] [--weights FILE] [--cli] [--json FILE]

Compiles, round by round (each round every file once, in a fixed order), with the same command line
as a consumer of the installed package (`-std=c++17 -O2`, the include directories, OpenMP's flag):

  eigen_only         bench/compile/eigen_only.cpp: #include <Eigen/Dense> and one product
  readme             README.md's first C++ example (the ```cpp block after `<!-- snippet: usage -->`)
  consumer           bench/compile/consumer.cpp: io (safetensors), layer_norm, a KV cache, probs
  consumer_edit      consumer.cpp with one line changed, compiled and linked again (what
                     `cmake --build` does after a one-line edit)
  library            src/gpt2_attention.cpp + src/gpt2_attention_io.cpp: the compiled mode's part,
                     once per build tree

each in the compiled mode (GPT2_ATTENTION_SEPARATE_KERNELS and _IO, linked with the library) and,
for readme and consumer, header-only. Prints the median seconds of each and its ratio to
eigen_only. --cli also builds, in a fresh CMake tree (Release, Ninja) with -j2, once: the libraries
(library_j2: gpt2_attention, gpt2_attention_io and, with MPI, gpt2_attention_mpi), then the gpt2-attention target's own files on it (cli_from_scratch_j2), and gives
their ratios. --weights (or GPT2_SMALL_WEIGHTS) runs the
consumer built without optimisation (-O0, what a CMake project without a build type compiles) and
with -O2, in the compiled mode and header-only, and prints the forward's time at T=64 in each.
Times move by 10-50% between machines and runs: read the ratios, which come from one run.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPILED = ["-DGPT2_ATTENTION_SEPARATE_KERNELS", "-DGPT2_ATTENTION_SEPARATE_IO"]
TARGETS = {  # the targets, as ratios to eigen_only (compiled mode)
    "readme": 2.0, "consumer": 2.5, "consumer_edit": 3.0, "cli_from_scratch_j2": 8.0,
}


def readme_example(out: Path) -> None:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- snippet: usage -->\n```cpp\n(.*?)\n```\n", text, re.S)
    if not m:
        sys.exit("README.md: no ```cpp block after <!-- snippet: usage -->")
    out.write_text(m.group(1) + "\n")


def eigen_include() -> str:
    for d in ("/usr/include/eigen3", "/usr/local/include/eigen3"):
        if Path(d, "Eigen/Core").exists():
            return d
    sys.exit("Eigen 3 not found under /usr/include/eigen3 or /usr/local/include/eigen3")


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stdout}")
    return r.stdout


def timed(cmd, **kw) -> float:
    t0 = time.perf_counter()
    run(cmd, **kw)
    return time.perf_counter() - t0


def has_target(build: Path, target: str) -> bool:
    """Whether the CMake tree `build` (Ninja) has `target` (gpt2_attention_mpi: only with MPI)."""
    out = run(["ninja", "-C", str(build), "-t", "targets", "all"])
    return any(line.split(":")[0] == target for line in out.splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--weights", default=os.environ.get("GPT2_SMALL_WEIGHTS", ""))
    ap.add_argument("--cli", action="store_true", help="also time the CLI target from scratch, -j2")
    ap.add_argument("--json", help="write every measurement here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gpt2_compile_time-"))
    try:
        base = [args.cxx, "-std=c++17", "-O2", "-fopenmp", f"-I{ROOT / 'include'}",
                "-isystem", eigen_include()]
        readme = tmp / "readme.cpp"
        readme_example(readme)
        consumer = ROOT / "bench/compile/consumer.cpp"
        edited = tmp / "consumer_edit.cpp"
        lib_objs = [tmp / "gpt2_attention.o", tmp / "gpt2_attention_io.o"]

        def compile_(src, extra, obj):
            return base + extra + ["-c", str(src), "-o", str(obj)]

        # The library's part first (timed below too): the edit-and-link step links against it.
        for src, obj in zip(("src/gpt2_attention.cpp", "src/gpt2_attention_io.cpp"), lib_objs):
            run(compile_(ROOT / src, COMPILED, obj))

        def edit_and_link() -> float:
            text = consumer.read_text().replace("const gpt2::Index T = argc > 2 ? std::atoi(argv[2]) : 64;",
                                                "const gpt2::Index T = argc > 2 ? std::atoi(argv[2]) : 65;")
            edited.write_text(text)
            t0 = time.perf_counter()
            run(base + COMPILED + [f"-I{ROOT}", "-c", str(edited), "-o", str(tmp / "edit.o")])
            run([args.cxx, "-fopenmp", str(tmp / "edit.o"), *map(str, lib_objs), "-o", str(tmp / "edit")])
            return time.perf_counter() - t0

        cases = [
            ("eigen_only", "-", lambda: timed(compile_(ROOT / "bench/compile/eigen_only.cpp", [], tmp / "e.o"))),
            ("readme", "compiled", lambda: timed(compile_(readme, COMPILED, tmp / "r.o"))),
            ("readme", "header-only", lambda: timed(compile_(readme, [], tmp / "rh.o"))),
            ("consumer", "compiled", lambda: timed(compile_(consumer, COMPILED, tmp / "c.o"))),
            ("consumer", "header-only", lambda: timed(compile_(consumer, [], tmp / "ch.o"))),
            ("consumer_edit", "compiled", edit_and_link),
            ("library", "compiled", lambda: sum(
                timed(compile_(ROOT / s, COMPILED, tmp / "l.o"))
                for s in ("src/gpt2_attention.cpp", "src/gpt2_attention_io.cpp"))),
        ]
        times = {(n, m): [] for n, m, _ in cases}
        for r in range(args.rounds):
            for name, mode, f in cases:
                times[(name, mode)].append(f())
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

        if args.cli:
            build = tmp / "cli-build"
            run(["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 f"-DCMAKE_CXX_COMPILER={shutil.which(args.cxx) or args.cxx}",
                 "-DGPT2_ATTENTION_BUILD_TESTS=OFF", "-DGPT2_ATTENTION_BUILD_BENCH=OFF",
                 "-DGPT2_ATTENTION_EXAMPLE_PROGRAMS=OFF", "-DGPT2_ATTENTION_INSTALL=OFF"])
            # The library first (once per build tree), then the CLI's own files on it.
            times[("library_j2", "compiled")] = [
                timed(["cmake", "--build", str(build), "--target", "gpt2_attention", "gpt2_attention_io",
                       *(["gpt2_attention_mpi"] if has_target(build, "gpt2_attention_mpi") else []),
                       "-j2"])]
            times[("cli_from_scratch_j2", "compiled")] = [
                timed(["cmake", "--build", str(build), "--target", "gpt2-attention", "-j2"])]

        eigen = statistics.median(times[("eigen_only", "-")])
        cpu = ""
        try:
            cpu = next(l.split(":", 1)[1].strip() for l in run(["lscpu"]).splitlines()
                       if l.startswith("Model name"))
        except Exception:
            pass
        version = run([args.cxx, "--version"]).splitlines()[0]
        print(f"compiler: {version}; cpu: {cpu}; median of {args.rounds} rounds (cli: one build)")
        print("| translation unit | mode | seconds | / eigen_only | target |")
        print("|---|---|---|---|---|")
        for (name, mode), ts in times.items():
            med = statistics.median(ts)
            target = f"<= {TARGETS[name]}x" if mode == "compiled" and name in TARGETS else ""
            print(f"| {name} | {mode} | {med:.2f} | {med / eigen:.2f}x | {target} |")

        runs = {}
        if args.weights:
            print(f"\nforward at T=64, consumer.cpp on {Path(args.weights).name} (ms per call):")
            print("| mode | -O0 (no build type) | -O2 (Release) | -O0 / -O2 |")
            print("|---|---|---|---|")
            for mode, extra, libs in (("compiled", COMPILED, list(map(str, lib_objs))),
                                      ("header-only", [], [])):
                ms = {}
                for opt in ("-O0", "-O2"):
                    exe = tmp / f"run{opt}{mode}"
                    cmd = [c if c != "-O2" else opt for c in base] + extra + [str(consumer), *libs,
                                                                               "-o", str(exe)]
                    run(cmd)
                    out = run([str(exe), args.weights, "64"])
                    ms[opt] = float(re.search(r"forward ([0-9.]+) ms/call", out).group(1))
                runs[mode] = ms
                print(f"| {mode} | {ms['-O0']:.3f} | {ms['-O2']:.3f} | {ms['-O0'] / ms['-O2']:.2f}x |")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "compiler": version, "cpu": cpu, "rounds": args.rounds,
                "times": {f"{n}/{m}": ts for (n, m), ts in times.items()}, "forward_ms": runs}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
