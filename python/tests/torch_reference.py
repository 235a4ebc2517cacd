"""PyTorch float32 references of moekit's twelve operators, written plainly from
SPEC.md (loops over experts and routes; small test shapes only).

Every GEMM runs in f32 on f32 copies of the (already rounded) inputs; the F-wide
activation is rounded to the op's dtype before the down projection, and outputs
are rounded once at the end, as the SPEC says.
"""

import torch

ACCURACY = {  # SPEC: rel_l2 limits per output dtype
    torch.float32: 1e-5,
    torch.float16: 5e-3,
    torch.bfloat16: 1e-2,
    "fp8": 3e-2,
}


def silu(x):
    return x * torch.sigmoid(x)


def rel_l2(out, ref):
    out = out.double()
    ref = ref.double()
    den = ref.norm().item()
    num = (out - ref).norm().item()
    if den == 0.0:
        return num
    return num / den


def err_ratio(out, ref, limit):
    """SPEC's err_ratio: the share of elements outside atol + rtol * |ref| (both the limit,
    as the C++ checks' tolerance_for)."""
    if ref.numel() == 0:
        return 0.0
    out = out.double()
    ref = ref.double()
    return ((out - ref).abs() > limit + limit * ref.abs()).double().mean().item()


def assert_close(out, ref, limit, what=""):
    """SPEC's check: finite, rel_l2 <= limit and err_ratio <= limit (a few elements far off
    barely move rel_l2 on a large output; err_ratio catches them)."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} vs {tuple(ref.shape)}"
    assert torch.isfinite(out.float()).all(), f"{what}: NaN or Inf in the output"
    err = rel_l2(out, ref)
    assert err <= limit, f"{what}: rel_l2 {err:.3e} > {limit:.1e}"
    ratio = err_ratio(out, ref, limit)
    assert ratio <= limit, f"{what}: err_ratio {ratio:.3e} > {limit:.1e} (rel_l2 {err:.3e})"


# ---------------------------------------------------------------- routing


def fused_topk(
    gating_output,
    top_k,
    renormalize=False,
    scoring_func="softmax",
    num_expert_group=0,
    topk_group=0,
    routed_scaling_factor=1.0,
    correction_bias=None,
):
    """Returns (weights [T,K] f32, ids [T,K] i64, score [T,E] f32, sel [T,E] f32)."""
    logits = gating_output.float()
    T, E = logits.shape
    if scoring_func == "softmax":
        score = torch.softmax(logits, dim=-1)
    else:
        score = torch.sigmoid(logits)
    sel = score + correction_bias.float() if correction_bias is not None else score.clone()
    if num_expert_group > 0:
        G = num_expert_group
        grouped = sel.view(T, G, E // G)
        if correction_bias is not None:
            group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)
        else:
            group_score = grouped.max(dim=-1).values
        keep = torch.sort(group_score, dim=-1, descending=True, stable=True).indices[:, :topk_group]
        mask = torch.zeros(T, G, dtype=torch.bool, device=sel.device).scatter_(1, keep, True)
        sel = sel.masked_fill(~mask.repeat_interleave(E // G, dim=1), float("-inf"))
    # Descending, ties to the lower id: a stable sort keeps index order among equals.
    ids = torch.sort(sel, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = topk_weights_for(score, ids, renormalize, routed_scaling_factor)
    return weights, ids, score, sel


def topk_weights_for(score, ids, renormalize, routed_scaling_factor):
    w = score.gather(1, ids.long())
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w * routed_scaling_factor


# ---------------------------------------------------------------- permutes


def moe_permute_align(topk_ids, num_experts, block_size):
    """Returns (sorted list up to num_tokens_post_padded, expert id per used block)."""
    ids = topk_ids.flatten().tolist()
    num_routes = len(ids)
    sorted_ids, block_experts = [], []
    for e in range(num_experts):
        rows = [i for i, x in enumerate(ids) if x == e]
        if not rows:
            continue
        padded = -(-len(rows) // block_size) * block_size
        sorted_ids += rows + [num_routes] * (padded - len(rows))
        block_experts += [e] * (padded // block_size)
    return sorted_ids, block_experts


def layout_ends(counts, alignment):
    """Inclusive physical ends of a contiguous(alignment) layout, and the starts."""
    starts, ends, end = [], [], 0
    for c in counts:
        start = -(-end // alignment) * alignment
        starts.append(start)
        end = start + c
        ends.append(end)
    return starts, ends


def moe_pre_permute(hidden_states, local_expert_ids, num_local_experts, alignment):
    """Returns (row -> token map {row: token}, layout_metadata list, inverse list)."""
    T, K = local_expert_ids.shape
    ids = local_expert_ids.flatten().tolist()
    counts = [sum(1 for x in ids if x == e) for e in range(num_local_experts)]
    starts, ends = layout_ends(counts, alignment)
    inverse = [-1] * (T * K)
    pos = list(starts)
    rows = {}
    for i, e in enumerate(ids):
        if 0 <= e < num_local_experts:
            inverse[i] = pos[e]
            rows[pos[e]] = i // K
            pos[e] += 1
    return rows, ends, inverse


def moe_post_permute(expert_output, topk_weights, inverse_indices, out_dtype=None):
    T, K = topk_weights.shape
    H = expert_output.shape[1]
    inv = inverse_indices.view(T, K).long()
    out = torch.zeros(T, H, dtype=torch.float32, device=expert_output.device)
    for k in range(K):  # k order, f32
        idx = inv[:, k]
        valid = (idx >= 0).unsqueeze(1)
        rows = expert_output[idx.clamp(min=0)].float()
        out += torch.where(valid, topk_weights[:, k : k + 1].float() * rows, torch.zeros_like(rows))
    return out.to(out_dtype or expert_output.dtype)


# ---------------------------------------------------------------- GEMMs and MLPs


def _act(h, n):
    return silu(h[:, :n]) * h[:, n:]


def moe_grouped_gemm(a, b, layout_metadata, masked=False, alignment=1, activation="none",
                     out_dtype=None):  # fmt: skip
    """Returns (c in f32 rounded to the output dtype, bool mask of the valid rows)."""
    out_dtype = out_dtype or a.dtype
    E, Nb, _ = b.shape
    N = Nb // 2 if activation == "silu_and_mul" else Nb
    meta = layout_metadata.tolist()
    if masked:
        _, M, _ = a.shape
        c = torch.zeros(E, M, N, dtype=torch.float32, device=a.device)
        valid = torch.zeros(E, M, dtype=torch.bool, device=a.device)
        for e in range(E):
            n = meta[e]
            if n == 0:
                continue
            h = a[e, :n].float() @ b[e].float().t()
            c[e, :n] = _act(h, N) if activation == "silu_and_mul" else h
            valid[e, :n] = True
    else:
        P = a.shape[0]
        c = torch.zeros(P, N, dtype=torch.float32, device=a.device)
        valid = torch.zeros(P, dtype=torch.bool, device=a.device)
        end = 0
        for e in range(E):
            start = -(-end // alignment) * alignment
            end = meta[e]
            if end > start:
                h = a[start:end].float() @ b[e].float().t()
                c[start:end] = _act(h, N) if activation == "silu_and_mul" else h
                valid[start:end] = True
    return c.to(out_dtype), valid


def moe_grouped_gemm_fp8(a, a_scale, b, b_scale, layout_metadata, masked=True, alignment=1,
                         scales="block", activation="none", c_scale=None):  # fmt: skip
    """MoEGroupedGemmFP8Fwd (docs/gemm.md "FP8 scale modes"): a and b dequantized by their
    scales (per 128-column group / 128 x 128 block, per row, or per tensor / expert), the
    grouped GEMM in f32 (silu_and_mul on the scaled gate and up), rounded to bf16, or with
    c_scale to e4m3 of c / c_scale (saturated). Returns (c, bool mask of the valid rows)."""
    Kd = a.shape[-1]
    E, Bn, _ = b.shape
    if scales == "block":
        sa = a_scale.repeat_interleave(128, dim=-1)[..., :Kd]
        sb = b_scale.repeat_interleave(128, dim=1)[:, :Bn].repeat_interleave(128, dim=2)[:, :, :Kd]
    elif scales == "per_channel":
        sa, sb = a_scale.unsqueeze(-1), b_scale.unsqueeze(-1)
    else:
        assert scales == "per_tensor", scales
        sa, sb = a_scale.reshape(1), b_scale.reshape(E, 1, 1)
    c, valid = moe_grouped_gemm(a.float() * sa, b.float() * sb, layout_metadata, masked,
                                alignment, activation, torch.float32)  # fmt: skip
    if c_scale is None:
        return c.to(torch.bfloat16), valid
    return (c / c_scale.float()).clamp(-448, 448).to(torch.float8_e4m3fn), valid


def activate(h, activation):
    """The MLP activations (docs/moe.md "Activations") of the f32 pre-activations h
    [rows, 2F] ([rows, F] for relu2), by moekit's Python names."""
    if activation == "relu2":
        return torch.relu(h) ** 2
    if activation == "swigluoai":  # gate and up interleaved
        g, u = h[:, 0::2].clamp(max=7.0), h[:, 1::2].clamp(-7.0, 7.0)
        return g * torch.sigmoid(1.702 * g) * (u + 1)
    F = h.shape[-1] // 2
    g, u = h[:, :F], h[:, F:]
    if activation == "gelu":
        return torch.nn.functional.gelu(g) * u
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(g, approximate="tanh") * u
    assert activation == "silu", activation
    return silu(g) * u


