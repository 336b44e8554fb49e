// gpt2-attention run --tensor-parallel, under `mpiexec -n R`: the heads of the sublayer split over
// the R ranks of MPI_COMM_WORLD (gpt2/tensor_parallel.hpp). Every rank reads the checkpoint and the
// input and runs what a plain run runs (compute_with, with its TensorParallelAttention shard in
// place of the weights: every flag of run works the same); rank 0 gathers the probabilities of
// every head and writes the outputs, all or nothing as always; the other ranks write nothing.
//
// No rank is left waiting for another that failed: the steps that might fail on one rank alone
// (reading the files, allocating the results, writing the outputs) each end in an agreement, and the
// forwards agree before they compute; an error on any rank is thrown on every rank with the same
// message, which rank 0 prints (exit status 1 on every rank; mpiexec then reports the job
// aborted). MPI_Init is called only here: every
// other command line of the CLI runs without MPI. Compiled in tensor_parallel_run.cpp alone (it
// defines run_tensor_parallel, declared in run_command.hpp).
#pragma once

#include <mpi.h>

#include <iostream>
#include <new>
#include <optional>

#include "gpt2/tensor_parallel.hpp"
#include "run_command.hpp"
#include "run_compute.hpp"

namespace gpt2::cli {

// MPI from MPI_Init to MPI_Finalize, for one run. MPI_COMM_WORLD returns errors (exceptions)
// instead of aborting.
class MpiSession {
 public:
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized && MPI_Init(nullptr, nullptr) != MPI_SUCCESS)
      throw MpiError("--tensor-parallel: MPI_Init failed");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession() { MPI_Finalize(); }

  int rank() const { return rank_; }

  // f() on every rank; if it throws on any, every rank throws the first failing rank's error.
  template <class F>
  void agree(const F& f) const {
    gpt2::detail::agree_on_ranks(MPI_COMM_WORLD, rank_, size_, f, gpt2::detail::RankAgreement());
  }

 private:
  int rank_ = 0, size_ = 1;
};

template <class T>
void run_tensor_parallel_in(const RunOptions& o, const MpiSession& mpi) {
  std::optional<safetensors::File> file;
  std::optional<safetensors::LoadedAttention<T>> loaded;
  std::optional<RunInput<T>> input;
  std::optional<BatchLayout> layout;
  mpi.agree([&] {
    file.emplace(open_weights(o.weights));
    loaded.emplace(load_layer<T>(*file, o.layer, o.n_head));
    input.emplace(read_input<T>(o.input, loaded->weights().n_embd()));
    layout = input_layout(input->shape, o.starts, o.lengths);
    if (o.share_prefix) check_share_prefix_shape(input->shape, *o.share_prefix);
  });
  // the shard packs its own copies in the precision the weights are packed in (--dtype bf16)
  const TensorParallelAttention<T> tp(packed_for_kernels(loaded->weights(), weight_dtype(o.precision)),
                                      MPI_COMM_WORLD);
  const Index B = input->batch(), T_ = input->tokens(), H = tp.n_head(), H_r = tp.heads().count;
  const bool root = tp.rank() == 0;
  const bool want_probs = (!o.probs.empty() || !o.png.empty()) && input->x.rows() > 0;

  // The results first (as a plain run: a P too large fails before anything is computed): this
  // rank's heads' probabilities and, on rank 0, every head's.
  RunResult<T> r;
  RowMatrix<T> all_probs;
  mpi.agree([&] {
    if (input->x.rows() == 0) return;
    if (want_probs) r.probs.resize(B * H_r * T_, T_);
    if (want_probs && root) all_probs.resize(B * H * T_, T_);
    r.out.resize(input->x.rows(), tp.n_embd());
  });
  compute_with<T>(o, SublayerOf<T, TensorParallelAttention<T>>(tp), *input, layout, r);

  if (want_probs) {  // sequence by sequence: [H_r, T, T] blocks into rank 0's [H, T, T]
    for (Index b = 0; b < B; ++b) {
      const Eigen::Map<const RowMatrix<T>> local(r.probs.data() + b * H_r * T_ * T_, H_r * T_, T_);
      Eigen::Map<RowMatrix<T>> all(root ? all_probs.data() + b * H * T_ * T_ : nullptr,
                                   root ? H * T_ : 0, root ? T_ : 0);
      MatrixRef<T> all_ref = all;
      tp.gather_heads(local, T_, root ? &all_ref : nullptr);
    }
    r.probs.swap(all_probs);  // rank 0: every head's; elsewhere: nothing
  }
  mpi.agree([&] {
    if (root) write_run_result<T>(o, r);
  });
  if (root) {  // a NaN or infinity in X: rank 0 says it, once
    r.warning = non_finite_warning(o.input, *input, layout);
    print_warning(r);
  }
}

int run_tensor_parallel(const RunOptions& o) {
  const MpiSession mpi;
  try {
    if (o.precision == Precision::f64)
      run_tensor_parallel_in<double>(o, mpi);
    else  // f32, bf16: float32 files, the weights packed in weight_dtype(o.precision)
      run_tensor_parallel_in<float>(o, mpi);
  } catch (const MpiError&) {  // may be this rank's alone: every rank reports its own
    throw;
  } catch (const std::exception& e) {  // shared by every rank: rank 0 reports it, before
    // MPI_Finalize (which waits for every rank: the message is out before any rank exits)
    const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
    if (mpi.rank() == 0)
      std::cerr << "gpt2-attention: " << one_line(oom ? "out of memory" : e.what()) << std::endl;
    throw ReportedElsewhere(e.what());
  }
  return 0;
}

}  // namespace gpt2::cli
