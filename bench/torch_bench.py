#!/usr/bin/python3
"""Times PyTorch on the work of bench/bench_attention.cpp: the GPT-2 small attention sublayer, fp32.

    prefill/T:N/threads:n      the sublayer over N tokens, as Hugging Face GPT2Attention computes it
    decode/past:N/threads:n    one token attending to a KV cache of N positions plus itself

Several ways of writing the same math are timed (--variants); for each name the fastest by median
is reported, with the medians of all of them, so the comparison is with PyTorch at its best:

    hf        GPT2Attention._attn, literally: addmm, split, view/transpose heads, q @ k^T, / 8,
              torch.where(causal, w, finfo.min), softmax, @ v, merge, addmm (transformers 4.x eager)
    baddbmm   q @ k^T / 8 plus an additive -inf causal bias in one baddbmm (HF's
              _upcast_and_reordered_attn), softmax in place, bmm
    linear    as baddbmm, projections with F.linear on weights transposed at load time (nn.Linear layout)
    sdpa      torch.nn.functional.scaled_dot_product_attention (PyTorch >= 2.0 only; skipped on 1.13)
    decode:   concat          HF's layer_past: torch.cat of past k/v with the new row, a new cache each step
              prealloc        preallocated cache, the new row written in place, attention over a view
              prealloc_linear as prealloc, projections with F.linear

Timing: warm-up, then single calls timed with time.perf_counter until --min-time seconds and at least
--min-reps calls; the JSON lists, per name, the median (`real_time_ns`) and the minimum (`min_ns`).
PyTorch is fastest here with OMP_WAIT_POLICY=PASSIVE and glibc malloc kept from unmapping large
buffers; --tuned re-executes the script with that environment (TUNED_ENV below). Debian's torch
calls the BLAS behind libblas.so.3 for addmm: reference BLAS there makes prefill 15x slower than
OpenBLAS, and serial OpenBLAS leaves the projections on one thread. --blas DIR loads the
libblas.so.3 in DIR instead; the JSON context lists the libraries that were actually loaded.

    /usr/bin/python3 bench/torch_bench.py --tuned --out torch.json
    /usr/bin/python3 bench/torch_bench.py --tuned --dtype bf16 --filter 'prefill_bf16/T:64/'   # bf16
    /usr/bin/python3 bench/torch_bench.py --check          # each variant against a float64 reference
    /usr/bin/python3 bench/torch_bench.py --export-onnx bench/ort   # models for bench/ort/ort_bench.mjs
"""
import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

C, N_HEAD, HEAD_DIM = 768, 12, 64
PREFILL_T = [64, 128, 256, 512, 1024, 2048]
DECODE_PAST = [0, 127, 1023]
THREADS = [1, 2]

# The environment in which PyTorch 1.13 (Debian) is fastest on this machine: OpenMP workers sleep
# instead of spinning between ops, and glibc keeps large buffers mapped instead of returning them to
# the kernel after every op (without these, prefill/T:1024 takes 90-160 ms instead of ~62 ms).
TUNED_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": "100000000000",
}


class Weights:
    """GPT-2 small attention weights, Conv1D layout (x @ W), random with a fixed seed."""

    def __init__(self, dtype=torch.float32, seed=1):
        g = torch.Generator().manual_seed(seed)
        u = lambda *shape, s: ((torch.rand(*shape, generator=g) * 2 - 1) * s).to(dtype)
        self.c_attn_w = u(C, 3 * C, s=0.05)
        self.c_attn_b = u(3 * C, s=0.1)
        self.c_proj_w = u(C, C, s=0.05)
        self.c_proj_b = u(C, s=0.1)
        self.transpose()

    def transpose(self):
        # nn.Linear layout ([out, in], F.linear computes x @ W^T): a load-time copy, for the
        # `linear` variants, in case the BLAS or oneDNN path is faster with it.
        self.c_attn_wt = self.c_attn_w.t().contiguous()
        self.c_proj_wt = self.c_proj_w.t().contiguous()

    def to(self, dtype):
        w = Weights.__new__(Weights)
        for k, v in vars(self).items():
            setattr(w, k, v.to(dtype))
        return w

    def c_attn(self, x, linear=False):
        return F.linear(x, self.c_attn_wt, self.c_attn_b) if linear else torch.addmm(self.c_attn_b, x, self.c_attn_w)

    def c_proj(self, y, linear=False):
        return F.linear(y, self.c_proj_wt, self.c_proj_b) if linear else torch.addmm(self.c_proj_b, y, self.c_proj_w)