def mlp(x, w_gate_up, w_down, activation="silu", gate_up_bias=None, down_bias=None):
    """An MLP in f32 with the F-wide activation rounded to x's dtype; f32 result. The
    biases (one expert's rows) are added to the f32 projections."""
    h = x.float() @ w_gate_up.float().t()
    if gate_up_bias is not None:
        h = h + gate_up_bias.float()
    act = activate(h, activation).to(x.dtype).float()
    y = act @ w_down.float().t()
    return y if down_bias is None else y + down_bias.float()


def _row(bias, e):
    return None if bias is None else bias[e]


def moe_expert_mlp(expert_input, layout_metadata, w_gate_up, w_down, alignment=1,
                   activation="silu", gate_up_bias=None, down_bias=None):  # fmt: skip
    """Returns (output rounded to the input dtype, bool mask of the valid rows)."""
    out = torch.zeros(expert_input.shape, dtype=torch.float32, device=expert_input.device)
    valid = torch.zeros(expert_input.shape[0], dtype=torch.bool, device=expert_input.device)
    end = 0
    for e, e_end in enumerate(layout_metadata.tolist()):
        start = -(-end // alignment) * alignment
        end = e_end
        if end > start:
            out[start:end] = mlp(expert_input[start:end], w_gate_up[e], w_down[e], activation,
                                 _row(gate_up_bias, e), _row(down_bias, e))
            valid[start:end] = True
    return out.to(expert_input.dtype), valid


def fused_moe_experts_f32(hidden_states, w_gate_up, w_down, topk_weights, topk_ids,
                          activation="silu", gate_up_bias=None, down_bias=None):  # fmt: skip
    T, H = hidden_states.shape
    E = w_gate_up.shape[0]
    out = torch.zeros(T, H, dtype=torch.float32, device=hidden_states.device)
    ids = topk_ids.long()
    for e in range(E):
        t, k = torch.nonzero(ids == e, as_tuple=True)
        if t.numel() == 0:
            continue
        y = mlp(hidden_states[t], w_gate_up[e], w_down[e], activation, _row(gate_up_bias, e),
                _row(down_bias, e))
        out.index_add_(0, t, y * topk_weights[t, k].float().unsqueeze(1))
    return out


def local_ids(topk_ids, expert_map, num_local):
    """moekit's engine ids (docs/routing-permute.md, "Engine ids"): int32 or int64 ids,
    global ones read through expert_map when given (-1 outside it), then -1 outside
    [0, num_local)."""
    ids = topk_ids.long()
    if expert_map is not None:
        n = expert_map.numel()
        inside = (ids >= 0) & (ids < n)
        ids = torch.where(inside, expert_map.long()[ids.clamp(0, n - 1)], -1)
    return torch.where((ids >= 0) & (ids < num_local), ids, -1)


def engine_inputs(hidden_states, topk_weights, topk_ids, expert_map, apply_on_input, num_local):
    """(x, weights, local ids) the routed sum runs on: apply_router_weight_on_input (top-1)
    scales x by the weight, round(round(w) * x), and weighs the outputs by 1."""
    ids = local_ids(topk_ids, expert_map, num_local)
    if not apply_on_input:
        return hidden_states, topk_weights, ids
    x = (hidden_states.float() * topk_weights.to(hidden_states.dtype).float())
    return x.to(hidden_states.dtype), torch.ones_like(topk_weights), ids


def fused_moe_experts(hidden_states, w_gate_up, w_down, topk_weights, topk_ids,
                      activation="silu", gate_up_bias=None, down_bias=None, expert_map=None,
                      apply_router_weight_on_input=False):  # fmt: skip
    x, w, ids = engine_inputs(hidden_states, topk_weights, topk_ids, expert_map,
                              apply_router_weight_on_input, w_gate_up.shape[0])  # fmt: skip
    out = fused_moe_experts_f32(x, w_gate_up, w_down, w, ids, activation, gate_up_bias,
                                down_bias)  # fmt: skip
    return out.to(hidden_states.dtype)


def fused_moe(hidden_states, gating_output, w_gate_up, w_down, top_k, renormalize=False,
              scoring_func="softmax", num_expert_group=0, topk_group=0,
              routed_scaling_factor=1.0, correction_bias=None, activation="silu",
              gate_up_bias=None, down_bias=None, expert_map=None,
              apply_router_weight_on_input=False):  # fmt: skip
    w, ids, _, _ = fused_topk(gating_output, top_k, renormalize, scoring_func, num_expert_group,
                              topk_group, routed_scaling_factor, correction_bias)  # fmt: skip
    return fused_moe_experts(hidden_states, w_gate_up, w_down, w, ids, activation, gate_up_bias,
                             down_bias, expert_map, apply_router_weight_on_input)  # fmt: skip


def fused_moe_shared_expert(hidden_states, gating_output, w_gate_up, w_down, shared_w_gate_up,
                            shared_w_down, top_k, renormalize=False, scoring_func="softmax",
                            num_expert_group=0, topk_group=0, routed_scaling_factor=1.0,
                            correction_bias=None, activation="silu", gate_up_bias=None,
                            down_bias=None, shared_gate_up_bias=None, shared_down_bias=None,
                            expert_map=None, apply_router_weight_on_input=False):  # fmt: skip
    w, ids, _, _ = fused_topk(gating_output, top_k, renormalize, scoring_func, num_expert_group,
                              topk_group, routed_scaling_factor, correction_bias)  # fmt: skip
    x, w, ids = engine_inputs(hidden_states, w, ids, expert_map, apply_router_weight_on_input,
                              w_gate_up.shape[0])  # fmt: skip
    routed = fused_moe_experts_f32(x, w_gate_up, w_down, w, ids, activation, gate_up_bias,
                                   down_bias)  # fmt: skip
    if shared_w_gate_up is None:
        return routed.to(hidden_states.dtype)
    shared = mlp(hidden_states, shared_w_gate_up, shared_w_down, activation, shared_gate_up_bias,
                 shared_down_bias)  # fmt: skip
    return (routed + shared).to(hidden_states.dtype)


def shared_expert_mlp(hidden_states, w_gate_up, w_down, activation="silu", gate_up_bias=None,
                      down_bias=None):  # fmt: skip
    return mlp(hidden_states, w_gate_up, w_down, activation, gate_up_bias,
               down_bias).to(hidden_states.dtype)  # fmt: skip
