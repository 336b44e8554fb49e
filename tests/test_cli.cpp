// Tests of the gpt2-attention command-line tool (examples/cli). Each test runs the built binary
// (GPT2_CLI_PATH) with fork/exec in its own temporary directory, with stdout and stderr captured
// to files kept elsewhere, and checks the files it writes against the library, its exit status and
// its one-line error messages. Output paths that are symbolic links, FIFOs, directories or other
// flags' files are all made inside that directory.
//
// Tolerances: the CLI and these tests call the same library functions on the same data, so the
// results are normally bitwise equal; but they are two separately compiled programs, and the
// compiler may contract or order floating-point operations differently in each, so the comparison
// allows max|diff| <= 1e-6 * max|expected| in float (about 8 ulp of the largest value) and 1e-12 *
// max|expected| in double (a margin far below any real error, far above reordering noise).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <stb_image.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/npy.hpp"
#include "gpt2/safetensors.hpp"
#include "attention_picture.hpp"  // examples/cli: where the picture puts each map, and its colours
#include "support/compare.hpp"
#include "support/sanitizers.hpp"
#include "support/tmpdir.hpp"

#ifndef GPT2_CLI_PATH
#error "GPT2_CLI_PATH must name the gpt2-attention executable"
#endif

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::RowVector;

constexpr Index kC = 64;       // n_embd of the synthetic layers
constexpr Index kHeads = 4;    // passed with --n-head (the default would be C / 64 = 1)
constexpr Index kT = 9;        // tokens of the synthetic input
constexpr double kFloatTol = 1e-6;
constexpr double kDoubleTol = 1e-12;

// ---------------------------------------------------------------------------------------------
// Files and processes
// ---------------------------------------------------------------------------------------------

using gpt2::test::read_text;
using gpt2::test::TempDir;
using gpt2::test::write_text;

struct CliResult {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
  double seconds = 0;  // wall time from fork to exit
};

// AddressSanitizer (the asan preset) reserves terabytes of address space for its shadow memory
// and aborts on an allocation it cannot serve, so under it no address-space limit is set and the
// test that needs a failing allocation is skipped.
using gpt2::test::kAddressSanitizer;

// The address space (RLIMIT_AS) allowed to the CLI in the tests of what a run may allocate: far
// above what a run on these small inputs needs, far below any buffer sized by a huge B or T.
// None under AddressSanitizer.
constexpr rlim_t kSmallAddressSpace = kAddressSanitizer ? 0 : rlim_t{512} << 20;

// How run_cli connects the CLI's stdout.
enum class Stdout {
  File,        // a file in another directory, read back into CliResult::out
  ClosedPipe,  // a pipe nobody reads (SIGPIPE ignored): every write fails with EPIPE
};

// Runs the CLI with `args` in directory `cwd`; stdout and stderr go to files in another directory,
// so that `cwd` holds only what the CLI itself writes. A run that takes over two minutes (a hang,
// e.g. on a FIFO) is killed and reported as status -2. address_space > 0: the child's RLIMIT_AS,
// so that an allocation beyond it fails (std::bad_alloc) instead of succeeding or swapping.
// launcher: a program (absolute path) and its arguments that start the CLI, e.g. mpiexec -n 2.
// env: NAME=VALUE entries added to the child's environment.
CliResult run_cli(const std::vector<std::string>& args, const std::string& cwd,
                  Stdout stdout_to = Stdout::File, rlim_t address_space = 0,
                  const std::vector<std::string>& launcher = {},
                  std::vector<std::string> env = {}) {
  const TempDir logs("gpt2-cli");
  const std::string out_path = logs.file("stdout"), err_path = logs.file("stderr");
  std::vector<std::string> argv_strings = launcher;
  argv_strings.push_back(GPT2_CLI_PATH);
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int pipe_fds[2] = {-1, -1};
  if (stdout_to == Stdout::ClosedPipe) {
    if (::pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
    ::close(pipe_fds[0]);  // no reader, before the child can write
  }
  const auto started = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    const int out = stdout_to == Stdout::ClosedPipe
                        ? pipe_fds[1]
                        : ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0 || ::chdir(cwd.c_str()) != 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0)
      ::_exit(127);
    if (stdout_to == Stdout::ClosedPipe) ::signal(SIGPIPE, SIG_IGN);  // kept across exec
    if (address_space > 0) {
      const rlimit limit{address_space, address_space};
      if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(127);
    }
    for (std::string& e : env) ::putenv(e.data());
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (pipe_fds[1] >= 0) ::close(pipe_fds[1]);
  int wstatus = 0;
  CliResult r;
  for (int waited_ms = 0;; waited_ms += 5) {
    const pid_t done = ::waitpid(pid, &wstatus, WNOHANG);
    if (done < 0 && errno != EINTR) throw std::runtime_error("waitpid failed");
    if (done == pid) {
      r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
      break;
    }
    if (waited_ms > 120000) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &wstatus, 0);
      ADD_FAILURE() << "gpt2-attention did not finish within two minutes: killed";
      r.status = -2;
      break;
    }
    ::usleep(5000);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (stdout_to == Stdout::File) r.out = read_text(out_path);
  r.err = read_text(err_path);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Synthetic checkpoints
// ---------------------------------------------------------------------------------------------

struct Tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;  // stored as F32
};

// A safetensors file with the tensors in order (header padded with spaces to 8 bytes).
void write_safetensors(const std::string& path, const std::vector<Tensor>& tensors) {
  std::string header = "{", data;
  for (const Tensor& t : tensors) {
    std::string shape;
    for (std::size_t i = 0; i < t.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(t.shape[i]);
    const std::size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
    header += (header.size() > 1 ? "," : "") + std::string("\"") + t.name +
              "\":{\"dtype\":\"F32\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(begin) + "," + std::to_string(data.size()) + "]}";
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  write_text(path, bytes + header + data);
}

RowMatrix<float> random_matrix(std::mt19937& rng, Index rows, Index cols, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  RowMatrix<float> m(rows, cols);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
  return m;
}

std::vector<float> values(const RowMatrix<float>& m) { return {m.data(), m.data() + m.size()}; }

// One attention sublayer's weights (float, as stored in the file).
struct Layer {
  RowMatrix<float> c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias;  // biases [1, n]

  static Layer random(unsigned seed) {
    std::mt19937 rng(seed);
    Layer l;
    l.c_attn_weight = random_matrix(rng, kC, 3 * kC, 0.3f);
    l.c_attn_bias = random_matrix(rng, 1, 3 * kC, 0.1f);
    l.c_proj_weight = random_matrix(rng, kC, kC, 0.2f);
    l.c_proj_bias = random_matrix(rng, 1, kC, 0.1f);
    return l;
  }

  // The four tensors under `prefix` (e.g. "h.0.attn." or "transformer.h.0.attn.").
  std::vector<Tensor> tensors(const std::string& prefix) const {
    return {{prefix + "c_attn.weight", {kC, 3 * kC}, values(c_attn_weight)},
            {prefix + "c_attn.bias", {3 * kC}, values(c_attn_bias)},
            {prefix + "c_proj.weight", {kC, kC}, values(c_proj_weight)},
            {prefix + "c_proj.bias", {kC}, values(c_proj_bias)}};
  }

  // The library's output (and probabilities) in precision T, weights converted to T.
  template <class T>
  RowMatrix<T> forward(const RowMatrix<T>& x, Index n_head, RowMatrix<T>* probs = nullptr) const {
    const RowMatrix<T> cw = c_attn_weight.cast<T>(), cb = c_attn_bias.cast<T>(),
                       pw = c_proj_weight.cast<T>(), pb = c_proj_bias.cast<T>();
    const gpt2::AttentionWeights<T> w(gpt2::make_config(kC, n_head), gpt2::view(cw),
                                      gpt2::ConstVectorMap<T>(cb.data(), cb.size()), gpt2::view(pw),
                                      gpt2::ConstVectorMap<T>(pb.data(), pb.size()));
    return probs ? gpt2::attention(w, x, *probs) : gpt2::attention(w, x);
  }

  // The library's float output through a KVCacheBF16, all of x in one chunk.
  RowMatrix<float> forward_bf16_cache(const RowMatrix<float>& x, Index n_head) const {
    return forward_through<gpt2::KVCacheBF16>(x, n_head);
  }
  // The same through an int8 cache (KVCacheInt8), with the weights as they are or packed in int8.
  RowMatrix<float> forward_int8_cache(const RowMatrix<float>& x, Index n_head,
                                      bool int8_weights = false) const {
    return forward_through<gpt2::KVCacheInt8>(x, n_head, int8_weights);
  }
  template <class Cache>
  RowMatrix<float> forward_through(const RowMatrix<float>& x, Index n_head, bool int8_weights = false) const {
    const gpt2::AttentionWeights<float> views(
        gpt2::make_config(kC, n_head), gpt2::view(c_attn_weight),
        gpt2::ConstVectorMap<float>(c_attn_bias.data(), c_attn_bias.size()), gpt2::view(c_proj_weight),
        gpt2::ConstVectorMap<float>(c_proj_bias.data(), c_proj_bias.size()));
    const gpt2::AttentionWeights<float> w =
        int8_weights ? gpt2::pack_weights(views, gpt2::WeightDtype::int8) : views;
    Cache cache(w.config(), x.rows());
    gpt2::Workspace<float> ws(w.config());
    RowMatrix<float> out(x.rows(), kC);
    gpt2::attention_forward<float>(w, x, cache, ws, out);
    return out;
  }
};

// Reads a .npy file, checking its dtype and shape.
template <class T>
std::vector<T> read_npy(const std::string& path, const std::vector<std::int64_t>& shape) {
  const gpt2::npy::Array a = gpt2::npy::read(path);
  EXPECT_EQ(a.dtype, gpt2::npy::dtype_of<T>()) << path;
  EXPECT_EQ(a.shape, shape) << path;
  return a.to_vector<T>();
}

template <class T>
RowMatrix<T> read_npy_matrix(const std::string& path, Index rows, Index cols) {
  const std::vector<T> v = read_npy<T>(path, {rows, cols});
  if (static_cast<Index>(v.size()) != rows * cols) return RowMatrix<T>();
  return Eigen::Map<const RowMatrix<T>>(v.data(), rows, cols);
}

// A float32 (dtype "f32") or float64 ("f64") .npy of `shape` as double, its leading dimensions
// flattened: [T, C] -> [T, C], [B, T, C] -> [B * T, C], [n_head, T, T] -> [n_head * T, T].
RowMatrix<double> read_matrix_as_double(const std::string& path, const std::string& dtype,
                                        const std::vector<std::int64_t>& shape) {
  const Index cols = static_cast<Index>(shape.back());
  Index rows = 1;
  for (std::size_t i = 0; i + 1 < shape.size(); ++i) rows *= static_cast<Index>(shape[i]);
  if (dtype == "f32") {
    const std::vector<float> v = read_npy<float>(path, shape);
    if (static_cast<Index>(v.size()) != rows * cols) return RowMatrix<double>();
    return Eigen::Map<const RowMatrix<float>>(v.data(), rows, cols).cast<double>();
  }
  const std::vector<double> v = read_npy<double>(path, shape);
  if (static_cast<Index>(v.size()) != rows * cols) return RowMatrix<double>();
  return Eigen::Map<const RowMatrix<double>>(v.data(), rows, cols);
}

// ---------------------------------------------------------------------------------------------
// Fixture: a directory holding w.safetensors (layers 0 and 1) and x.npy [kT, kC]
// ---------------------------------------------------------------------------------------------

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<Tensor> tensors = layer0.tensors("h.0.attn.");
    for (Tensor& t : layer1.tensors("h.1.attn.")) tensors.push_back(std::move(t));
    write_safetensors(file("w.safetensors"), tensors);
    gpt2::npy::write<float>(file("x.npy"), x);
  }

  std::string file(const std::string& name) const { return dir.file(name); }
  CliResult cli(const std::vector<std::string>& args, Stdout stdout_to = Stdout::File,
                rlim_t address_space = 0) const {
    return run_cli(args, dir.path_string(), stdout_to, address_space);
  }
  // The CLI with GPT2_ATTENTION_ISA=level (unset when empty) in its environment.
  CliResult cli_at(const std::string& level, const std::vector<std::string>& args) const {
    std::vector<std::string> env;
    if (!level.empty()) env.push_back("GPT2_ATTENTION_ISA=" + level);
    return run_cli(args, dir.path_string(), Stdout::File, 0, {}, env);
  }
  // The CLI under `launcher` (e.g. mpiexec -n 2 --oversubscribe).
  CliResult cli_under(const std::vector<std::string>& launcher,
                      const std::vector<std::string>& args) const {
    return run_cli(args, dir.path_string(), Stdout::File, 0, launcher);
  }
  // The CLI in kSmallAddressSpace.
  CliResult cli_small(const std::vector<std::string>& args) const {
    return cli(args, Stdout::File, kSmallAddressSpace);
  }

  // run --weights w.safetensors --input x.npy --output y.npy --n-head 4, plus `extra`.
  CliResult run_default(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", "x.npy",
                                     "--output", "y.npy", "--n-head", std::to_string(kHeads)};
    args.insert(args.end(), extra.begin(), extra.end());
    return cli(args);
  }

  TempDir dir{"gpt2-cli"};
  Layer layer0 = Layer::random(1), layer1 = Layer::random(2);
  RowMatrix<float> x = [] {
    std::mt19937 rng(3);
    return random_matrix(rng, kT, kC, 1.0f);
  }();
};

// Exit status 0 and nothing on stderr. `r` is evaluated once: it is often the run itself.
#define EXPECT_SUCCESS(r)                                          \
  do {                                                             \
    const CliResult& expect_success_result = (r);                  \
    EXPECT_EQ(expect_success_result.status, 0)                     \
        << "stderr: " << expect_success_result.err;                \
    EXPECT_EQ(expect_success_result.err, "");                      \
  } while (0)

// ---------------------------------------------------------------------------------------------
// run: results
// ---------------------------------------------------------------------------------------------

TEST_F(CliTest, RunFloatMatchesLibrary) {
  const CliResult r = run_default();
  EXPECT_SUCCESS(r);
  const RowMatrix<float> y = read_npy_matrix<float>(file("y.npy"), kT, kC);
  EXPECT_TRUE(gpt2::test::near(y, layer0.forward<float>(x, kHeads), kFloatTol));
}

TEST_F(CliTest, RunDefaultHeadCountIsEmbdOver64) {
  const CliResult r = cli({"run", "--weights", "w.safetensors", "--input", "x.npy", "--output", "y.npy"});
  EXPECT_SUCCESS(r);
  const RowMatrix<float> y = read_npy_matrix<float>(file("y.npy"), kT, kC);
  EXPECT_TRUE(gpt2::test::near(y, layer0.forward<float>(x, kC / 64), kFloatTol));
  EXPECT_FALSE(gpt2::test::near(y, layer0.forward<float>(x, kHeads), kFloatTol));
}

TEST_F(CliTest, RunDoubleComputesInDouble) {
  const CliResult r = run_default({"--dtype", "f64"});
  EXPECT_SUCCESS(r);
  const RowMatrix<double> y = read_npy_matrix<double>(file("y.npy"), kT, kC);
  const RowMatrix<double> expected = layer0.forward<double>(x.cast<double>(), kHeads);
  EXPECT_TRUE(gpt2::test::near(y, expected, kDoubleTol));
  // Really double: the float result differs from it by far more than the tolerance.
  EXPECT_FALSE(gpt2::test::near(layer0.forward<float>(x, kHeads).cast<double>(), expected, kDoubleTol));
}

TEST_F(CliTest, RunProbsShapeRowsAndValues) {
  for (const std::string dtype : {"f32", "f64"}) {
    SCOPED_TRACE("--dtype " + dtype);
    const CliResult r = run_default({"--probs", "p.npy", "--dtype", dtype});
    EXPECT_SUCCESS(r);
    RowMatrix<double> probs;  // [n_head * T, T]
    if (dtype == "f32") {
      const std::vector<float> p = read_npy<float>(file("p.npy"), {kHeads, kT, kT});
      RowMatrix<float> expected;
      layer0.forward<float>(x, kHeads, &expected);
      ASSERT_EQ(static_cast<Index>(p.size()), expected.size());
      probs = Eigen::Map<const RowMatrix<float>>(p.data(), kHeads * kT, kT).cast<double>();
      EXPECT_TRUE(gpt2::test::near(probs, expected.cast<double>(), kFloatTol));
    } else {
      const std::vector<double> p = read_npy<double>(file("p.npy"), {kHeads, kT, kT});
      RowMatrix<double> expected;
      layer0.forward<double>(x.cast<double>(), kHeads, &expected);
      ASSERT_EQ(static_cast<Index>(p.size()), expected.size());
      probs = Eigen::Map<const RowMatrix<double>>(p.data(), kHeads * kT, kT);
      EXPECT_TRUE(gpt2::test::near(probs, expected, kDoubleTol));
    }
    for (Index row = 0; row < probs.rows(); ++row) {
      const Index t = row % kT;
      EXPECT_NEAR(probs.row(row).sum(), 1.0, 1e-5) << "row " << row;
      for (Index s = t + 1; s < kT; ++s) EXPECT_EQ(probs(row, s), 0.0) << "row " << row << " key " << s;
    }
  }
}

TEST_F(CliTest, RunLayerPicksTheLayersTensors) {
  const CliResult r = run_default({"--layer", "1"});
  EXPECT_SUCCESS(r);
  const RowMatrix<float> y = read_npy_matrix<float>(file("y.npy"), kT, kC);
  EXPECT_TRUE(gpt2::test::near(y, layer1.forward<float>(x, kHeads), kFloatTol));
  EXPECT_FALSE(gpt2::test::near(y, layer0.forward<float>(x, kHeads), kFloatTol));
}

TEST_F(CliTest, RunAcceptsTheTransformerPrefix) {
  write_safetensors(file("hf.safetensors"), layer1.tensors("transformer.h.0.attn."));
  const CliResult r = cli({"run", "--weights", "hf.safetensors", "--input", "x.npy", "--output",
                           "y.npy", "--n-head", "4"});
  EXPECT_SUCCESS(r);
  const RowMatrix<float> y = read_npy_matrix<float>(file("y.npy"), kT, kC);
  EXPECT_TRUE(gpt2::test::near(y, layer1.forward<float>(x, kHeads), kFloatTol));
}

TEST_F(CliTest, RunFloat64InputIsComputedInFloat) {
  const RowMatrix<double> x64 = x.cast<double>() * (1.0 + 1e-9);  // not representable in float
  gpt2::npy::write<double>(file("x64.npy"), x64);
  const CliResult r = cli({"run", "--weights", "w.safetensors", "--input", "x64.npy", "--output",
                           "y.npy", "--n-head", "4"});
  EXPECT_SUCCESS(r);
  const RowMatrix<float> y = read_npy_matrix<float>(file("y.npy"), kT, kC);
  EXPECT_TRUE(gpt2::test::near(y, layer0.forward<float>(x64.cast<float>(), kHeads), kFloatTol));
}

TEST_F(CliTest, RunEmptySequenceGivesAnEmptyOutput) {
  gpt2::npy::write<float>(file("x0.npy"), RowMatrix<float>(0, kC));
  const CliResult r = cli({"run", "--weights", "w.safetensors", "--input", "x0.npy", "--output",
                           "y.npy", "--n-head", "4", "--probs", "p.npy"});
  EXPECT_SUCCESS(r);
  EXPECT_TRUE(read_npy<float>(file("y.npy"), {0, kC}).empty());
  EXPECT_TRUE(read_npy<float>(file("p.npy"), {kHeads, 0, 0}).empty());
}

