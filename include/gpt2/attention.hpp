// gpt2-attention: GPT-2's multi-head causal self-attention sublayer on Eigen 3.4.
// The front door: the forwards, contiguous KV caches and batches (needs Eigen only). In the
// compiled mode (the CMake target gpt2::attention; docs/building.md) it declares what the library
// compiled; header-only, it compiles what the file uses.
//
//   qkv    = x @ c_attn.weight + c_attn.bias             [T, C] @ [C, 3C]   qkv.hpp
//   q|k|v  = three contiguous C-blocks of qkv; head h at h*head_dim within each   qkv.hpp
//   y_h    = softmax(q_h k_h^T / sqrt(head_dim), causal) v_h                causal_attention.hpp
//   merged = [y_0 | y_1 | ... ]  (head h at columns h*head_dim)            projection.hpp
//   out    = merged @ c_proj.weight + c_proj.bias                           projection.hpp
//
//   AttentionWeights, pack_weights (float32 or bf16 copies)                 weights.hpp
//   attention_forward(w, x, ws, out) / (w, x, cache, ws, out): one sequence sublayer.hpp
//   KVCache<float|double|bfloat16|int8>: the cache concept and contiguous caches kv_cache.hpp
//   BatchLayout + attention_forward(w, x, batch, [caches,] ws, out)         batch.hpp
//   Workspace: the scratch of the forwards, sized once                      workspace.hpp
//   set_num_threads / num_threads: threads of the forwards                  threads.hpp
//   kernel_info / set_isa: the kernel level, chosen at run time             kernels/dispatch.hpp
// Beside it, included where used: paged_kv_cache.hpp (KVBlockPool + PagedSequence: paged caches,
// forks share a prompt), tensor_parallel.hpp (heads over MPI ranks; gpt2::mpi), safetensors.hpp
// and npy.hpp (gpt2::io).
#pragma once

#include "gpt2/batch.hpp"
#include "gpt2/causal_attention.hpp"
#include "gpt2/config.hpp"
#include "gpt2/error.hpp"
#include "gpt2/gemm.hpp"
#include "gpt2/kernels/dispatch.hpp"
#include "gpt2/kv_cache.hpp"
#include "gpt2/layer_norm.hpp"
#include "gpt2/projection.hpp"
#include "gpt2/qkv.hpp"
#include "gpt2/sublayer.hpp"
#include "gpt2/threads.hpp"
#include "gpt2/types.hpp"
#include "gpt2/version.hpp"
#include "gpt2/weights.hpp"
#include "gpt2/workspace.hpp"