def split_heads(t, T):
    # [T, C] -> [n_head, T, head_dim]  (HF: view(B, T, n_head, head_dim).permute(0, 2, 1, 3))
    return t.view(T, N_HEAD, HEAD_DIM).transpose(0, 1)


def merge_heads(a, T):
    # [n_head, T, head_dim] -> [T, C]  (HF: permute(0, 2, 1, 3).contiguous().view(B, T, C))
    return a.transpose(0, 1).contiguous().view(T, C)


class Prefill:
    """The sublayer over T tokens. Masks are built once per T (HF keeps a [max_pos, max_pos] buffer)."""

    def __init__(self, w, variant):
        self.w, self.variant = w, variant
        self.causal = {}  # T -> bool [T, T], True where attending is allowed
        self.bias = {}    # T -> float [T, T], 0 where allowed, -inf above the diagonal

    def masks(self, T, dtype):
        if T not in self.causal:
            self.causal[T] = torch.tril(torch.ones(T, T, dtype=torch.bool))
            self.bias[T] = torch.zeros(T, T, dtype=dtype).masked_fill_(~self.causal[T], float("-inf"))
        return self.causal[T], self.bias[T]

    def __call__(self, x):
        w, T, linear = self.w, x.shape[0], self.variant == "linear"
        qkv = w.c_attn(x, linear)                                         # [T, 3C]
        q, k, v = (split_heads(t, T) for t in qkv.split(C, dim=1))       # [n_head, T, head_dim]
        causal, bias = self.masks(T, x.dtype)
        if self.variant == "hf":
            att = torch.matmul(q, k.transpose(-1, -2))
            att = att / torch.full([], v.size(-1) ** 0.5, dtype=att.dtype)
            mask_value = torch.full([], torch.finfo(att.dtype).min, dtype=att.dtype)
            att = torch.where(causal, att, mask_value)
            att = torch.softmax(att, dim=-1)
            y = torch.matmul(att, v)
        elif self.variant in ("baddbmm", "linear"):
            att = torch.baddbmm(bias.expand(N_HEAD, T, T), q, k.transpose(-1, -2),
                                beta=1.0, alpha=1.0 / math.sqrt(HEAD_DIM))
            att = torch.softmax(att, dim=-1)
            y = torch.bmm(att, v)
        elif self.variant == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            raise ValueError(self.variant)
        return w.c_proj(merge_heads(y, T), linear)                        # [T, C]


def attend_one(w, q, k, v):
    """q [n_head, 1, head_dim] against k, v [n_head, n, head_dim]: no mask, the new token sees all."""
    att = torch.bmm(q * (1.0 / math.sqrt(HEAD_DIM)), k.transpose(-1, -2))
    return torch.bmm(torch.softmax(att, dim=-1), v)


class DecodeConcat:
    """HF layer_past: present = cat(past, new) along the sequence; a new tensor every step."""

    def __init__(self, w, past_k, past_v):
        self.w, self.past_k, self.past_v = w, past_k, past_v

    def __call__(self, x):
        w = self.w
        qkv = torch.addmm(w.c_attn_b, x, w.c_attn_w)
        q, k, v = (split_heads(t, 1) for t in qkv.split(C, dim=1))
        k = torch.cat((self.past_k, k), dim=1)
        v = torch.cat((self.past_v, v), dim=1)
        y = attend_one(w, q, k, v)
        return torch.addmm(w.c_proj_b, y.view(1, C), w.c_proj_w)


class DecodePrealloc:
    """Preallocated cache [n_head, max_len, head_dim]; the new k/v row is written at position `past`.
    Every timed call writes the same slot, so the cache holds `past` positions each time."""

    def __init__(self, w, past_k, past_v, max_len=2048, linear=False):
        self.w, self.past, self.linear = w, past_k.shape[1], linear
        self.k = torch.zeros(N_HEAD, max_len, HEAD_DIM, dtype=past_k.dtype)
        self.v = torch.zeros_like(self.k)
        self.k[:, : self.past] = past_k
        self.v[:, : self.past] = past_v

    def __call__(self, x):
        w, n = self.w, self.past + 1
        qkv = w.c_attn(x, self.linear)
        q, k, v = (split_heads(t, 1) for t in qkv.split(C, dim=1))
        self.k[:, self.past : n] = k
        self.v[:, self.past : n] = v
        y = attend_one(w, q, self.k[:, :n], self.v[:, :n])
        return w.c_proj(y.view(1, C), self.linear)