TEST_F(CliTest, RunAcceptsFlagEqualsValue) {
  EXPECT_SUCCESS(run_default({"--layer", "1", "--probs", "p.npy"}));
  const CliResult r = cli({"run", "--weights=w.safetensors", "--layer=1", "--input=x.npy",
                           "--output=y2.npy", "--n-head=4", "--dtype=f32", "--probs=p2.npy"});
  EXPECT_SUCCESS(r);
  EXPECT_EQ(read_text(file("y2.npy")), read_text(file("y.npy")));
  EXPECT_EQ(read_text(file("p2.npy")), read_text(file("p.npy")));
}

// ---------------------------------------------------------------------------------------------
// run --prefill: through a KV cache
// ---------------------------------------------------------------------------------------------

// Y and P of `run --prefill N` against a plain run: byte-identical for every N in float at the
// vector levels (row-exact projections and attention core), and for N >= T (one chunk) always;
// within the file's tolerance otherwise (the generic level's and double's projections run Eigen's
// kernels, whose one-row products round differently: measured max |diff| / max |plain| on these
// inputs, any N < T, Y 2.2e-16, P 1.7e-16 in double).
bool row_exact_cli(const std::string& dtype) {
  return dtype == "f32" && gpt2::active_isa() != gpt2::Isa::generic;
}

TEST_F(CliTest, RunPrefillMatchesThePlainRun) {
  for (const std::string dtype : {"f32", "f64"}) {
    ASSERT_EQ(run_default({"--probs", "p.npy", "--dtype", dtype}).status, 0);
    const double tol = dtype == "f32" ? kFloatTol : kDoubleTol;
    const RowMatrix<double> y = read_matrix_as_double(file("y.npy"), dtype, {kT, kC});
    const RowMatrix<double> p = read_matrix_as_double(file("p.npy"), dtype, {kHeads, kT, kT});
    for (const Index n : {Index{0}, Index{1}, kT - 1, kT, kT + 5}) {
      SCOPED_TRACE("--dtype " + dtype + " --prefill " + std::to_string(n));
      const CliResult r = cli({"run", "--weights", "w.safetensors", "--input", "x.npy", "--output",
                               "yc.npy", "--n-head", "4", "--probs", "pc.npy", "--dtype", dtype,
                               "--prefill", std::to_string(n)});
      EXPECT_SUCCESS(r);
      if (n >= kT || row_exact_cli(dtype)) {
        EXPECT_EQ(read_text(file("yc.npy")), read_text(file("y.npy")));
        EXPECT_EQ(read_text(file("pc.npy")), read_text(file("p.npy")));
      } else {
        EXPECT_TRUE(gpt2::test::near(read_matrix_as_double(file("yc.npy"), dtype, {kT, kC}), y, tol));
        const RowMatrix<double> pc = read_matrix_as_double(file("pc.npy"), dtype, {kHeads, kT, kT});
        EXPECT_TRUE(gpt2::test::near(pc, p, tol));
        for (Index row = 0; row < pc.rows(); ++row)  // the chunks' maps were placed right
          for (Index s = row % kT + 1; s < kT; ++s) EXPECT_EQ(pc(row, s), 0.0) << row << ", " << s;
      }
    }
  }
}

TEST_F(CliTest, RunPrefillWithoutProbsAndOnAnEmptySequence) {
  ASSERT_EQ(run_default().status, 0);
  EXPECT_SUCCESS(cli({"run", "--weights", "w.safetensors", "--input", "x.npy", "--output", "yc.npy",
                      "--n-head", "4", "--prefill", "3"}));
  EXPECT_TRUE(gpt2::test::near(read_npy_matrix<float>(file("yc.npy"), kT, kC),
                               read_npy_matrix<float>(file("y.npy"), kT, kC), kFloatTol));

  gpt2::npy::write<float>(file("x0.npy"), RowMatrix<float>(0, kC));
  EXPECT_SUCCESS(cli({"run", "--weights", "w.safetensors", "--input", "x0.npy", "--output", "y.npy",
                      "--n-head", "4", "--prefill", "2", "--probs", "p.npy"}));
  EXPECT_TRUE(read_npy<float>(file("y.npy"), {0, kC}).empty());
  EXPECT_TRUE(read_npy<float>(file("p.npy"), {kHeads, 0, 0}).empty());
}

// ---------------------------------------------------------------------------------------------
// run --dtype bf16: float32 files, c_attn.weight and c_proj.weight packed in bfloat16
// ---------------------------------------------------------------------------------------------

// x rounded to the nearest bfloat16 (ties to even), as a float: written here from the definition
// (the nearer of the two bf16 values around x, compared in double), not with the library's bit
// trick. For the finite values of these tests.
float round_to_bf16(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t toward_zero = u & 0xFFFF0000u, away = toward_zero + 0x10000u;
  float a = 0, b = 0;
  std::memcpy(&a, &toward_zero, sizeof a);
  std::memcpy(&b, &away, sizeof b);
  const double da = std::abs(static_cast<double>(x) - a), db = std::abs(static_cast<double>(b) - x);
  if (da != db) return da < db ? a : b;
  return (toward_zero & 0x10000u) == 0 ? a : b;  // a tie: the even one
}

RowMatrix<float> rounded_to_bf16(const RowMatrix<float>& m) {
  RowMatrix<float> r(m.rows(), m.cols());
  for (Index i = 0; i < m.size(); ++i) r.data()[i] = round_to_bf16(m.data()[i]);
  return r;
}

// The layer with its two weights rounded to bf16 (biases as they are): what --dtype bf16 computes
// with at the levels that widen the weights to float32 (generic, avx2, avx512).
Layer bf16_weights(const Layer& l) {
  Layer r = l;
  r.c_attn_weight = rounded_to_bf16(l.c_attn_weight);
  r.c_proj_weight = rounded_to_bf16(l.c_proj_weight);
  return r;
}

// max |actual - expected| / max |expected|.
double relative_max_error(const RowMatrix<double>& actual, const RowMatrix<double>& expected) {
  if (actual.rows() != expected.rows() || actual.cols() != expected.cols() || expected.size() == 0)
    return std::numeric_limits<double>::infinity();
  return (actual - expected).cwiseAbs().maxCoeff() / expected.cwiseAbs().maxCoeff();
}

// The bound of --dtype bf16 against f32 that these tests (and the CLI's documentation) hold:
// max |Y_bf16 - Y_f32| <= 1e-2 max |Y_f32|, and |P_bf16 - P_f32| <= 5e-2 (absolute).
constexpr double kBf16Tol = 1e-2;
constexpr double kBf16ProbsTol = 5e-2;

// Whether a level computes bf16 products on bf16 activations (the instructions need them) rather
// than widening the bf16 weights to float32.
bool rounds_activations(const std::string& level) { return level == "avx512_bf16" || level == "amx"; }

std::vector<std::string> available_levels() {
  std::vector<std::string> levels;
  for (const gpt2::Isa isa : gpt2::available_isas()) levels.push_back(gpt2::isa_name(isa));
  return levels;
}

// At every level: float32 files of the f32 shapes; Y within kBf16Tol of the f32 run at the same
// level and not equal to it (the weights really were rounded); P rows are causal and sum to 1,
// within kBf16ProbsTol of f32's. Where the weights are widened (generic, avx2, avx512), Y and P are
// the float32 sublayer on the bf16-rounded weights, within the float tolerance; where activations
// are rounded too (avx512_bf16, amx) they are not.
TEST_F(CliTest, RunBf16IsCloseToFloat32AndReallyBf16) {
  RowMatrix<float> probs_rounded;
  const RowMatrix<double> y_rounded =
      bf16_weights(layer0).forward<float>(x, kHeads, &probs_rounded).cast<double>();
  for (const std::string& level : available_levels()) {
    SCOPED_TRACE("GPT2_ATTENTION_ISA=" + level);
    const std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", "x.npy",
                                           "--n-head", "4"};
    std::vector<std::string> f32 = args, bf16 = args;
    f32.insert(f32.end(), {"--output", "y.npy", "--probs", "p.npy"});
    bf16.insert(bf16.end(), {"--output", "yb.npy", "--probs", "pb.npy", "--dtype", "bf16"});
    EXPECT_SUCCESS(cli_at(level, f32));
    EXPECT_SUCCESS(cli_at(level, bf16));
    const RowMatrix<double> y = read_matrix_as_double(file("y.npy"), "f32", {kT, kC});
    const RowMatrix<double> yb = read_matrix_as_double(file("yb.npy"), "f32", {kT, kC});
    const RowMatrix<double> p = read_matrix_as_double(file("p.npy"), "f32", {kHeads, kT, kT});
    const RowMatrix<double> pb = read_matrix_as_double(file("pb.npy"), "f32", {kHeads, kT, kT});
    ASSERT_EQ(yb.rows(), kT);
    ASSERT_EQ(pb.rows(), kHeads * kT);
    const double err = relative_max_error(yb, y);
    std::printf("(--dtype bf16 at %s: max |Y - Y_f32| / max |Y_f32| = %.2e, max |P - P_f32| = %.2e)\n",
                level.c_str(), err, (pb - p).cwiseAbs().maxCoeff());
    EXPECT_LE(err, kBf16Tol);
    EXPECT_NE(read_text(file("yb.npy")), read_text(file("y.npy"))) << "bf16 gave the f32 bytes";
    EXPECT_LE((pb - p).cwiseAbs().maxCoeff(), kBf16ProbsTol);
    for (Index row = 0; row < pb.rows(); ++row) {
      EXPECT_NEAR(pb.row(row).sum(), 1.0, 1e-5) << "row " << row;
      for (Index s = row % kT + 1; s < kT; ++s) EXPECT_EQ(pb(row, s), 0.0) << "row " << row << " key " << s;
    }
    if (rounds_activations(level)) {
      EXPECT_FALSE(gpt2::test::near(yb, y_rounded, kFloatTol)) << "the activations were not rounded";
    } else {
      EXPECT_TRUE(gpt2::test::near(yb, y_rounded, kFloatTol));
      EXPECT_TRUE(gpt2::test::near(pb, probs_rounded.cast<double>(), kFloatTol));
    }
  }
}

// The same with a float64 input (converted to float32, as f32 does) and on an empty sequence.
TEST_F(CliTest, RunBf16ReadsFloat64AndEmptyInputs) {
  gpt2::npy::write<double>(file("x64.npy"), RowMatrix<double>(x.cast<double>()));
  EXPECT_SUCCESS(run_default({"--dtype", "bf16", "--probs", "p.npy"}));
  const std::string y = read_text(file("y.npy")), p = read_text(file("p.npy"));
  EXPECT_SUCCESS(cli({"run", "--weights", "w.safetensors", "--input", "x64.npy", "--output", "y.npy",
                      "--n-head", "4", "--dtype", "bf16", "--probs", "p.npy"}));
  EXPECT_EQ(read_text(file("y.npy")), y);
  EXPECT_EQ(read_text(file("p.npy")), p);

  gpt2::npy::write<float>(file("x0.npy"), RowMatrix<float>(0, kC));
  EXPECT_SUCCESS(cli({"run", "--weights", "w.safetensors", "--input", "x0.npy", "--output", "y.npy",
                      "--n-head", "4", "--dtype", "bf16", "--probs", "p.npy", "--prefill", "2"}));
  EXPECT_TRUE(read_npy<float>(file("y.npy"), {0, kC}).empty());
  EXPECT_TRUE(read_npy<float>(file("p.npy"), {kHeads, 0, 0}).empty());
}

// run --dtype bf16 --prefill N against run --dtype bf16, at every level: the same bytes (Y and P)
// at every level but generic, whose projections agree only to float rounding (as in f32, see
// row_exact_cli), and for N >= T (one chunk) always.
TEST_F(CliTest, RunBf16PrefillMatchesThePlainRun) {
  for (const std::string& level : available_levels()) {
    const std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", "x.npy",
                                           "--n-head", "4", "--dtype", "bf16"};
    std::vector<std::string> plain = args;
    plain.insert(plain.end(), {"--output", "y.npy", "--probs", "p.npy"});
    ASSERT_EQ(cli_at(level, plain).status, 0);
    const RowMatrix<double> y = read_matrix_as_double(file("y.npy"), "f32", {kT, kC});
    const RowMatrix<double> p = read_matrix_as_double(file("p.npy"), "f32", {kHeads, kT, kT});
    for (const Index n : {Index{0}, Index{1}, Index{4}, kT - 1, kT, kT + 5}) {
      SCOPED_TRACE("GPT2_ATTENTION_ISA=" + level + " --dtype bf16 --prefill " + std::to_string(n));
      std::vector<std::string> prefill = args;
      prefill.insert(prefill.end(), {"--output", "yc.npy", "--probs", "pc.npy", "--prefill", std::to_string(n)});
      EXPECT_SUCCESS(cli_at(level, prefill));
      if (n >= kT || level != "generic") {
        EXPECT_EQ(read_text(file("yc.npy")), read_text(file("y.npy")));
        EXPECT_EQ(read_text(file("pc.npy")), read_text(file("p.npy")));
      } else {
        EXPECT_TRUE(gpt2::test::near(read_matrix_as_double(file("yc.npy"), "f32", {kT, kC}), y, kFloatTol));
        EXPECT_TRUE(gpt2::test::near(read_matrix_as_double(file("pc.npy"), "f32", {kHeads, kT, kT}), p, kFloatTol));
      }
    }
  }
}

// run --dtype int8 (docs/int8.md) at every level: Y within kInt8Tol of the f32 run and not equal
// to it, P rows causal and summing to 1; and --prefill N gives the same bytes (Y and P) at every
// level but generic (whose attention orders its sums by shape), as bf16 does.
constexpr double kInt8Tol = 2e-2;
TEST_F(CliTest, RunInt8IsCloseToFloat32AndPrefillMatches) {
  for (const std::string& level : available_levels()) {
    const std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", "x.npy",
                                           "--n-head", "4"};
    std::vector<std::string> f32 = args, int8 = args;
    f32.insert(f32.end(), {"--output", "y.npy"});
    int8.insert(int8.end(), {"--output", "y8.npy", "--probs", "p8.npy", "--dtype", "int8"});
    ASSERT_EQ(cli_at(level, f32).status, 0);
    ASSERT_EQ(cli_at(level, int8).status, 0);
    const RowMatrix<double> y = read_matrix_as_double(file("y.npy"), "f32", {kT, kC});
    const RowMatrix<double> y8 = read_matrix_as_double(file("y8.npy"), "f32", {kT, kC});
    const RowMatrix<double> p8 = read_matrix_as_double(file("p8.npy"), "f32", {kHeads, kT, kT});
    const double err = relative_max_error(y8, y);
    std::printf("(--dtype int8 at %s: max |Y - Y_f32| / max |Y_f32| = %.2e)\n", level.c_str(), err);
    EXPECT_LE(err, kInt8Tol) << level;
    EXPECT_NE(read_text(file("y8.npy")), read_text(file("y.npy"))) << "int8 gave the f32 bytes";
    for (Index row = 0; row < p8.rows(); ++row) {
      EXPECT_NEAR(p8.row(row).sum(), 1.0, 1e-5) << "row " << row;
      for (Index t = row % kT + 1; t < kT; ++t) EXPECT_EQ(p8(row, t), 0.0) << "row " << row << " key " << t;
    }
    for (const Index n : {Index{0}, Index{1}, Index{4}, kT}) {
      SCOPED_TRACE("GPT2_ATTENTION_ISA=" + level + " --dtype int8 --prefill " + std::to_string(n));
      std::vector<std::string> prefill = args;
      prefill.insert(prefill.end(), {"--output", "yc.npy", "--probs", "pc.npy", "--dtype", "int8",
                                     "--prefill", std::to_string(n)});
      EXPECT_SUCCESS(cli_at(level, prefill));
      if (n >= kT || level != "generic") {
        EXPECT_EQ(read_text(file("yc.npy")), read_text(file("y8.npy")));
        EXPECT_EQ(read_text(file("pc.npy")), read_text(file("p8.npy")));
      } else {
        EXPECT_TRUE(gpt2::test::near(read_matrix_as_double(file("yc.npy"), "f32", {kT, kC}), y8, kFloatTol));
      }
    }
  }
}

// run --prefill N --kv-cache bf16: the caches hold keys and values in bf16. Y (and P) are the
// same bytes for every N at the vector levels (within the file's tolerance at generic), they are
// the library's forward through a KVCacheBF16, and they differ from the f32 cache's by the
// rounding of k and v. The flag's usage errors write nothing.
TEST_F(CliTest, RunKvCacheBf16IsTheLibrarysBf16CacheForward) {
  const std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", "x.npy",
                                         "--n-head", "4", "--kv-cache", "bf16"};
  std::vector<std::string> whole = args;
  whole.insert(whole.end(), {"--output", "y.npy", "--probs", "p.npy", "--prefill", std::to_string(kT)});
  ASSERT_EQ(cli(whole).status, 0);
  const RowMatrix<float> y = read_npy_matrix<float>(file("y.npy"), kT, kC);
  EXPECT_TRUE(gpt2::test::near(y, layer0.forward_bf16_cache(x, kHeads), kFloatTol));
  const RowMatrix<float> y_f32_cache = layer0.forward<float>(x, kHeads);
  EXPECT_FALSE(gpt2::test::near(y, y_f32_cache, kFloatTol));  // the rounding is there
  EXPECT_TRUE(gpt2::test::near(y, y_f32_cache, 2e-2));
  for (const Index n : {Index{0}, Index{1}, Index{4}, kT - 1}) {
    SCOPED_TRACE("--prefill " + std::to_string(n));
    std::vector<std::string> chunked = args;
    chunked.insert(chunked.end(), {"--output", "yc.npy", "--probs", "pc.npy", "--prefill", std::to_string(n)});
    EXPECT_SUCCESS(cli(chunked));
    if (gpt2::active_isa() != gpt2::Isa::generic) {
      EXPECT_EQ(read_text(file("yc.npy")), read_text(file("y.npy")));
      EXPECT_EQ(read_text(file("pc.npy")), read_text(file("p.npy")));
    } else {
      EXPECT_TRUE(gpt2::test::near(read_npy_matrix<float>(file("yc.npy"), kT, kC), y, 5e-3));
    }
  }
  const std::vector<std::string> before = dir.list();
  const std::vector<std::pair<std::vector<std::string>, std::string>> errors = {
      {{"--output", "z.npy", "--kv-cache", "bf16"},
       "--kv-cache needs --prefill or --share-prefix (the caches are theirs)"},
      {{"--output", "z.npy", "--prefill", "2", "--dtype", "f64", "--kv-cache", "bf16"},
       "--kv-cache bf16: not available with --dtype f64 (a bf16 cache serves float32 forwards)"},
      {{"--output", "z.npy", "--prefill", "2", "--kv-cache", "f16"},
       "--kv-cache: expected f32, bf16 or int8, got 'f16'"},
      {{"--output", "z.npy", "--prefill", "2", "--dtype", "f64", "--kv-cache", "int8"},
       "--kv-cache int8: not available with --dtype f64 (an int8 cache serves float32 forwards)"}};
  for (const auto& [extra, message] : errors) {
    std::vector<std::string> bad(args.begin(), args.end() - 2);  // without --kv-cache bf16
    bad.insert(bad.end(), extra.begin(), extra.end());
    const CliResult r = cli(bad);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.err, "gpt2-attention: " + message + " (see gpt2-attention --help)\n");
  }
  EXPECT_EQ(dir.list(), before);
}

