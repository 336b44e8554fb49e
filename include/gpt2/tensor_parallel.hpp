// Tensor parallelism over MPI: one attention sublayer split by heads over the ranks of a
// communicator (optional component gpt2::mpi; needs <mpi.h>). See docs/tensor-parallel.md.
//
// Rank r of R holds heads [h0, h0 + H_r) (contiguous, as even as possible: heads_of_rank) and
// runs the ordinary sublayer over them, as a shard with C_r = H_r * head_dim:
//   qkv_r   = x @ c_attn_r + c_attn_bias_r      x [T, C], c_attn_r [C, 3 C_r] -> qkv_r [T, 3 C_r]
//             c_attn_r: the columns of its heads from EACH of the q, k, v blocks of c_attn,
//             (q at h*head_dim, k at C + h*head_dim, v at 2C + h*head_dim), packed once at setup
//   y_h     = softmax(q_h k_h^T / sqrt(head_dim), causal) v_h   for its heads    merged_r [T, C_r]
//   out_r   = merged_r @ c_proj_r (+ c_proj.bias on rank 0 only)
//             c_proj_r = rows h0*head_dim .. (h0 + H_r)*head_dim of c_proj.weight [C_r, C] (a view)
//   out     = sum over ranks of out_r               MPI_Allreduce(MPI_IN_PLACE, MPI_SUM)
// Every rank ends with the whole out [T, C]. A rank's KV cache holds its heads only
// (KVCache over shard_config()): cache memory per rank falls as 1/R.
//
// Collectives: every forward is a collective over the communicator; all ranks call the same
// functions in the same order with the same shapes (x may differ only in its values; x is read
// whole on every rank). Before anything is computed, the ranks agree (one small MPI_Allreduce)
// that every rank's checks passed and that their shapes match; otherwise every rank throws the
// same error, naming the first failing rank, so no rank is left waiting in a collective.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "gpt2/attention.hpp"

namespace gpt2 {

// An MPI call that failed (its message, from MPI_Error_string, names the rank and the call), or
// MPI not initialized.
class MpiError : public Error {
 public:
  using Error::Error;
};

// Heads [begin, begin + count) of one rank.
struct HeadRange {
  Index begin = 0, count = 0;
  Index end() const { return begin + count; }
};

// The heads of rank `rank` of n_ranks over n_head heads: contiguous ranges in rank order, the first
// n_head % n_ranks ranks one head more (25 heads over 3 ranks: 9, 8, 8).
inline HeadRange heads_of_rank(Index n_head, int rank, int n_ranks) {
  if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
    throw ConfigError("tensor parallel: expected a rank in [0, n_ranks) with n_ranks >= 1, got rank " +
                      std::to_string(rank) + " of " + std::to_string(n_ranks));
  const Index per = n_head / n_ranks, extra = n_head % n_ranks, r = rank;
  return {r * per + std::min(r, extra), per + (r < extra ? 1 : 0)};
}

namespace detail {

template <class T>
MPI_Datatype mpi_datatype() {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "tensor parallel: float or double");
  return std::is_same<T, float>::value ? MPI_FLOAT : MPI_DOUBLE;
}

inline std::string rank_label(int rank, int n_ranks) {
  return "tensor parallel rank " + std::to_string(rank) + " of " + std::to_string(n_ranks);
}

// Throws MpiError "tensor parallel rank r of R: <call> failed: <MPI's message>" unless code is
// MPI_SUCCESS (the communicator returns errors: MPI_ERRORS_RETURN).
inline void mpi_check(int code, const char* call, int rank, int n_ranks) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  throw MpiError(rank_label(rank, n_ranks) + ": " + call + " failed: " +
                 (length > 0 ? std::string(text, static_cast<std::size_t>(length))
                             : "MPI error " + std::to_string(code)));
}

// Values every rank must have in common for a call (its shapes): at most kMax, no allocation.
struct RankAgreement {
  static constexpr int kMax = 8;
  const char* names[kMax] = {};
  long long values[kMax] = {};
  int n = 0;
  RankAgreement& add(const char* name, long long value) {
    names[n] = name;
    values[n] = value;
    ++n;
    return *this;
  }
};

// The kinds of error an agreement carries from the failing rank to the others.
enum class ErrorKind : int { shape, config, capacity, format, mpi, error, bad_alloc, other, count };

