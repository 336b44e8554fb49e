// The error table of docs/errors.md ("Errors: every rejected input and its message"): each row is
// produced here by actually making the library or the CLI reject the input, and the test fails
// unless docs/errors.md holds exactly the table this program builds, between the markers
//   <!-- error-table:begin -->  and  <!-- error-table:end -->
// so the table cannot go stale. After changing a message: GPT2_UPDATE_ERROR_TABLE=1
// test_error_table rewrites the block in docs/errors.md (then review the diff).
//
// Library rows give the exception type and what() (ShapeError, ConfigError, CapacityError and
// FormatError all derive from gpt2::Error); CLI rows give the exit status and the line on stderr.
// The CLI runs in a temporary directory with relative file names, so its messages are stable.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/npy.hpp"
#include "gpt2/paged_kv_cache.hpp"
#include "gpt2/safetensors.hpp"
#include "support/models.hpp"
#include "support/tmpdir.hpp"

#ifndef GPT2_CLI_PATH
#error "GPT2_CLI_PATH must name the gpt2-attention executable"
#endif
#ifndef GPT2_ERRORS_DOC_PATH
#error "GPT2_ERRORS_DOC_PATH must name docs/errors.md"
#endif

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::RowVector;

struct Row {
  std::string where, input, kind, message;
};

std::string escape_cell(std::string s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// The exception type of a gpt2 error, most derived first.
std::string type_of(const std::exception& e) {
  if (dynamic_cast<const gpt2::ShapeError*>(&e)) return "ShapeError";
  if (dynamic_cast<const gpt2::ConfigError*>(&e)) return "ConfigError";
  if (dynamic_cast<const gpt2::CapacityError*>(&e)) return "CapacityError";
  if (dynamic_cast<const gpt2::FormatError*>(&e)) return "FormatError";
  if (dynamic_cast<const gpt2::Error*>(&e)) return "Error";
  return "NOT A gpt2::Error";
}

class Table {
 public:
  // Runs f, which must throw a gpt2::Error, and records the row.
  void lib(const std::string& where, const std::string& input, const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      const std::string kind = type_of(e);
      EXPECT_NE(kind, "NOT A gpt2::Error") << input << ": " << e.what();
      rows_.push_back({where, input, kind, e.what()});
      return;
    }
    ADD_FAILURE() << where << ": " << input << ": no exception";
  }

  // Runs the CLI with `args` in `dir`; it must fail with a one-line message on stderr.
  void cli(const std::string& input, const std::vector<std::string>& args, const std::string& dir) {
    const gpt2::test::TempDir logs("gpt2-errtab");
    const std::string err_path = logs.file("stderr");
    std::vector<std::string> argv_s = {GPT2_CLI_PATH};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const int out = ::open("/dev/null", O_WRONLY);
      const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0 || ::chdir(dir.c_str()) != 0 || ::dup2(out, 1) < 0 ||
          ::dup2(err, 2) < 0)
        ::_exit(127);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << input;
    const int code = WEXITSTATUS(status);
    EXPECT_TRUE(code == 1 || code == 2) << input << ": exit status " << code;
    std::string err = gpt2::test::read_text(err_path);
    EXPECT_TRUE(!err.empty() && err.back() == '\n' && err.find('\n') == err.size() - 1)
        << input << ": expected one line on stderr, got '" << err << "'";
    while (!err.empty() && err.back() == '\n') err.pop_back();
    std::string cmd = "gpt2-attention";
    for (const std::string& a : args) cmd += " " + a;
    rows_.push_back({"CLI", input + ": `" + cmd + "`", "exit " + std::to_string(code), err});
  }

  std::string markdown() const {
    std::ostringstream s;
    s << "| where | bad input | thrown / exit status | message |\n|---|---|---|---|\n";
    for (const Row& r : rows_)
      s << "| " << escape_cell(r.where) << " | " << escape_cell(r.input) << " | " << r.kind
        << " | `" << escape_cell(r.message) << "` |\n";
    return s.str();
  }

 private:
  std::vector<Row> rows_;
};