// run --prefill N --kv-cache int8 (with --dtype f32 and int8): the library's forward through a
// KVCacheInt8, the same bytes for every N at the vector levels (within the file's tolerance at
// generic), and different from the f32 cache's by the quantization of k and v.
TEST_F(CliTest, RunKvCacheInt8IsTheLibrarysInt8CacheForward) {
  for (const bool int8_weights : {false, true}) {
    SCOPED_TRACE(int8_weights ? "--dtype int8" : "--dtype f32");
    const std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", "x.npy",
                                           "--n-head", "4", "--kv-cache", "int8",
                                           "--dtype", int8_weights ? "int8" : "f32"};
    std::vector<std::string> whole = args;
    whole.insert(whole.end(), {"--output", "y.npy", "--probs", "p.npy", "--prefill", std::to_string(kT)});
    ASSERT_EQ(cli(whole).status, 0);
    const RowMatrix<float> y = read_npy_matrix<float>(file("y.npy"), kT, kC);
    EXPECT_TRUE(gpt2::test::near(y, layer0.forward_int8_cache(x, kHeads, int8_weights), kFloatTol));
    const RowMatrix<float> y_f32_cache = layer0.forward<float>(x, kHeads);
    EXPECT_FALSE(gpt2::test::near(y, y_f32_cache, kFloatTol));  // the quantization is there
    EXPECT_TRUE(gpt2::test::near(y, y_f32_cache, 4e-2));
    for (const Index n : {Index{0}, Index{1}, Index{4}, kT - 1}) {
      SCOPED_TRACE("--prefill " + std::to_string(n));
      std::vector<std::string> chunked = args;
      chunked.insert(chunked.end(), {"--output", "yc.npy", "--probs", "pc.npy", "--prefill", std::to_string(n)});
      EXPECT_SUCCESS(cli(chunked));
      if (gpt2::active_isa() != gpt2::Isa::generic) {
        EXPECT_EQ(read_text(file("yc.npy")), read_text(file("y.npy")));
        EXPECT_EQ(read_text(file("pc.npy")), read_text(file("p.npy")));
      } else {
        EXPECT_TRUE(gpt2::test::near(read_npy_matrix<float>(file("yc.npy"), kT, kC), y, 5e-3));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// run on a padded batch X [B, T, C]
// ---------------------------------------------------------------------------------------------

constexpr Index kB = 3;   // sequences of the batch input
constexpr Index kTb = 7;  // its padded length

// What the library gives each sequence's real rows alone (rows starts[b] .. starts[b] +
// lengths[b] - 1 of sequence b of x [kB * kTb, kC]), everything else 0:
//   y [kB * kTb, kC]; probs [kB * kHeads * kTb, kTb] = [B, n_head, T, T]
template <class T>
struct BatchExpected {
  RowMatrix<T> y, probs;
};

// The same for any batch [B, T, kC]: y [B * T, kC]; probs [B * kHeads * T, T].
template <class T>
BatchExpected<T> expected_batch(const Layer& layer, const RowMatrix<T>& x, Index B, Index T_,
                                const std::vector<Index>& starts, const std::vector<Index>& lengths) {
  BatchExpected<T> e{RowMatrix<T>::Zero(B * T_, kC), RowMatrix<T>::Zero(B * kHeads * T_, T_)};
  for (Index b = 0; b < B; ++b) {
    const Index s = starts[static_cast<std::size_t>(b)], l = lengths[static_cast<std::size_t>(b)];
    RowMatrix<T> probs;
    const RowMatrix<T> real = x.middleRows(b * T_ + s, l);  // a copy: the real rows alone
    e.y.middleRows(b * T_ + s, l) = layer.forward<T>(real, kHeads, &probs);
    for (Index h = 0; h < kHeads; ++h)
      e.probs.block((b * kHeads + h) * T_ + s, s, l, l) = probs.middleRows(h * l, l);
  }
  return e;
}

template <class T>
BatchExpected<T> per_sequence(const Layer& layer, const RowMatrix<T>& x,
                              const std::vector<Index>& starts, const std::vector<Index>& lengths) {
  return expected_batch<T>(layer, x, kB, kTb, starts, lengths);
}

// A .npy file of any rank as T, checked twice: its bytes against the header numpy.save writes for
// T and `shape` (its own spelling of the format, independent of gpt2::npy's writer), then through
// gpt2::npy::read (dtype, shape), whose values must equal the bytes after the header.
template <class T>
std::vector<T> read_npy_numpy_save(const std::string& path, const std::vector<std::int64_t>& shape) {
  const std::string bytes = read_text(path);
  std::string dict = std::string("{'descr': '") + (sizeof(T) == 4 ? "<f4" : "<f8") +
                     "', 'fortran_order': False, 'shape': (";
  std::size_t n = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    dict += (i ? ", " : "") + std::to_string(shape[i]);
    n *= static_cast<std::size_t>(shape[i]);
  }
  dict += shape.size() == 1 ? ",), }" : "), }";
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8)) << path;
  const std::size_t header = bytes.size() < 10 ? 0 : 10 + (static_cast<unsigned char>(bytes[8]) |
                                                           static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ(header % 64, 0u) << path;
  EXPECT_EQ(bytes.substr(10, dict.size()), dict) << path;
  EXPECT_EQ(bytes.size(), header + n * sizeof(T)) << path;
  if (header == 0 || bytes.size() != header + n * sizeof(T)) return {};
  std::vector<T> raw(n);
  if (n > 0) std::memcpy(raw.data(), bytes.data() + header, n * sizeof(T));
  const std::vector<T> v = read_npy<T>(path, shape);
  EXPECT_EQ(v.size(), raw.size()) << path;
  if (v.size() == raw.size() && n > 0) {  // bitwise: NaN and -0 included
    EXPECT_EQ(std::memcmp(v.data(), raw.data(), n * sizeof(T)), 0) << path;
  }
  return v;
}

// Y [B, T, C] as [B * T, C] and P [B, n_head, T, T] as [B * n_head * T, T].
template <class T>
RowMatrix<T> read_batch_y(const std::string& path) {
  const std::vector<T> v = read_npy<T>(path, {kB, kTb, kC});
  if (static_cast<Index>(v.size()) != kB * kTb * kC) return RowMatrix<T>();
  return Eigen::Map<const RowMatrix<T>>(v.data(), kB * kTb, kC);
}
template <class T>
RowMatrix<T> read_batch_probs(const std::string& path) {
  const std::vector<T> v = read_npy_numpy_save<T>(path, {kB, kHeads, kTb, kTb});
  if (static_cast<Index>(v.size()) != kB * kHeads * kTb * kTb) return RowMatrix<T>();
  return Eigen::Map<const RowMatrix<T>>(v.data(), kB * kHeads * kTb, kTb);
}

// Rows of the batch that are padding under (starts, lengths).
std::vector<Index> padded_rows(const std::vector<Index>& starts, const std::vector<Index>& lengths) {
  std::vector<Index> rows;
  for (Index b = 0; b < kB; ++b)
    for (Index t = 0; t < kTb; ++t) {
      const Index s = starts[static_cast<std::size_t>(b)], l = lengths[static_cast<std::size_t>(b)];
      if (t < s || t >= s + l) rows.push_back(b * kTb + t);
    }
  return rows;
}

// "3,0,7"
std::string csv(const std::vector<Index>& values) {
  std::string s;
  for (const Index v : values) s += (s.empty() ? "" : ",") + std::to_string(v);
  return s;
}

class CliBatchTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    write_batch("xb.npy", xb);
  }

  void write_batch(const std::string& name, const RowMatrix<float>& m) const {
    gpt2::npy::write<float>(file(name), m.data(), {kB, kTb, kC});
  }

  // run on xb.npy (or `input`) -> yb.npy, pb.npy, plus `extra`.
  CliResult run_batch(const std::vector<std::string>& extra, const std::string& input = "xb.npy") const {
    std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", input,
                                     "--output", "yb.npy", "--probs", "pb.npy", "--n-head", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    return cli(args);
  }

  // The run's Y and P against the library on each sequence's real rows alone, in float; padded
  // rows of Y and padded rows and columns of P exactly 0.
  void expect_per_sequence(const std::vector<Index>& starts, const std::vector<Index>& lengths) const {
    const BatchExpected<float> e = per_sequence<float>(layer0, xb, starts, lengths);
    const RowMatrix<float> y = read_batch_y<float>(file("yb.npy")), p = read_batch_probs<float>(file("pb.npy"));
    EXPECT_TRUE(gpt2::test::near(y, e.y, kFloatTol));
    EXPECT_TRUE(gpt2::test::near(p, e.probs, kFloatTol));
    if (y.rows() != kB * kTb || p.rows() != kB * kHeads * kTb) return;
    for (const Index row : padded_rows(starts, lengths)) {
      EXPECT_TRUE((y.row(row).array() == 0.0f).all()) << "Y row " << row;
      const Index b = row / kTb, t = row % kTb;
      for (Index h = 0; h < kHeads; ++h) {
        EXPECT_TRUE((p.row((b * kHeads + h) * kTb + t).array() == 0.0f).all()) << "P row " << row;
        EXPECT_TRUE((p.block((b * kHeads + h) * kTb, t, kTb, 1).array() == 0.0f).all()) << "P column " << t;
      }
    }
  }

  RowMatrix<float> xb = [] {
    std::mt19937 rng(4);
    return random_matrix(rng, kB * kTb, kC, 1.0f);
  }();
};

TEST_F(CliBatchTest, EveryRowIsRealWithoutLengths) {
  EXPECT_SUCCESS(run_batch({}));
  expect_per_sequence({0, 0, 0}, {kTb, kTb, kTb});
}

TEST_F(CliBatchTest, LengthsAreRightPadding) {
  const std::vector<Index> lengths = {kTb, 4, 0};  // a full sequence, a shorter one, an empty one
  EXPECT_SUCCESS(run_batch({"--lengths", csv(lengths)}));
  expect_per_sequence({0, 0, 0}, lengths);
}

TEST_F(CliBatchTest, StartsAreLeftPadding) {
  const std::vector<Index> starts = {0, 3, kTb};  // lengths T - start: 7, 4, 0
  EXPECT_SUCCESS(run_batch({"--starts", csv(starts)}));
  expect_per_sequence(starts, {kTb, 4, 0});

  const std::vector<Index> lengths = {2, 3, 0};  // padding on both sides
  EXPECT_SUCCESS(run_batch({"--starts", "5,1,0", "--lengths", csv(lengths)}));
  expect_per_sequence({5, 1, 0}, lengths);
}

TEST_F(CliBatchTest, DoubleComputesInDouble) {
  const std::vector<Index> starts = {1, 0, 6}, lengths = {5, kTb, 1};
  EXPECT_SUCCESS(run_batch({"--starts", csv(starts), "--lengths", csv(lengths), "--dtype", "f64"}));
  const BatchExpected<double> e = per_sequence<double>(layer0, RowMatrix<double>(xb.cast<double>()), starts, lengths);
  EXPECT_TRUE(gpt2::test::near(read_batch_y<double>(file("yb.npy")), e.y, kDoubleTol));
  EXPECT_TRUE(gpt2::test::near(read_batch_probs<double>(file("pb.npy")), e.probs, kDoubleTol));
}

// Padded rows holding NaN, +-Inf or +-1e38 (finite, but overflowing any product with it) change
// nothing: Y and P are bitwise those of a clean input, with and without --prefill.
TEST_F(CliBatchTest, GarbageInPaddedRowsReachesNothing) {
  const std::vector<Index> starts = {2, 0, 0}, lengths = {3, 5, 0};
  const std::vector<std::string> flags = {"--starts", csv(starts), "--lengths", csv(lengths)};
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<std::string, float>> garbage = {
      {"NaN", std::numeric_limits<float>::quiet_NaN()}, {"+Inf", inf}, {"-Inf", -inf},
      {"1e38", 1e38f}, {"-1e38", -1e38f}};
  for (const std::string prefill : {"", "2"}) {
    std::vector<std::string> extra = flags;
    if (!prefill.empty()) extra.insert(extra.end(), {"--prefill", prefill});
    ASSERT_EQ(run_batch(extra).status, 0);
    const std::string y = read_text(file("yb.npy")), p = read_text(file("pb.npy"));
    for (const auto& [name, value] : garbage) {
      SCOPED_TRACE("--prefill '" + prefill + "', padding " + name);
      RowMatrix<float> poisoned = xb;
      for (const Index row : padded_rows(starts, lengths)) poisoned.row(row).setConstant(value);
      write_batch("xbad.npy", poisoned);
      EXPECT_SUCCESS(run_batch(extra, "xbad.npy"));
      EXPECT_EQ(read_text(file("yb.npy")), y) << "the padding changed Y";
      EXPECT_EQ(read_text(file("pb.npy")), p) << "the padding changed P";
      EXPECT_TRUE(read_batch_y<float>(file("yb.npy")).allFinite());
      EXPECT_TRUE(read_batch_probs<float>(file("pb.npy")).allFinite());
      expect_per_sequence(starts, lengths);
    }
  }
}

// A NaN or an infinity in a real row of X: exit status 0, the outputs written, and one warning
// line on stderr naming the first one (row, column, value) and what it does: every output row of
// its sequence from there on is NaN (attention is causal), as are those rows of P; the rows
// before it are the clean input's, bit for bit. The same through every path (--prefill, the bf16
// KV cache, --share-prefix, f64, bf16 weights).
TEST_F(CliBatchTest, NonFiniteInputWarnsAndExitsZero) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Index> lengths = {kTb, kTb, 5};
  const std::vector<std::string> paths[] = {{"--dtype", "f32"}, {"--prefill", "2"},
                                            {"--prefill", "2", "--kv-cache", "bf16"},
                                            {"--share-prefix", "0", "--prefill", "1"}, {"--dtype", "f64"},
                                            {"--dtype", "bf16"}};
  for (const auto& [name, value] : std::vector<std::pair<std::string, float>>{
           {"nan", std::numeric_limits<float>::quiet_NaN()}, {"inf", inf}, {"-inf", -inf}}) {
    for (const std::vector<std::string>& path : paths) {
      std::string flags;
      for (const std::string& f : path) flags += " " + f;
      SCOPED_TRACE(name + flags);
      // 2-D: X [T, C] with x[3, 17] non-finite (--share-prefix needs a batch: --prefill 1 here).
      const bool shared = path.front() == "--share-prefix";
      const std::vector<std::string> flags_2d = shared ? std::vector<std::string>{"--prefill", "1"} : path;
      const auto run_2d = [&](const std::string& input) {
        std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", input, "--output",
                                         "y.npy", "--probs", "p.npy", "--n-head", std::to_string(kHeads)};
        args.insert(args.end(), flags_2d.begin(), flags_2d.end());
        return cli(args);
      };
      RowMatrix<float> bad = x;
      bad(3, 17) = value;
      gpt2::npy::write<float>(file("xbad.npy"), bad);
      EXPECT_SUCCESS(run_2d("x.npy"));
      const std::string clean_y = read_text(file("y.npy"));
      const CliResult r = run_2d("xbad.npy");
      EXPECT_EQ(r.status, 0);
      EXPECT_EQ(r.out, "");
      EXPECT_EQ(r.err, "gpt2-attention: warning: input xbad.npy: non-finite value " + name +
                           " at row 3, column 17 (1 in all): output rows 3 to " + std::to_string(kT - 1) +
                           " (and their probabilities) are NaN: attention is causal, so every row "
                           "from 3 on attends to row 3\n");
      const bool f64 = std::find(path.begin(), path.end(), "f64") != path.end();
      const RowMatrix<double> y = read_matrix_as_double(file("y.npy"), f64 ? "f64" : "f32", {kT, kC});
      const RowMatrix<double> p = read_matrix_as_double(file("p.npy"), f64 ? "f64" : "f32", {kHeads, kT, kT});
      ASSERT_EQ(y.rows(), kT);
      for (Index t = 0; t < kT; ++t) {
        EXPECT_EQ(t >= 3, y.row(t).array().isNaN().all()) << "Y row " << t;
        EXPECT_EQ(t < 3, y.row(t).allFinite()) << "Y row " << t;
        for (Index h = 0; h < kHeads; ++h)
          EXPECT_EQ(t >= 3, p.row(h * kT + t).head(t + 1).array().isNaN().all()) << "P head " << h << " row " << t;
      }
      // The rows before it are the clean run's (a batch of one sequence: compare the bytes of rows 0-2).
      const std::string bad_y = read_text(file("y.npy"));
      const std::size_t header = bad_y.size() - static_cast<std::size_t>(kT * kC) * (f64 ? 8 : 4);
      EXPECT_EQ(bad_y.substr(0, header + 3 * kC * (f64 ? 8 : 4)), clean_y.substr(0, header + 3 * kC * (f64 ? 8 : 4)));

      // 3-D: sequence 1's row 2 and sequence 2's row 4 (its last real row) non-finite, and
      // sequence 2's padded row 6 (never read); sequence 0 clean.
      RowMatrix<float> bad_b = xb;
      bad_b(1 * kTb + 2, 5) = value;
      bad_b(2 * kTb + 4, 0) = value;
      bad_b(2 * kTb + 6, 0) = value;  // padding (length 5): never read, not counted
      write_batch("xbbad.npy", bad_b);
      std::vector<std::string> batch_flags = {"--lengths", csv(lengths)};
      batch_flags.insert(batch_flags.end(), path.begin(), path.end());
      const CliResult rb = run_batch(batch_flags, "xbbad.npy");
      EXPECT_EQ(rb.status, 0);
      EXPECT_EQ(rb.err, "gpt2-attention: warning: input xbbad.npy: non-finite value " + name +
                            " at x[1, 2, 5] (2 in all, in 2 of 3 sequences): output rows 2 to 6 of "
                            "sequence 1 (and their probabilities) are NaN, as are every such "
                            "sequence's rows from its first non-finite one on: attention is causal\n");
      const RowMatrix<double> yb = read_matrix_as_double(file("yb.npy"), f64 ? "f64" : "f32", {kB, kTb, kC});
      ASSERT_EQ(yb.rows(), kB * kTb);
      for (Index t = 0; t < kTb; ++t) {
        EXPECT_TRUE(yb.row(t).allFinite()) << "sequence 0 row " << t;
        EXPECT_EQ(t >= 2, yb.row(kTb + t).array().isNaN().all()) << "sequence 1 row " << t;
        EXPECT_EQ(t == 4, yb.row(2 * kTb + t).array().isNaN().all()) << "sequence 2 row " << t;
        if (t > 4) {
          EXPECT_TRUE((yb.row(2 * kTb + t).array() == 0).all()) << "padding";
        }
      }
    }
  }
  // A clean input: no warning (EXPECT_SUCCESS checks stderr is empty).
  EXPECT_SUCCESS(run_batch({}));
}