[[noreturn]] inline void throw_kind(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::shape: throw ShapeError(message);
    case ErrorKind::config: throw ConfigError(message);
    case ErrorKind::capacity: throw CapacityError(message);
    case ErrorKind::format: throw FormatError(message);
    case ErrorKind::mpi: throw MpiError(message);
    case ErrorKind::bad_alloc: throw std::bad_alloc();
    default: throw Error(message);
  }
}

// Runs check() on this rank, then, with one MPI_Allreduce (MIN over a few integers), learns
// whether it threw on any rank and whether every rank has the same `agreement` values. If check()
// threw somewhere, every rank throws the error of the lowest failing rank (same type, its message
// broadcast, prefixed with "tensor parallel rank r of R: "); if the values differ, every rank
// throws ShapeError naming the value and its range over the ranks. A collective: every rank of
// comm calls it. Allocates nothing unless something fails.
template <class F>
void agree_on_ranks(MPI_Comm comm, int rank, int n_ranks, const F& check,
                    const RankAgreement& agreement) {
  constexpr int kinds = static_cast<int>(ErrorKind::count);
  const long long none = static_cast<long long>(n_ranks) * kinds;
  long long code = none;
  std::string message;
  try {
    check();
  } catch (const ShapeError& e) {
    code = static_cast<long long>(rank) * kinds + static_cast<int>(ErrorKind::shape);
    message = e.what();
  } catch (const ConfigError& e) {
    code = static_cast<long long>(rank) * kinds + static_cast<int>(ErrorKind::config);
    message = e.what();
  } catch (const CapacityError& e) {
    code = static_cast<long long>(rank) * kinds + static_cast<int>(ErrorKind::capacity);
    message = e.what();
  } catch (const FormatError& e) {
    code = static_cast<long long>(rank) * kinds + static_cast<int>(ErrorKind::format);
    message = e.what();
  } catch (const MpiError& e) {
    code = static_cast<long long>(rank) * kinds + static_cast<int>(ErrorKind::mpi);
    message = e.what();
  } catch (const Error& e) {
    code = static_cast<long long>(rank) * kinds + static_cast<int>(ErrorKind::error);
    message = e.what();
  } catch (const std::bad_alloc&) {
    code = static_cast<long long>(rank) * kinds + static_cast<int>(ErrorKind::bad_alloc);
  } catch (const std::exception& e) {
    code = static_cast<long long>(rank) * kinds + static_cast<int>(ErrorKind::other);
    message = e.what();
  } catch (...) {
    code = static_cast<long long>(rank) * kinds + static_cast<int>(ErrorKind::other);
    message = "an exception that is not a std::exception";
  }
  // [code, v_0, -v_0, v_1, -v_1, ...]: MIN gives the first failing rank and each value's range.
  long long buffer[1 + 2 * RankAgreement::kMax];
  buffer[0] = code;
  for (int i = 0; i < agreement.n; ++i) {
    buffer[1 + 2 * i] = agreement.values[i];
    buffer[2 + 2 * i] = -agreement.values[i];
  }
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, buffer, 1 + 2 * agreement.n, MPI_LONG_LONG, MPI_MIN, comm),
            "MPI_Allreduce (agreement)", rank, n_ranks);
  if (buffer[0] != none) {
    const int failed = static_cast<int>(buffer[0] / kinds);
    const auto kind = static_cast<ErrorKind>(buffer[0] % kinds);
    long long length = static_cast<long long>(message.size());
    mpi_check(MPI_Bcast(&length, 1, MPI_LONG_LONG, failed, comm), "MPI_Bcast (error)", rank,
              n_ranks);
    message.resize(static_cast<std::size_t>(length));
    if (length > 0)
      mpi_check(MPI_Bcast(&message[0], static_cast<int>(length), MPI_CHAR, failed, comm),
                "MPI_Bcast (error)", rank, n_ranks);
    throw_kind(kind, rank_label(failed, n_ranks) + ": " + message);
  }
  for (int i = 0; i < agreement.n; ++i) {
    const long long low = buffer[1 + 2 * i], high = -buffer[2 + 2 * i];
    if (low != high)
      throw ShapeError("tensor parallel: the " + std::to_string(n_ranks) + " ranks disagree on " +
                       agreement.names[i] + ": from " + std::to_string(low) + " to " +
                       std::to_string(high) + " (every rank must make the same call)");
  }
}

