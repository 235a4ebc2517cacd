"""The op API implemented by torch_reference, for MOEKIT_TEST_SELFCHECK=1 runs on
the CPU (they check the GPU tests' own logic: shapes, masks, comparisons)."""

import torch

import torch_reference as ref


def fused_topk(gating_output, top_k, renormalize=False, scoring_func="softmax",
               num_expert_group=0, topk_group=0, routed_scaling_factor=1.0,
               correction_bias=None):  # fmt: skip
    w, ids, _, _ = ref.fused_topk(gating_output, top_k, renormalize, scoring_func,
                                  num_expert_group, topk_group, routed_scaling_factor,
                                  correction_bias)  # fmt: skip
    return w, ids.int()


def moe_permute_align(topk_ids, num_experts, block_size=64, expert_map=None):
    local = ref.local_ids(topk_ids, expert_map, num_experts) if expert_map is not None else topk_ids
    sorted_ids, blocks = ref.moe_permute_align(local, num_experts, block_size)
    routes = topk_ids.numel()
    size = routes + num_experts * (block_size - 1)
    out = torch.full((size,), routes, dtype=torch.int32)
    out[: len(sorted_ids)] = torch.tensor(sorted_ids, dtype=torch.int32)
    experts = torch.full((-(-size // block_size),), -1, dtype=torch.int32)
    experts[: len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    return out, experts, torch.tensor([len(sorted_ids)], dtype=torch.int32)


def moe_pre_permute(hidden_states, local_expert_ids, num_local_experts, alignment=1):
    rows, ends, inverse = ref.moe_pre_permute(hidden_states, local_expert_ids,
                                              num_local_experts, alignment)  # fmt: skip
    T, K = local_expert_ids.shape
    P = T * K + num_local_experts * (alignment - 1)
    out = torch.zeros(P, hidden_states.shape[1], dtype=hidden_states.dtype)
    for r, t in rows.items():
        out[r] = hidden_states[t]
    return (out, torch.tensor(ends, dtype=torch.int32).reshape(num_local_experts),
            torch.tensor(inverse, dtype=torch.int32).reshape(T * K))  # fmt: skip


def moe_post_permute(expert_output, topk_weights, inverse_indices, out_dtype=None):
    return ref.moe_post_permute(expert_output, topk_weights, inverse_indices, out_dtype)


def moe_grouped_gemm(a, b, layout_metadata, masked=False, alignment=1, activation="none",
                     out_dtype=None):  # fmt: skip
    return ref.moe_grouped_gemm(a, b, layout_metadata, masked, alignment, activation,
                                out_dtype)[0]  # fmt: skip


def moe_grouped_gemm_fp8(a, a_scale, b, b_scale, layout_metadata, masked=True, alignment=1,
                         scales="block", activation="none", c_scale=None):  # fmt: skip
    return ref.moe_grouped_gemm_fp8(a, a_scale, b, b_scale, layout_metadata, masked, alignment,
                                    scales, activation, c_scale)[0]  # fmt: skip


def moe_expert_mlp(expert_input, layout_metadata, w_gate_up, w_down, alignment=1, *act):
    return ref.moe_expert_mlp(expert_input, layout_metadata, w_gate_up, w_down, alignment,
                              *act)[0]  # fmt: skip


fused_moe_experts = ref.fused_moe_experts
indexed_expert_mlp = ref.fused_moe_experts
fused_moe = ref.fused_moe
fused_moe_shared_expert = ref.fused_moe_shared_expert
shared_expert_mlp = ref.shared_expert_mlp