// --output may name the --input file of a batch too (X is read in full first); the batched
// decode reads its step inputs from X, never from Y.
TEST_F(CliBatchTest, OutputMayBeTheBatchInput) {
  const std::vector<Index> starts = {0, 2, 1}, lengths = {kTb, 3, 0};
  const BatchExpected<float> e = per_sequence<float>(layer0, xb, starts, lengths);
  for (const std::string prefill : {"", "0", "2"}) {
    SCOPED_TRACE("--prefill '" + prefill + "'");
    std::vector<std::string> extra = {"--starts", csv(starts), "--lengths", csv(lengths)};
    if (!prefill.empty()) extra.insert(extra.end(), {"--prefill", prefill});
    ASSERT_EQ(run_batch(extra).status, 0);  // to yb.npy, for the bitwise comparison
    write_batch("xio.npy", xb);
    std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", "xio.npy",
                                     "--output", "./xio.npy", "--probs", "pio.npy", "--n-head", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    EXPECT_SUCCESS(cli(args));
    EXPECT_EQ(read_text(file("xio.npy")), read_text(file("yb.npy")));
    EXPECT_EQ(read_text(file("pio.npy")), read_text(file("pb.npy")));
    EXPECT_TRUE(gpt2::test::near(read_batch_y<float>(file("xio.npy")), e.y, kFloatTol));
  }
  const std::vector<std::string> expected = {"pb.npy", "pio.npy", "w.safetensors", "x.npy",
                                             "xb.npy", "xio.npy", "yb.npy"};
  EXPECT_EQ(dir.list(), expected);
}

// Batched decode (--prefill N with [B, T, C]) against the plain batched run: byte-identical in
// float at the vector levels for every N, and when the first step holds every token (N >= T);
// within the file's tolerance otherwise (measured max |diff| / max |plain|, any N < T, 2.0e-16 in
// double); P is computed the same way with and without --prefill (per sequence, no cache), so it
// is bitwise the same.
TEST_F(CliBatchTest, PrefillIsABatchedDecode) {
  const std::vector<Index> starts = {0, 3, 1}, lengths = {kTb, 4, 0};
  for (const std::string dtype : {"f32", "f64"}) {
    const std::vector<std::string> flags = {"--starts", csv(starts), "--lengths", csv(lengths), "--dtype", dtype};
    ASSERT_EQ(run_batch(flags).status, 0);
    const std::string y = read_text(file("yb.npy")), p = read_text(file("pb.npy"));
    const RowMatrix<double> y_plain = read_matrix_as_double(file("yb.npy"), dtype, {kB, kTb, kC});
    for (const Index n : {Index{0}, Index{1}, Index{3}, kTb - 1, kTb, kTb + 1}) {
      SCOPED_TRACE("--dtype " + dtype + " --prefill " + std::to_string(n));
      std::vector<std::string> extra = flags;
      extra.insert(extra.end(), {"--prefill", std::to_string(n)});
      EXPECT_SUCCESS(run_batch(extra));
      EXPECT_EQ(read_text(file("pb.npy")), p);
      if (n >= kTb || row_exact_cli(dtype)) {
        EXPECT_EQ(read_text(file("yb.npy")), y);
      } else {
        const RowMatrix<double> y_decode = read_matrix_as_double(file("yb.npy"), dtype, {kB, kTb, kC});
        EXPECT_TRUE(gpt2::test::near(y_decode, y_plain, dtype == "f32" ? kFloatTol : kDoubleTol));
        for (const Index row : padded_rows(starts, lengths))
          EXPECT_TRUE((y_decode.row(row).array() == 0.0).all()) << "row " << row;
      }
    }
  }
}

// The same with --kv-cache bf16 (int8): one KVCacheBF16 (KVCacheInt8) per sequence; Y the same
// bytes for every N at the vector levels, padded rows 0, within bf16's rounding (int8's
// quantization) of the f32 cache's.
TEST_F(CliBatchTest, PrefillThroughBf16CachesIsABatchedDecode) {
  for (const std::string kv : {"bf16", "int8"}) {
  SCOPED_TRACE("--kv-cache " + kv);
  const std::vector<Index> starts = {0, 3, 1}, lengths = {kTb, 4, 0};
  const std::vector<std::string> flags = {"--starts", csv(starts), "--lengths", csv(lengths)};
  ASSERT_EQ(run_batch(flags).status, 0);
  const RowMatrix<double> y_plain = read_matrix_as_double(file("yb.npy"), "f32", {kB, kTb, kC});
  std::string y_first;
  for (const Index n : {Index{0}, Index{1}, Index{3}, kTb}) {
    SCOPED_TRACE("--prefill " + std::to_string(n));
    std::vector<std::string> extra = flags;
    extra.insert(extra.end(), {"--prefill", std::to_string(n), "--kv-cache", kv});
    EXPECT_SUCCESS(run_batch(extra));
    const RowMatrix<double> y = read_matrix_as_double(file("yb.npy"), "f32", {kB, kTb, kC});
    EXPECT_TRUE(gpt2::test::near(y, y_plain, kv == "int8" ? 4e-2 : 2e-2));
    EXPECT_FALSE(gpt2::test::near(y, y_plain, kFloatTol));
    for (const Index row : padded_rows(starts, lengths))
      EXPECT_TRUE((y.row(row).array() == 0.0).all()) << "row " << row;
    if (y_first.empty()) {
      y_first = read_text(file("yb.npy"));
    } else if (gpt2::active_isa() != gpt2::Isa::generic) {
      EXPECT_EQ(read_text(file("yb.npy")), y_first);
    }
  }
  }
}

TEST_F(CliBatchTest, EmptyBatchesAndSequences) {
  gpt2::npy::write<float>(file("xe.npy"), std::vector<float>().data(), {2, 0, kC});
  for (const std::string prefill : {"", "1"}) {
    SCOPED_TRACE("--prefill '" + prefill + "'");
    std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", "xe.npy",
                                     "--output", "ye.npy", "--probs", "pe.npy", "--n-head", "4",
                                     "--lengths", "0,0"};
    if (!prefill.empty()) args.insert(args.end(), {"--prefill", prefill});
    EXPECT_SUCCESS(cli(args));
    EXPECT_TRUE(read_npy<float>(file("ye.npy"), {2, 0, kC}).empty());
    EXPECT_TRUE(read_npy_numpy_save<float>(file("pe.npy"), {2, kHeads, 0, 0}).empty());
  }
  EXPECT_SUCCESS(run_batch({"--lengths", "0,0,0", "--prefill", "2"}));
  EXPECT_TRUE((read_batch_y<float>(file("yb.npy")).array() == 0.0f).all());
  EXPECT_TRUE((read_batch_probs<float>(file("pb.npy")).array() == 0.0f).all());
}

// An empty batch costs nothing beyond reading the header, however large the other dimension: B = 0
// with T = 1e8, and B = 1e8 with T = 0, in a file of a header alone. The run gets kSmallAddressSpace,
// far below anything sized by B or T (a cache, a workspace, a layout, a map), and must be quick.
// What can be checked still is: the number of --lengths/--starts values against B, each against T.
class CliEmptyBatchTest : public CliBatchTest {
 protected:
  static constexpr std::int64_t kHuge = 100000000;

  // run --input <input> -> ye.npy (and pe.npy unless `probs` is false), plus `extra`, in
  // kSmallAddressSpace; succeeds quickly with outputs of the right shapes.
  void expect_empty_outputs(const std::string& input, const std::vector<std::int64_t>& shape,
                            const std::vector<std::string>& extra, bool probs = true) {
    std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", input,
                                     "--output", "ye.npy", "--n-head", "4"};
    if (probs) args.insert(args.end(), {"--probs", "pe.npy"});
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = cli_small(args);
    EXPECT_SUCCESS(r);
    EXPECT_LT(r.seconds, 5.0);
    EXPECT_TRUE(read_npy_numpy_save<float>(file("ye.npy"), shape).empty());
    if (probs) {
      EXPECT_TRUE(read_npy_numpy_save<float>(file("pe.npy"), {shape[0], kHeads, shape[1], shape[1]}).empty());
    }
    std::filesystem::remove(file("ye.npy"));
    std::filesystem::remove(file("pe.npy"));
  }

  // The same run fails with status `status` and exactly `message`, quickly.
  void expect_error(const std::string& input, const std::vector<std::string>& extra, int status,
                    const std::string& message) {
    std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", input,
                                     "--output", "ye.npy", "--probs", "pe.npy", "--n-head", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = cli_small(args);
    EXPECT_EQ(r.status, status);
    EXPECT_EQ(r.err, "gpt2-attention: " + message + "\n");
    EXPECT_LT(r.seconds, 5.0);
    EXPECT_FALSE(std::filesystem::exists(file("ye.npy")));
  }
};

TEST_F(CliEmptyBatchTest, NoSequencesOfAHugeLength) {
  const std::vector<std::int64_t> shape = {0, kHuge, kC};
  gpt2::npy::write<float>(file("x0.npy"), std::vector<float>().data(), shape);
  for (const std::string prefill : {"", "0", "5", "200000000"}) {
    SCOPED_TRACE("--prefill '" + prefill + "'");
    const std::vector<std::string> extra =
        prefill.empty() ? std::vector<std::string>{} : std::vector<std::string>{"--prefill", prefill};
    expect_empty_outputs("x0.npy", shape, extra);
    expect_empty_outputs("x0.npy", shape, extra, false);
  }
  // B = 0: no list can have B values (an empty value is a usage error).
  expect_error("x0.npy", {"--lengths", "0"}, 1,
               "--lengths: expected 0 values (one per sequence of input [0, 100000000, 64]), got 1");
  expect_error("x0.npy", {"--starts=0,0", "--prefill", "1"}, 1,
               "--starts: expected 0 values (one per sequence of input [0, 100000000, 64]), got 2");
  expect_error("x0.npy", {"--lengths="}, 2,
               "flag --lengths needs a value, got an empty one (see gpt2-attention --help)");
}

TEST_F(CliEmptyBatchTest, AHugeNumberOfEmptySequences) {
  const std::vector<std::int64_t> shape = {kHuge, 0, kC};
  gpt2::npy::write<float>(file("xh.npy"), std::vector<float>().data(), shape);
  for (const std::string prefill : {"", "0", "3"}) {
    SCOPED_TRACE("--prefill '" + prefill + "'");
    const std::vector<std::string> extra =
        prefill.empty() ? std::vector<std::string>{} : std::vector<std::string>{"--prefill", prefill};
    expect_empty_outputs("xh.npy", shape, extra);
    expect_empty_outputs("xh.npy", shape, extra, false);
  }
  expect_error("xh.npy", {"--lengths", "0,0"}, 1,
               "--lengths: expected 100000000 values (one per sequence of input [100000000, 0, 64]), got 2");
  expect_error("xh.npy", {"--starts", "0", "--prefill", "2"}, 1,
               "--starts: expected 100000000 values (one per sequence of input [100000000, 0, 64]), got 1");

  // T = 0 with a few sequences: every value is checked against T.
  gpt2::npy::write<float>(file("x20.npy"), std::vector<float>().data(), {2, 0, kC});
  expect_empty_outputs("x20.npy", {2, 0, kC}, {"--starts", "0,0", "--lengths", "0,0", "--prefill", "1"});
  expect_error("x20.npy", {"--starts", "0,1"}, 1,
               "--starts: expected sequence 1's start in [0, 0] (T of input [2, 0, 64]), got 1");
  expect_error("x20.npy", {"--lengths", "1,0", "--prefill", "0"}, 1,
               "--lengths: expected sequence 0's length in [0, 0] (T of input [2, 0, 64]), got 1");
}

// B = 1: the batch is the 2-D run of its real rows (Y and P within the tolerance, padding 0), with
// every row real, with padding on both sides, and through the decode.
TEST_F(CliBatchTest, OneSequence) {
  gpt2::npy::write<float>(file("x1.npy"), x.data(), {1, kT, kC});
  for (const auto& [starts, lengths] : std::vector<std::pair<std::vector<Index>, std::vector<Index>>>{
           {{0}, {kT}}, {{2}, {5}}, {{kT}, {0}}}) {
    const BatchExpected<float> e = expected_batch<float>(layer0, x, 1, kT, starts, lengths);
    for (const std::string prefill : {"", "0", "3", "100"}) {
      SCOPED_TRACE("--starts " + csv(starts) + " --lengths " + csv(lengths) + " --prefill '" + prefill + "'");
      std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", "x1.npy",
                                       "--output", "y1.npy", "--probs", "p1.npy", "--n-head", "4",
                                       "--starts", csv(starts), "--lengths", csv(lengths)};
      if (!prefill.empty()) args.insert(args.end(), {"--prefill", prefill});
      EXPECT_SUCCESS(cli(args));
      const std::vector<float> y = read_npy<float>(file("y1.npy"), {1, kT, kC});
      const std::vector<float> p = read_npy_numpy_save<float>(file("p1.npy"), {1, kHeads, kT, kT});
      ASSERT_EQ(static_cast<Index>(y.size()), e.y.size());
      ASSERT_EQ(static_cast<Index>(p.size()), e.probs.size());
      EXPECT_TRUE(gpt2::test::near(Eigen::Map<const RowMatrix<float>>(y.data(), kT, kC), e.y, kFloatTol));
      EXPECT_TRUE(gpt2::test::near(Eigen::Map<const RowMatrix<float>>(p.data(), kHeads * kT, kT), e.probs, kFloatTol));
      for (Index t = 0; t < kT; ++t) {
        if (t >= starts[0] && t < starts[0] + lengths[0]) continue;
        for (Index c = 0; c < kC; ++c) EXPECT_EQ(y[static_cast<std::size_t>(t * kC + c)], 0.0f);
      }
    }
  }
  // With every row real, Y and P are bitwise those of the 2-D run.
  EXPECT_SUCCESS(cli({"run", "--weights", "w.safetensors", "--input", "x1.npy", "--output", "y1.npy",
                      "--probs", "p1.npy", "--n-head", "4"}));
  ASSERT_EQ(run_default({"--probs", "p.npy"}).status, 0);
  const std::vector<float> y1 = read_npy<float>(file("y1.npy"), {1, kT, kC}), y = read_npy<float>(file("y.npy"), {kT, kC});
  const std::vector<float> p1 = read_npy<float>(file("p1.npy"), {1, kHeads, kT, kT}),
                           p = read_npy<float>(file("p.npy"), {kHeads, kT, kT});
  EXPECT_EQ(y1, y);
  EXPECT_EQ(p1, p);
}

// T = 1: every sequence is one token or none (start 1, length 0), with and without --prefill.
TEST_F(CliBatchTest, OneTokenSequences) {
  const RowMatrix<float> x3 = xb.topRows(kB);
  gpt2::npy::write<float>(file("xt1.npy"), x3.data(), {kB, 1, kC});
  const std::vector<Index> starts = {0, 1, 0}, lengths = {1, 0, 1};
  const BatchExpected<float> e = expected_batch<float>(layer0, x3, kB, 1, starts, lengths);
  for (const std::string prefill : {"", "0", "1", "4"}) {
    for (const bool given : {false, true}) {
      SCOPED_TRACE("--prefill '" + prefill + "', layout given: " + std::to_string(given));
      std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", "xt1.npy",
                                       "--output", "yt.npy", "--probs", "pt.npy", "--n-head", "4"};
      if (given) args.insert(args.end(), {"--starts", csv(starts), "--lengths", csv(lengths)});
      if (!prefill.empty()) args.insert(args.end(), {"--prefill", prefill});
      EXPECT_SUCCESS(cli(args));
      const BatchExpected<float> full = expected_batch<float>(layer0, x3, kB, 1, {0, 0, 0}, {1, 1, 1});
      const BatchExpected<float>& want = given ? e : full;
      const std::vector<float> y = read_npy<float>(file("yt.npy"), {kB, 1, kC});
      const std::vector<float> p = read_npy_numpy_save<float>(file("pt.npy"), {kB, kHeads, 1, 1});
      ASSERT_EQ(static_cast<Index>(y.size()), want.y.size());
      ASSERT_EQ(static_cast<Index>(p.size()), want.probs.size());
      EXPECT_TRUE(gpt2::test::near(Eigen::Map<const RowMatrix<float>>(y.data(), kB, kC), want.y, kFloatTol));
      // One key: P is exactly 1 for a real token, 0 for the empty sequence.
      for (Index b = 0; b < kB; ++b)
        for (Index h = 0; h < kHeads; ++h)
          EXPECT_EQ(p[static_cast<std::size_t>(b * kHeads + h)], given && b == 1 ? 0.0f : 1.0f);
    }
  }
}

// The data errors of --lengths and --starts, whole messages.
TEST_F(CliBatchTest, LayoutErrorsNameTheFlagWhatWasExpectedAndWhatWasGot) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--lengths", "7,4"},
       "--lengths: expected 3 values (one per sequence of input [3, 7, 64]), got 2"},
      {{"--starts", "0,1,2,3"},
       "--starts: expected 3 values (one per sequence of input [3, 7, 64]), got 4"},
      {{"--lengths", "7,8,0"},
       "--lengths: expected sequence 1's length in [0, 7] (T of input [3, 7, 64]), got 8"},
      {{"--starts", "0,0,8"},
       "--starts: expected sequence 2's start in [0, 7] (T of input [3, 7, 64]), got 8"},
      {{"--starts", "0,4,0", "--lengths", "7,4,0"},
       "--lengths: expected sequence 1's length in [0, 3] (T - start = 7 - 4; input [3, 7, 64]), got 4"},
  };
  for (const auto& [flags, message] : cases) {
    SCOPED_TRACE(message);
    const CliResult r = run_batch(flags);
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err, "gpt2-attention: " + message + "\n");
  }
  const CliResult two_d = run_batch({"--lengths", "9"}, "x.npy");
  EXPECT_EQ(two_d.status, 1);
  EXPECT_EQ(two_d.err, "gpt2-attention: --lengths: expected a 3-D input [B, T, C] (one value per "
                       "sequence), got input [9, 64]\n");
  const std::vector<std::string> expected = {"w.safetensors", "x.npy", "xb.npy"};
  EXPECT_EQ(dir.list(), expected);
}