// A 64-bit checksum of n scalars' bits (order-dependent), to compare weights across ranks.
template <class T>
long long checksum(const T* data, Index n) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (Index i = 0; i < n; ++i) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, data + i, sizeof(T));
    h = (h ^ bits) * 0x100000001b3ull;
  }
  long long out;
  std::memcpy(&out, &h, sizeof(out));
  return out;
}

}  // namespace detail

// One rank's shard of an attention sublayer, and the communicator the ranks share. Built on every
// rank of `comm` from the same full weights (a collective); the shard copies its c_attn columns
// ([C, 3 C_r] and [3 C_r], once) and views c_proj: the caller keeps the weights' buffers alive.
// Non-copyable; movable. One forward at a time per object (they are collectives on one
// communicator). Destroy it before MPI_Finalize.
template <class T>
class TensorParallelAttention {
 public:
  // Collective over comm (which the caller owns; it is duplicated, the duplicate returns MPI errors
  // as exceptions). Throws on every rank (never a hang) when MPI is not initialized (MpiError),
  // when the ranks' configs, dtypes or weights differ, or when there are more ranks than heads
  // (ConfigError), each message naming the rank and the problem.
  TensorParallelAttention(const AttentionWeights<T>& w, MPI_Comm comm) : config_(w.config()) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
      throw MpiError("tensor parallel: MPI is not initialized (call MPI_Init first)");
    if (comm == MPI_COMM_NULL) throw MpiError("tensor parallel: the communicator is MPI_COMM_NULL");
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    detail::mpi_check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup", rank, size);
    try {
      detail::mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN),
                        "MPI_Comm_set_errhandler", rank, size);
      rank_ = rank;
      n_ranks_ = size;
      setup(w);
    } catch (...) {
      MPI_Comm_free(&comm_);
      throw;
    }
  }

  TensorParallelAttention(const TensorParallelAttention&) = delete;
  TensorParallelAttention& operator=(const TensorParallelAttention&) = delete;
  TensorParallelAttention(TensorParallelAttention&& other) noexcept
      : config_(other.config_),
        shard_(other.shard_),
        heads_(other.heads_),
        rank_(other.rank_),
        n_ranks_(other.n_ranks_),
        comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
        c_attn_weight_(std::move(other.c_attn_weight_)),
        c_attn_bias_(std::move(other.c_attn_bias_)),
        zero_bias_(std::move(other.zero_bias_)),
        c_proj_weight_(other.c_proj_weight_),
        c_proj_bias_(other.c_proj_bias_),
        reduce_seconds_(other.reduce_seconds_) {}
  TensorParallelAttention& operator=(TensorParallelAttention&&) = delete;
  ~TensorParallelAttention() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }

  // The whole sublayer's shape (n_embd C, n_head), and this rank's shard of it
  // {C_r = H_r * head_dim, H_r}: the config of its KVCache and Workspace (see cache(), workspace()).
  const AttentionConfig& config() const { return config_; }
  const AttentionConfig& shard_config() const { return shard_; }
  Index n_embd() const { return config_.n_embd; }
  Index n_head() const { return config_.n_head; }
  Index head_dim() const { return config_.head_dim(); }
  HeadRange heads() const { return heads_; }  // this rank's heads
  int rank() const { return rank_; }
  int n_ranks() const { return n_ranks_; }
  MPI_Comm comm() const { return comm_; }  // the duplicate the forwards use

  // The shard's weights: c_attn_weight [C, 3 C_r] (its q | k | v columns, owned),
  // c_attn_bias [3 C_r] (owned), c_proj_weight [C_r, C] (a view of the caller's rows),
  // c_proj_bias [C] (the caller's on rank 0, zeros elsewhere: the bias is added once).
  ConstMatrixMap<T> c_attn_weight() const { return view(c_attn_weight_); }
  ConstVectorMap<T> c_attn_bias() const { return view(c_attn_bias_); }
  ConstMatrixMap<T> c_proj_weight() const { return {c_proj_weight_, shard_.n_embd, n_embd()}; }
  ConstVectorMap<T> c_proj_bias() const {
    return {rank_ == 0 ? c_proj_bias_ : zero_bias_.data(), n_embd()};
  }
  // Bytes this object owns (the packed c_attn columns and the zero bias).
  Index bytes() const {
    return (c_attn_weight_.size() + c_attn_bias_.size() + zero_bias_.size()) *
           static_cast<Index>(sizeof(T));
  }

  // A KV cache for this rank's heads, room for max_tokens positions (2 H_r max_tokens head_dim
  // scalars), and a workspace for this rank's forwards (as Workspace(config, max_tokens, max_keys),
  // with the projections' packing buffers sized for the shard's [C, 3 C_r] and [C_r, C]).
  KVCache<T> cache(Index max_tokens) const { return KVCache<T>(shard_, max_tokens); }
  Workspace<T> workspace(Index max_tokens = 0, Index max_keys = -1) const {
    Workspace<T> ws(shard_);
    reserve(ws, max_tokens, max_keys);
    return ws;
  }

  // Grows ws (a workspace over shard_config()) for max_tokens tokens and max_keys keys (default
  // max_tokens) on num_threads() threads; allocates only when it grows.
  void reserve(Workspace<T>& ws, Index max_tokens, Index max_keys = -1) const {
    ws.reserve(max_tokens, max_keys);
    const Index C = n_embd(), N = std::max(3 * shard_.n_embd, C);
    for (ThreadScratch<T>& t : ws.threads) t.gemm.reserve(std::max<Index>(max_tokens, 1), N, C);
  }

  // Seconds this rank spent in the all-reduce of out since construction (or reset_times()),
  // waiting for the other ranks included (MPI_Wtime).
  double reduce_seconds() const { return reduce_seconds_; }
  void reset_times() { reduce_seconds_ = 0; }

  // out = sum over the ranks of out (in place, every rank gets the sum). Collective.
  void all_reduce_sum(MatrixRef<T> out) const {
    const double start = MPI_Wtime();
    const bool contiguous = out.rows() <= 1 || out.outerStride() == out.cols();
    if (contiguous) {
      reduce_contiguous(out.data(), out.size());
    } else {
      for (Index i = 0; i < out.rows(); ++i) reduce_contiguous(out.row(i).data(), out.cols());
    }
    reduce_seconds_ += MPI_Wtime() - start;
  }

  // Agreement of a call (see detail::agree_on_ranks): check() ran on every rank, and `values`
  // are equal on all of them, or every rank throws the same error.
  template <class F>
  void agree(const F& check, const detail::RankAgreement& values) const {
    detail::agree_on_ranks(comm_, rank_, n_ranks_, check, values);
  }

  // Gathers the per-head rows of the ranks onto root: local [H_r * rows, cols] (rows h*rows ..
  // of this rank's head h0 + h, e.g. probs of a forward) into full [n_head * rows, cols] on root
  // (head h at rows h*rows ..; ignored, may be null, elsewhere). Both contiguous. Collective.
  void gather_heads(const ConstMatrixRef<T>& local, Index rows, MatrixRef<T>* full,
                    int root = 0) const {
    const Index cols = local.cols();
    agree(
        [&] {
          detail::check_shape("probs (this rank's heads)", {heads_.count * rows, cols},
                              {local.rows(), local.cols()});
          if (local.size() > 0 && local.rows() > 1 && local.outerStride() != cols)
            throw ShapeError("probs (this rank's heads): expected contiguous rows");
          if (rank_ == root) {
            if (!full) throw ShapeError("probs: the root rank needs the full matrix");
            detail::check_shape("probs", {n_head() * rows, cols}, {full->rows(), full->cols()});
            if (full->size() > 0 && full->rows() > 1 && full->outerStride() != cols)
              throw ShapeError("probs: expected contiguous rows");
          }
          if (n_head() * rows * cols > INT_MAX)
            throw CapacityError("probs: " + std::to_string(n_head() * rows * cols) +
                                " values exceed what one MPI_Gatherv sends (INT_MAX)");
        },
        detail::RankAgreement().add("rows per head", rows).add("columns", cols).add("root", root));
    std::vector<int> counts, displs;
    if (rank_ == root)
      for (int r = 0; r < n_ranks_; ++r) {
        const HeadRange h = heads_of_rank(n_head(), r, n_ranks_);
        counts.push_back(static_cast<int>(h.count * rows * cols));
        displs.push_back(static_cast<int>(h.begin * rows * cols));
      }
    const T* send = local.data();
    detail::mpi_check(MPI_Gatherv(send, static_cast<int>(local.size()), detail::mpi_datatype<T>(),
                                  rank_ == root ? full->data() : nullptr,
                                  rank_ == root ? counts.data() : nullptr,
                                  rank_ == root ? displs.data() : nullptr,
                                  detail::mpi_datatype<T>(), root, comm_),
                      "MPI_Gatherv", rank_, n_ranks_);
  }

 private:
  void setup(const AttentionWeights<T>& w) {
    const Index C = w.n_embd(), n_elements = 3 * C * C + 3 * C + C * C + C;
    long long sum = detail::checksum(w.c_attn_weight().data(), 3 * C * C);
    sum ^= detail::checksum(w.c_attn_bias().data(), 3 * C) * 3;
    sum ^= detail::checksum(w.c_proj_weight().data(), C * C) * 5;
    sum ^= detail::checksum(w.c_proj_bias().data(), C) * 7;
    agree([] {}, detail::RankAgreement()
                     .add("n_embd", C)
                     .add("n_head", w.n_head())
                     .add("the scalar type's size in bytes", static_cast<long long>(sizeof(T)))
                     .add("the weights' values (a checksum of their bits)", sum)
                     .add("the weights' element count", n_elements));
    if (n_ranks_ > w.n_head())
      throw ConfigError("tensor parallel: " + std::to_string(n_ranks_) + " ranks but n_head = " +
                        std::to_string(w.n_head()) +
                        ": every rank needs at least one head (use at most " +
                        std::to_string(w.n_head()) + " ranks)");
    heads_ = heads_of_rank(w.n_head(), rank_, n_ranks_);
    const Index hd = w.head_dim(), C_r = heads_.count * hd;
    shard_ = AttentionConfig{C_r, heads_.count};
    agree(
        [&] {  // the only allocations: one rank out of memory fails them all
          c_attn_weight_.resize(C, 3 * C_r);
          c_attn_bias_.resize(3 * C_r);
          zero_bias_ = RowVector<T>::Zero(C);
          for (Index part = 0; part < 3; ++part) {
            const Index from = part * C + heads_.begin * hd;
            c_attn_weight_.middleCols(part * C_r, C_r) = w.c_attn_weight().middleCols(from, C_r);
            c_attn_bias_.segment(part * C_r, C_r) = w.c_attn_bias().segment(from, C_r);
          }
        },
        detail::RankAgreement());
    c_proj_weight_ = w.c_proj_weight().data() + heads_.begin * hd * C;
    c_proj_bias_ = w.c_proj_bias().data();
  }

  void reduce_contiguous(T* data, Index n) const {
    for (Index done = 0; done < n;) {
      const int count = static_cast<int>(std::min<Index>(n - done, INT_MAX));
      detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, data + done, count, detail::mpi_datatype<T>(),
                                      MPI_SUM, comm_),
                        "MPI_Allreduce", rank_, n_ranks_);
      done += count;
    }
  }

  AttentionConfig config_, shard_;
  HeadRange heads_;
  int rank_ = 0, n_ranks_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  RowMatrix<T> c_attn_weight_;  // [C, 3 C_r]
  RowVector<T> c_attn_bias_;    // [3 C_r]
  RowVector<T> zero_bias_;      // [C]
  const T* c_proj_weight_ = nullptr;  // rows of the caller's c_proj.weight [C_r, C]
  const T* c_proj_bias_ = nullptr;    // the caller's c_proj.bias [C]
  mutable double reduce_seconds_ = 0;
};

