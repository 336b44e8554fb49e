// Thread safety: one set of weights (and the mapped safetensors file they come from) shared
// read-only by many std::threads, each with its own Workspace and KVCaches, gives results bitwise
// identical to the same calls made on one thread. Plain forwards (with probabilities), a prefill
// then decode steps through a cache, a cache forked from a shared const cache, padded batches and
// batched decoding all run at once. The tsan preset runs this program under ThreadSanitizer
// (OpenMP off there: libgomp is not instrumented); the ci and asan presets run it too.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2/detail/parallel.hpp"
#include "gpt2/safetensors.hpp"
#include "support/compare.hpp"
#include "support/models.hpp"
#include "support/tmpdir.hpp"

namespace {

using gpt2::AttentionWeights;
using gpt2::BatchLayout;
using gpt2::Index;
using gpt2::KVCache;
using gpt2::RowMatrix;
using gpt2::Workspace;

constexpr int kThreads = 8;
constexpr int kRounds = 2;      // each thread repeats its work, so calls interleave differently
constexpr Index kC = 128;       // n_embd
constexpr Index kHeads = 4;     // head_dim 32
constexpr Index kT = 80;        // crosses the 64-row attention tile
constexpr Index kPrefill = 67;  // then kT - kPrefill decode steps
constexpr Index kBatch = 3;     // padded batch of kBatch sequences of up to kBT tokens
constexpr Index kBT = 20;

// Bitwise equality (NaN payloads included), with the first differing element on failure.
template <class T>
::testing::AssertionResult same_bits(const RowMatrix<T>& a, const RowMatrix<T>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols())
    return ::testing::AssertionFailure() << "shapes differ";
  for (Index i = 0; i < a.size(); ++i)
    if (std::memcmp(a.data() + i, b.data() + i, sizeof(T)) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << " differs: " << a.data()[i] << " vs " << b.data()[i];
  return ::testing::AssertionSuccess();
}

// Everything one thread computes.
template <class T>
struct Results {
  RowMatrix<T> out, probs;   // plain forward [kT, kC], [kHeads * kT, kT]
  RowMatrix<T> decoded;      // prefill + decode steps through a cache [kT, kC]
  RowMatrix<T> forked;       // decode steps from a copy of the shared const cache
  RowMatrix<T> batch_out;    // padded batch [kBatch * kBT, kC]
  RowMatrix<T> batch_decode; // batched decode, one token per sequence per step
};

// The work of one thread: only `w`, `x` and `shared_cache` are shared, all read-only.
template <class T>
Results<T> work(const AttentionWeights<T>& w, const RowMatrix<T>& x, const RowMatrix<T>& xb,
                const KVCache<T>& shared_cache) {
  Results<T> r;
  const gpt2::AttentionConfig& config = w.config();
  Workspace<T> ws(config, kT);
  r.out.resize(kT, kC);
  r.probs.resize(kHeads * kT, kT);
  gpt2::attention_forward<T>(w, x, ws, r.out, r.probs);

  KVCache<T> cache(config, kT);
  Workspace<T> dws(config, kPrefill, cache.capacity());
  r.decoded.resize(kT, kC);
  gpt2::attention_forward<T>(w, x.topRows(kPrefill), cache, dws, r.decoded.topRows(kPrefill));
  for (Index t = kPrefill; t < kT; ++t)
    gpt2::attention_forward<T>(w, x.row(t), cache, dws, r.decoded.row(t));

  KVCache<T> fork = shared_cache.copy();  // reads the shared cache
  r.forked.resize(kT - kPrefill, kC);
  for (Index t = kPrefill; t < kT; ++t)
    gpt2::attention_forward<T>(w, x.row(t), fork, dws, r.forked.row(t - kPrefill));

  const BatchLayout layout(kBT, {0, 5, 0}, {kBT, 15, 0});  // full, left-padded, empty
  r.batch_out.resize(kBatch * kBT, kC);
  gpt2::attention_forward<T>(w, xb, layout, ws, r.batch_out);

  std::vector<KVCache<T>> caches;
  for (Index b = 0; b < kBatch; ++b) caches.emplace_back(config, kBT);
  r.batch_decode.resize(kBatch * kBT, kC);
  RowMatrix<T> step(kBatch, kC), step_out(kBatch, kC);
  BatchLayout one = BatchLayout::full(kBatch, 1);
  for (Index t = 0; t < kBT; ++t) {
    for (Index b = 0; b < kBatch; ++b) {
      step.row(b) = xb.row(b * kBT + t);
      one.set(b, 0, t < kBT - 4 * b ? 1 : 0);  // sequence b finishes 4b steps early
    }
    gpt2::attention_forward<T>(w, step, one, caches, dws, step_out);
    for (Index b = 0; b < kBatch; ++b) r.batch_decode.row(b * kBT + t) = step_out.row(b);
  }
  return r;
}

template <class T>
void expect_same(const Results<T>& got, const Results<T>& want, int thread) {
  EXPECT_TRUE(same_bits(got.out, want.out)) << "thread " << thread << ": out";
  EXPECT_TRUE(same_bits(got.probs, want.probs)) << "thread " << thread << ": probs";
  EXPECT_TRUE(same_bits(got.decoded, want.decoded)) << "thread " << thread << ": decoded";
  EXPECT_TRUE(same_bits(got.forked, want.forked)) << "thread " << thread << ": forked";
  EXPECT_TRUE(same_bits(got.batch_out, want.batch_out)) << "thread " << thread << ": batch";
  EXPECT_TRUE(same_bits(got.batch_decode, want.batch_decode))
      << "thread " << thread << ": batch decode";
}

// Runs work() on kThreads threads at once (released together), kRounds times each, and compares
// every result with the single-threaded one.
template <class T>
void run_threads(const AttentionWeights<T>& w, const RowMatrix<T>& x, const RowMatrix<T>& xb,
                 const KVCache<T>& shared_cache) {
  const Results<T> expected = work<T>(w, x, xb, shared_cache);
  std::vector<std::vector<Results<T>>> results(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();
      for (int round = 0; round < kRounds; ++round)
        results[static_cast<std::size_t>(i)].push_back(work<T>(w, x, xb, shared_cache));
    });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i)
    for (const Results<T>& r : results[static_cast<std::size_t>(i)]) expect_same(r, expected, i);
}

