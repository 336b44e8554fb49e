// Times ONNX Runtime (CPU, onnxruntime-node) on the suite's prefill and decode names, for
// bench/compare.py. The models are exported at run time by bench/torch_bench.py (not committed):
//
//   /usr/bin/python3 bench/torch_bench.py --export-onnx bench/ort
//   (cd bench/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci)   # CPU binaries ship in the package
//   node bench/ort/ort_bench.mjs [--dir bench/ort] [--filter REGEX] [--min-time 0.5] [--quick] [--spin 1,0] [--out f.json]
//
// prefill.onnx: x[T, 768] -> out[T, 768] (dynamic T). decode.onnx: x[1, 768], past_k/past_v
// [12, past, 64] -> out, present_k, present_v (HF layer_past, concatenated inside the graph).
// One session per thread count (intraOpNumThreads n, interOpNumThreads 1, sequential, all graph
// optimisations). Pool threads spin while idle by default (allow_spinning 1); that is fastest on a
// quiet machine and slowest on a busy one, so --spin lists the settings to time (default 1,0) and the
// faster per name is reported, with the medians of each. Warm-up, then single runs timed with process.hrtime until --min-time seconds and
// at least --min-reps runs; the JSON lists, per name, the median (real_time_ns) and minimum (min_ns).
import * as ort from 'onnxruntime-node';
import { writeFileSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const C = 768, N_HEAD = 12, HEAD_DIM = 64;

function parseArgs(argv) {
  const a = { dir: dirname(fileURLToPath(import.meta.url)), filter: '.', minTime: 0.5, minReps: 10,
              quick: false, out: null, spin: '1,0' };
  for (let i = 0; i < argv.length; ++i) {
    const k = argv[i];
    if (k === '--dir') a.dir = argv[++i];
    else if (k === '--filter') a.filter = argv[++i];
    else if (k === '--min-time') a.minTime = Number(argv[++i]);
    else if (k === '--min-reps') a.minReps = Number(argv[++i]);
    else if (k === '--quick') a.quick = true;
    else if (k === '--out') a.out = argv[++i];
    else if (k === '--spin') a.spin = argv[++i];
    else throw new Error(`unknown argument ${k}`);
  }
  if (a.quick) { a.minTime = Math.min(a.minTime, 0.1); a.minReps = Math.min(a.minReps, 3); }
  return a;
}

function names(quick) {
  const ts = quick ? [64, 1024] : [64, 128, 256, 512, 1024, 2048];
  const pasts = quick ? [1023] : [0, 127, 1023];
  const out = [];
  for (const n of [1, 2]) {
    for (const T of ts) out.push(`prefill/T:${T}/threads:${n}`);
    for (const p of pasts) out.push(`decode/past:${p}/threads:${n}`);
  }
  return out;
}

// Uniform in [-1, 1) from a fixed-seed LCG: the values do not matter for timing, only finiteness.
function random(n, seed) {
  const a = new Float32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; ++i) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    a[i] = s / 2 ** 31 - 1;
  }
  return a;
}

function feeds(name) {
  const [, kind, n] = name.match(/^(prefill|decode)\/(?:T|past):(\d+)/);
  const N = Number(n);
  if (kind === 'prefill') return { kind, feeds: { x: new ort.Tensor('float32', random(N * C, 2), [N, C]) } };
  return {
    kind,
    feeds: {
      x: new ort.Tensor('float32', random(C, 4), [1, C]),
      past_k: new ort.Tensor('float32', random(N_HEAD * N * HEAD_DIM, 3), [N_HEAD, N, HEAD_DIM]),
      past_v: new ort.Tensor('float32', random(N_HEAD * N * HEAD_DIM, 5), [N_HEAD, N, HEAD_DIM]),
    },
  };
}

async function timeRuns(session, input, minTime, minReps) {
  const warm = process.hrtime.bigint();  // one warm-up run, up to three within 0.1 s
  for (let i = 0; i < 3 && (i === 0 || Number(process.hrtime.bigint() - warm) < 1e8); ++i) await session.run(input);
  const samples = [];
  const start = process.hrtime.bigint();
  while (samples.length < minReps || Number(process.hrtime.bigint() - start) < minTime * 1e9) {
    const t0 = process.hrtime.bigint();
    await session.run(input);
    samples.push(Number(process.hrtime.bigint() - t0));
  }
  samples.sort((x, y) => x - y);
  const m = samples.length;
  const median = m % 2 ? samples[(m - 1) / 2] : (samples[m / 2 - 1] + samples[m / 2]) / 2;
  return { median, min: samples[0], reps: m };
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const re = new RegExp(args.filter);
  const sessions = new Map();
  const session = async (kind, threads, spin) => {
    const key = `${kind}/${threads}/${spin}`;
    if (!sessions.has(key)) {
      sessions.set(key, await ort.InferenceSession.create(join(args.dir, `${kind}.onnx`), {
        executionProviders: ['cpu'], intraOpNumThreads: threads, interOpNumThreads: 1,
        executionMode: 'sequential', graphOptimizationLevel: 'all',
        extra: { session: { intra_op: { allow_spinning: spin } } },
      }));
    }
    return sessions.get(key);
  };
  const results = [];
  for (const name of names(args.quick)) {
    if (!re.test(name)) continue;
    const threads = Number(name.split(':').pop());
    const { kind, feeds: input } = feeds(name);
    const perSpin = {};
    for (const spin of args.spin.split(',')) {
      perSpin[spin] = await timeRuns(await session(kind, threads, spin), input, args.minTime, args.minReps);
    }
    const best = Object.keys(perSpin).reduce((a, b) => (perSpin[b].median < perSpin[a].median ? b : a));
    const r = perSpin[best];
    results.push({ name, variant: `allow_spinning=${best}`, real_time_ns: r.median, min_ns: r.min,
                   repetitions: r.reps,
                   variants_median_ns: Object.fromEntries(Object.entries(perSpin).map(([k, v]) => [`allow_spinning=${k}`, v.median])) });
    process.stderr.write(`${name.padEnd(32)} spin=${best} median ${(r.median / 1e6).toFixed(3).padStart(8)} ms  ` +
                         `min ${(r.min / 1e6).toFixed(3).padStart(8)} ms  ` +
                         Object.entries(perSpin).map(([k, v]) => `spin=${k}: ${(v.median / 1e6).toFixed(3)}`).join('  ') + '\n');
  }
  const doc = {
    context: { library: 'onnxruntime-node', version: ort.env.versions?.node ?? 'unknown',
               node: process.version, min_time: args.minTime, allow_spinning: args.spin },
    benchmarks: results,
  };
  const text = JSON.stringify(doc, null, 1);
  if (args.out) writeFileSync(args.out, text + '\n');
  else process.stdout.write(text + '\n');
}

main().catch((e) => { console.error(e); process.exit(1); });