namespace detail {

// Which forward the ranks are calling (they must agree).
enum class TpCall : int { plain = 1, cached = 2, batch = 3, batch_cached = 4 };

template <class T>
void check_shard_workspace(const TensorParallelAttention<T>& tp, const Workspace<T>& ws) {
  const AttentionConfig& a = tp.shard_config();
  const AttentionConfig& b = ws.config();
  if (a.n_embd != b.n_embd || a.n_head != b.n_head)
    throw ConfigError("workspace: expected this rank's shard, n_embd " + std::to_string(a.n_embd) +
                      ", n_head " + std::to_string(a.n_head) + " (tp.workspace()), got n_embd " +
                      std::to_string(b.n_embd) + ", n_head " + std::to_string(b.n_head));
}

template <class T>
void check_shard_cache(const TensorParallelAttention<T>& tp, const KVCache<T>& cache) {
  const AttentionConfig& a = tp.shard_config();
  const AttentionConfig& b = cache.config();
  if (a.n_embd != b.n_embd || a.n_head != b.n_head)
    throw ConfigError("cache: expected this rank's shard, n_embd " + std::to_string(a.n_embd) +
                      ", n_head " + std::to_string(a.n_head) + " (tp.cache()), got n_embd " +
                      std::to_string(b.n_embd) + ", n_head " + std::to_string(b.n_head));
}

// This rank's part of out for T new tokens (no reduction): the sublayer over its heads, the keys
// and values of its heads appended to `cache` first when it is not null. Checked beforehand; ws
// grown. out [T, C] may alias x; probs (or null) [H_r * T, n_keys].
template <class T>
void shard_partial(const TensorParallelAttention<T>& tp, const ConstMatrixRef<T>& x,
                   KVCache<T>* cache, Workspace<T>& ws, MatrixRef<T> out, MatrixRef<T>* probs) {
  const AttentionConfig& shard = tp.shard_config();
  const Index T_ = x.rows(), C_r = shard.n_embd;
  if (T_ == 0) return;
  MatrixRef<T> qkv = ws.qkv.topRows(T_);
  MatrixRef<T> merged = ws.merged.topRows(T_);
  const int n_threads = forward_threads(ws);
  // x is fully read here: out may alias x
  // (the shard's weights are not in the kernels' panel layout: the products pack B per call)
  use_weight_dtype(ws, WeightDtype::float32);  // tensor-parallel shards are float32
  projection_parallel<T>(x, tp.c_attn_weight(), nullptr, tp.c_attn_bias(), qkv, ws, n_threads);
  const ConstMatrixRef<T> qkv_read = qkv;
  if (cache) {
    cache->append(qkv.middleCols(C_r, C_r), qkv.middleCols(2 * C_r, C_r));
    const KVCache<T>& cached = *cache;
    attend_heads<T>(
        shard, qkv_read, [&](Index h) { return cached.keys(h); },
        [&](Index h) { return cached.values(h); }, ws, merged, probs, n_threads,
        [&](Index h) { return cached.transposed_key_blocks(h); });
  } else {
    attend_heads<T>(
        shard, qkv_read, [&](Index h) { return k_view(qkv_read, shard, h); },
        [&](Index h) { return v_view(qkv_read, shard, h); }, ws, merged, probs, n_threads);
  }
  const ConstMatrixRef<T> merged_read = merged;
  projection_parallel<T>(merged_read, tp.c_proj_weight(), nullptr, tp.c_proj_bias(), out, ws,
                         n_threads);
}

template <class T>
void tp_forward(const TensorParallelAttention<T>& tp, const ConstMatrixRef<T>& x,
                Workspace<T>& ws, MatrixRef<T>& out, MatrixRef<T>* probs) {
  const Index T_ = x.rows(), C = tp.n_embd(), H_r = tp.heads().count;
  tp.agree(
      [&] {
        check_shape("x", {T_, C}, {x.rows(), x.cols()});
        check_shape("out", {T_, C}, {out.rows(), out.cols()});
        if (probs) check_shape("probs (this rank's heads)", {H_r * T_, T_}, {probs->rows(), probs->cols()});
        check_shard_workspace(tp, ws);
        if (T_ == 0) return;
        tp.reserve(ws, T_);
        check_workspace_overlap<T>(ws, T_, out, probs);
      },
      RankAgreement()
          .add("the call", static_cast<int>(TpCall::plain))
          .add("x's rows (T)", T_)
          .add("whether probs are written", probs != nullptr));
  if (T_ == 0) return;
  shard_partial<T>(tp, x, nullptr, ws, out, probs);
  tp.all_reduce_sum(out);
}

template <class T>
void tp_forward_cached(const TensorParallelAttention<T>& tp, const ConstMatrixRef<T>& x,
                       KVCache<T>& cache, Workspace<T>& ws, MatrixRef<T>& out,
                       MatrixRef<T>* probs) {
  const Index T_ = x.rows(), C = tp.n_embd(), H_r = tp.heads().count, n_past = cache.n_past();
  tp.agree(
      [&] {
        check_shape("x", {T_, C}, {x.rows(), x.cols()});
        check_shape("out", {T_, C}, {out.rows(), out.cols()});
        if (probs)
          check_shape("probs (this rank's heads)", {H_r * T_, n_past + T_},
                      {probs->rows(), probs->cols()});
        check_shard_workspace(tp, ws);
        check_shard_cache(tp, cache);
        cache.check_room(T_);
        if (overlaps(out, cache.key_storage()) || overlaps(out, cache.value_storage()))
          throw ShapeError("out: must not overlap the KV cache");
        if (probs && (overlaps(*probs, cache.key_storage()) ||
                      overlaps(*probs, cache.value_storage())))
          throw ShapeError("probs: must not overlap the KV cache");
        tp.reserve(ws, T_, cache.capacity());
        check_workspace_overlap<T>(ws, T_, out, probs);
      },
      RankAgreement()
          .add("the call", static_cast<int>(TpCall::cached))
          .add("x's rows (T_new)", T_)
          .add("the cached positions (n_past)", n_past)
          .add("whether probs are written", probs != nullptr));
  if (T_ == 0) return;
  try {
    shard_partial<T>(tp, x, &cache, ws, out, probs);
    tp.all_reduce_sum(out);
  } catch (...) {
    cache.truncate(n_past);
    throw;
  }
}

template <class T>
void tp_batch_forward(const TensorParallelAttention<T>& tp, const ConstMatrixRef<T>& x,
                      const BatchLayout& batch, Workspace<T>& ws, MatrixRef<T>& out) {
  Index total = 0;
  for (Index b = 0; b < batch.batch(); ++b) total += batch.length(b);
  tp.agree(
      [&] {
        check_batch_io<T>(batch, tp.n_embd(), x, out);
        check_shard_workspace(tp, ws);
        tp.reserve(ws, batch.max_length());
        for (Index b = 0; b < batch.batch(); ++b) {
          const MatrixRef<T> out_b = out.middleRows(batch.first_row(b), batch.length(b));
          try {
            check_workspace_overlap<T>(ws, batch.length(b), out_b, nullptr);
          } catch (...) {
            rethrow_for_sequence(b);
          }
        }
      },
      RankAgreement()
          .add("the call", static_cast<int>(TpCall::batch))
          .add("the batch size (B)", batch.batch())
          .add("the padded length (T)", batch.tokens())
          .add("the real rows (sum of lengths)", total));
  for (Index b = 0; b < batch.batch(); ++b) {
    shard_partial<T>(tp, x.middleRows(batch.first_row(b), batch.length(b)), nullptr, ws,
                     out.middleRows(batch.first_row(b), batch.length(b)), nullptr);
    zero_padding<T>(batch, b, out);  // zero on every rank: the sum stays 0
  }
  tp.all_reduce_sum(out);
}

template <class T, class CacheAt>
void tp_batch_forward_cached(const TensorParallelAttention<T>& tp, const ConstMatrixRef<T>& x,
                             const BatchLayout& batch, const CacheAt& caches, Index n_caches,
                             Workspace<T>& ws, MatrixRef<T>& out) {
  const Index B = batch.batch();
  Index total = 0, past = 0;
  for (Index b = 0; b < B; ++b) {
    total += batch.length(b);
    if (n_caches == B) past += caches(b).n_past();
  }
  tp.agree(
      [&] {
        if (n_caches != B)
          throw ShapeError("caches: expected one KV cache per sequence (" + std::to_string(B) +
                           "), got " + std::to_string(n_caches));
        check_batch_io<T>(batch, tp.n_embd(), x, out);
        check_shard_workspace(tp, ws);
        Index max_keys = batch.max_length();
        for (Index b = 0; b < B; ++b) {
          const KVCache<T>& cache = caches(b);
          try {
            check_shard_cache(tp, cache);
            cache.check_room(batch.length(b));
            const MatrixRef<T> out_b = out.middleRows(batch.first_row(b), batch.length(b));
            if (overlaps(out_b, cache.key_storage()) || overlaps(out_b, cache.value_storage()))
              throw ShapeError("out: must not overlap the KV cache");
          } catch (...) {
            rethrow_for_sequence(b);
          }
          max_keys = std::max(max_keys, cache.capacity());
        }
        tp.reserve(ws, batch.max_length(), max_keys);
        for (Index b = 0; b < B; ++b) {
          const MatrixRef<T> out_b = out.middleRows(batch.first_row(b), batch.length(b));
          try {
            check_workspace_overlap<T>(ws, batch.length(b), out_b, nullptr);
            check_input_outside_workspace<T>(ws, batch.length(b),
                                             x.middleRows(batch.first_row(b), batch.length(b)));
          } catch (...) {
            rethrow_for_sequence(b);
          }
        }
      },
      RankAgreement()
          .add("the call", static_cast<int>(TpCall::batch_cached))
          .add("the batch size (B)", B)
          .add("the padded length (T)", batch.tokens())
          .add("the real rows (sum of lengths)", total)
          .add("the cached positions (sum of n_past)", past));
  Index done = 0;  // caches 0 .. done - 1 have been appended to
  try {
    for (; done < B; ++done) {
      const Index n = batch.length(done);
      if (n > 0)
        shard_partial<T>(tp, x.middleRows(batch.first_row(done), n), &caches(done), ws,
                         out.middleRows(batch.first_row(done), n), nullptr);
      zero_padding<T>(batch, done, out);
    }
    tp.all_reduce_sum(out);
  } catch (...) {  // an MPI error: every cache back to where it was
    for (Index b = 0; b < done; ++b) caches(b).truncate(caches(b).n_past() - batch.length(b));
    throw;
  }
}

}  // namespace detail

