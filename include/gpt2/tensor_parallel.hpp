// Tensor parallelism over MPI: one attention sublayer split by heads over the ranks of a
// communicator (optional component gpt2::mpi; needs <mpi.h>). See docs/tensor-parallel.md.
//
// Rank r of R holds heads [h0, h0 + H_r) (contiguous, as even as possible: heads_of_rank): a
// TensorParallelAttention<T> is the sublayer of those heads, C_r = H_r * head_dim wide,
//   qkv_r = x @ c_attn_r + c_attn_bias_r     c_attn_r [C, 3 C_r]: its heads' columns of each of the
//                                            q, k, v blocks of c_attn, copied once at setup
//   merged_r: its heads, as the whole sublayer computes them
//   out_r = merged_r @ c_proj_r (+ c_proj.bias on rank 0 only)   c_proj_r: rows h0 * head_dim ..
//   out   = sum over ranks of out_r          MPI_Allreduce(MPI_IN_PLACE, MPI_SUM)
// and every forward of sublayer.hpp and batch.hpp takes it in place of the weights: it is a
// wrapper, with the same forward (agreement, this rank's heads, all-reduce), so packed weights
// (float32 or bf16: the shard packs its copies as the given weights are packed), every KV cache
// (KVCache<float|double|bfloat16|int8>, paged sequences) and batches work under it. Every rank ends with
// the whole out [T, C]; its caches and workspaces hold its heads only (shard_config(): memory per
// rank falls as 1/R); probabilities, where written, are its heads' [H_r * T, n_keys].
//
// Collectives: every forward is a collective over the communicator; all ranks call the same
// functions in the same order with the same shapes (x may differ only in its values). Before
// anything changes, the ranks agree (one small MPI_Allreduce) that every rank's checks passed and
// that their shapes match; otherwise every rank throws the same error, naming the first failing
// rank, so no rank is left waiting in a collective.
#pragma once

#include <mpi.h>

#include <climits>
#include <memory>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt2/detail/pipeline.hpp"
#include "gpt2/kv_cache.hpp"
// Which mode gpt2::mpi is built in: with GPT2_ATTENTION_SEPARATE_MPI (the compiled library) the
// shard's forwards are declared extern at the end of this file, over the caches of these headers.
#if defined(GPT2_ATTENTION_SEPARATE_MPI) && \
    (defined(GPT2_ATTENTION_MPI_IMPLEMENTATION) || !defined(GPT2_ATTENTION_NO_EXTERN_FORWARDS))
#define GPT2_ATTENTION_MPI_EXTERN_FORWARDS 1
#if defined(GPT2_ATTENTION_MPI_IMPLEMENTATION)
#define GPT2_ATTENTION_MPI_EXTERN
#else
#define GPT2_ATTENTION_MPI_EXTERN extern
#endif
#include "gpt2/batch.hpp"
#include "gpt2/detail/compiled_mode.hpp"
#include "gpt2/paged_kv_cache.hpp"
#else
#define GPT2_ATTENTION_MPI_EXTERN_FORWARDS 0
#endif
#include "gpt2/weights.hpp"
#include "gpt2/workspace.hpp"

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

// Values every rank must have in common for a call (detail/pipeline.hpp's CallShape).
using RankAgreement = CallShape;

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
// check is taken by reference through CheckRef: one body for every check, not one per lambda.
class CheckRef {
 public:
  template <class F, class = std::enable_if_t<!std::is_same<std::decay_t<F>, CheckRef>::value>>
  CheckRef(const F& f)  // NOLINT: implicit, from any callable check
      : object_(&f), call_([](const void* o) { (*static_cast<const F*>(o))(); }) {}
  void operator()() const { call_(object_); }

 private:
  const void* object_;
  void (*call_)(const void*);
};

inline void agree_on_ranks(MPI_Comm comm, int rank, int n_ranks, CheckRef check,
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
        packed_(std::move(other.packed_)),
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
  // The packed copies of c_attn_weight and c_proj_weight (null when the weights given were views
  // only), made in the precision the given weights were packed in.
  const PackedMatrix* packed_c_attn_weight() const { return packed_ ? &packed_->c_attn : nullptr; }
  const PackedMatrix* packed_c_proj_weight() const { return packed_ ? &packed_->c_proj : nullptr; }
  WeightDtype weight_dtype() const { return packed_ ? packed_->c_attn.dtype() : WeightDtype::float32; }
  // Bytes this object owns (the c_attn columns, their bias, the zero bias, the packed copies).
  Index bytes() const {
    return (c_attn_weight_.size() + c_attn_bias_.size() + zero_bias_.size()) *
               static_cast<Index>(sizeof(T)) +
           (packed_ ? packed_->c_attn.bytes() + packed_->c_proj.bytes() : 0);
  }

  // A KV cache for this rank's heads, room for max_tokens positions (2 H_r max_tokens head_dim
  // elements; S: float, double, bfloat16 or int8, as for KVCache), and a workspace for this rank's
  // forwards (as Workspace(config, max_tokens, max_keys), with the projections' packing buffers
  // sized for the shard's [C, 3 C_r] and [C_r, C]).
  template <class S = T>
  KVCache<S> cache(Index max_tokens) const {
    return KVCache<S>(shard_, max_tokens);
  }
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
                     .add("the weights' element count", n_elements)
                     .add("the weights' packing (0 none, 1 float32, 2 bf16, 3 int8)",
                          !w.is_packed()                              ? 0
                          : w.weight_dtype() == WeightDtype::bf16     ? 2
                          : w.weight_dtype() == WeightDtype::int8     ? 3
                                                                      : 1));
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
          c_proj_weight_ = w.c_proj_weight().data() + heads_.begin * hd * C;
          c_proj_bias_ = w.c_proj_bias().data();
          if constexpr (std::is_same<T, float>::value) {
            if (w.is_packed()) {  // the shard's copies in the precision of the given weights'
              auto p = std::make_shared<Packed>();
              p->c_attn = PackedMatrix(c_attn_weight(), w.weight_dtype());
              p->c_proj = PackedMatrix(c_proj_weight(), w.weight_dtype());
              packed_ = std::move(p);
            }
          }
        },
        detail::RankAgreement());
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
  struct Packed {
    PackedMatrix c_attn, c_proj;
  };
  std::shared_ptr<const Packed> packed_;
  mutable double reduce_seconds_ = 0;
};