template <class T>
class Concurrency : public ::testing::Test {};
TYPED_TEST_SUITE(Concurrency, gpt2::test::Scalars, );

// Weights in the caller's buffers, shared by every thread.
TYPED_TEST(Concurrency, SharedWeightsGiveSingleThreadedResults) {
  using T = TypeParam;
  const gpt2::test::Model<T> model = gpt2::test::random_model<T>(kC, kHeads, 11);
  const AttentionWeights<T> w = model.weights();
  const RowMatrix<T> x = gpt2::test::random_input<T>(kT, kC, 12);
  RowMatrix<T> xb = gpt2::test::random_input<T>(kBatch * kBT, kC, 13);
  xb.middleRows(kBT, 5).setConstant(std::numeric_limits<T>::quiet_NaN());  // padding: never read
  KVCache<T> shared_cache(w.config(), kT);
  Workspace<T> ws(w.config(), kPrefill, kT);
  RowMatrix<T> out(kPrefill, kC);
  gpt2::attention_forward<T>(w, x.topRows(kPrefill), shared_cache, ws, out);
  const KVCache<T>& shared = shared_cache;
  run_threads<T>(w, x, xb, shared);
}

// Weights viewed in a memory-mapped safetensors file, shared by every thread; each thread also
// loads the layer from the shared File itself (zero copy) and converts a tensor (to_vector).
TEST(ConcurrencyFile, SharedMappedFileAndLoadsFromManyThreads) {
  const gpt2::test::Model<float> model = gpt2::test::random_model<float>(kC, kHeads, 21);
  const gpt2::test::TempDir dir("gpt2-concurrency");
  const std::string path = dir.file("layer.safetensors");
  {
    struct Entry {
      const char* name;
      const float* data;
      std::vector<std::int64_t> shape;
    };
    const std::vector<Entry> entries = {
        {"h.0.attn.c_attn.weight", model.c_attn_w.data(), {kC, 3 * kC}},
        {"h.0.attn.c_attn.bias", model.c_attn_b.data(), {3 * kC}},
        {"h.0.attn.c_proj.weight", model.c_proj_w.data(), {kC, kC}},
        {"h.0.attn.c_proj.bias", model.c_proj_b.data(), {kC}}};
    std::string header = "{", data;
    for (const Entry& e : entries) {
      std::size_t n = 1;
      std::string shape;
      for (std::int64_t d : e.shape) {
        n *= static_cast<std::size_t>(d);
        shape += (shape.empty() ? "" : ",") + std::to_string(d);
      }
      const std::size_t begin = data.size();
      data.append(reinterpret_cast<const char*>(e.data), n * sizeof(float));
      header += std::string(header.size() > 1 ? "," : "") + "\"" + e.name +
                "\":{\"dtype\":\"F32\",\"shape\":[" + shape + "],\"data_offsets\":[" +
                std::to_string(begin) + "," + std::to_string(data.size()) + "]}";
    }
    header += "}";
    header.append((8 - header.size() % 8) % 8, ' ');
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i)
      bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
    gpt2::test::write_text(path, bytes + header + data);
  }
  const gpt2::safetensors::File file = gpt2::safetensors::File::open(path);
  const gpt2::safetensors::LoadedAttention<float> loaded =
      gpt2::safetensors::load_attention<float>(file, 0, kHeads);
  ASSERT_TRUE(loaded.zero_copy());
  const AttentionWeights<float>& w = loaded.weights();
  const RowMatrix<float> x = gpt2::test::random_input<float>(kT, kC, 22);
  const RowMatrix<float> expected = gpt2::attention(w, x);

  std::vector<RowMatrix<float>> shared_out(kThreads), own_out(kThreads);
  std::vector<std::vector<double>> converted(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      const auto k = static_cast<std::size_t>(i);
      shared_out[k] = gpt2::attention(w, x);
      const gpt2::safetensors::LoadedAttention<float> own =
          gpt2::safetensors::load_attention<float>(file, 0, kHeads);
      own_out[k] = gpt2::attention(own.weights(), x);
      converted[k] = file.to_vector<double>("h.0.attn.c_proj.bias");
    });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    const auto k = static_cast<std::size_t>(i);
    EXPECT_TRUE(same_bits(shared_out[k], expected)) << "thread " << i;
    EXPECT_TRUE(same_bits(own_out[k], expected)) << "thread " << i;
    ASSERT_EQ(converted[k].size(), static_cast<std::size_t>(kC));
    for (Index j = 0; j < kC; ++j)
      EXPECT_EQ(converted[k][static_cast<std::size_t>(j)], double(model.c_proj_b(j)));
  }
}