// The tensor-parallel forwards: the same calls as the single-process ones (forward.hpp,
// incremental.hpp, batch.hpp) with `tp` in place of the weights, a workspace from tp.workspace()
// and caches from tp.cache(). Collectives: every rank calls them with the same shapes; every rank
// gets the whole out [T, C] (x and out [T, C] / [B * T, C] are full-width on every rank).
// probs, where written, are this rank's heads only: [H_r * T, n_keys], rows h*T .. of head
// tp.heads().begin + h (gather them with tp.gather_heads).
// PyTorch (HF): GPT2Attention(x)[0], the heads split over the ranks.
template <class T, class D>
void attention_forward(const TensorParallelAttention<T>& tp, const Eigen::MatrixBase<D>& x,
                       Workspace<T>& ws, MatrixRef<T> out) {
  detail::tp_forward<T>(tp, detail::as_view<T>(x), ws, out, nullptr);
}
template <class T, class D>
void attention_forward(const TensorParallelAttention<T>& tp, const Eigen::MatrixBase<D>& x,
                       Workspace<T>& ws, MatrixRef<T> out, MatrixRef<T> probs) {
  detail::tp_forward<T>(tp, detail::as_view<T>(x), ws, out, &probs);
}

// Through a KV cache of this rank's heads (tp.cache(max_tokens)).
template <class T, class D>
void attention_forward(const TensorParallelAttention<T>& tp, const Eigen::MatrixBase<D>& x,
                       KVCache<T>& cache, Workspace<T>& ws, MatrixRef<T> out) {
  detail::tp_forward_cached<T>(tp, detail::as_view<T>(x), cache, ws, out, nullptr);
}
template <class T, class D>
void attention_forward(const TensorParallelAttention<T>& tp, const Eigen::MatrixBase<D>& x,
                       KVCache<T>& cache, Workspace<T>& ws, MatrixRef<T> out,
                       MatrixRef<T> probs) {
  detail::tp_forward_cached<T>(tp, detail::as_view<T>(x), cache, ws, out, &probs);
}

// A padded batch (sequence by sequence; one all-reduce for the whole batch).
template <class T, class D>
void attention_forward(const TensorParallelAttention<T>& tp, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, Workspace<T>& ws, MatrixRef<T> out) {
  detail::tp_batch_forward<T>(tp, detail::as_view<T>(x), batch, ws, out);
}

// A padded batch through one cache per sequence (each over this rank's heads).
template <class T, class D>
void attention_forward(const TensorParallelAttention<T>& tp, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, std::vector<KVCache<T>>& caches,
                       Workspace<T>& ws, MatrixRef<T> out) {
  detail::tp_batch_forward_cached<T>(
      tp, detail::as_view<T>(x), batch,
      [&](Index b) -> KVCache<T>& { return caches[static_cast<std::size_t>(b)]; },
      static_cast<Index>(caches.size()), ws, out);
}

}  // namespace gpt2