// A safetensors file from its JSON header and data section.
std::vector<unsigned char> st_bytes(const std::string& header, const std::string& data = "") {
  std::vector<unsigned char> b(8);
  for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = (header.size() >> (8 * i)) & 0xFF;
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

// One tensor entry of a header.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  std::size_t begin, std::size_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

void parse_st(const std::vector<unsigned char>& b) {
  (void)gpt2::safetensors::File::parse(b.data(), b.size(), "w.safetensors");
}

// A .npy file: preamble (version 1.0) + dict + data.
std::vector<unsigned char> npy_bytes(const std::string& dict, std::size_t data_bytes = 0) {
  std::string h = dict + "\n";
  std::vector<unsigned char> b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  b.push_back(static_cast<unsigned char>(h.size() & 0xFF));
  b.push_back(static_cast<unsigned char>(h.size() >> 8));
  b.insert(b.end(), h.begin(), h.end());
  b.insert(b.end(), data_bytes, 0);
  return b;
}

void parse_npy(const std::vector<unsigned char>& b) { (void)gpt2::npy::parse(b.data(), b.size(), "x.npy"); }

std::string dict(const std::string& descr, const std::string& order, const std::string& shape) {
  return "{'descr': " + descr + ", 'fortran_order': " + order + ", 'shape': " + shape + ", }";
}

// A safetensors checkpoint with layer 0's attention (F32, C = 64, random), and with_wpe: a 4-row
// wpe and layer 0's ln_1 for the demo.
void write_checkpoint(const std::string& path, Index C, bool with_wpe) {
  const gpt2::test::Model<float> m = gpt2::test::random_model<float>(C, 1, 3);
  struct E {
    std::string name;
    std::vector<float> v;
    std::string shape;
  };
  std::vector<E> es = {
      {"h.0.attn.c_attn.weight", {m.c_attn_w.data(), m.c_attn_w.data() + m.c_attn_w.size()},
       "[" + std::to_string(C) + "," + std::to_string(3 * C) + "]"},
      {"h.0.attn.c_attn.bias", {m.c_attn_b.data(), m.c_attn_b.data() + m.c_attn_b.size()},
       "[" + std::to_string(3 * C) + "]"},
      {"h.0.attn.c_proj.weight", {m.c_proj_w.data(), m.c_proj_w.data() + m.c_proj_w.size()},
       "[" + std::to_string(C) + "," + std::to_string(C) + "]"},
      {"h.0.attn.c_proj.bias", {m.c_proj_b.data(), m.c_proj_b.data() + m.c_proj_b.size()},
       "[" + std::to_string(C) + "]"}};
  if (with_wpe) {  // 4 positions only, and ln_1
    es.push_back({"wpe.weight", std::vector<float>(4 * C, 0.5f), "[4," + std::to_string(C) + "]"});
    es.push_back({"h.0.ln_1.weight", std::vector<float>(C, 1.0f), "[" + std::to_string(C) + "]"});
    es.push_back({"h.0.ln_1.bias", std::vector<float>(C, 0.0f), "[" + std::to_string(C) + "]"});
  }
  std::string header = "{", data;
  for (const E& e : es) {
    const std::size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(e.v.data()), e.v.size() * 4);
    header += (header.size() > 1 ? "," : "") + entry(e.name, "F32", e.shape, begin, data.size());
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::vector<unsigned char> b = st_bytes(header, data);
  gpt2::test::write_file(path, b);
}

void library_rows(Table& t) {
  using namespace gpt2;
  using F = float;
  const test::Model<F> model = test::random_model<F>(64, 4, 1);
  const AttentionWeights<F> w = model.weights();
  const AttentionConfig config = w.config();
  const RowMatrix<F> x = test::random_input<F>(3, 64, 2);

  // Configuration and weights.
  t.lib("config", "n_embd <= 0", [] { make_config(0, 1); });
  t.lib("config", "n_head <= 0", [] { make_config(64, 0); });
  t.lib("config", "n_head not dividing n_embd", [] { make_config(64, 5); });
  t.lib("weights", "c_attn.weight transposed ([3C, C])", [&] {
    const RowMatrix<F> wt = model.c_attn_w.transpose();
    AttentionWeights<F>(config, view(wt), view(model.c_attn_b), view(model.c_proj_w), view(model.c_proj_b));
  });
  t.lib("weights", "a bias of the wrong length", [&] {
    const RowVector<F> b = RowVector<F>::Zero(100);
    AttentionWeights<F>(config, view(model.c_attn_w), view(b), view(model.c_proj_w), view(model.c_proj_b));
  });
  t.lib("weights", "a null buffer", [&] {
    AttentionWeights<F>(config, ConstMatrixMap<F>(nullptr, 64, 192), view(model.c_attn_b),
                        view(model.c_proj_w), view(model.c_proj_b));
  });
  t.lib("threads", "set_num_threads(0)", [] { set_num_threads(0); });

  // Forwards.
  t.lib("attention_forward", "x of the wrong width", [&] {
    const RowMatrix<F> bad(3, 63);
    Workspace<F> ws(config);
    RowMatrix<F> out(3, 64);
    attention_forward<F>(w, bad, ws, out);
  });
  t.lib("attention_forward", "out of the wrong shape", [&] {
    Workspace<F> ws(config);
    RowMatrix<F> out(2, 64);
    attention_forward<F>(w, x, ws, out);
  });
  t.lib("attention_forward", "probs of the wrong shape", [&] {
    Workspace<F> ws(config);
    RowMatrix<F> out(3, 64), probs(3, 3);
    attention_forward<F>(w, x, ws, out, probs);
  });
  t.lib("attention_forward", "a workspace made for another config", [&] {
    Workspace<F> ws(AttentionConfig{128, 4});
    RowMatrix<F> out(3, 64);
    attention_forward<F>(w, x, ws, out);
  });
  t.lib("attention_forward", "out inside the workspace", [&] {
    Workspace<F> ws(config, 3);
    attention_forward<F>(w, x, ws, ws.qkv.topLeftCorner(3, 64));
  });
  t.lib("attention", "x of the wrong width", [&] { attention(w, RowMatrix<F>(3, 32)); });
  t.lib("Workspace", "max_tokens < 0", [&] { Workspace<F>(config, -1); });
  t.lib("Workspace", "max_keys < max_tokens", [&] { Workspace<F>(config, 4, 2); });
  t.lib("causal_attention_head", "fewer keys than queries", [&] {
    AttentionScratch<F> s;
    const RowMatrix<F> q(4, 16), kv(3, 16);
    RowMatrix<F> y(4, 16);
    causal_attention_head<F>(q, kv, kv, y, s);
  });
  t.lib("causal_attention_head", "out overlapping q", [&] {
    AttentionScratch<F> s;
    RowMatrix<F> q(4, 16);
    const RowMatrix<F> kv(4, 16);
    causal_attention_head<F>(q, kv, kv, q, s);
  });
  t.lib("gemm_accumulate", "inner dimensions that differ", [&] {
    GemmScratch<F> s;
    const RowMatrix<F> a(2, 3), b(4, 5);
    RowMatrix<F> c(2, 5);
    gemm_accumulate<F>(1.0f, a, b, Op::None, c, s);
  });

  // KV cache.
  t.lib("KVCache", "max_tokens < 0", [&] { KVCache<F>(config, -1); });
  t.lib("KVCache", "a capacity whose size overflows", [&] {
    KVCache<F>(config, std::numeric_limits<Index>::max() / 2);
  });
  t.lib("cached forward", "more tokens than the cache has room for", [&] {
    KVCache<F> cache(config, 4);
    Workspace<F> ws(config);
    RowMatrix<F> out(3, 64);
    attention_forward<F>(w, x, cache, ws, out);
    attention_forward<F>(w, x, cache, ws, out);
  });
  t.lib("cached forward", "a cache made for another config", [&] {
    KVCache<F> cache(AttentionConfig{64, 8}, 4);
    Workspace<F> ws(config);
    RowMatrix<F> out(3, 64);
    attention_forward<F>(w, x, cache, ws, out);
  });
  t.lib("KVCache", "truncate beyond n_past", [&] { KVCache<F>(config, 4).truncate(2); });
  t.lib("KVCache", "a head index out of range", [&] { (void)KVCache<F>(config, 4).keys(4); });
  t.lib("KVCache", "copy_from a cache holding more than the capacity", [&] {
    KVCache<F> big(config, 4), small(config, 1);
    const RowMatrix<F> kv = RowMatrix<F>::Zero(3, 64);
    big.append(kv, kv);
    small.copy_from(big);
  });
  t.lib("cached forward", "a bf16 cache with more tokens than room", [&] {
    KVCacheBF16 cache(config, 4);
    Workspace<F> ws(config);
    RowMatrix<F> out(3, 64);
    attention_forward<F>(w, x, cache, ws, out);
    attention_forward<F>(w, x, cache, ws, out);
  });

  // Paged KV cache.
  t.lib("KVBlockPool", "block_rows not a multiple of 16", [&] { KVBlockPool<F>(config, 4, 1, 24); });
  t.lib("paged forward", "more blocks than the pool has free", [&] {
    KVBlockPool<F> pool(config, 1);
    PagedSequence<F> seq(pool);
    Workspace<F> ws(config);
    RowMatrix<F> xs = RowMatrix<F>::Zero(17, 64), out(17, 64);
    attention_forward<F>(w, xs, seq, ws, out);
  });
  t.lib("PagedSequence", "a write into a block shared since grow()", [&] {
    KVBlockPool<F> pool(config, 2);
    PagedSequence<F> seq(pool);
    seq.grow(1);
    PagedSequence<F> child = seq.fork();
    const RowMatrix<F> kv = RowMatrix<F>::Zero(1, 64);
    seq.write_last(0, kv, kv);
  });
  t.lib("batched paged forward", "one sequence twice", [&] {
    KVBlockPool<F> pool(config, 2);
    PagedSequence<F> seq(pool);
    std::vector<PagedSequence<F>*> seqs = {&seq, &seq};
    Workspace<F> ws(config);
    RowMatrix<F> xb = RowMatrix<F>::Zero(2, 64), out(2, 64);
    attention_forward<F>(w, xb, BatchLayout::full(2, 1), seqs, ws, out);
  });

  // Batches.
  t.lib("BatchLayout", "a sequence past the padded length", [] { BatchLayout(4, {1}, {4}); });
  t.lib("BatchLayout", "left_padded length > T", [] { BatchLayout::left_padded(4, {5}); });
  t.lib("batched forward", "caches: not one per sequence", [&] {
    std::vector<KVCache<F>> caches;
    Workspace<F> ws(config);
    RowMatrix<F> xb = RowMatrix<F>::Zero(4, 64), out(4, 64);
    attention_forward<F>(w, xb, BatchLayout::full(2, 2), caches, ws, out);
  });
  t.lib("batched forward", "a null cache pointer", [&] {
    KVCache<F>* caches[2] = {nullptr, nullptr};
    Workspace<F> ws(config);
    RowMatrix<F> xb = RowMatrix<F>::Zero(4, 64), out(4, 64);
    attention_forward<F>(w, xb, BatchLayout::full(2, 2), caches, ws, out);
  });
  t.lib("batched forward", "two sequences sharing one cache", [&] {
    KVCache<F> cache(config, 4);
    std::vector<KVCache<F>*> caches = {&cache, &cache};
    Workspace<F> ws(config);
    RowMatrix<F> xb = RowMatrix<F>::Zero(4, 64), out(4, 64);
    attention_forward<F>(w, xb, BatchLayout::full(2, 2), caches, ws, out);
  });
  t.lib("batched forward", "out partly overlapping x", [&] {
    RowMatrix<F> buf = RowMatrix<F>::Zero(5, 64);
    Workspace<F> ws(config);
    attention_forward<F>(w, buf.topRows(4), BatchLayout::full(2, 2), ws, buf.bottomRows(4));
  });
  t.lib("batched forward", "x inside the workspace", [&] {
    std::vector<KVCache<F>> caches;
    caches.emplace_back(config, 4);
    caches.emplace_back(config, 4);
    Workspace<F> ws(config, 4, 4);  // room for the batch: the call does not reallocate it
    RowMatrix<F> out(4, 64);
    attention_forward<F>(w, ws.qkv.topLeftCorner(4, 64), BatchLayout::full(2, 2), caches, ws, out);
  });
  t.lib("batched forward", "a sequence whose cache is full", [&] {
    std::vector<KVCache<F>> caches;
    caches.emplace_back(config, 2);
    caches.emplace_back(config, 1);
    Workspace<F> ws(config);
    RowMatrix<F> xb = RowMatrix<F>::Zero(4, 64), out(4, 64);
    attention_forward<F>(w, xb, BatchLayout::full(2, 2), caches, ws, out);
  });
  t.lib("layer_norm", "weight of the wrong length", [&] {
    const RowVector<F> g = RowVector<F>::Ones(63), b = RowVector<F>::Zero(64);
    RowMatrix<F> out(3, 64);
    layer_norm<F>(x, view(g), view(b), 1e-5f, out);
  });

  // safetensors.
  using safetensors::File;
  t.lib("safetensors", "a file that does not exist", [] { File::open("/nonexistent/w.safetensors"); });
  t.lib("safetensors", "a directory", [] { File::open("/"); });
  t.lib("safetensors", "shorter than 8 bytes", [] { parse_st({1, 2, 3}); });
  t.lib("safetensors", "header length over the 16 MiB cap", [] {
    std::vector<unsigned char> b = st_bytes("{}");
    b[5] = 1;  // 2^40 + 2
    parse_st(b);
  });
  t.lib("safetensors", "header length past the end of the file", [] {
    std::vector<unsigned char> b = st_bytes("{}");
    b[0] = 10;
    parse_st(b);
  });
  t.lib("safetensors", "a NUL byte in the header", [] { parse_st(st_bytes(std::string("{ \0}", 4))); });
  t.lib("safetensors", "malformed JSON", [] { parse_st(st_bytes("{\"a\":}")); });
  t.lib("safetensors", "a duplicate key", [] {
    parse_st(st_bytes("{" + entry("a", "F32", "[0]", 0, 0) + "," + entry("a", "F32", "[0]", 0, 0) + "}"));
  });
  t.lib("safetensors", "nesting deeper than 32 levels", [] {
    parse_st(st_bytes("{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}"));
  });
  t.lib("safetensors", "a header that is not an object", [] { parse_st(st_bytes("[]")); });
  t.lib("safetensors", "an entry that is not an object", [] { parse_st(st_bytes("{\"a\":1}")); });
  t.lib("safetensors", "no dtype", [] { parse_st(st_bytes("{\"a\":{\"shape\":[],\"data_offsets\":[0,0]}}")); });
  t.lib("safetensors", "a dtype that is not a string", [] {
    parse_st(st_bytes("{\"a\":{\"dtype\":4,\"shape\":[],\"data_offsets\":[0,0]}}"));
  });
  t.lib("safetensors", "an unknown dtype", [] { parse_st(st_bytes("{" + entry("a", "F4", "[0]", 0, 0) + "}")); });
  t.lib("safetensors", "no shape", [] { parse_st(st_bytes("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,0]}}")); });
  t.lib("safetensors", "a shape that is not an array", [] { parse_st(st_bytes("{" + entry("a", "F32", "7", 0, 0) + "}")); });
  t.lib("safetensors", "a negative dimension", [] { parse_st(st_bytes("{" + entry("a", "F32", "[2,-1]", 0, 0) + "}")); });
  t.lib("safetensors", "a non-integer dimension", [] { parse_st(st_bytes("{" + entry("a", "F32", "[2.5]", 0, 0) + "}")); });
  t.lib("safetensors", "a dimension over INT64_MAX", [] {
    parse_st(st_bytes("{" + entry("a", "F32", "[9223372036854775808]", 0, 0) + "}"));
  });
  t.lib("safetensors", "an element count that overflows", [] {
    parse_st(st_bytes("{" + entry("a", "F32", "[4294967296,4294967296]", 0, 0) + "}"));
  });
  t.lib("safetensors", "a byte size that overflows", [] {
    parse_st(st_bytes("{" + entry("a", "F64", "[2305843009213693952]", 0, 0) + "}"));
  });
  t.lib("safetensors", "no data_offsets", [] { parse_st(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[]}}")); });
  t.lib("safetensors", "data_offsets not a pair", [] {
    parse_st(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0]}}"));
  });
  t.lib("safetensors", "a negative offset", [] {
    parse_st(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[-4,0]}}"));
  });
  t.lib("safetensors", "begin > end", [] { parse_st(st_bytes("{" + entry("a", "F32", "[0]", 4, 0) + "}", "1234")); });
  t.lib("safetensors", "end past the data section", [] { parse_st(st_bytes("{" + entry("a", "F32", "[2]", 0, 8) + "}", "1234")); });
  t.lib("safetensors", "offsets that disagree with shape and dtype", [] {
    parse_st(st_bytes("{" + entry("a", "F32", "[2]", 0, 4) + "}", "1234"));
  });
  t.lib("safetensors", "overlapping tensors", [] {
    parse_st(st_bytes("{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[1]", 0, 4) + "}", "1234"));
  });
  t.lib("safetensors", "a hole between tensors", [] {
    parse_st(st_bytes("{" + entry("a", "F32", "[1]", 4, 8) + "}", "12345678"));
  });
  t.lib("safetensors", "bytes after the last tensor", [] {
    parse_st(st_bytes("{" + entry("a", "F32", "[1]", 0, 4) + "}", "12345678"));
  });
  t.lib("safetensors", "__metadata__ not an object", [] { parse_st(st_bytes("{\"__metadata__\":[]}")); });
  t.lib("safetensors", "a __metadata__ value that is not a string", [] {
    parse_st(st_bytes("{\"__metadata__\":{\"k\":1}}"));
  });
  {
    // Views and conversions of a valid file: U8 [1] at 0, F32 [1, 2] at 1 (misaligned), F16 [2].
    static const std::vector<unsigned char> b = st_bytes(
        "{" + entry("u", "U8", "[1]", 0, 1) + "," + entry("f", "F32", "[1,2]", 1, 9) + "," +
            entry("h", "F16", "[2]", 9, 13) + "}",
        std::string(13, '\0'));
    static const File file = File::parse(b.data(), b.size(), "w.safetensors");
    t.lib("safetensors", "a tensor that is not there", [] { file.tensor("nope"); });
    t.lib("safetensors", "a view of another dtype", [] { file.vector<float>("h"); });
    t.lib("safetensors", "a view of another rank", [] { file.vector<float>("f"); });
    t.lib("safetensors", "a view of misaligned data", [] { file.matrix<float>("f"); });
    t.lib("safetensors", "to_vector of an integer tensor", [] { file.to_vector<float>("u"); });
  }
  const auto load = [](const std::string& header, const std::string& data, Index n_head = 0) {
    const std::vector<unsigned char> b = st_bytes(header, data);
    const File file = File::parse(b.data(), b.size(), "w.safetensors");
    (void)safetensors::load_attention<float>(file, 0, n_head);
  };
  t.lib("load_attention", "no tensors of the layer", [&] { load("{}", ""); });
  t.lib("load_attention", "both naming schemes", [&] {
    load("{" + entry("h.0.attn.c_attn.weight", "F32", "[0]", 0, 0) + "," +
             entry("transformer.h.0.attn.c_attn.weight", "F32", "[0]", 0, 0) + "}", "");
  });
  const auto layer = [](Index C, const std::string& attn_w_shape, const std::string& dtype,
                        bool with_proj_bias) {
    const std::size_t s = dtype == "F32" ? 4 : 1;
    std::size_t at = 0;
    std::string h = "{";
    const auto add = [&](const std::string& name, const std::string& shape, std::size_t n) {
      h += (h.size() > 1 ? "," : "") + entry(name, dtype, shape, at, at + n * s);
      at += n * s;
    };
    const auto c = static_cast<std::size_t>(C);
    add("h.0.attn.c_attn.weight", attn_w_shape, 3 * c * c);
    add("h.0.attn.c_attn.bias", "[" + std::to_string(3 * C) + "]", 3 * c);
    add("h.0.attn.c_proj.weight", "[" + std::to_string(C) + "," + std::to_string(C) + "]", c * c);
    if (with_proj_bias) add("h.0.attn.c_proj.bias", "[" + std::to_string(C) + "]", c);
    return std::make_pair(h + "}", std::string(at, '\0'));
  };
  t.lib("load_attention", "a missing tensor", [&] {
    const auto [h, d] = layer(8, "[8,24]", "F32", false);
    load(h, d, 2);
  });
  t.lib("load_attention", "a tensor of the wrong rank", [&] {
    const auto [h, d] = layer(8, "[192]", "F32", true);
    load(h, d, 2);
  });
  t.lib("load_attention", "an integer dtype", [&] {
    const auto [h, d] = layer(8, "[8,24]", "I8", true);
    load(h, d, 2);
  });
  t.lib("load_attention", "c_attn.weight stored as nn.Linear [3C, C]", [&] {
    const auto [h, d] = layer(8, "[24,8]", "F32", true);
    load(h, d, 2);
  });
  t.lib("load_attention", "n_head = 0 with n_embd not a multiple of 64", [&] {
    const auto [h, d] = layer(8, "[8,24]", "F32", true);
    load(h, d, 0);
  });
  t.lib("load_attention", "n_head not dividing n_embd", [&] {
    const auto [h, d] = layer(8, "[8,24]", "F32", true);
    load(h, d, 3);
  });

  // .npy reader.
  t.lib("npy", "a file that does not exist", [] { npy::read("/nonexistent/x.npy"); });
  t.lib("npy", "a directory", [] { npy::read("/"); });
  t.lib("npy", "not a .npy file", [] { parse_npy({'P', 'K', 3, 4}); });
  t.lib("npy", "cut in the version field", [] { parse_npy({0x93, 'N', 'U', 'M', 'P', 'Y', 1}); });
  t.lib("npy", "an unsupported version", [] { parse_npy({0x93, 'N', 'U', 'M', 'P', 'Y', 4, 0, 0, 0}); });
  t.lib("npy", "cut in the header length", [] { parse_npy({0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0}); });
  t.lib("npy", "header length over the 64 KiB cap", [] {
    parse_npy({0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0, 0, 2, 0});
  });
  t.lib("npy", "header length past the end of the file", [] {
    parse_npy({0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 100, 0, '{'});
  });
  t.lib("npy", "a header that is not a dict", [] { parse_npy(npy_bytes("[1, 2]")); });
  t.lib("npy", "a one-element shape without its comma", [] { parse_npy(npy_bytes(dict("'<f4'", "False", "(3)"))); });
  t.lib("npy", "an integer too large", [] {
    parse_npy(npy_bytes(dict("'<f4'", "False", "(99999999999999999999,)")));
  });
  t.lib("npy", "an unsupported dtype", [] { parse_npy(npy_bytes(dict("'<i8'", "False", "(1,)"), 8)); });
  t.lib("npy", "Fortran order", [] { parse_npy(npy_bytes(dict("'<f4'", "True", "(1,)"), 4)); });
  t.lib("npy", "fortran_order not a bool", [] { parse_npy(npy_bytes(dict("'<f4'", "'no'", "(1,)"), 4)); });
  t.lib("npy", "a shape that is not a tuple", [] { parse_npy(npy_bytes(dict("'<f4'", "False", "'3'"), 4)); });
  t.lib("npy", "an unexpected key", [] {
    parse_npy(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': True}", 4));
  });
  t.lib("npy", "a duplicate key", [] {
    parse_npy(npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4));
  });
  t.lib("npy", "a missing key", [] { parse_npy(npy_bytes("{'descr': '<f4', 'fortran_order': False}", 4)); });
  t.lib("npy", "no dimensions", [] { parse_npy(npy_bytes(dict("'<f4'", "False", "()"), 4)); });
  t.lib("npy", "more than 8 dimensions", [] {
    parse_npy(npy_bytes(dict("'<f4'", "False", "(1, 1, 1, 1, 1, 1, 1, 1, 1)"), 4));
  });
  t.lib("npy", "a negative dimension", [] { parse_npy(npy_bytes(dict("'<f4'", "False", "(2, -1)"))); });
  t.lib("npy", "an element count that overflows", [] {
    parse_npy(npy_bytes(dict("'<f4'", "False", "(4294967296, 4294967296)")));
  });
  t.lib("npy", "data cut short", [] { parse_npy(npy_bytes(dict("'<f4'", "False", "(2, 3)"), 20)); });
  t.lib("npy", "bytes after the data", [] { parse_npy(npy_bytes(dict("'<f4'", "False", "(2, 3)"), 28)); });
  t.lib("npy::Array", "to_matrix of a 3-D array", [] {
    npy::Array a;
    a.shape = {1, 1, 1};
    a.bytes.resize(4);
    (void)a.to_matrix<float>();
  });
  t.lib("npy::write", "more than 8 dimensions", [] {
    const float v = 0;
    npy::write<float>("y.npy", &v, {1, 1, 1, 1, 1, 1, 1, 1, 1});
  });
  t.lib("npy::write", "a directory that does not exist", [] {
    npy::write("/nonexistent/y.npy", RowMatrix<float>::Zero(1, 1));
  });
  t.lib("npy::write", "a target that is a directory", [] { npy::write("/", RowMatrix<float>::Zero(1, 1)); });
}