// detail::StepBarrier (the task hand-out and barrier of parallel_steps, which a decode step's
// region runs on) on plain std::threads, so that ThreadSanitizer checks its ordering too (OpenMP is
// off under it): each step's tasks write plain ints, which every thread reads after the barrier;
// a second barrier keeps the next step's writes after those reads. Each task runs once a step.
TEST(ConcurrencyStepBarrier, OrdersEachStepsWritesBeforeTheNextStep) {
  constexpr int kTeam = 4, kSteps = 200;
  constexpr Index kTasks = 7;
  gpt2::detail::StepBarrier barrier;
  std::vector<int> value(static_cast<std::size_t>(kTasks), 0);
  std::atomic<int> wrong{0};
  auto member = [&] {
    barrier.set_threads(kTeam);
    for (int step = 1; step <= kSteps; ++step) {
      for (Index t = barrier.next_task(); t < kTasks; t = barrier.next_task())
        value[static_cast<std::size_t>(t)] += 1;
      barrier.arrive_and_wait();
      for (const int v : value) wrong += v != step;
      barrier.arrive_and_wait();
    }
  };
  std::vector<std::thread> team;
  for (int i = 0; i < kTeam; ++i) team.emplace_back(member);
  for (std::thread& t : team) t.join();
  EXPECT_EQ(wrong.load(), 0);
  for (const int v : value) EXPECT_EQ(v, kSteps);
}

// detail::WorkerTeam (the threads a decode step's steps run on, with OpenMP) on its own, so that
// ThreadSanitizer checks its hand-over: each call's threads write plain ints that the caller reads
// after run() returns, and read what the caller wrote before it; over many calls, with workers
// that sleep between calls and workers that spin, and a team destroyed while its workers sleep.
TEST(ConcurrencyWorkerTeam, HandsEachCallsWritesToTheCaller) {
  using gpt2::detail::WaitPolicy;
  using std::chrono::microseconds;
  for (const WaitPolicy& policy : {WaitPolicy{microseconds(0), microseconds(0), true},
                                   WaitPolicy{microseconds(20), microseconds(100), true},
                                   WaitPolicy{microseconds(20), microseconds(100), false}}) {
    constexpr int kTeam = 4, kCalls = 300;
    gpt2::detail::WorkerTeam team(kTeam - 1, policy);
    std::vector<int> value(kTeam, 0);
    int input = 0, wrong = 0;
    for (int call = 1; call <= kCalls; ++call) {
      input = call;
      const int n = 1 + call % kTeam;
      std::vector<int> saw(kTeam, 0);  // written by thread t only, read here after run()
      team.run(n, [&](int thread) {
        saw[static_cast<std::size_t>(thread)] = input == call ? 1 : -1;  // the caller's write
        value[static_cast<std::size_t>(thread)]++;
      });
      for (int t = 0; t < kTeam; ++t) wrong += saw[static_cast<std::size_t>(t)] != (t < n ? 1 : 0);
      if (call % 50 == 0) std::this_thread::sleep_for(microseconds(300));  // let them sleep
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(value[0], kCalls);
    int total = 0;
    for (const int v : value) total += v;
    int expected = 0;
    for (int call = 1; call <= kCalls; ++call) expected += 1 + call % kTeam;
    EXPECT_EQ(total, expected);
  }
}

}  // namespace