// run --share-prefix N: a batch whose sequences start with the same N rows (left and right
// padding), the prefix computed once into shared blocks, against the same run without it: Y
// byte-identical in float at the vector levels (row-exact), within the file's tolerance otherwise
// (and in double); P the same bytes (computed per sequence either way). With --prefill P, P
// counts from the start of the sequence, below and above N.
TEST_F(CliBatchTest, SharePrefixGivesTheRunWithoutIt) {
  const std::vector<Index> starts = {0, 1, 2}, lengths = {7, 6, 4};
  const Index n = 4;
  RowMatrix<float> shared = xb;
  for (Index b = 1; b < kB; ++b)
    shared.middleRows(b * kTb + starts[static_cast<std::size_t>(b)], n) = xb.topRows(n);
  write_batch("xs.npy", shared);
  const bool row_exact = gpt2::kernel_info().level != "generic";
  for (const std::string dtype : {"f32", "f64"}) {
    for (const std::string prefill : {"", "0", "2", "4", "5", "7"}) {
      SCOPED_TRACE("--dtype " + dtype + " --prefill '" + prefill + "'");
      std::vector<std::string> flags = {"--starts", csv(starts), "--lengths", csv(lengths), "--dtype", dtype};
      if (!prefill.empty()) flags.insert(flags.end(), {"--prefill", prefill});
      ASSERT_EQ(run_batch(flags, "xs.npy").status, 0);
      const std::string y = read_text(file("yb.npy")), p = read_text(file("pb.npy"));
      flags.insert(flags.end(), {"--share-prefix", std::to_string(n)});
      EXPECT_SUCCESS(run_batch(flags, "xs.npy"));
      EXPECT_EQ(read_text(file("pb.npy")), p);
      if (dtype == "f32" && row_exact) {
        EXPECT_EQ(read_text(file("yb.npy")), y);
      } else {
        const RowMatrix<double> y_shared = read_matrix_as_double(file("yb.npy"), dtype, {kB, kTb, kC});
        ASSERT_EQ(run_batch({"--starts", csv(starts), "--lengths", csv(lengths), "--dtype", dtype}, "xs.npy").status, 0);
        const RowMatrix<double> y_plain = read_matrix_as_double(file("yb.npy"), dtype, {kB, kTb, kC});
        EXPECT_TRUE(gpt2::test::near(y_shared, y_plain, dtype == "f32" ? kFloatTol : kDoubleTol));
        for (const Index row : padded_rows(starts, lengths))
          EXPECT_TRUE((y_shared.row(row).array() == 0.0).all()) << "row " << row;
      }
    }
  }
  // Longer sequences: a prefix of 20 rows ends inside the second 16-position block (the forks copy
  // it), the first steps and the decode steps cross blocks.
  {
    const Index B = 3, T = 40, n20 = 20;
    std::mt19937 rng(9);
    RowMatrix<float> xl = random_matrix(rng, B * T, kC, 1.0f);
    for (Index b = 1; b < B; ++b) xl.middleRows(b * T, n20) = xl.topRows(n20);
    gpt2::npy::write<float>(file("xl.npy"), xl.data(), {B, T, kC});
    for (const std::string prefill : {"", "5", "25", "40"}) {
      SCOPED_TRACE("[3, 40, 64], --prefill '" + prefill + "'");
      std::vector<std::string> flags = {"--lengths", "40,33,21"};
      if (!prefill.empty()) flags.insert(flags.end(), {"--prefill", prefill});
      ASSERT_EQ(run_batch(flags, "xl.npy").status, 0);
      const std::string y = read_text(file("yb.npy")), p = read_text(file("pb.npy"));
      flags.insert(flags.end(), {"--share-prefix", "20"});
      EXPECT_SUCCESS(run_batch(flags, "xl.npy"));
      EXPECT_EQ(read_text(file("pb.npy")), p);
      if (row_exact) {
        EXPECT_EQ(read_text(file("yb.npy")), y);
      }
    }
  }
  // N = 0 (nothing shared) and N = the shortest sequence
  for (const std::string share : {"0", "4"}) {
    ASSERT_EQ(run_batch({"--starts", csv(starts), "--lengths", csv(lengths), "--prefill", "1"}, "xs.npy").status, 0);
    const std::string y = read_text(file("yb.npy"));
    EXPECT_SUCCESS(run_batch({"--starts", csv(starts), "--lengths", csv(lengths), "--prefill", "1",
                              "--share-prefix", share}, "xs.npy"));
    if (row_exact) {
      EXPECT_EQ(read_text(file("yb.npy")), y) << "--share-prefix " << share;
    }
  }
}

// --share-prefix N --kv-cache bf16 (a paged cache of bf16 blocks, forked from the prefix) gives the
// bytes of the same batch through --prefill with --kv-cache bf16 (one contiguous bf16 cache per
// sequence) at every level but generic (there within the float tolerance) and amx (its AMX core
// runs the tiles of 16 rows or more, the float32 core the shorter ones: within kAmxChunkTol), with
// float32 and bf16 weights; the same for an int8 cache with int8 weights; and P is the plain run's.
constexpr double kAmxChunkTolSynthetic = 5e-4;
TEST_F(CliBatchTest, SharePrefixWithBf16CacheGivesThePrefillRunsBytes) {
  const std::vector<Index> starts = {0, 1, 2}, lengths = {7, 6, 4};
  RowMatrix<float> shared = xb;
  for (Index b = 1; b < kB; ++b)
    shared.middleRows(b * kTb + starts[static_cast<std::size_t>(b)], 4) = xb.topRows(4);
  write_batch("xs.npy", shared);
  for (const std::string& level : available_levels()) {
    for (const auto& [dtype, kv] : std::vector<std::pair<std::string, std::string>>{
             {"f32", "bf16"}, {"bf16", "bf16"}, {"int8", "int8"}}) {
      // "": --share-prefix without --prefill (the rest of each sequence in one step), against
      // --prefill 7 (every sequence in one chunk)
      for (const std::string prefill : {"", "0", "2", "4", "5", "7"}) {
        SCOPED_TRACE(level + " --dtype " + dtype + " --kv-cache " + kv + " --prefill '" + prefill + "'");
        const std::vector<std::string> base = {
            "run", "--weights", "w.safetensors", "--input", "xs.npy", "--n-head", "4", "--output",
            "yb.npy", "--probs", "pb.npy", "--starts", csv(starts), "--lengths", csv(lengths),
            "--dtype", dtype, "--kv-cache", kv};
        std::vector<std::string> plain_args = base;
        plain_args.insert(plain_args.end(), {"--prefill", prefill.empty() ? "7" : prefill});
        ASSERT_EQ(cli_at(level, plain_args).status, 0);
        const std::string y = read_text(file("yb.npy")), p = read_text(file("pb.npy"));
        const RowMatrix<double> y_plain = read_matrix_as_double(file("yb.npy"), "f32", {kB, kTb, kC});
        std::vector<std::string> shared_args = base;
        if (!prefill.empty()) shared_args.insert(shared_args.end(), {"--prefill", prefill});
        shared_args.insert(shared_args.end(), {"--share-prefix", "4"});
        EXPECT_SUCCESS(cli_at(level, shared_args));
        EXPECT_EQ(read_text(file("pb.npy")), p);
        const RowMatrix<double> y_shared = read_matrix_as_double(file("yb.npy"), "f32", {kB, kTb, kC});
        if (level == "generic")
          EXPECT_TRUE(gpt2::test::near(y_shared, y_plain, kFloatTol));
        else if (level == "amx")
          EXPECT_LE(relative_max_error(y_shared, y_plain), kAmxChunkTolSynthetic);
        else
          EXPECT_EQ(read_text(file("yb.npy")), y);
      }
    }
  }
}

// The data errors of --share-prefix, whole messages, and nothing written.
TEST_F(CliBatchTest, SharePrefixErrorsNameTheSequenceAndTheRow) {
  RowMatrix<float> shared = xb;
  for (Index b = 1; b < kB; ++b) shared.middleRows(b * kTb, 3) = xb.topRows(3);
  shared(2 * kTb + 1, 5) += 1.0f;  // sequence 2's row 1 differs
  write_batch("xs.npy", shared);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--share-prefix", "3"},
       "--share-prefix 3: sequence 2's row 1 differs from sequence 0's (the first 3 real rows of "
       "every sequence must be the same tokens)"},
      {{"--share-prefix", "1", "--lengths", "7,0,7"},
       "--share-prefix 1: sequence 1 has 0 real rows, fewer than the shared prefix"},
      {{"--share-prefix", "8"},
       "--share-prefix: expected at most 7 rows (T of input [3, 7, 64]), got 8"},
  };
  for (const auto& [flags, message] : cases) {
    SCOPED_TRACE(message);
    const CliResult r = run_batch(flags, "xs.npy");
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err, "gpt2-attention: " + message + "\n");
  }
  const CliResult two_d = run_batch({"--share-prefix", "2"}, "x.npy");
  EXPECT_EQ(two_d.status, 1);
  EXPECT_EQ(two_d.err, "gpt2-attention: --share-prefix: expected a 3-D input [B, T, C] (a batch "
                       "of sequences), got input [9, 64]\n");
  const CliResult bad = run_batch({"--share-prefix", "-1"}, "xs.npy");
  EXPECT_EQ(bad.status, 2);
  const std::vector<std::string> expected = {"w.safetensors", "x.npy", "xb.npy", "xs.npy"};
  EXPECT_EQ(dir.list(), expected);
}

// A padded batch with --dtype bf16, at every level: Y [B, T, C] and P [B, n_head, T, T] float32,
// within kBf16Tol (kBf16ProbsTol) of the f32 batch and not its bytes, padded rows 0; --prefill N
// (the batched decode) and --share-prefix N (the paged cache, with and without --prefill) give
// the bytes of the plain bf16 run at every level but generic (there: within the float tolerance,
// as in f32); P is computed the same way in all of them (the same bytes).
TEST_F(CliBatchTest, Bf16PrefillAndSharePrefixGiveThePlainBf16Run) {
  const std::vector<Index> starts = {0, 1, 2}, lengths = {7, 6, 4};
  const Index n_shared = 4;
  RowMatrix<float> shared = xb;
  for (Index b = 1; b < kB; ++b)
    shared.middleRows(b * kTb + starts[static_cast<std::size_t>(b)], n_shared) = xb.topRows(n_shared);
  write_batch("xs.npy", shared);
  const std::vector<std::string> layout = {"--starts", csv(starts), "--lengths", csv(lengths)};
  const auto batch = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", "xs.npy",
                                     "--output", "yb.npy", "--probs", "pb.npy", "--n-head", "4"};
    args.insert(args.end(), layout.begin(), layout.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  for (const std::string& level : available_levels()) {
    ASSERT_EQ(cli_at(level, batch({})).status, 0);
    const RowMatrix<double> y32 = read_matrix_as_double(file("yb.npy"), "f32", {kB, kTb, kC});
    const RowMatrix<double> p32 = read_matrix_as_double(file("pb.npy"), "f32", {kB, kHeads, kTb, kTb});
    const std::string y32_bytes = read_text(file("yb.npy"));
    ASSERT_EQ(cli_at(level, batch({"--dtype", "bf16"})).status, 0);
    const std::string y = read_text(file("yb.npy")), p = read_text(file("pb.npy"));
    const RowMatrix<double> y_plain = read_matrix_as_double(file("yb.npy"), "f32", {kB, kTb, kC});
    const RowMatrix<double> p_plain = read_matrix_as_double(file("pb.npy"), "f32", {kB, kHeads, kTb, kTb});
    {
      SCOPED_TRACE("GPT2_ATTENTION_ISA=" + level + " --dtype bf16 against f32");
      EXPECT_LE(relative_max_error(y_plain, y32), kBf16Tol);
      EXPECT_NE(y, y32_bytes);
      ASSERT_EQ(p_plain.rows(), p32.rows());
      EXPECT_LE((p_plain - p32).cwiseAbs().maxCoeff(), kBf16ProbsTol);
      for (const Index row : padded_rows(starts, lengths))
        EXPECT_TRUE((y_plain.row(row).array() == 0.0).all()) << "row " << row;
    }
    std::vector<std::vector<std::string>> variants;
    for (const Index n : {Index{0}, Index{1}, Index{3}, kTb - 1, kTb})
      variants.push_back({"--prefill", std::to_string(n)});
    for (const std::string prefill : {"", "0", "2", "5"}) {
      std::vector<std::string> v = {"--share-prefix", std::to_string(n_shared)};
      if (!prefill.empty()) v.insert(v.end(), {"--prefill", prefill});
      variants.push_back(v);
    }
    for (const std::vector<std::string>& v : variants) {
      std::string flags;
      for (const std::string& f : v) flags += " " + f;
      SCOPED_TRACE("GPT2_ATTENTION_ISA=" + level + " --dtype bf16" + flags);
      std::vector<std::string> extra = {"--dtype", "bf16"};
      extra.insert(extra.end(), v.begin(), v.end());
      EXPECT_SUCCESS(cli_at(level, batch(extra)));
      EXPECT_EQ(read_text(file("pb.npy")), p);
      if (level != "generic") {
        EXPECT_EQ(read_text(file("yb.npy")), y);
      } else {
        const RowMatrix<double> y_other = read_matrix_as_double(file("yb.npy"), "f32", {kB, kTb, kC});
        EXPECT_TRUE(gpt2::test::near(y_other, y_plain, kFloatTol));
        for (const Index row : padded_rows(starts, lengths))
          EXPECT_TRUE((y_other.row(row).array() == 0.0).all()) << "row " << row;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// run --tensor-parallel (under mpiexec, in a build with MPI)
// ---------------------------------------------------------------------------------------------

TEST_F(CliTest, TensorParallelIsASwitch) {
  const CliResult r = run_default({"--tensor-parallel=1"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "gpt2-attention: flag --tensor-parallel takes no value (see gpt2-attention --help)\n");
  EXPECT_NE(cli({"--help"}).out.find("mpiexec -n R gpt2-attention run --tensor-parallel"), std::string::npos);
}

#ifndef GPT2_CLI_MPIEXEC
TEST_F(CliTest, TensorParallelWithoutMpiIsAUsageError) {
  const CliResult r = run_default({"--tensor-parallel"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "gpt2-attention: --tensor-parallel: this gpt2-attention was built without MPI "
                   "(configure with GPT2_ATTENTION_MPI=ON; Debian: libopenmpi-dev, openmpi-bin) "
                   "(see gpt2-attention --help)\n");
  const std::vector<std::string> expected = {"w.safetensors", "x.npy"};
  EXPECT_EQ(dir.list(), expected);
}
#else
// mpiexec -n R --oversubscribe, one thread per rank (Open MPI needs the two variables as root).
std::vector<std::string> mpiexec(int ranks) {
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  ::setenv("OMP_NUM_THREADS", "1", 0);
  return {GPT2_CLI_MPIEXEC, "-n", std::to_string(ranks), "--oversubscribe"};
}

// The tensor-parallel run's files against the plain run's: the partial outputs are summed in
// another order (over the ranks), so Y differs by rounding: float within 8 kFloatTol, double
// within kDoubleTol. Only rank 0 writes: the directory ends with exactly the expected files.
TEST_F(CliBatchTest, TensorParallelMatchesThePlainRun) {
  struct Case {
    std::vector<std::string> flags;
    std::string input, dtype;
    std::vector<std::int64_t> y_shape, p_shape;
  };
  // xs.npy: the first 4 real rows of every sequence are the same (for --share-prefix 4)
  RowMatrix<float> shared = xb;
  for (Index b = 1; b < kB; ++b) shared.middleRows(b * kTb + b, 4) = xb.topRows(4);
  write_batch("xs.npy", shared);
  const std::vector<std::int64_t> y1 = {kT, kC}, p1 = {kHeads, kT, kT};
  const std::vector<std::int64_t> yb = {kB, kTb, kC}, pb = {kB, kHeads, kTb, kTb};
  const std::vector<std::string> s = {"--starts", "0,1,2", "--lengths", "7,6,4"};
  const auto cat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<Case> cases = {
      {{}, "x.npy", "f32", y1, p1},
      {{"--prefill", "3"}, "x.npy", "f64", y1, p1},
      {{"--starts", "0,2,0", "--lengths", "7,4,0"}, "xb.npy", "f32", yb, pb},
      {{"--starts", "2,0,1", "--lengths", "5,7,3", "--prefill", "2"}, "xb.npy", "f64", yb, pb},
      // every flag of run composes with --tensor-parallel: bf16 weights, bf16 KV caches, paged
      // caches forked from a shared prefix (float and bf16 blocks)
      {{}, "x.npy", "bf16", y1, p1},
      {{"--prefill", "3", "--kv-cache", "bf16"}, "x.npy", "f32", y1, p1},
      {{"--prefill", "2", "--kv-cache", "bf16"}, "x.npy", "bf16", y1, p1},
      {{"--starts", "2,0,1", "--lengths", "5,7,3", "--prefill", "2", "--kv-cache", "bf16"}, "xb.npy",
       "f32", yb, pb},
      {cat(s, {"--share-prefix", "4"}), "xs.npy", "f32", yb, pb},
      {cat(s, {"--share-prefix", "4", "--prefill", "5"}), "xs.npy", "f64", yb, pb},
      {cat(s, {"--share-prefix", "4", "--prefill", "2", "--kv-cache", "bf16"}), "xs.npy", "f32", yb, pb},
      {cat(s, {"--share-prefix", "4", "--prefill", "6", "--kv-cache", "bf16"}), "xs.npy", "bf16", yb, pb},
      {cat(s, {"--share-prefix", "4", "--kv-cache", "bf16"}), "xs.npy", "f32", yb, pb},
  };
  for (const Case& c : cases) {
    const std::string file_dtype = c.dtype == "f64" ? "f64" : "f32";
    const auto args_for = [&](const std::string& y_file, const std::string& p_file) {
      std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", c.input, "--n-head",
                                       "4", "--dtype", c.dtype, "--probs", p_file, "--output", y_file};
      args.insert(args.end(), c.flags.begin(), c.flags.end());
      return args;
    };
    std::string flags;
    for (const std::string& f : c.flags) flags += " " + f;
    SCOPED_TRACE(c.input + " --dtype " + c.dtype + flags);
    ASSERT_EQ(cli(args_for("y.npy", "p.npy")).status, 0);
    const RowMatrix<double> y = read_matrix_as_double(file("y.npy"), file_dtype, c.y_shape);
    const RowMatrix<double> p = read_matrix_as_double(file("p.npy"), file_dtype, c.p_shape);
    // the ranks' partial outputs are summed in another order than one product's chains
    const double tol = c.dtype == "f64" ? kDoubleTol : 8 * kFloatTol;
    for (const int ranks : {2, 3}) {  // 4 heads: 2 + 2, and 2 + 1 + 1
      SCOPED_TRACE(std::to_string(ranks) + " ranks");
      std::vector<std::string> tp_args = args_for("yt.npy", "pt.npy");
      tp_args.push_back("--tensor-parallel");
      const CliResult r = cli_under(mpiexec(ranks), tp_args);
      EXPECT_SUCCESS(r);
      EXPECT_TRUE(gpt2::test::near(read_matrix_as_double(file("yt.npy"), file_dtype, c.y_shape), y, tol));
      EXPECT_TRUE(gpt2::test::near(read_matrix_as_double(file("pt.npy"), file_dtype, c.p_shape), p, tol));
      const std::vector<std::string> expected = {"p.npy", "pt.npy", "w.safetensors", "x.npy", "xb.npy",
                                                 "xs.npy", "y.npy", "yt.npy"};
      EXPECT_EQ(dir.list(), expected);
    }
  }
}

// An error on any rank: exit status 1, rank 0's one line naming the rank (once, whatever the
// number of ranks), nothing written.
TEST_F(CliTest, TensorParallelErrorsStopEveryRankAndWriteNothing) {
  const std::vector<std::string> run = {"run", "--weights", "w.safetensors", "--input", "x.npy",
                                        "--output", "y.npy", "--probs", "p.npy", "--tensor-parallel"};
  std::vector<std::string> too_many = run, missing = run;
  too_many.insert(too_many.end(), {"--n-head", "2"});
  missing[2] = "nope.safetensors";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {too_many, "gpt2-attention: tensor parallel: 3 ranks but n_head = 2: every rank needs at "
                 "least one head (use at most 2 ranks)"},
      {missing, "gpt2-attention: tensor parallel rank 0 of 3: weights nope.safetensors: cannot open: "
                "No such file or directory"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(message);
    const CliResult r = cli_under(mpiexec(3), args);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find(message + "\n"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find(message), r.err.rfind(message)) << "printed more than once: " << r.err;
    const std::vector<std::string> expected = {"w.safetensors", "x.npy"};
    EXPECT_EQ(dir.list(), expected);
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// help and usage
// ---------------------------------------------------------------------------------------------

TEST_F(CliTest, HelpPrintsUsageToStdout) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--help"}, {"-h"}, {"help"}, {"run", "--help"},
                                             {"demo", "-h"}, {"run", "--weights=x", "-h"}}) {
    SCOPED_TRACE(args.back());
    const CliResult r = cli(args);
    EXPECT_EQ(r.status, 0);
    EXPECT_NE(r.out.find("usage: gpt2-attention run"), std::string::npos);
    EXPECT_NE(r.out.find("gpt2-attention demo"), std::string::npos);
    for (const std::string flag : {"--prefill N", "--lengths l0,l1,...", "--starts s0,s1,...", "[B, T, C]",
                                   "[B, n_head, T, T]", "P is computed per sequence\n                   without the cache",
                                   "With B = 0,\n                   leave --lengths and --starts out",
                                   "B = 0 or T = 0 gives empty outputs", "fails at once (out of memory)",
                                   "--png FILE.png", "--png-scale linear|sqrt", "keys after the query grey",
                                   "[--dtype f32|f64|bf16|int8]", "[--dtype f32|bf16|int8]", "[--kv-cache f32|bf16|int8]",
                                   "--dtype f32|f64|bf16|int8  ", "', weights: bf16'", "', weights: int8'"})
      EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
    EXPECT_EQ(r.err, "");
  }
}

// --version: "gpt2-attention VERSION (kernels: LEVEL; cpu: FEATURES)", LEVEL the one in use.
TEST_F(CliTest, VersionNamesTheKernelLevelInUseAndTheCpuFeatures) {
  const std::string version = std::to_string(gpt2::version_major) + "." +
                              std::to_string(gpt2::version_minor) + "." +
                              std::to_string(gpt2::version_patch);
  const std::string cpu = gpt2::kernels::cpu_features().names();
  const auto line = [&](const char* level) {
    return "gpt2-attention " + version + " (kernels: " + level + "; cpu: " + cpu + ")\n";
  };
  const CliResult chosen = cli_at("", {"--version"});
  EXPECT_EQ(chosen.status, 0) << chosen.err;
  EXPECT_EQ(chosen.out, line(gpt2::isa_name(gpt2::best_isa())));
  EXPECT_EQ(chosen.err, "");
  for (const gpt2::Isa isa : gpt2::available_isas()) {
    const CliResult forced = cli_at(gpt2::isa_name(isa), {"--version"});
    EXPECT_EQ(forced.status, 0) << forced.err;
    EXPECT_EQ(forced.out, line(gpt2::isa_name(isa)));
  }
  const CliResult extra = cli_at("", {"--version", "x"});
  EXPECT_EQ(extra.status, 2);
  EXPECT_EQ(extra.err, "gpt2-attention: --version takes no arguments, got 'x' (see gpt2-attention --help)\n");
}

TEST_F(CliTest, AnUnknownOrUnavailableLevelIsAnErrorForEveryCommand) {
  std::string available;
  for (const gpt2::Isa isa : gpt2::available_isas())
    available += (available.empty() ? "" : ", ") + std::string(gpt2::isa_name(isa));
  std::string every;
  for (const gpt2::Isa isa : gpt2::kAllIsas)
    every += (every.empty() ? "" : ", ") + std::string(gpt2::isa_name(isa));
  EXPECT_EQ(every, "generic, avx2, avx512, avx512_bf16, amx");
  const std::string unknown = "gpt2-attention: GPT2_ATTENTION_ISA: unknown kernel level 'avx9' "
                              "(expected one of " + every + "; available here: " + available + ")\n";
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--version"}, {"demo", "--tokens", "8"},
                                             {"run", "--weights", "w.safetensors", "--input",
                                              "x.npy", "--output", "y.npy", "--n-head", "4"}}) {
    SCOPED_TRACE(args.front());
    const CliResult r = cli_at("avx9", args);
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, unknown);
    EXPECT_FALSE(std::filesystem::exists(file("y.npy"))) << "nothing written";
  }
  bool refused = false;
  for (const gpt2::Isa isa : gpt2::kAllIsas) {
    if (gpt2::isa_supported(isa)) continue;
    refused = true;
    const CliResult r = cli_at(gpt2::isa_name(isa), {"--version"});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err.rfind(std::string("gpt2-attention: GPT2_ATTENTION_ISA: the CPU has no ") +
                              gpt2::isa_name(isa) + " (levels available here: " + available,
                          0),
              0u)
        << r.err;
  }
  if (!refused) std::printf("(this machine has every level: none to refuse)\n");
}