PREFILL_VARIANTS = ["hf", "baddbmm", "linear", "sdpa"]
DECODE_VARIANTS = ["concat", "prealloc", "prealloc_linear"]


def loaded_blas():
    """Shared libraries of BLAS/oneDNN/OpenMP mapped into this process (which libblas.so.3 the
    Debian alternatives or LD_LIBRARY_PATH selected decides how fast addmm is)."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if re.search(r"blas|lapack|dnnl|gomp|omp\.so", path):
                libs.add(os.path.realpath(path))
    return sorted(libs)


def have_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


def inputs(T, dtype=torch.float32, seed=2):
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(T, C, generator=g) * 2 - 1)).to(dtype)


def past_kv(past, dtype=torch.float32, seed=3):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(N_HEAD, past, HEAD_DIM, generator=g).to(dtype)
    v = torch.randn(N_HEAD, past, HEAD_DIM, generator=g).to(dtype)
    return k, v


def make(w, name, variant, dtype=torch.float32):
    """(callable, input) for a benchmark name such as prefill/T:64 or decode/past:127."""
    kind, n = re.match(r"(prefill|decode)(?:_bf16)?/(?:T|past):(\d+)", name).groups()
    n = int(n)
    if kind == "prefill":
        return Prefill(w, variant), inputs(n, dtype)
    k, v = past_kv(n, dtype)
    if variant == "concat":
        return DecodeConcat(w, k, v), inputs(1, dtype, seed=4)
    return DecodePrealloc(w, k, v, linear=variant == "prealloc_linear"), inputs(1, dtype, seed=4)


def time_calls(fn, x, min_time, min_reps, warmup=3):
    start = time.perf_counter()
    fn(x)  # at least one warm-up call; up to `warmup` of them within 0.1 s
    for _ in range(warmup - 1):
        if time.perf_counter() - start > 0.1:
            break
        fn(x)
    samples = []
    start = time.perf_counter()
    while len(samples) < min_reps or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn(x)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e9, min(samples) * 1e9, len(samples)


# ---------------------------------------------------------------------------------------------
# Reference: the same math in float64, written independently (one head at a time, explicit loops
# over the causal triangle, a running max that starts at -inf), to check what is being timed.

def reference(w64, x64, past_k=None, past_v=None):
    T, n_past = x64.shape[0], 0 if past_k is None else past_k.shape[1]
    qkv = x64 @ w64.c_attn_w + w64.c_attn_b
    out = torch.empty(T, C, dtype=torch.float64)
    for h in range(N_HEAD):
        cols = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
        q = qkv[:, cols]
        k = qkv[:, C:][:, cols]
        v = qkv[:, 2 * C:][:, cols]
        if n_past:
            k = torch.cat([past_k[h], k])
            v = torch.cat([past_v[h], v])
        for t in range(T):
            s = k[: n_past + t + 1] @ q[t] / math.sqrt(HEAD_DIM)
            p = torch.exp(s - s.max())
            out[t, cols] = (p / p.sum()) @ v[: n_past + t + 1]
    return out @ w64.c_proj_w + w64.c_proj_b


def check(variants):
    torch.set_num_threads(1)
    w = Weights()
    w64 = w.to(torch.float64)
    worst = 0.0
    for T in (1, 7, 64, 130):
        x = inputs(T)
        ref = reference(w64, x.double())
        for variant in variants["prefill"]:
            got = Prefill(w, variant)(x).double()
            err = ((got - ref).abs() / (ref.abs() + 1e-3)).max().item()
            print(f"prefill/T:{T:<4} {variant:9} max rel err {err:.2e}")
            worst = max(worst, err)
    for past in (0, 5, 127):
        k, v = past_kv(past)
        x = inputs(1, seed=4)
        ref = reference(w64, x.double(), k.double(), v.double())
        for variant in variants["decode"]:
            fn, _ = make(w, f"decode/past:{past}", variant)
            got = fn(x).double()
            err = ((got - ref).abs() / (ref.abs() + 1e-3)).max().item()
            print(f"decode/past:{past:<4} {variant:9} max rel err {err:.2e}")
            worst = max(worst, err)
    ok = worst < 1e-3
    print(f"{'OK' if ok else 'FAIL'}: worst relative error {worst:.2e} (tolerance 1e-3, fp32 vs fp64)")
    return ok


# ---------------------------------------------------------------------------------------------
# ONNX export for bench/ort/ort_bench.mjs: the `baddbmm`-free HF math (portable ops only).

class PrefillModule(torch.nn.Module):
    def __init__(self, w, max_t=2048):
        super().__init__()
        self.c_attn_w = torch.nn.Parameter(w.c_attn_w, requires_grad=False)
        self.c_attn_b = torch.nn.Parameter(w.c_attn_b, requires_grad=False)
        self.c_proj_w = torch.nn.Parameter(w.c_proj_w, requires_grad=False)
        self.c_proj_b = torch.nn.Parameter(w.c_proj_b, requires_grad=False)
        # HF's `bias` buffer: the causal mask for up to max_t positions, sliced to [T, T].
        self.register_buffer("causal", torch.tril(torch.ones(max_t, max_t, dtype=torch.bool)))

    def forward(self, x):  # x [T, C]
        T = x.shape[0]
        qkv = x @ self.c_attn_w + self.c_attn_b
        q, k, v = qkv.split(C, dim=1)
        q = q.reshape(T, N_HEAD, HEAD_DIM).transpose(0, 1)
        k = k.reshape(T, N_HEAD, HEAD_DIM).transpose(0, 1)
        v = v.reshape(T, N_HEAD, HEAD_DIM).transpose(0, 1)
        att = (q @ k.transpose(1, 2)) * (1.0 / math.sqrt(HEAD_DIM))
        att = att.masked_fill(~self.causal[:T, :T], torch.finfo(torch.float32).min)
        y = torch.softmax(att, dim=-1) @ v
        y = y.transpose(0, 1).reshape(T, C)
        return y @ self.c_proj_w + self.c_proj_b


class DecodeModule(PrefillModule):
    def forward(self, x, past_k, past_v):  # x [1, C], past_k/v [n_head, past, head_dim]
        qkv = x @ self.c_attn_w + self.c_attn_b
        q, k, v = qkv.split(C, dim=1)
        q = q.reshape(N_HEAD, 1, HEAD_DIM)
        k = torch.cat((past_k, k.reshape(N_HEAD, 1, HEAD_DIM)), dim=1)
        v = torch.cat((past_v, v.reshape(N_HEAD, 1, HEAD_DIM)), dim=1)
        att = (q @ k.transpose(1, 2)) * (1.0 / math.sqrt(HEAD_DIM))
        y = torch.softmax(att, dim=-1) @ v
        return y.reshape(1, C) @ self.c_proj_w + self.c_proj_b, k, v


def export_onnx(directory):
    os.makedirs(directory, exist_ok=True)
    w = Weights()
    prefill_path = os.path.join(directory, "prefill.onnx")
    decode_path = os.path.join(directory, "decode.onnx")
    with torch.no_grad():
        torch.onnx.export(PrefillModule(w).eval(), (inputs(16),), prefill_path, opset_version=14,
                          input_names=["x"], output_names=["out"],
                          dynamic_axes={"x": {0: "T"}, "out": {0: "T"}})
        k, v = past_kv(5)
        torch.onnx.export(DecodeModule(w, max_t=1).eval(), (inputs(1, seed=4), k, v), decode_path,
                          opset_version=14, input_names=["x", "past_k", "past_v"],
                          output_names=["out", "present_k", "present_v"],
                          dynamic_axes={"past_k": {1: "past"}, "past_v": {1: "past"},
                                        "present_k": {1: "present"}, "present_v": {1: "present"}})
    # The exported graphs against the eager ones (float64 reference would need a second export).
    with torch.no_grad():
        x = inputs(16)
        err = (PrefillModule(w)(x) - Prefill(w, "hf")(x)).abs().max().item()
    print(f"wrote {prefill_path}, {decode_path} (module vs eager: max abs diff {err:.1e})",
          file=sys.stderr)


# ---------------------------------------------------------------------------------------------

def names(quick, suffix=""):
    ts = [64, 1024] if quick else PREFILL_T
    pasts = [1023] if quick else DECODE_PAST
    for n in THREADS:
        for T in ts:
            yield f"prefill{suffix}/T:{T}/threads:{n}"
        for p in pasts:
            yield f"decode{suffix}/past:{p}/threads:{n}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--filter", default=".", help="regex on benchmark names (default: all)")
    ap.add_argument("--variants", default="all",
                    help="comma list among hf,baddbmm,sdpa,concat,prealloc (default: all available)")
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds of timed calls per name and variant")
    ap.add_argument("--min-reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="smoke run: a few names, short timing")
    ap.add_argument("--tuned", action="store_true", help="re-execute with TUNED_ENV set (see above)")
    ap.add_argument("--blas", metavar="DIR",
                    help="directory holding the libblas.so.3 to load (prepended to LD_LIBRARY_PATH; "
                         "e.g. /usr/lib/x86_64-linux-gnu/openblas-openmp)")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--check", action="store_true", help="check each variant against a float64 reference")
    ap.add_argument("--export-onnx", metavar="DIR", help="write prefill.onnx and decode.onnx to DIR")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="bf16: weights, input and every op in torch.bfloat16 (model.to(torch.bfloat16) "
                         "on CPU); the names become prefill_bf16/..., decode_bf16/... (gpt2_bench's)")
    args = ap.parse_args()

    want = dict(TUNED_ENV) if args.tuned else {}
    if args.blas:
        paths = os.environ.get("LD_LIBRARY_PATH", "").split(":")
        if paths[0] != args.blas:  # the dynamic loader reads LD_LIBRARY_PATH only at start-up
            want["LD_LIBRARY_PATH"] = ":".join([args.blas] + [p for p in paths if p])
    if any(os.environ.get(k) != v for k, v in want.items()):
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, **want))

    chosen = args.variants.split(",") if args.variants != "all" else PREFILL_VARIANTS + DECODE_VARIANTS
    variants = {
        "prefill": [v for v in PREFILL_VARIANTS if v in chosen and (v != "sdpa" or have_sdpa())],
        "decode": [v for v in DECODE_VARIANTS if v in chosen],
    }
    if args.check:
        sys.exit(0 if check(variants) else 1)
    if args.export_onnx:
        export_onnx(args.export_onnx)
        return
    if args.quick:
        args.min_time, args.min_reps = min(args.min_time, 0.1), min(args.min_reps, 3)

    torch.set_num_interop_threads(1)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    w = Weights().to(dtype)
    results = []
    with torch.inference_mode():
        for name in names(args.quick, "_bf16" if args.dtype == "bf16" else ""):
            if not re.search(args.filter, name):
                continue
            torch.set_num_threads(int(name.rsplit(":", 1)[1]))
            kind = name.split("/")[0].split("_")[0]
            per_variant = {}
            for variant in variants[kind]:
                fn, x = make(w, name, variant, dtype)
                per_variant[variant] = time_calls(fn, x, args.min_time, args.min_reps)
                del fn
            best = min(per_variant, key=lambda v: per_variant[v][0])
            median, minimum, reps = per_variant[best]
            results.append({
                "name": name, "variant": best, "real_time_ns": median, "min_ns": minimum,
                "repetitions": reps,
                "variants_median_ns": {v: r[0] for v, r in per_variant.items()},
            })
            print(f"{name:32} {best:9} median {median / 1e6:8.3f} ms  min {minimum / 1e6:8.3f} ms  "
                  + "  ".join(f"{v}={r[0] / 1e6:.3f}" for v, r in per_variant.items()), file=sys.stderr)
    doc = {
        "context": {
            "library": "torch", "version": torch.__version__, "python": platform.python_version(),
            "parallel_info": torch.__config__.parallel_info().splitlines()[:6],
            "env": {k: os.environ.get(k) for k in TUNED_ENV},
            "has_sdpa": have_sdpa(), "min_time": args.min_time,
            "libraries": loaded_blas(), "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH"),
        },
        "benchmarks": results,
    }
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