void cli_rows(Table& t) {
  const gpt2::test::TempDir dir("gpt2-errtab-cli");
  const std::string d = dir.path_string();
  write_checkpoint(dir.file("w.safetensors"), 64, false);
  write_checkpoint(dir.file("wpe.safetensors"), 64, true);
  gpt2::npy::write(dir.file("x.npy"), gpt2::test::random_input<float>(3, 64, 4));
  gpt2::npy::write(dir.file("x3.npy"), RowMatrix<float>::Zero(2 * 3, 64));  // shape [6, 64]
  const std::vector<float> zeros(2 * 3 * 64, 0.0f);
  gpt2::npy::write<float>(dir.file("xb.npy"), zeros.data(), {2, 3, 64});
  std::vector<float> differing = zeros;
  differing[(3 + 1) * 64] = 1.0f;  // sequence 1's row 1
  gpt2::npy::write<float>(dir.file("xd.npy"), differing.data(), {2, 3, 64});
  gpt2::npy::write<float>(dir.file("x1.npy"), zeros.data(), {64});
  gpt2::npy::write<float>(dir.file("x4.npy"), zeros.data(), {1, 2, 3, 64});
  gpt2::npy::write(dir.file("x32.npy"), RowMatrix<float>::Zero(3, 32));
  gpt2::test::write_text(dir.file("junk.safetensors"), "not a checkpoint");
  gpt2::test::write_text(dir.file("junk.npy"), "not an array");
  ASSERT_EQ(::mkdir(dir.file("outdir").c_str(), 0755), 0);

  const std::vector<std::string> run = {"run", "--weights", "w.safetensors", "--input", "x.npy",
                                        "--output", "y.npy"};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = run;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const auto replace = [&](const std::string& flag, const std::string& value) {
    std::vector<std::string> a = run;
    for (std::size_t i = 0; i + 1 < a.size(); ++i)
      if (a[i] == flag) a[i + 1] = value;
    return a;
  };
  t.cli("no command", {}, d);
  t.cli("an unknown command", {"train"}, d);
  t.cli("a flag before the command", {"--weights", "w.safetensors"}, d);
  t.cli("an unknown flag", with({"--heads", "4"}), d);
  t.cli("an unknown short flag", with({"-x"}), d);
  t.cli("a stray argument", with({"extra"}), d);
  t.cli("a flag without a value", {"run", "--weights"}, d);
  t.cli("a flag followed by another flag", {"run", "--weights", "--input", "x.npy"}, d);
  t.cli("an empty value", with({"--probs="}), d);
  t.cli("a flag given twice", with({"--input", "x.npy"}), d);
  t.cli("a switch given a value", with({"--tensor-parallel=2"}), d);
  t.cli("a required flag missing", {"run", "--input", "x.npy", "--output", "y.npy"}, d);
  t.cli("a number that is not one", with({"--layer", "one"}), d);
  t.cli("a number out of range", {"demo", "--tokens", "2000"}, d);
  t.cli("a negative number", with({"--prefill", "-1"}), d);
  t.cli("an unknown dtype", with({"--dtype", "f16"}), d);
  t.cli("--kv-cache without --prefill or --share-prefix", with({"--kv-cache", "bf16"}), d);
  t.cli("--kv-cache bf16 with --dtype f64", with({"--prefill", "2", "--kv-cache", "bf16", "--dtype", "f64"}), d);
  t.cli("demo: an unknown dtype (no f64)", {"demo", "--dtype", "f64"}, d);
  t.cli("a malformed list", {"run", "--weights", "w.safetensors", "--input", "xb.npy", "--output",
                             "y.npy", "--lengths", "3,,1"}, d);
  t.cli("two flags naming one file", replace("--output", "w.safetensors"), d);
  t.cli("--probs naming the input", with({"--probs", "./x.npy"}), d);
  t.cli("a checkpoint that does not exist", replace("--weights", "nope.safetensors"), d);
  t.cli("a checkpoint that is not one", replace("--weights", "junk.safetensors"), d);
  t.cli("a layer the checkpoint lacks", with({"--layer", "3"}), d);
  t.cli("n_head not dividing n_embd", with({"--n-head", "5"}), d);
  t.cli("an input that does not exist", replace("--input", "nope.npy"), d);
  t.cli("an input that is not .npy", replace("--input", "junk.npy"), d);
  t.cli("an input of another width", replace("--input", "x32.npy"), d);
  t.cli("a 1-D input", replace("--input", "x1.npy"), d);
  t.cli("a 4-D input", replace("--input", "x4.npy"), d);
  t.cli("--lengths with a 2-D input", with({"--lengths", "3"}), d);
  const std::vector<std::string> batch = {"run", "--weights", "w.safetensors", "--input", "xb.npy",
                                          "--output", "y.npy"};
  const auto batch_with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = batch;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  t.cli("--lengths: not one per sequence", batch_with({"--lengths", "3"}), d);
  t.cli("--starts beyond T", batch_with({"--starts", "0,4"}), d);
  t.cli("--lengths beyond T - start", batch_with({"--starts", "1,0", "--lengths", "3,3"}), d);
  t.cli("--share-prefix with a 2-D input", with({"--share-prefix", "1"}), d);
  t.cli("--share-prefix beyond T", batch_with({"--share-prefix", "4"}), d);
  t.cli("--share-prefix: a row differing between sequences",
        {"run", "--weights", "w.safetensors", "--input", "xd.npy", "--output", "y.npy",
         "--share-prefix", "2"}, d);
  t.cli("an output in a directory that does not exist", replace("--output", "no/y.npy"), d);
  t.cli("an output that is a directory", replace("--output", "outdir"), d);
  t.cli("demo: a checkpoint without wpe", {"demo", "--weights", "w.safetensors"}, d);
  t.cli("demo: --tokens beyond the checkpoint's wpe", {"demo", "--weights", "wpe.safetensors"}, d);
  t.cli("demo: a layer the embedded model lacks", {"demo", "--layer", "1"}, d);
}

