// gpt2-attention: GPT-2's multi-head causal self-attention sublayer, header-only, on Eigen 3.4.
// The front door: include this header for the whole core (needs Eigen only).
//
//   qkv    = x @ c_attn.weight + c_attn.bias             [T, C] @ [C, 3C]   qkv.hpp
//   q|k|v  = three contiguous C-blocks of qkv; head h at h*head_dim within each   qkv.hpp
//   y_h    = softmax(q_h k_h^T / sqrt(head_dim), causal) v_h                causal_attention.hpp
//   merged = [y_0 | y_1 | ... ]  (head h at columns h*head_dim)            projection.hpp
//   out    = merged @ c_proj.weight + c_proj.bias                           projection.hpp
//   attention_forward / attention: all of it, with reusable scratch         forward.hpp
//   KVCache + attention_forward(w, x, cache, ws, out): prefill and decode   kv_cache.hpp, incremental.hpp
//   KVCacheBF16: the same with keys and values held in bf16 (float forwards)  kv_cache_bf16.hpp, incremental_bf16.hpp
//   BatchLayout + attention_forward(w, x, batch, ...): padded batches       batch.hpp
//   KVBlockPool + PagedSequence: paged KV cache, forks share a prompt       paged_kv_cache.hpp
//   attention_forward(w, x, seq, ...): forwards over block tables           paged_attention.hpp
//   set_num_threads / num_threads: OpenMP threads of the forwards           threads.hpp
//   kernel_info / set_isa / pack_weights: the kernel level, chosen at run time  kernels/dispatch.hpp, weights.hpp
#pragma once

#include "gpt2/batch.hpp"
#include "gpt2/causal_attention.hpp"
#include "gpt2/config.hpp"
#include "gpt2/error.hpp"
#include "gpt2/forward.hpp"
#include "gpt2/gemm.hpp"
#include "gpt2/incremental.hpp"
#include "gpt2/incremental_bf16.hpp"
#include "gpt2/kernels/dispatch.hpp"
#include "gpt2/kv_cache.hpp"
#include "gpt2/kv_cache_bf16.hpp"
#include "gpt2/layer_norm.hpp"
#include "gpt2/paged_attention.hpp"
#include "gpt2/paged_kv_cache.hpp"
#include "gpt2/projection.hpp"
#include "gpt2/qkv.hpp"
#include "gpt2/threads.hpp"
#include "gpt2/types.hpp"
#include "gpt2/version.hpp"
#include "gpt2/weights.hpp"
#include "gpt2/workspace.hpp"
