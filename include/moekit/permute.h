// Route sorting and the gather / combine around an expert-grouped buffer. No output may
// overlap an input, another output or the workspace (docs/bad-inputs.md).
#pragma once

#include <cuda_runtime_api.h>

#include "moekit/tensor.h"

namespace moekit {

// MoEPermuteAlignFwd (vLLM's moe_align_block_size).
struct PermuteAlignArgs {
  TensorView topk_ids;          // [T, K] i32 / i64, ids in [0, num_experts) or -1 (global with map)
  int num_experts = 0;          // the (local) experts of the blocks
  int block_size = 64;          // power of two, 16..256
  TensorView sorted_token_ids;  // out [permute_align_sorted_size(...)] i32
  TensorView expert_ids;        // out [permute_align_num_blocks(...)] i32
  TensorView num_tokens_post_padded;  // out [1] i32
  Workspace workspace;                // permute_align_workspace_size(args) bytes
  // Expert parallelism: topk_ids hold global ids, sorted by their local id; routes to
  // other ranks' experts (map -1) are dropped like -1 (docs/routing-permute.md).
  TensorView expert_map;  // optional [E_global] i32: global id -> local id in [0, num_experts)
};

// T*K + E*(block_size-1)
int64_t permute_align_sorted_size(int64_t num_routes, int num_experts, int block_size);
// ceil(sorted_size / block_size)
int64_t permute_align_num_blocks(int64_t num_routes, int num_experts, int block_size);
size_t permute_align_workspace_size(const PermuteAlignArgs& args);
void moe_permute_align(const PermuteAlignArgs& args, cudaStream_t stream);

// MoEPrePermuteFwd: gather token rows into a contiguous(alignment) expert-grouped buffer.
struct PrePermuteArgs {
  TensorView hidden_states;     // [T, H] bf16 / f16
  TensorView local_expert_ids;  // [T, K] i32 / i64 in [0, num_local_experts) or -1
  int num_local_experts = 0;
  PermutedLayout layout;       // contiguous only
  TensorView permuted;         // out [P, H], P = permuted_rows(T, K, E, alignment)
  TensorView layout_metadata;  // out [num_local_experts] i32, inclusive physical end of each block
  TensorView inverse_indices;  // out [T*K] i32, physical row of route t*K+k or -1
  Workspace workspace;         // pre_permute_workspace_size(args) bytes
};

size_t pre_permute_workspace_size(const PrePermuteArgs& args);
void moe_pre_permute(const PrePermuteArgs& args, cudaStream_t stream);

// MoEPostPermuteFwd: out[t] = sum_k w[t,k] * expert_output[inverse[t*K+k]] (f32, k order).
struct PostPermuteArgs {
  TensorView expert_output;    // [P, H] bf16 / f16
  TensorView topk_weights;     // [T, K] f32
  TensorView inverse_indices;  // [T*K] i32
  TensorView out;              // out [T, H], dtype of expert_output or f32
};

void moe_post_permute(const PostPermuteArgs& args, cudaStream_t stream);

}  // namespace moekit