TEST(ErrorTable, ErrorsPageListsEveryRejectedInputWithItsMessage) {
  Table t;
  library_rows(t);
  cli_rows(t);
  const std::string table = t.markdown();
  const std::string begin = "<!-- error-table:begin -->\n", end = "<!-- error-table:end -->";
  std::string page = gpt2::test::read_text(GPT2_ERRORS_DOC_PATH);
  const std::size_t b = page.find(begin), e = page.find(end);
  ASSERT_NE(b, std::string::npos) << GPT2_ERRORS_DOC_PATH << " has no '" << begin << "' marker";
  ASSERT_NE(e, std::string::npos) << GPT2_ERRORS_DOC_PATH << " has no '" << end << "' marker";
  const std::string current = page.substr(b + begin.size(), e - b - begin.size());
  if (current == table) return;
  const char* update = std::getenv("GPT2_UPDATE_ERROR_TABLE");
  if (update != nullptr && std::string(update) == "1") {
    page.replace(b + begin.size(), e - b - begin.size(), table);
    std::ofstream(GPT2_ERRORS_DOC_PATH, std::ios::binary | std::ios::trunc) << page;
    std::printf("%s: error table updated (%zu bytes)\n", GPT2_ERRORS_DOC_PATH, table.size());
    return;
  }
  ADD_FAILURE() << GPT2_ERRORS_DOC_PATH
                << "'s error table is out of date; rerun with GPT2_UPDATE_ERROR_TABLE=1 to "
                   "rewrite it. The table today:\n"
                << table;
}

}  // namespace