TEST_F(CliTest, DemoPrintsTheKernelLevelBesideItsTiming) {
  for (const gpt2::Isa isa : gpt2::available_isas()) {
    const CliResult r = cli_at(gpt2::isa_name(isa), {"demo", "--tokens", "8"});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find(std::string("GFLOP/s, kernels: ") + gpt2::isa_name(isa) + "\n"),
              std::string::npos)
        << r.out;
  }
}

// demo --dtype bf16 (and int8) at every level: the timing line names the level and the weights' dtype; with
// --dtype f32 (the default spelled out) it is the float32 line, without it.
TEST_F(CliTest, DemoBf16ReportsItsWeightDtype) {
  for (const std::string& level : available_levels()) {
    SCOPED_TRACE("GPT2_ATTENTION_ISA=" + level);
    const CliResult r = cli_at(level, {"demo", "--tokens", "8", "--dtype", "bf16"});
    EXPECT_SUCCESS(r);
    EXPECT_NE(r.out.find("GFLOP/s, kernels: " + level + ", weights: bf16\n"), std::string::npos) << r.out;
    const CliResult r8 = cli_at(level, {"demo", "--tokens", "8", "--dtype", "int8"});
    EXPECT_SUCCESS(r8);
    EXPECT_NE(r8.out.find("GFLOP/s, kernels: " + level + ", weights: int8\n"), std::string::npos) << r8.out;
    const CliResult f32 = cli_at(level, {"demo", "--tokens", "8", "--dtype", "f32"});
    EXPECT_SUCCESS(f32);
    EXPECT_NE(f32.out.find("GFLOP/s, kernels: " + level + "\n"), std::string::npos) << f32.out;
    EXPECT_EQ(f32.out.find("weights:"), std::string::npos) << f32.out;
  }
}

TEST_F(CliTest, NoCommandIsOneLineOnStderr) {
  const CliResult r = cli({});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "gpt2-attention: missing command (run, demo); see gpt2-attention --help\n");
}

TEST_F(CliTest, HelpThatCannotBeWrittenFails) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--help"}, {"run", "-h"}}) {
    SCOPED_TRACE(args.front());
    const CliResult r = cli(args, Stdout::ClosedPipe);
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err.rfind("gpt2-attention: cannot write to standard output", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input: exit status, one line naming the problem, nothing left behind
// ---------------------------------------------------------------------------------------------

struct BadCase {
  std::vector<std::string> args;
  int status;                         // 2: command line, 1: data
  std::vector<std::string> keywords;  // each must occur in the message
};

// The run command with the defaults, the flag `name` replaced by (or added as) `value`.
std::vector<std::string> run_with(const std::vector<std::pair<std::string, std::string>>& changes) {
  std::vector<std::pair<std::string, std::string>> flags = {
      {"--weights", "w.safetensors"}, {"--input", "x.npy"}, {"--output", "Y.npy"}, {"--n-head", "4"}};
  for (const std::pair<std::string, std::string>& change : changes) {
    const auto it = std::find_if(flags.begin(), flags.end(),
                                 [&](const auto& f) { return f.first == change.first; });
    if (it == flags.end())
      flags.push_back(change);
    else
      it->second = change.second;
  }
  std::vector<std::string> args = {"run"};
  for (const auto& [name, value] : flags) {
    if (value == "<drop>") continue;
    args.push_back(name);
    if (value != "<none>") args.push_back(value);
  }
  return args;
}

std::vector<BadCase> bad_cases() {
  const auto run = [](std::vector<std::pair<std::string, std::string>> c) { return run_with(c); };
  return {
      // The command line alone is wrong: 2.
      {{"frobnicate"}, 2, {"unknown command", "frobnicate"}},
      {{"--weights", "w.safetensors"}, 2, {"command", "--weights"}},
      {run({{"--bogus", "1"}}), 2, {"unknown flag", "--bogus"}},
      {run({{"-x", "<none>"}}), 2, {"unknown flag", "-x"}},
      {run({{"--weights", "<drop>"}}), 2, {"missing", "--weights"}},
      {run({{"--input", "<drop>"}}), 2, {"missing", "--input"}},
      {run({{"--output", "<drop>"}}), 2, {"missing", "--output"}},
      {{"run", "--weights", "w.safetensors", "--input", "x.npy", "--output", "Y.npy", "--layer", "0",
        "--layer", "1"}, 2, {"--layer", "more than once"}},
      {run({{"--probs", "<none>"}}), 2, {"--probs", "needs a value"}},
      {{"run", "--weights", "--input", "x.npy", "--output", "Y.npy"}, 2, {"--weights", "needs a value"}},
      {{"run", "--weights=w.safetensors", "--input=x.npy", "--output="}, 2, {"--output", "value"}},
      {run({{"--layer", "x1"}}), 2, {"--layer", "integer", "x1"}},
      {run({{"--layer", "-1"}}), 2, {"--layer", "-1"}},
      {run({{"--n-head", "0"}}), 2, {"--n-head", "0"}},
      {run({{"--n-head", "2.5"}}), 2, {"--n-head", "2.5"}},
      {run({{"--dtype", "f16"}}), 2, {"--dtype: expected f32, f64, bf16 or int8, got 'f16'"}},
      {run({{"--dtype", "BF16"}}), 2, {"--dtype: expected f32, f64, bf16 or int8, got 'BF16'"}},
      {{"demo", "--dtype", "f64"}, 2, {"--dtype: expected f32, bf16 or int8 (demo computes in float32), got 'f64'"}},
      {{"demo", "--dtype", "bf"}, 2, {"--dtype", "f32, bf16 or int8", "'bf'"}},
      {{"run", "stray", "--weights", "w.safetensors"}, 2, {"unexpected argument", "stray"}},
      {run({{"--probs", "Y.npy"}}), 2, {"--output", "--probs", "same file"}},
      {run({{"--probs", "./Y.npy"}}), 2, {"--output 'Y.npy' and --probs './Y.npy' name the same file"}},
      {run({{"--output", "./Y.npy"}, {"--probs", "Y.npy"}}), 2, {"--output", "--probs", "same file"}},
      {run({{"--probs", "ylink.npy"}}), 2, {"--output", "--probs", "ylink.npy", "same file"}},
      {run({{"--output", "w.safetensors"}}), 2, {"--output and --weights name the same file"}},
      {run({{"--output", "./w.safetensors"}}), 2, {"--output", "--weights", "same file"}},
      {run({{"--output", "wlink"}}), 2, {"--output 'wlink' and --weights 'w.safetensors'"}},
      {run({{"--probs", "w.safetensors"}}), 2, {"--probs and --weights name the same file"}},
      {run({{"--probs", "x.npy"}}), 2, {"--probs and --input name the same file"}},
      {run({{"--probs", "xlink.npy"}}), 2, {"--probs", "--input", "same file"}},
      {run({{"--probs", "hard.npy"}}), 2, {"--probs", "--input", "same file"}},
      {run({{"--png", "x.npy"}}), 2, {"--png and --input name the same file"}},
      {run({{"--png", "Y.npy"}}), 2, {"--output and --png name the same file"}},
      {run({{"--png", "P.npy"}, {"--probs", "P.npy"}}), 2, {"--probs and --png name the same file"}},
      {run({{"--png", "w.safetensors"}}), 2, {"--png and --weights name the same file"}},
      {run({{"--png-scale", "sqrt"}}), 2, {"--png-scale needs --png"}},
      {run({{"--png", "A.png"}, {"--png-scale", "log"}}), 2, {"--png-scale: expected linear or sqrt, got 'log'"}},
      {{"demo", "--png", "A.png", "--png-scale", "cubic"}, 2, {"--png-scale", "'cubic'"}},
      {{"demo", "--png-scale", "sqrt"}, 2, {"--png-scale needs --png"}},
      {{"demo", "--tokens", "0"}, 2, {"--tokens", "0"}},
      {{"demo", "--bogus", "1"}, 2, {"unknown flag", "--bogus"}},
      // The data are wrong: 1.
      {run({{"--n-head", "3"}}), 1, {"n_head", "divisor", "64", "3"}},
      {run({{"--n-head", "3"}, {"--dtype", "bf16"}}), 1, {"n_head", "divisor", "64", "3"}},
      {run({{"--input", "x60.npy"}, {"--dtype", "bf16"}, {"--probs", "P.npy"}}), 1,
       {"input", "x60.npy", "expected shape [T, 64], got [5, 60]"}},
      {run({{"--input", "x3.npy"}, {"--dtype", "bf16"}, {"--lengths", "3,4"}, {"--prefill", "1"}}), 1,
       {"--lengths", "[0, 3]", "got 4"}},
      {run({{"--output", "adir"}, {"--dtype", "bf16"}, {"--probs", "P.npy"}}), 1,
       {"output adir: not a regular file (it is a directory)"}},
      {{"demo", "--dtype", "bf16", "--n-head", "5"}, 1, {"n_head", "768", "5"}},
      {run({{"--weights", "nope.safetensors"}}), 1, {"weights", "nope.safetensors", "No such file"}},
      {run({{"--weights", "garbage.safetensors"}}), 1, {"weights", "garbage.safetensors"}},
      {run({{"--weights", "partial.safetensors"}}), 1, {"partial.safetensors", "c_proj.bias"}},
      {run({{"--layer", "2"}}), 1, {"layer 2", "h.2.attn.c_attn.weight"}},
      {run({{"--input", "missing.npy"}}), 1, {"input", "missing.npy", "No such file"}},
      {run({{"--input", "bad.npy"}}), 1, {"input", "bad.npy", "not a .npy file"}},
      {run({{"--input", "x1.npy"}}), 1, {"input x1.npy: expected shape [T, C] or [B, T, C] with C = 64, got [64]"}},
      {run({{"--input", "x4.npy"}}), 1,
       {"input x4.npy: expected shape [T, C] or [B, T, C] with C = 64, got 4 dimensions (shape [1, 2, 3, 64])"}},
      {run({{"--input", "x8.npy"}}), 1,
       {"input x8.npy: expected shape [T, C] or [B, T, C] with C = 64, got 8 dimensions "
        "(shape [1, 1, 1, 1, 1, 2, 3, 64])"}},
      {run({{"--input", "x9.npy"}}), 1,  // beyond what npy::read accepts: its own message
       {"input x9.npy: expected 1 to 8 dimensions, got 9 (shape [1, 1, 1, 1, 1, 1, 1, 1, 1])"}},
      {run({{"--input", "x60.npy"}}), 1, {"input", "x60.npy", "expected shape [T, 64], got [5, 60]"}},
      {run({{"--input", "x3c60.npy"}}), 1, {"input x3c60.npy: expected shape [B, T, 64], got [2, 3, 60]"}},
      {run({{"--prefill", "-1"}}), 2, {"--prefill: expected an integer >= 0, got '-1'"}},
      {run({{"--prefill", "2x"}}), 2, {"--prefill", "2x"}},
      {run({{"--prefill", "+2"}}), 2, {"--prefill: expected an integer >= 0, got '+2'"}},
      {run({{"--prefill", "-0"}}), 2, {"--prefill: expected an integer >= 0, got '-0'"}},
      {run({{"--prefill", " 2"}}), 2, {"--prefill: expected an integer >= 0, got ' 2'"}},
      {run({{"--prefill", "\n2"}}), 2, {"--prefill: expected an integer >= 0, got ' 2'"}},  // one_line
      {run({{"--layer", "+1"}}), 2, {"--layer: expected an integer in [0, 1000000], got '+1'"}},
      {run({{"--n-head", "+4"}}), 2, {"--n-head: expected an integer in [1, 1000000], got '+4'"}},
      {{"demo", "--tokens", "+16"}, 2, {"--tokens", "got '+16'"}},
      {run({{"--prefill", "99999999999999999999"}}), 2, {"--prefill", "99999999999999999999"}},
      {run({{"--lengths", "3,,4"}}), 2, {"--lengths: expected comma-separated integers >= 0, got '3,,4'"}},
      {run({{"--lengths", "x"}}), 2, {"--lengths", "integers >= 0", "'x'"}},
      {run({{"--lengths", "3,-1,4"}}), 2, {"--lengths", "'3,-1,4'"}},
      {run({{"--lengths", "3,4,"}}), 2, {"--lengths", "'3,4,'"}},
      {run({{"--lengths", "+3"}}), 2, {"--lengths", "'+3'"}},
      {run({{"--lengths", "3, 4"}}), 2, {"--lengths", "'3, 4'"}},
      {run({{"--starts", ",1"}}), 2, {"--starts", "integers >= 0", "',1'"}},
      {{"run", "--weights", "w.safetensors", "--input", "x.npy", "--output", "Y.npy", "--starts", "0",
        "--starts", "1"}, 2, {"--starts", "more than once"}},
      {run({{"--lengths", "9"}}), 1, {"--lengths: expected a 3-D input [B, T, C]", "got input [9, 64]"}},
      {run({{"--starts", "0"}}), 1, {"--starts: expected a 3-D input [B, T, C]", "got input [9, 64]"}},
      {run({{"--input", "x3.npy"}, {"--lengths", "3"}}), 1,
       {"--lengths: expected 2 values (one per sequence of input [2, 3, 64]), got 1"}},
      {run({{"--input", "x3.npy"}, {"--lengths", "3,4"}}), 1, {"--lengths", "[0, 3]", "got 4"}},
      {run({{"--input", "x3.npy"}, {"--starts", "4,0"}}), 1, {"--starts", "[0, 3]", "got 4"}},
      {run({{"--input", "x3.npy"}, {"--starts", "1,0"}, {"--lengths", "3,3"}, {"--prefill", "1"}}), 1,
       {"--lengths", "[0, 2]", "T - start = 3 - 1", "got 3"}},
      {run({{"--output", "nodir/Y.npy"}}), 1, {"output", "nodir/Y.npy"}},
      {run({{"--png", "nodir/A.png"}}), 1, {"png nodir/A.png: cannot create a temporary file", "No such file"}},
      {run({{"--png", "x.npy/A.png"}, {"--probs", "P.npy"}}), 1, {"png x.npy/A.png", "Not a directory"}},
      {run({{"--png", "adir"}}), 1, {"png adir: not a regular file (it is a directory)"}},
      {run({{"--input", "x0.npy"}, {"--png", "A.png"}}), 1, {"png A.png: the input [0, 64] has no tokens: nothing to draw"}},
      {{"demo", "--tokens", "8", "--png", "nodir/A.png"}, 1, {"png nodir/A.png", "No such file"}},
      {{"demo", "--tokens", "8", "--png", "adir"}, 1, {"png adir: not a regular file (it is a directory)"}},
      {run({{"--probs", "nodir/P.npy"}}), 1, {"probs", "nodir/P.npy"}},
      {run({{"--probs", "adir"}}), 1, {"probs adir: not a regular file (it is a directory)"}},
      {run({{"--output", "fifo"}}), 1, {"output fifo: not a regular file (it is a FIFO)"}},
      {run({{"--probs", "fifolink"}}), 1, {"probs fifolink: not a regular file (it links to fifo, a FIFO)"}},
      {{"demo", "--layer", "1"}, 1, {"embedded model", "layer 1"}},
      {{"demo", "--n-head", "5"}, 1, {"n_head", "768", "5"}},
      {{"demo", "--weights", "w.safetensors", "--n-head", "4"}, 1, {"w.safetensors", "wpe.weight"}},
      {{"demo", "--weights", "nope.safetensors"}, 1, {"nope.safetensors", "No such file"}},
  };
}

TEST_F(CliTest, BadInputFailsCleanly) {
  write_text(file("garbage.safetensors"), "this is not a safetensors file at all");
  write_text(file("bad.npy"), "neither is this a .npy file");
  std::vector<Tensor> partial = layer0.tensors("h.0.attn.");
  partial.pop_back();  // no c_proj.bias
  write_safetensors(file("partial.safetensors"), partial);
  gpt2::npy::write<float>(file("x3.npy"), std::vector<float>(2 * 3 * kC).data(), {2, 3, kC});
  gpt2::npy::write<float>(file("x1.npy"), std::vector<float>(kC).data(), {kC});
  gpt2::npy::write<float>(file("x4.npy"), std::vector<float>(2 * 3 * kC).data(), {1, 2, 3, kC});
  gpt2::npy::write<float>(file("x8.npy"), std::vector<float>(2 * 3 * kC).data(), {1, 1, 1, 1, 1, 2, 3, kC});
  {  // 9 dimensions, which npy::write refuses: numpy.save's bytes for np.zeros((1,) * 9, np.float32)
    std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }";
    dict.append(63 - (10 + dict.size()) % 64, ' ');
    dict += '\n';
    write_text(file("x9.npy"), std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(dict.size()) +
                                   std::string(1, '\0') + dict + std::string(sizeof(float), '\0'));
  }
  gpt2::npy::write<float>(file("x60.npy"), RowMatrix<float>::Zero(5, 60));
  gpt2::npy::write<float>(file("x0.npy"), RowMatrix<float>(0, kC));
  gpt2::npy::write<float>(file("x3c60.npy"), std::vector<float>(2 * 3 * 60).data(), {2, 3, 60});
  std::filesystem::create_directory(file("adir"));
  std::filesystem::create_symlink("Y.npy", file("ylink.npy"));  // dangling: Y.npy does not exist
  std::filesystem::create_symlink("w.safetensors", file("wlink"));
  std::filesystem::create_symlink("x.npy", file("xlink.npy"));
  std::filesystem::create_hard_link(file("x.npy"), file("hard.npy"));
  ASSERT_EQ(::mkfifo(file("fifo").c_str(), 0644), 0);
  std::filesystem::create_symlink("fifo", file("fifolink"));
  const std::vector<std::string> before = dir.list();

  for (const BadCase& c : bad_cases()) {
    std::string command;
    for (const std::string& a : c.args) command += " " + a;
    SCOPED_TRACE("gpt2-attention" + command);
    const CliResult r = cli(c.args);
    EXPECT_EQ(r.status, c.status) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.rfind("gpt2-attention: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.back(), '\n');
    for (const std::string& k : c.keywords) EXPECT_NE(r.err.find(k), std::string::npos) << k << " in " << r.err;
    EXPECT_EQ(dir.list(), before) << "files were left behind";
  }
}

// A malformed value is echoed in its message cut to 80 characters ("..." for the rest): a list
// given by a script can be long. Values of up to 80 characters are echoed whole.
TEST_F(CliTest, LongValuesAreCutInMessages) {
  std::string list;
  for (int i = 0; i < 100; ++i) list += std::to_string(i) + ",";
  list += "x";  // 291 characters, malformed at the end
  const std::string cut = list.substr(0, 77) + "...";
  const std::string digits(200, '7');
  const std::string eighty = std::string(79, '1') + "x";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {run_with({{"--lengths", list}}), "--lengths: expected comma-separated integers >= 0, got '" + cut + "'"},
      {run_with({{"--starts", list}}), "--starts: expected comma-separated integers >= 0, got '" + cut + "'"},
      {run_with({{"--lengths", eighty}}), "--lengths: expected comma-separated integers >= 0, got '" + eighty + "'"},
      {run_with({{"--prefill", digits}}), "--prefill: expected an integer >= 0, got '" + digits.substr(0, 77) + "...'"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(message);
    const CliResult r = cli(args);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.err, "gpt2-attention: " + message + " (see gpt2-attention --help)\n");
  }
}

