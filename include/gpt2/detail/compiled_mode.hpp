// Which of the library's two modes this translation unit is built in (docs/building.md):
//   header-only  (the default of a plain `-I`): every file that runs a forward compiles the kernels
//                of every level and the forwards it calls;
//   compiled     (GPT2_ATTENTION_SEPARATE_KERNELS, what the CMake target gpt2::attention and the
//                pkg-config module gpt2-attention give): the vector levels' kernels and the float
//                and double forwards are compiled once, in the library (src/gpt2_attention.cpp,
//                which includes gpt2/compiled.hpp with GPT2_ATTENTION_KERNELS_IMPLEMENTATION).
// GPT2_ATTENTION_EXTERN_FORWARDS is 1 where a header declares its float/double forwards as explicit
// instantiations (extern template: compiled elsewhere) or, in the implementation file, defines them.
// A file that must compile its own copy (EIGEN_RUNTIME_NO_MALLOC checks its own code only) defines
// GPT2_ATTENTION_NO_EXTERN_FORWARDS; its copy is the one it runs, and it still links.
#pragma once

#if defined(GPT2_ATTENTION_SEPARATE_KERNELS) && \
    (defined(GPT2_ATTENTION_KERNELS_IMPLEMENTATION) || !defined(GPT2_ATTENTION_NO_EXTERN_FORWARDS))
#define GPT2_ATTENTION_EXTERN_FORWARDS 1
#if defined(GPT2_ATTENTION_KERNELS_IMPLEMENTATION)
#define GPT2_ATTENTION_EXTERN
#else
#define GPT2_ATTENTION_EXTERN extern
#endif
// The explicit instantiations (declarations or definitions) of the forward over AttentionWeights<T>
// and a cache, and of its sublayer-independent body run_forward (which a TensorParallelAttention<T>
// forward calls too); inside namespace gpt2.
#define GPT2_ATTENTION_FORWARD(T, Cache)                                                        \
  GPT2_ATTENTION_SUBLAYER_FORWARD(GPT2_ATTENTION_EXTERN, T, AttentionWeights<T>, Cache)         \
  GPT2_ATTENTION_EXTERN template void detail::run_forward<T, Cache>(                            \
      const kernels::Kernels<T>&, const detail::Sublayer<T>&, const ConstMatrixRef<T>&, Cache&,  \
      Index, Workspace<T>&, MatrixRef<T>&, MatrixRef<T>*);
// The same for the batch forward over AttentionWeights<T> and a named b -> cache (batch.hpp), and
// its sublayer-independent part run_group.
#define GPT2_ATTENTION_BATCH_FORWARD(T, CacheAt)                                                \
  GPT2_ATTENTION_SUBLAYER_BATCH_FORWARD(GPT2_ATTENTION_EXTERN, T, AttentionWeights<T>, CacheAt) \
  GPT2_ATTENTION_EXTERN template void detail::run_group<T, CacheAt>(                            \
      const kernels::Kernels<T>&, const detail::Sublayer<T>&, const ConstMatrixRef<T>&,          \
      const BatchLayout&, const CacheAt&, Index, Index, Index, Workspace<T>&, MatrixRef<T>&);
#else
#define GPT2_ATTENTION_EXTERN_FORWARDS 0
#endif

// The explicit instantiation (EXTERN: `extern`, or empty where it is defined) of the forward and of
// the batch forward over sublayer S (AttentionWeights<T> above; TensorParallelAttention<T> in
// tensor_parallel.hpp, whose compiled mode is gpt2::mpi's); inside namespace gpt2.
#define GPT2_ATTENTION_SUBLAYER_FORWARD(EXTERN, T, S, Cache)                                    \
  EXTERN template void detail::forward<T, S, Cache>(const S&, const ConstMatrixRef<T>&, Cache&, \
                                                    Workspace<T>&, MatrixRef<T>&, MatrixRef<T>*);
#define GPT2_ATTENTION_SUBLAYER_BATCH_FORWARD(EXTERN, T, S, CacheAt)                            \
  EXTERN template void detail::batch_forward<T, S, CacheAt>(                                    \
      const S&, const ConstMatrixRef<T>&, const BatchLayout&, const CacheAt&, Workspace<T>&,     \
      MatrixRef<T>&);
