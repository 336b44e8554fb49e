// gpt2-attention demo (demo_command.hpp): the input built (the embedded model's position code, or
// ln_1(wpe[:T]) of a checkpoint), every head's map analysed, the forward timed, the report printed
// and the picture written.
#include "cli_kernels.hpp"  // first: the kernels are compiled once, in kernels.cpp

#include "demo_command.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "gpt2/attention.hpp"
#include "gpt2/layer_norm.hpp"
#include "gpt2/safetensors.hpp"
#include "output_files.hpp"

namespace gpt2::cli {
namespace {

// ---------------------------------------------------------------------------------------------
// Input of a checkpoint: x = ln_1(wpe[:T])
// ---------------------------------------------------------------------------------------------

// `name` or "transformer." + name, whichever the file has; FormatError when neither.
std::string find_tensor(const safetensors::File& file, const std::string& name) {
  if (file.contains(name)) return name;
  if (file.contains("transformer." + name)) return "transformer." + name;
  throw FormatError(file.label() + ": missing tensor '" + name + "' (also looked for 'transformer." +
                    name + "'; " + file.tensor_hint({name, "transformer." + name}) + ")");
}

// x = ln_1(wpe[:T]) [T, C]: the position-only input of layer `layer`.
//   wpe.weight [n_ctx, C] with n_ctx >= T, h.{layer}.ln_1.weight [C], h.{layer}.ln_1.bias [C]
// PyTorch: F.layer_norm(wpe[:T], (C,), ln_1.weight, ln_1.bias, 1e-5)
RowMatrix<float> position_input(const safetensors::File& file, int layer, Index T, Index C) {
  const std::string wpe_name = find_tensor(file, "wpe.weight");
  const std::string ln = "h." + std::to_string(layer) + ".ln_1.";
  const std::string ln_weight_name = find_tensor(file, ln + "weight");
  const std::string ln_bias_name = find_tensor(file, ln + "bias");

  const std::vector<std::int64_t>& wpe_shape = file.tensor(wpe_name).shape;
  if (wpe_shape.size() != 2 || wpe_shape[1] != C)
    throw ShapeError(file.label() + ": " + wpe_name + ": expected shape [n_ctx, " +
                     std::to_string(C) + "], got " + detail::shape_string(wpe_shape));
  if (wpe_shape[0] < T)
    throw ShapeError(file.label() + ": " + wpe_name + ": --tokens " + std::to_string(T) +
                     " exceeds its " + std::to_string(wpe_shape[0]) + " positions");
  detail::check_shape(file.label() + ": " + ln_weight_name, {C}, file.tensor(ln_weight_name).shape);
  detail::check_shape(file.label() + ": " + ln_bias_name, {C}, file.tensor(ln_bias_name).shape);

  const std::vector<float> wpe = file.to_vector<float>(wpe_name);  // explicit copies (any dtype)
  const std::vector<float> ln_weight = file.to_vector<float>(ln_weight_name);
  const std::vector<float> ln_bias = file.to_vector<float>(ln_bias_name);
  RowMatrix<float> x(T, C);
  layer_norm<float>(ConstMatrixMap<float>(wpe.data(), T, C),
                    ConstVectorMap<float>(ln_weight.data(), C),
                    ConstVectorMap<float>(ln_bias.data(), C), kLayerNormEps, x);
  return x;
}

// ---------------------------------------------------------------------------------------------
// Analysis and timing
// ---------------------------------------------------------------------------------------------

// The attention maps of every head on x.   x [T, C] -> probs [n_head * T, T] (head h: rows h*T ..)
RowMatrix<float> head_maps(const AttentionWeights<float>& w, const RowMatrix<float>& x) {
  RowMatrix<float> probs;
  attention(w, x, probs);  // the output itself is not needed here
  return probs;
}

// Statistics of every head.   probs [n_head * T, T] -> n_head HeadStats
std::vector<HeadStats> analyse_heads(const RowMatrix<float>& probs, Index n_head) {
  const Index T_ = probs.cols();
  std::vector<HeadStats> stats;
  for (Index h = 0; h < n_head; ++h)
    stats.push_back(head_stats<float>(probs.middleRows(h * T_, T_)));
  return stats;
}

struct Timing {
  double median_seconds = 0;
  int runs = 0;
  int warmup = 0;
};

// Median wall time of attention_forward on x (no probabilities; one reused Workspace): at least
// kMinTimedRuns runs and kMinTimedSeconds in total, after kWarmupRuns untimed runs.
Timing time_forward(const AttentionWeights<float>& w, const RowMatrix<float>& x) {
  using clock = std::chrono::steady_clock;
  Workspace<float> ws(w.config(), x.rows());
  RowMatrix<float> out(x.rows(), w.n_embd());
  for (int i = 0; i < kWarmupRuns; ++i) attention_forward<float>(w, x, ws, out);
  std::vector<double> seconds;
  double total = 0;
  while ((static_cast<int>(seconds.size()) < kMinTimedRuns || total < kMinTimedSeconds) &&
         static_cast<int>(seconds.size()) < kMaxTimedRuns) {
    const clock::time_point start = clock::now();
    attention_forward<float>(w, x, ws, out);
    seconds.push_back(std::chrono::duration<double>(clock::now() - start).count());
    total += seconds.back();
  }
  std::sort(seconds.begin(), seconds.end());
  const std::size_t n = seconds.size();
  Timing t;
  t.median_seconds = n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
  t.runs = static_cast<int>(n);
  t.warmup = kWarmupRuns;
  return t;
}

// FLOP of one forward: 2*T*C*3C (qkv) + 2*T*C*C (c_proj) + 2*2*n_head*head_dim*T*(T+1)/2
// (q k^T and att v over the causal triangle).
double attention_flop(Index T, Index C, Index n_head, Index head_dim) {
  const double t = static_cast<double>(T), c = static_cast<double>(C);
  return 2 * t * c * 3 * c + 2 * t * c * c +
         2.0 * 2.0 * static_cast<double>(n_head * head_dim) * t * (t + 1) / 2;
}

// ---------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------

struct DemoReport {
  std::string title;           // the model and its input
  AttentionConfig config;
  Index T = 0;
  std::vector<HeadStats> stats;  // one per head
  std::vector<Job> designed;     // the embedded model's intended jobs; empty for a checkpoint
  Timing timing;
  std::string kernels;  // the kernel level the forward ran at (kernel_info().level)
  WeightDtype weights_dtype = WeightDtype::float32;  // of the packed weights (w.weight_dtype())
};

void print_head_table(std::ostream& out, const DemoReport& r) {
  const bool designed = !r.designed.empty();
  out << "head   prev  first   self  mean dist  evenness  job" << (designed ? "             designed" : "")
      << "\n";
  for (std::size_t h = 0; h < r.stats.size(); ++h) {
    const HeadStats& s = r.stats[h];
    out << strprintf("%4zu  %5.3f  %5.3f  %5.3f  %9.2f  %8.3f  ", h, s.prev, s.first, s.self,
                     s.mean_distance, s.evenness);
    if (designed)
      out << strprintf("%-14s  %s", job_name(classify(s)), job_name(r.designed[h]));
    else
      out << job_name(classify(s));
    out << "\n";
  }
}

// "jobs: 3 previous-token, 3 first-token, ..." in the order of the Job enum.
std::string job_summary(const std::vector<HeadStats>& stats) {
  std::string s;
  for (Job job : {Job::previous_token, Job::first_token, Job::self, Job::even, Job::local, Job::mixed}) {
    const auto n = std::count_if(stats.begin(), stats.end(),
                                 [&](const HeadStats& h) { return classify(h) == job; });
    if (n > 0) s += (s.empty() ? "" : ", ") + std::to_string(n) + " " + job_name(job);
  }
  return "jobs: " + s;
}

void print_legend(std::ostream& out, const DemoReport& r) {
  out << strprintf(
      "rows: every column averages query rows t = %td..%td (row 0 sees only itself; in row 1 the "
      "previous token is the first)\n"
      "prev, first, self: attention on key t-1, key 0, key t; mean dist: sum_s P[t,s] (t - s), in "
      "tokens (uniform: about T/4)\n"
      "evenness: entropy of row t / log(t + 1) (1 = uniform over the visible keys)\n"
      "job: the first rule that holds: previous-token, first-token, self if that share >= %.2f; "
      "even if evenness >= %.2f; local if mean dist <= %.1f; else mixed\n",
      kFirstAnalysedRow, r.T - 1, kDominant, kEven, kLocalDistance);
}

void print_timing(std::ostream& out, const DemoReport& r) {
  const Index C = r.config.n_embd, n_head = r.config.n_head, hd = r.config.head_dim();
  const double flop = attention_flop(r.T, C, n_head, hd);
  // float32 weights: no mention (the line as it always was); bf16: ", weights: bf16"
  const std::string weights = r.weights_dtype == WeightDtype::float32
                                  ? std::string()
                                  : std::string(", weights: ") + dtype_name(r.weights_dtype);
  out << strprintf("forward: %.3f ms (median of %d runs after %d warm-up runs), %.2f GFLOP/s, "
                   "kernels: %s%s\n",
                   r.timing.median_seconds * 1e3, r.timing.runs, r.timing.warmup,
                   flop / r.timing.median_seconds * 1e-9, r.kernels.c_str(), weights.c_str());
  out << strprintf(
      "FLOP = 2*T*C*3C + 2*T*C*C + 2*2*n_head*head_dim*T*(T+1)/2 = %.4f GFLOP (T = %td, C = %td, "
      "n_head = %td, head_dim = %td)\n",
      flop * 1e-9, r.T, C, n_head, hd);
}

void print_report(std::ostream& out, const DemoReport& r) {
  out << r.title << "\n\n";
  print_head_table(out, r);
  out << "\n" << job_summary(r.stats) << "\n";
  print_legend(out, r);
  print_timing(out, r);
}

// Writes the maps probs [n_head * T, T] as the picture `path` (all or nothing).
void write_demo_picture(const std::string& path, const RowMatrix<float>& probs, Index n_head,
                        ColourScale scale, const std::string& title) {
  std::vector<unsigned char> png;
  try {
    png = attention_png<float>(probs, n_head, probs.cols(), {Span{0, probs.cols()}},
                               /*batched=*/false, scale, title);
  } catch (const Error& e) {
    throw Error(in_context("png", path, e.what()));
  }
  write_all_or_nothing({{"png", path, [&png](const std::string& p) { return stage_bytes(p, png); }}});
}

// Analyses and times w on x; writes the picture if `png` names one; prints the report.
void demo_report(std::ostream& out, const std::string& title, const std::string& picture_title,
                 const AttentionWeights<float>& w, const RowMatrix<float>& x,
                 const std::vector<Job>& designed, const std::string& png, ColourScale png_scale) {
  DemoReport r;
  r.title = title;
  r.config = w.config();
  r.T = x.rows();
  const RowMatrix<float> probs = head_maps(w, x);
  r.stats = analyse_heads(probs, w.n_head());
  r.designed = designed;
  r.timing = time_forward(w, x);
  r.kernels = kernel_info().level;
  r.weights_dtype = w.weight_dtype();
  if (!png.empty()) write_demo_picture(png, probs, w.n_head(), png_scale, picture_title);
  print_report(out, r);
  if (!png.empty()) out << "picture: " << png << "\n";
}

// ---------------------------------------------------------------------------------------------
// The two sources
// ---------------------------------------------------------------------------------------------

void demo_embedded(const DemoOptions& o, std::ostream& out) {
  if (o.layer != 0)
    throw ConfigError("embedded model: layer " + std::to_string(o.layer) +
                      ": it has only layer 0 (pass --weights FILE for a checkpoint)");
  const Index n_head = o.n_head == 0 ? kDemoEmbd / 64 : o.n_head;
  const DemoModel model = make_demo_model();
  AttentionConfig config{kDemoEmbd, n_head};
  try {
    config.validate();
  } catch (const Error& e) {
    throw ConfigError(std::string("embedded model: ") + e.what());
  }
  const AttentionWeights<float> w = pack_weights(model.weights(n_head), o.weights_dtype);
  std::vector<Job> designed;
  if (n_head == kDemoHeads)
    for (Index h = 0; h < kDemoHeads; ++h) designed.push_back(demo_designed_job(h));
  const std::string title = strprintf(
      "gpt2-attention demo: embedded model (C = %td, %td heads of %td), input x_t = sinusoidal "
      "position code, T = %td",
      kDemoEmbd, n_head, kDemoEmbd / n_head, o.tokens);
  const std::string picture_title =
      strprintf("embedded model, layer 0, x = position code, T = %td", o.tokens);
  demo_report(out, title, picture_title, w, demo_input(o.tokens), designed, o.png, o.png_scale);
}

void demo_checkpoint(const DemoOptions& o, std::ostream& out) {
  const safetensors::File file = open_weights(o.weights);
  const safetensors::LoadedAttention<float> loaded = load_layer<float>(file, o.layer, o.n_head);
  const AttentionWeights<float> w = pack_weights(loaded.weights(), o.weights_dtype);
  RowMatrix<float> x;
  try {
    x = position_input(file, o.layer, o.tokens, w.n_embd());
  } catch (const Error& e) {
    throw Error(in_context("weights", o.weights, e.what()));
  }
  const std::string title = strprintf(
      "gpt2-attention demo: %s, layer %d (C = %td, %td heads of %td), input x = ln_1(wpe[:T]), "
      "T = %td",
      o.weights.c_str(), o.layer, w.n_embd(), w.n_head(), w.head_dim(), o.tokens);
  const std::string picture_title = strprintf("%s, layer %d, x = ln_1(wpe[:T]), T = %td",
                                              o.weights.c_str(), o.layer, o.tokens);
  demo_report(out, title, picture_title, w, x, {}, o.png, o.png_scale);
}

}  // namespace

int demo_command(const Flags& flags, std::ostream& out) {
  const DemoOptions o = parse_demo_options(flags);
  if (o.weights.empty())
    demo_embedded(o, out);
  else
    demo_checkpoint(o, out);
  return 0;
}

}  // namespace gpt2::cli