// P is allocated before anything is computed: one too large for memory fails at once with the
// usual one-line error (status 1), not after computing Y. T = 100000 tokens (a 25.6 MB input):
// computing Y would take far longer than the limit below; P [4, T, T] would take 160 GB (in
// kSmallAddressSpace, a sure std::bad_alloc). Each path: 2-D plain and --prefill, 3-D plain and
// --prefill.
TEST_F(CliTest, ProbsTooLargeForMemoryFailBeforeAnythingIsComputed) {
  if (kAddressSanitizer) GTEST_SKIP() << "AddressSanitizer: no address-space limit, no std::bad_alloc";
  constexpr Index kLong = 100000;
  {
    const RowMatrix<float> big = RowMatrix<float>::Constant(kLong, kC, 0.5f);  // values do not matter
    gpt2::npy::write<float>(file("xl.npy"), big);
    gpt2::npy::write<float>(file("xl3.npy"), big.data(), {2, kLong / 2, kC});
  }
  for (const std::string input : {"xl.npy", "xl3.npy"})
    for (const std::string prefill : {"", "0", "1000"}) {
      SCOPED_TRACE(input + " --prefill '" + prefill + "'");
      std::vector<std::string> args = {"run", "--weights", "w.safetensors", "--input", input,
                                       "--output", "yl.npy", "--probs", "pl.npy", "--n-head", "4"};
      if (!prefill.empty()) args.insert(args.end(), {"--prefill", prefill});
      const CliResult r = cli_small(args);
      EXPECT_EQ(r.status, 1);
      EXPECT_EQ(r.err, "gpt2-attention: out of memory\n");
      EXPECT_LT(r.seconds, 5.0);
    }
  const std::vector<std::string> expected = {"w.safetensors", "x.npy", "xl.npy", "xl3.npy"};
  EXPECT_EQ(dir.list(), expected);
}

TEST_F(CliTest, FailedSecondWriteKeepsThePreviousOutput) {
  write_text(file("Y.npy"), "previous content");
  const CliResult r = cli(run_with({{"--probs", "nodir/P.npy"}}));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(read_text(file("Y.npy")), "previous content");
  const std::vector<std::string> expected = {"Y.npy", "w.safetensors", "x.npy"};
  EXPECT_EQ(dir.list(), expected);
}

// ---------------------------------------------------------------------------------------------
// What the outputs replace
// ---------------------------------------------------------------------------------------------

bool is_symlink(const std::string& path) {
  return std::filesystem::is_symlink(std::filesystem::symlink_status(path));
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<unsigned>(st.st_mode & 07777);
}

bool is_fifo(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

TEST_F(CliTest, OutputsThroughSymlinksKeepTheLinks) {
  std::filesystem::create_directory(file("real"));
  write_text(file("real/y.npy"), "old");
  std::filesystem::create_symlink("real/y.npy", file("ylink.npy"));
  std::filesystem::create_symlink("real/p.npy", file("plink.npy"));  // dangling: p.npy is created
  const CliResult r = cli(run_with({{"--output", "ylink.npy"}, {"--probs", "plink.npy"}}));
  EXPECT_SUCCESS(r);
  EXPECT_TRUE(is_symlink(file("ylink.npy")));
  EXPECT_TRUE(is_symlink(file("plink.npy")));
  const RowMatrix<float> y = read_npy_matrix<float>(file("real/y.npy"), kT, kC);
  EXPECT_TRUE(gpt2::test::near(y, layer0.forward<float>(x, kHeads), kFloatTol));
  EXPECT_EQ(read_npy<float>(file("real/p.npy"), {kHeads, kT, kT}).size(), std::size_t(kHeads * kT * kT));
  const std::vector<std::string> expected = {"plink.npy", "real", "w.safetensors", "x.npy", "ylink.npy"};
  EXPECT_EQ(dir.list(), expected);
  EXPECT_EQ(dir.list("real"), (std::vector<std::string>{"p.npy", "y.npy"}));
}

TEST_F(CliTest, OutputsKeepTheirPermissionsAndNewOnesFollowTheUmask) {
  write_text(file("Y.npy"), "old");
  ASSERT_EQ(::chmod(file("Y.npy").c_str(), 0600), 0);
  const mode_t saved = ::umask(027);  // inherited by the CLI
  const CliResult r = cli(run_with({{"--probs", "P.npy"}}));
  ::umask(saved);
  EXPECT_SUCCESS(r);
  EXPECT_EQ(mode_of(file("Y.npy")), 0600u);
  EXPECT_EQ(mode_of(file("P.npy")), 0640u);
  EXPECT_EQ(read_npy<float>(file("Y.npy"), {kT, kC}).size(), std::size_t(kT * kC));
}

TEST_F(CliTest, OutputThatIsNotARegularFileIsRefusedAndNothingIsWritten) {
  ASSERT_EQ(::mkfifo(file("fifo").c_str(), 0644), 0);
  write_text(file("Y.npy"), "previous content");
  ASSERT_EQ(::chmod(file("Y.npy").c_str(), 0640), 0);
  const CliResult r = cli(run_with({{"--probs", "fifo"}}));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "gpt2-attention: probs fifo: not a regular file (it is a FIFO)\n");
  EXPECT_EQ(read_text(file("Y.npy")), "previous content");
  EXPECT_EQ(mode_of(file("Y.npy")), 0640u);
  EXPECT_TRUE(is_fifo(file("fifo")));
  const std::vector<std::string> expected = {"Y.npy", "fifo", "w.safetensors", "x.npy"};
  EXPECT_EQ(dir.list(), expected);
}

TEST_F(CliTest, OutputMayBeTheInput) {
  // X is read in full before anything is written, so Y may replace it.
  const CliResult r = cli(run_with({{"--output", "./x.npy"}}));
  EXPECT_SUCCESS(r);
  const RowMatrix<float> y = read_npy_matrix<float>(file("x.npy"), kT, kC);
  EXPECT_TRUE(gpt2::test::near(y, layer0.forward<float>(x, kHeads), kFloatTol));
  const CliResult again = cli(run_with({{"--output", "x.npy"}}));
  EXPECT_SUCCESS(again);
  const RowMatrix<float> y2 = read_npy_matrix<float>(file("x.npy"), kT, kC);
  EXPECT_TRUE(gpt2::test::near(y2, layer0.forward<float>(y, kHeads), kFloatTol));
  const std::vector<std::string> expected = {"w.safetensors", "x.npy"};
  EXPECT_EQ(dir.list(), expected);
}

// ---------------------------------------------------------------------------------------------
// demo
// ---------------------------------------------------------------------------------------------

struct HeadRow {
  int head = -1;
  std::string job, designed;
};

// The table rows "<head> <prev> <first> <self> <mean dist> <evenness> <job> [<designed>]".
std::vector<HeadRow> head_rows(const std::string& text) {
  std::vector<HeadRow> rows;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    HeadRow row;
    double prev, first, self, distance, evenness;
    if (fields >> row.head >> prev >> first >> self >> distance >> evenness >> row.job) {
      fields >> row.designed;
      rows.push_back(row);
    }
  }
  return rows;
}

TEST_F(CliTest, DemoEmbeddedHeadsDoTheirDesignedJobs) {
  const CliResult r = cli({"demo"});
  EXPECT_SUCCESS(r);
  const std::vector<HeadRow> rows = head_rows(r.out);
  ASSERT_EQ(rows.size(), 12u) << r.out;
  const std::vector<std::string> jobs = {"previous-token", "first-token", "self", "even"};
  for (int h = 0; h < 12; ++h) {
    EXPECT_EQ(rows[static_cast<std::size_t>(h)].head, h);
    EXPECT_EQ(rows[static_cast<std::size_t>(h)].job, jobs[static_cast<std::size_t>(h % 4)]) << r.out;
    EXPECT_EQ(rows[static_cast<std::size_t>(h)].designed, jobs[static_cast<std::size_t>(h % 4)]);
  }
  EXPECT_NE(r.out.find("GFLOP/s"), std::string::npos);
  EXPECT_NE(r.out.find("median of"), std::string::npos);
  EXPECT_NE(r.out.find("FLOP = 2*T*C*3C + 2*T*C*C + 2*2*n_head*head_dim*T*(T+1)/2"), std::string::npos);
}

// With bf16 weights the embedded heads still do their designed jobs, and the table differs from
// the float32 one only in the statistics' last digits, if at all.
TEST_F(CliTest, DemoEmbeddedBf16HeadsDoTheirDesignedJobs) {
  const CliResult r = cli({"demo", "--dtype", "bf16"});
  EXPECT_SUCCESS(r);
  const std::vector<HeadRow> rows = head_rows(r.out);
  ASSERT_EQ(rows.size(), 12u) << r.out;
  for (const HeadRow& row : rows) EXPECT_EQ(row.job, row.designed) << r.out;
  EXPECT_NE(r.out.find(", weights: bf16\n"), std::string::npos) << r.out;
}

TEST_F(CliTest, DemoEmbeddedHoldsItsJobsOverLongerSequences) {
  const CliResult r = cli({"demo", "--tokens=256"});
  EXPECT_SUCCESS(r);
  const std::vector<HeadRow> rows = head_rows(r.out);
  ASSERT_EQ(rows.size(), 12u) << r.out;
  for (const HeadRow& row : rows) EXPECT_EQ(row.job, row.designed) << r.out;
}

// A checkpoint with wpe [32, C], ln_1 and the attention of layer 0, under `prefix`.
void write_demo_checkpoint(const std::string& path, const Layer& layer, const std::string& prefix) {
  std::mt19937 rng(7);
  std::vector<Tensor> tensors = layer.tensors(prefix + "h.0.attn.");
  tensors.push_back({prefix + "wpe.weight", {32, kC}, values(random_matrix(rng, 32, kC, 1.0f))});
  tensors.push_back({prefix + "h.0.ln_1.weight", {kC}, values(random_matrix(rng, 1, kC, 1.0f))});
  tensors.push_back({prefix + "h.0.ln_1.bias", {kC}, values(random_matrix(rng, 1, kC, 0.1f))});
  write_safetensors(path, tensors);
}

TEST_F(CliTest, DemoOnACheckpoint) {
  for (const std::string prefix : {"", "transformer."}) {
    SCOPED_TRACE("prefix '" + prefix + "'");
    write_demo_checkpoint(file("demo.safetensors"), layer0, prefix);
    const CliResult r = cli({"demo", "--weights", "demo.safetensors", "--tokens", "16", "--n-head", "4"});
    EXPECT_SUCCESS(r);
    const std::vector<HeadRow> rows = head_rows(r.out);
    ASSERT_EQ(rows.size(), 4u) << r.out;
    for (const HeadRow& row : rows) EXPECT_EQ(row.designed, "") << "a checkpoint has no designed jobs";
  }
  {  // bf16 weights: the same heads, the weight dtype reported
    const CliResult r = cli({"demo", "--weights", "demo.safetensors", "--tokens", "16", "--n-head", "4",
                             "--dtype", "bf16"});
    EXPECT_SUCCESS(r);
    EXPECT_EQ(head_rows(r.out).size(), 4u) << r.out;
    EXPECT_NE(r.out.find(", weights: bf16\n"), std::string::npos) << r.out;
  }
  const CliResult too_long = cli({"demo", "--weights", "demo.safetensors", "--tokens", "33", "--n-head", "4"});
  EXPECT_EQ(too_long.status, 1);
  EXPECT_NE(too_long.err.find("wpe.weight"), std::string::npos) << too_long.err;
  EXPECT_NE(too_long.err.find("33"), std::string::npos) << too_long.err;
}

// ---------------------------------------------------------------------------------------------
// --png: the probabilities as a picture
// ---------------------------------------------------------------------------------------------

// A PNG file decoded by stb_image as 8-bit RGB; width 0 when it cannot be read.
gpt2::cli::RgbImage read_png(const std::string& path) {
  int width = 0, height = 0, channels = 0;
  std::unique_ptr<unsigned char, void (*)(void*)> pixels(stbi_load(path.c_str(), &width, &height, &channels, 3),
                                                          stbi_image_free);
  if (!pixels) {
    ADD_FAILURE() << path << ": " << stbi_failure_reason();
    return {};
  }
  gpt2::cli::RgbImage image(width, height, gpt2::cli::kBlack);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      const unsigned char* p = pixels.get() + 3 * (static_cast<std::size_t>(y) * width + x);
      image.set(x, y, {p[0], p[1], p[2]});
    }
  return image;
}

// Checks the picture `png` against the probabilities P [B * n_head * T, T] it shows: its size is
// the layout's, and every pixel of every cell has the colour of its probability (or a grey).
void expect_picture_of(const std::string& png, const RowMatrix<float>& probs, Index n_head, Index T,
                       const std::vector<gpt2::cli::Span>& spans, bool batched,
                       gpt2::cli::ColourScale scale = gpt2::cli::ColourScale::linear) {
  const gpt2::cli::RgbImage image = read_png(png);
  const Index B = static_cast<Index>(spans.size());
  const gpt2::cli::PictureLayout layout(B, n_head, T, batched);
  ASSERT_EQ(image.width(), layout.width());
  ASSERT_EQ(image.height(), layout.height());
  ASSERT_EQ(probs.rows(), B * n_head * T);
  const int cell = layout.cell();
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < n_head; ++h)
      for (Index i = 0; i < T; ++i)
        for (Index j = 0; j < T; ++j) {
          const gpt2::cli::Rgb expected =
              gpt2::cli::cell_colour(i, j, spans[static_cast<std::size_t>(b)],
                                     static_cast<double>(probs((b * n_head + h) * T + i, j)), scale);
          for (int d = 0; d < cell; ++d) {  // the cell's diagonal pixels
            const gpt2::cli::Rgb got = image.at(layout.cells_x(b, h) + static_cast<int>(j) * cell + d,
                                                layout.cells_y(b, h) + static_cast<int>(i) * cell + d);
            ASSERT_TRUE(got == expected) << "b " << b << " h " << h << " cell (" << i << ", " << j << ")";
          }
        }
}

TEST_F(CliTest, RunPngShowsTheProbabilities) {
  RowMatrix<float> expected;  // the library's probabilities
  layer0.forward<float>(x, kHeads, &expected);
  for (const std::string scale : {"linear", "sqrt"}) {
    SCOPED_TRACE(scale);
    const CliResult r = run_default({"--probs", "p.npy", "--png", scale + ".png", "--png-scale", scale});
    EXPECT_SUCCESS(r);
    EXPECT_EQ(r.out, "");
    const std::vector<float> p = read_npy<float>(file("p.npy"), {kHeads, kT, kT});
    ASSERT_EQ(p.size(), std::size_t(kHeads * kT * kT));
    // The picture shows the very probabilities written to p.npy, which are the library's.
    const RowMatrix<float> probs = Eigen::Map<const RowMatrix<float>>(p.data(), kHeads * kT, kT);
    EXPECT_TRUE(gpt2::test::near(probs, expected, kFloatTol));
    expect_picture_of(file(scale + ".png"), probs, kHeads, kT, {{0, kT}}, false,
                      scale == "sqrt" ? gpt2::cli::ColourScale::sqrt : gpt2::cli::ColourScale::linear);
  }
  // Without --probs the picture alone is written, from the same probabilities: the same pixels.
  EXPECT_SUCCESS(run_default({"--png", "alone.png"}));
  const gpt2::cli::RgbImage alone = read_png(file("alone.png")), linear = read_png(file("linear.png"));
  ASSERT_EQ(alone.width(), linear.width());
  ASSERT_EQ(alone.height(), linear.height());
  EXPECT_TRUE(std::equal(alone.data(), alone.data() + 3 * alone.width() * alone.height(), linear.data()));
  const std::vector<std::string> files = {"alone.png", "linear.png", "p.npy", "sqrt.png", "w.safetensors",
                                          "x.npy", "y.npy"};
  EXPECT_EQ(dir.list(), files);
}