namespace detail {

// A rank's shard as a sublayer (detail/pipeline.hpp): the forwards run its heads, the ranks agree
// before anything changes, and out is summed over them.
template <class T>
struct SublayerTraits<TensorParallelAttention<T>> {
  static constexpr bool kIsSublayer = true;
  static Sublayer<T> of(const TensorParallelAttention<T>& tp) {
    Sublayer<T> s;
    s.heads = tp.shard_config();
    s.n_embd = tp.n_embd();
    s.c_attn = {tp.c_attn_weight().data(), 3 * tp.shard_config().n_embd,
                tp.packed_c_attn_weight(), tp.c_attn_bias().data()};
    s.c_proj = {tp.c_proj_weight().data(), tp.n_embd(), tp.packed_c_proj_weight(),
                tp.c_proj_bias().data()};
    s.bf16_products = tp.weight_dtype() != WeightDtype::float32;
    s.shard = true;
    s.probs_name = "probs (this rank's heads)";
    return s;
  }
  template <class F>
  static void agree(const TensorParallelAttention<T>& tp, const F& check, const CallShape& shape) {
    tp.agree(check, shape);
  }
  static void all_reduce(const TensorParallelAttention<T>& tp, MatrixRef<T>& out) {
    tp.all_reduce_sum(out);
  }
};

}  // namespace detail

// The compiled mode of gpt2::mpi (GPT2_ATTENTION_SEPARATE_MPI, from the CMake target): the float
// and double forwards of a shard, single-sequence and batched, over every cache type, are compiled
// once, in libgpt2_attention_mpi.a (src/gpt2_attention_mpi.cpp), as sublayer.hpp's are in
// libgpt2_attention.a (detail/compiled_mode.hpp).
#if GPT2_ATTENTION_MPI_EXTERN_FORWARDS
#define GPT2_ATTENTION_TP_FORWARD(T, Cache) \
  GPT2_ATTENTION_SUBLAYER_FORWARD(GPT2_ATTENTION_MPI_EXTERN, T, TensorParallelAttention<T>, Cache)
#define GPT2_ATTENTION_TP_BATCH_FORWARD(T, CacheAt)                                          \
  GPT2_ATTENTION_SUBLAYER_BATCH_FORWARD(GPT2_ATTENTION_MPI_EXTERN, T, TensorParallelAttention<T>, \
                                        CacheAt)
GPT2_ATTENTION_TP_FORWARD(float, detail::NoCache)
GPT2_ATTENTION_TP_FORWARD(float, KVCache<float>)
GPT2_ATTENTION_TP_FORWARD(float, KVCache<bfloat16>)
GPT2_ATTENTION_TP_FORWARD(float, KVCache<int8>)
GPT2_ATTENTION_TP_FORWARD(float, PagedSequence<float>)
GPT2_ATTENTION_TP_FORWARD(float, PagedSequence<bfloat16>)
GPT2_ATTENTION_TP_FORWARD(float, PagedSequence<int8>)
GPT2_ATTENTION_TP_FORWARD(double, detail::NoCache)
GPT2_ATTENTION_TP_FORWARD(double, KVCache<double>)
GPT2_ATTENTION_TP_FORWARD(double, PagedSequence<double>)
GPT2_ATTENTION_TP_BATCH_FORWARD(float, detail::NoCaches)
GPT2_ATTENTION_TP_BATCH_FORWARD(float, detail::CacheList<KVCache<float>>)
GPT2_ATTENTION_TP_BATCH_FORWARD(float, detail::CacheList<KVCache<bfloat16>>)
GPT2_ATTENTION_TP_BATCH_FORWARD(float, detail::CacheList<KVCache<int8>>)
GPT2_ATTENTION_TP_BATCH_FORWARD(float, detail::CacheList<PagedSequence<float>>)
GPT2_ATTENTION_TP_BATCH_FORWARD(float, detail::CacheList<PagedSequence<bfloat16>>)
GPT2_ATTENTION_TP_BATCH_FORWARD(float, detail::CacheList<PagedSequence<int8>>)
GPT2_ATTENTION_TP_BATCH_FORWARD(float, detail::PagedLayers<float>)
GPT2_ATTENTION_TP_BATCH_FORWARD(float, detail::PagedLayers<bfloat16>)
GPT2_ATTENTION_TP_BATCH_FORWARD(float, detail::PagedLayers<int8>)
GPT2_ATTENTION_TP_BATCH_FORWARD(double, detail::NoCaches)
GPT2_ATTENTION_TP_BATCH_FORWARD(double, detail::CacheList<KVCache<double>>)
GPT2_ATTENTION_TP_BATCH_FORWARD(double, detail::CacheList<PagedSequence<double>>)
GPT2_ATTENTION_TP_BATCH_FORWARD(double, detail::PagedLayers<double>)
#undef GPT2_ATTENTION_TP_FORWARD
#undef GPT2_ATTENTION_TP_BATCH_FORWARD
#endif

}  // namespace gpt2