TEST_F(CliTest, RunPngInDoubleShowsTheDoubleProbabilities) {
  EXPECT_SUCCESS(run_default({"--dtype", "f64", "--probs", "p.npy", "--png", "p.png", "--prefill", "4"}));
  const std::vector<double> p = read_npy<double>(file("p.npy"), {kHeads, kT, kT});
  ASSERT_EQ(p.size(), std::size_t(kHeads * kT * kT));
  const gpt2::cli::RgbImage image = read_png(file("p.png"));
  const gpt2::cli::PictureLayout layout(1, kHeads, kT, false);
  ASSERT_EQ(image.width(), layout.width());
  ASSERT_EQ(image.height(), layout.height());
  for (Index h = 0; h < kHeads; ++h)
    for (Index i = 0; i < kT; ++i)
      for (Index j = 0; j < kT; ++j)
        EXPECT_EQ(image.at(layout.cells_x(0, h) + static_cast<int>(j) * layout.cell(),
                           layout.cells_y(0, h) + static_cast<int>(i) * layout.cell()),
                  j > i ? gpt2::cli::kMasked
                        : gpt2::cli::viridis(p[static_cast<std::size_t>((h * kT + i) * kT + j)]))
            << "h " << h << " (" << i << ", " << j << ")";
}

TEST_F(CliBatchTest, PngStacksOneGridPerSequence) {
  const std::vector<Index> starts = {0, 2, 0}, lengths = {kTb, 4, 0};
  const CliResult r = run_batch({"--starts", csv(starts), "--lengths", csv(lengths), "--png", "pb.png"});
  EXPECT_SUCCESS(r);
  const RowMatrix<float> p = read_batch_probs<float>(file("pb.npy"));
  ASSERT_EQ(p.rows(), kB * kHeads * kTb);
  std::vector<gpt2::cli::Span> spans;
  for (Index b = 0; b < kB; ++b) spans.push_back({starts[b], lengths[b]});
  expect_picture_of(file("pb.png"), p, kHeads, kTb, spans, true);
  // Sequence 1's padded first row is light grey, its real rows are coloured.
  const gpt2::cli::RgbImage image = read_png(file("pb.png"));
  const gpt2::cli::PictureLayout layout(kB, kHeads, kTb, true);
  EXPECT_EQ(image.at(layout.cells_x(1, 0), layout.cells_y(1, 0)), gpt2::cli::kPadding);
  EXPECT_EQ(image.at(layout.cells_x(1, 0) + 2 * layout.cell(), layout.cells_y(1, 0) + 2 * layout.cell()),
            gpt2::cli::viridis(1.0)) << "a sequence's first real token attends only to itself";
}

TEST_F(CliTest, PngThatCannotBeWrittenLeavesNothingBehind) {
  write_text(file("Y.npy"), "previous content");
  // Staging fails for a missing directory and (as any user, root too) under a regular file.
  for (const std::string png : {"nodir/A.png", "x.npy/A.png"}) {
    SCOPED_TRACE(png);
    const CliResult r = cli(run_with({{"--probs", "P.npy"}, {"--png", png}}));
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err.rfind("gpt2-attention: png " + png + ": ", 0), 0u) << r.err;
    EXPECT_EQ(read_text(file("Y.npy")), "previous content");
    EXPECT_EQ(dir.list(), (std::vector<std::string>{"Y.npy", "w.safetensors", "x.npy"}));
  }
  // A directory without write permission (only meaningful when not root: root writes anyway).
  std::filesystem::create_directory(file("ro"));
  ASSERT_EQ(::chmod(file("ro").c_str(), 0555), 0);
  if (::geteuid() != 0) {
    const CliResult r = cli(run_with({{"--png", "ro/A.png"}}));
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("png ro/A.png: cannot create a temporary file"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
    EXPECT_EQ(read_text(file("Y.npy")), "previous content");
    EXPECT_TRUE(dir.list("ro").empty());
  }
  ::chmod(file("ro").c_str(), 0755);
}

TEST_F(CliTest, DemoPngShowsTheDesignedJobs) {
  constexpr Index T = 16;
  const CliResult r = cli({"demo", "--tokens", std::to_string(T), "--png", "demo.png"});
  EXPECT_SUCCESS(r);
  EXPECT_NE(r.out.find("picture: demo.png"), std::string::npos) << r.out;
  ASSERT_EQ(head_rows(r.out).size(), 12u);
  const gpt2::cli::RgbImage image = read_png(file("demo.png"));
  const gpt2::cli::PictureLayout layout(1, 12, T, false);
  ASSERT_EQ(image.width(), layout.width());
  ASSERT_EQ(image.height(), layout.height());
  // The embedded heads are sharp: 0 previous token, 1 first token, 2 the token itself. In row 10
  // the one key they attend to is near yellow, the others near viridis(0); keys after it are grey.
  const auto colour = [&](Index h, Index i, Index j) {
    return image.at(layout.cells_x(0, h) + static_cast<int>(j) * layout.cell(),
                    layout.cells_y(0, h) + static_cast<int>(i) * layout.cell());
  };
  const auto near = [](gpt2::cli::Rgb a, gpt2::cli::Rgb b) {
    return std::abs(a.r - b.r) + std::abs(a.g - b.g) + std::abs(a.b - b.b) <= 30;
  };
  const gpt2::cli::Rgb one = gpt2::cli::viridis(1.0), zero = gpt2::cli::viridis(0.0);
  for (const auto& [h, key] : {std::pair<Index, Index>{0, 9}, {1, 0}, {2, 10}}) {
    SCOPED_TRACE("head " + std::to_string(h));
    for (Index j = 0; j <= 10; ++j) EXPECT_TRUE(near(colour(h, 10, j), j == key ? one : zero)) << "key " << j;
    EXPECT_EQ(colour(h, 10, 11), gpt2::cli::kMasked);
  }
}

// ---------------------------------------------------------------------------------------------
// Real GPT-2 small layer 0 (optional)
// ---------------------------------------------------------------------------------------------

TEST_F(CliTest, RealGpt2Layer0) {
  const char* weights = std::getenv("GPT2_SMALL_WEIGHTS");
  if (weights == nullptr || *weights == '\0')
    GTEST_SKIP() << "GPT2_SMALL_WEIGHTS not set: skipping the real GPT-2 weights test";

  const CliResult demo = cli({"demo", "--weights", weights, "--png", "layer0.png"});
  EXPECT_SUCCESS(demo);
  const std::vector<HeadRow> rows = head_rows(demo.out);
  ASSERT_EQ(rows.size(), 12u) << demo.out;
  // Position alone drives some heads of layer 0: one attends to the first token, one to itself.
  EXPECT_EQ(std::count_if(rows.begin(), rows.end(), [](const HeadRow& h) { return h.job == "first-token"; }), 1);
  EXPECT_GE(std::count_if(rows.begin(), rows.end(), [](const HeadRow& h) { return h.job == "self"; }), 1);
  {  // The picture of the first-token head: its key-0 column is brighter than the rest of its rows.
    const gpt2::cli::RgbImage image = read_png(file("layer0.png"));
    const gpt2::cli::PictureLayout layout(1, 12, 64, false);
    ASSERT_EQ(image.width(), layout.width());
    const auto first = std::find_if(rows.begin(), rows.end(), [](const HeadRow& h) { return h.job == "first-token"; });
    ASSERT_NE(first, rows.end());
    const Index h = first - rows.begin();
    const auto luma = [&](Index i, Index j) {
      const gpt2::cli::Rgb c = image.at(layout.cells_x(0, h) + static_cast<int>(j) * layout.cell(),
                                        layout.cells_y(0, h) + static_cast<int>(i) * layout.cell());
      return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b;
    };
    for (Index i = 8; i < 64; i += 8)
      for (Index j = 1; j <= i; j += 3) EXPECT_GT(luma(i, 0), luma(i, j) + 50) << "row " << i << " key " << j;
  }

  // X = ln_1(wpe[:16]), built here with the library.
  constexpr Index T = 16, C = 768;
  const gpt2::safetensors::File checkpoint = gpt2::safetensors::File::open(weights);
  const std::vector<float> wpe = checkpoint.to_vector<float>("wpe.weight");
  const std::vector<float> ln_w = checkpoint.to_vector<float>("h.0.ln_1.weight");
  const std::vector<float> ln_b = checkpoint.to_vector<float>("h.0.ln_1.bias");
  RowMatrix<float> x(T, C);
  gpt2::layer_norm<float>(gpt2::ConstMatrixMap<float>(wpe.data(), T, C),
                          gpt2::ConstVectorMap<float>(ln_w.data(), C),
                          gpt2::ConstVectorMap<float>(ln_b.data(), C), 1e-5f, x);
  gpt2::npy::write<float>(file("x16.npy"), x);

  const CliResult run = cli({"run", "--weights", weights, "--input", "x16.npy", "--output", "y16.npy"});
  EXPECT_SUCCESS(run);
  const gpt2::safetensors::LoadedAttention<float> loaded = gpt2::safetensors::load_attention<float>(checkpoint, 0);
  const RowMatrix<float> y = read_npy_matrix<float>(file("y16.npy"), T, C);
  EXPECT_TRUE(gpt2::test::near(y, gpt2::attention(loaded.weights(), x), kFloatTol));
}

// ln_1(wpe[:T]) + a little noise [T, 768] from the real checkpoint: positions and content.
RowMatrix<float> real_layer0_input(const char* weights, Index T) {
  constexpr Index C = 768;
  const gpt2::safetensors::File checkpoint = gpt2::safetensors::File::open(weights);
  const std::vector<float> wpe = checkpoint.to_vector<float>("wpe.weight");
  const std::vector<float> ln_w = checkpoint.to_vector<float>("h.0.ln_1.weight");
  const std::vector<float> ln_b = checkpoint.to_vector<float>("h.0.ln_1.bias");
  RowMatrix<float> x(T, C);
  gpt2::layer_norm<float>(gpt2::ConstMatrixMap<float>(wpe.data(), T, C),
                          gpt2::ConstVectorMap<float>(ln_w.data(), C),
                          gpt2::ConstVectorMap<float>(ln_b.data(), C), 1e-5f, x);
  std::mt19937 rng(5);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  for (Index i = 0; i < T; ++i)
    for (Index j = 0; j < C; ++j) x(i, j) += noise(rng);
  return x;
}

// On the real layer 0: `run --prefill N` (a prompt of N tokens, then one token at a time through
// the KV cache) writes the bytes a plain run writes, for every N, also for a padded batch
// (--lengths with --prefill): the decode is bitwise the prefill.
TEST_F(CliTest, RealGpt2Layer0PrefillIsByteIdentical) {
  const char* weights = std::getenv("GPT2_SMALL_WEIGHTS");
  if (weights == nullptr || *weights == '\0')
    GTEST_SKIP() << "GPT2_SMALL_WEIGHTS not set: skipping the real GPT-2 weights test";
  if (!row_exact_cli("f32"))
    GTEST_SKIP() << "skipped: the CPU has no avx2 (the generic level's projections are not row-exact)";
  constexpr Index T = 100, C = 768;
  const RowMatrix<float> x = real_layer0_input(weights, T);
  gpt2::npy::write<float>(file("xr.npy"), x);
  ASSERT_EQ(cli({"run", "--weights", weights, "--input", "xr.npy", "--output", "yr.npy"}).status, 0);
  const std::string plain = read_text(file("yr.npy"));
  for (const Index n : {Index{0}, Index{1}, Index{64}, Index{65}, T - 1}) {
    SCOPED_TRACE("--prefill " + std::to_string(n));
    EXPECT_SUCCESS(cli({"run", "--weights", weights, "--input", "xr.npy", "--output", "yp.npy",
                        "--prefill", std::to_string(n)}));
    EXPECT_EQ(read_text(file("yp.npy")), plain);
  }
  // a padded batch [2, T, C]: sequence 0 the first 80 rows, sequence 1 rows 20 .. 99
  std::vector<float> xb(2 * T * C, 0.0f);
  for (Index i = 0; i < T; ++i)
    for (Index j = 0; j < C; ++j) xb[i * C + j] = xb[(T + i) * C + j] = x(i, j);
  gpt2::npy::write<float>(file("xrb.npy"), xb.data(), {2, T, C});
  const std::vector<std::string> batch = {"run", "--weights", weights, "--input", "xrb.npy",
                                          "--starts", "0,20", "--lengths", "80,80"};
  std::vector<std::string> args = batch;
  args.insert(args.end(), {"--output", "yrb.npy"});
  ASSERT_EQ(cli(args).status, 0);
  const std::string plain_batch = read_text(file("yrb.npy"));
  for (const Index n : {Index{1}, Index{70}}) {
    SCOPED_TRACE("batch --prefill " + std::to_string(n));
    args = batch;
    args.insert(args.end(), {"--output", "yrbp.npy", "--prefill", std::to_string(n)});
    EXPECT_SUCCESS(cli(args));
    EXPECT_EQ(read_text(file("yrbp.npy")), plain_batch);
  }
}

// On the real layer 0 with --dtype bf16, at every level: Y within kBf16Tol of the f32 run and not
// its bytes, P within kBf16ProbsTol; --prefill N, a padded batch with --lengths and --prefill, and
// --share-prefix give the plain bf16 run's bytes at every level but generic and amx (generic:
// within the float tolerance; amx: within kAmxChunkTol, because its AMX attention core runs tiles
// of 16 rows or more and the float32 core the shorter ones, such as decode steps).
// The float tolerance of the generic level's one-row products against its chunked ones on the
// real layer (C = 768: longer dot products than the synthetic C = 64 of kFloatTol). Measured max
// |diff| / max |plain| for --prefill 0, 1, 64: 1.9e-6 in f32, 1.1e-6 in bf16.
constexpr double kFloatTolReal = 4e-6;
// The amx level's chunked bf16 runs against its plain one (the AMX core's rows against the float32
// core's: q, k, v and p in two bf16 parts there, about 16 bits, float32 here; logits up to 80 in
// layer 0). Measured max |diff| / max |plain| on this test's runs (printed below): 0.7e-4 to
// 2.1e-4, against the 3e-3 of bf16 itself.
constexpr double kAmxChunkTol = 5e-4;

TEST_F(CliTest, RealGpt2Layer0Bf16) {
  const char* weights = std::getenv("GPT2_SMALL_WEIGHTS");
  if (weights == nullptr || *weights == '\0')
    GTEST_SKIP() << "GPT2_SMALL_WEIGHTS not set: skipping the real GPT-2 weights test";
  constexpr Index T = 100, C = 768;
  const RowMatrix<float> x = real_layer0_input(weights, T);
  gpt2::npy::write<float>(file("xr.npy"), x);
  // a padded batch [2, T, C]: both sequences start with x's rows; sequence 0 all T rows,
  // sequence 1 rows 0 .. 69 (right padding)
  std::vector<float> xb(2 * T * C, 0.0f);
  for (Index i = 0; i < T; ++i)
    for (Index j = 0; j < C; ++j) xb[i * C + j] = xb[(T + i) * C + j] = x(i, j);
  gpt2::npy::write<float>(file("xrb.npy"), xb.data(), {2, T, C});
  const std::vector<std::string> single = {"run", "--weights", weights, "--input", "xr.npy"};
  const std::vector<std::string> batch = {"run", "--weights", weights, "--input", "xrb.npy",
                                          "--lengths", "100,70"};
  const auto with = [](std::vector<std::string> args, const std::vector<std::string>& extra) {
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  for (const std::string& level : available_levels()) {
    SCOPED_TRACE("GPT2_ATTENTION_ISA=" + level);
    ASSERT_EQ(cli_at(level, with(single, {"--output", "y32.npy", "--probs", "p32.npy"})).status, 0);
    ASSERT_EQ(cli_at(level, with(single, {"--output", "yb.npy", "--probs", "pb.npy", "--dtype", "bf16"})).status, 0);
    const RowMatrix<double> y32 = read_matrix_as_double(file("y32.npy"), "f32", {T, C});
    const RowMatrix<double> yb = read_matrix_as_double(file("yb.npy"), "f32", {T, C});
    const RowMatrix<double> p32 = read_matrix_as_double(file("p32.npy"), "f32", {12, T, T});
    const RowMatrix<double> pb = read_matrix_as_double(file("pb.npy"), "f32", {12, T, T});
    ASSERT_EQ(pb.rows(), p32.rows());
    const double err = relative_max_error(yb, y32), p_err = (pb - p32).cwiseAbs().maxCoeff();
    std::printf("(GPT-2 small layer 0, T = 100, --dtype bf16 at %s: max |Y - Y_f32| / max |Y_f32| = "
                "%.2e, max |P - P_f32| = %.2e)\n", level.c_str(), err, p_err);
    EXPECT_LE(err, kBf16Tol);
    EXPECT_LE(p_err, kBf16ProbsTol);
    EXPECT_NE(read_text(file("yb.npy")), read_text(file("y32.npy")));

    const std::string plain = read_text(file("yb.npy")), plain_p = read_text(file("pb.npy"));
    for (const Index n : {Index{0}, Index{1}, Index{64}, Index{65}, T - 1}) {
      SCOPED_TRACE("--dtype bf16 --prefill " + std::to_string(n));
      EXPECT_SUCCESS(cli_at(level, with(single, {"--output", "yp.npy", "--probs", "pp.npy", "--dtype",
                                                 "bf16", "--prefill", std::to_string(n)})));
      if (level == "generic") {
        EXPECT_TRUE(gpt2::test::near(read_matrix_as_double(file("yp.npy"), "f32", {T, C}), yb, kFloatTolReal));
      } else if (level == "amx") {
        const double d = relative_max_error(read_matrix_as_double(file("yp.npy"), "f32", {T, C}), yb);
        std::printf("(amx, --dtype bf16 --prefill %ld: max |diff| / max |plain| = %.2e)\n", static_cast<long>(n), d);
        EXPECT_LE(d, kAmxChunkTol);
        EXPECT_EQ(read_text(file("pp.npy")), plain_p);  // the probabilities' own float32 path
      } else {
        EXPECT_EQ(read_text(file("yp.npy")), plain);
        EXPECT_EQ(read_text(file("pp.npy")), plain_p);
      }
    }
    ASSERT_EQ(cli_at(level, with(batch, {"--output", "yrb.npy", "--dtype", "bf16"})).status, 0);
    const std::string plain_batch = read_text(file("yrb.npy"));
    const RowMatrix<double> y_batch = read_matrix_as_double(file("yrb.npy"), "f32", {2, T, C});
    for (const std::vector<std::string>& v : std::vector<std::vector<std::string>>{
             {"--prefill", "1"}, {"--prefill", "70"}, {"--share-prefix", "50"},
             {"--share-prefix", "50", "--prefill", "20"}}) {
      SCOPED_TRACE("batch --dtype bf16 " + v.front() + " " + v[1] + (v.size() > 2 ? " --prefill 20" : ""));
      std::vector<std::string> extra = {"--output", "yrbp.npy", "--dtype", "bf16"};
      extra.insert(extra.end(), v.begin(), v.end());
      EXPECT_SUCCESS(cli_at(level, with(batch, extra)));
      if (level == "generic") {
        EXPECT_TRUE(gpt2::test::near(read_matrix_as_double(file("yrbp.npy"), "f32", {2, T, C}), y_batch, kFloatTolReal));
      } else if (level == "amx") {
        EXPECT_LE(relative_max_error(read_matrix_as_double(file("yrbp.npy"), "f32", {2, T, C}), y_batch), kAmxChunkTol);
      } else {
        EXPECT_EQ(read_text(file("yrbp.npy")), plain_batch);
      }
    }
  }
}

}  // namespace
