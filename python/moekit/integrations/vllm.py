"""vLLM's ``fused_topk`` and ``fused_experts`` run on moekit's ops.

The two functions take the arguments of vLLM's functions of the same names
(``vllm.model_executor.layers.fused_moe.fused_moe``): the same names, order and
defaults, the same layouts (``w1`` [E, 2N, K] with the gate rows then the up rows, ``w2``
[E, K, N], ``topk_ids`` int32 or int64, ``expert_map`` global -> local ids with -1 for an
expert on another rank), and return what vLLM's return. An engine can swap them in for
vLLM's own.

The engine arguments go to moekit's op as they are (docs/python.md, "vLLM", has the
mapping table); what moekit cannot do raises ``NotImplementedError`` naming the
argument; no argument is ignored. In short:

- ``topk_ids`` int32 or int64, ``expert_map`` (global -> local ids, -1 for another
  rank's expert) and ``apply_router_weight_on_input`` (top-1 only, as vLLM's models use
  it; x scaled as vLLM's ``x * w.to(x.dtype)``): moekit's op takes them natively, no
  copy here (docs/moe.md, "Engine inputs");
- an int64 ``expert_map``: one cast to int32 (E_global ints; vLLM builds its maps int32);
- ``topk_weights`` in another dtype than float32: one cast to float32;
- ``inplace=True``: moekit's op writes into ``hidden_states`` itself (``out=``; the op
  reads every input row before it writes the output), no copy;
- ``activation``: "silu", "gelu" (exact), "swigluoai" (gpt-oss: w1's gate and up rows
  interleaved) and "relu2_no_mul" (w1 [E, N, K]) map to moekit's activations;
  ``w1_bias`` [E, 2N] ([E, N]) and ``w2_bias`` [E, K] to its biases (no copy); ``w1_bias``
  with ``apply_router_weight_on_input`` raises ``NotImplementedError`` (vLLM scales the
  biased projection, moekit's adapter the input);
- other activations (the other ``*_no_mul``), quantization (``use_*``, scales, zero
  points, ``block_shape``, ``per_channel_quant``, a quantized ``quant_config``):
  ``NotImplementedError``.

Needs PyTorch and moekit's torch layer; importing this module without them raises
``ImportError``.
"""

import moekit as _moekit

if not _moekit.HAS_TORCH:
    raise ImportError(
        "moekit.integrations.vllm needs PyTorch and moekit's torch layer (torch is not "
        "importable here, or MOEKIT_NO_TORCH is set)"
    )

import torch  # noqa: E402

from .. import ops as _ops  # noqa: E402  (looked up per call: tests spy on the ops)

__all__ = ["fused_topk", "fused_experts"]

# vLLM's quantization arguments of fused_experts: flags that must be False, tensors (and
# block_shape) that must be None.
_QUANT_FLAGS = ("use_fp8_w8a8", "use_int8_w8a8", "use_int8_w8a16", "use_int4_w4a16",
                "use_mxfp4_w4a4", "per_channel_quant")  # fmt: skip
_QUANT_VALUES = ("w1_scale", "w2_scale", "w1_zp", "w2_zp", "a1_scale", "a2_scale", "block_shape")


# vLLM's fused_experts activations -> moekit's names (docs/python.md "vLLM").
_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "swigluoai": "swigluoai",
                "relu2_no_mul": "relu2"}  # fmt: skip


def _unsupported(fn, arg, value, why):
    raise NotImplementedError(
        f"moekit.integrations.vllm.{fn}: {arg}={value!r} is not supported: {why}"
    )


def fused_topk(hidden_states, gating_output, topk, renormalize, indices_type=None,
               scoring_func="softmax"):  # fmt: skip
    """vLLM's ``fused_topk`` on ``moekit.fused_topk``.

    Args:
        hidden_states: [T, H] (only its token count is used, as in vLLM).
        gating_output: [T, E] bf16/f16/f32 router logits (read as they are, no f32 copy).
        topk: experts per token.
        renormalize: divide the topk weights by their sum.
        indices_type: dtype of topk_ids: None or torch.int32 (moekit's own ids), or
            torch.int64 (one cast of the [T, topk] ids).
        scoring_func: "softmax" (over E) or "sigmoid".

    Returns:
        (topk_weights [T, topk] f32, topk_ids [T, topk] int32 or indices_type,
        token_expert_indices [T, topk] int32 with [t, k] = k * T + t, as vLLM's
        topk_softmax writes them; one arange kernel here).
    """
    if hidden_states.shape[0] != gating_output.shape[0]:
        raise ValueError(
            "moekit.integrations.vllm.fused_topk: number of tokens mismatch: hidden_states "
            f"has {hidden_states.shape[0]}, gating_output {gating_output.shape[0]}"
        )
    if indices_type not in (None, torch.int32, torch.int64):
        _unsupported("fused_topk", "indices_type", indices_type,
                     "moekit's ids are int32 (torch.int64 by a cast)")  # fmt: skip
    weights, ids = _ops.fused_topk(gating_output, topk, renormalize, scoring_func)
    if indices_type is torch.int64:
        ids = ids.to(torch.int64)
    T = gating_output.shape[0]
    token_expert_indices = (
        torch.arange(T * topk, dtype=torch.int32, device=gating_output.device)
        .view(topk, T)
        .t()
        .contiguous()
    )
    return weights, ids, token_expert_indices


def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, inplace=False,
                  activation="silu", apply_router_weight_on_input=False, use_fp8_w8a8=False,
                  use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False,
                  per_channel_quant=False, global_num_experts=-1, expert_map=None,
                  w1_scale=None, w2_scale=None, w1_zp=None, w2_zp=None, a1_scale=None,
                  a2_scale=None, block_shape=None, allow_deep_gemm=False, *,
                  use_mxfp4_w4a4=False, allow_cutlass_block_scaled_grouped_gemm=False,
                  w1_bias=None, w2_bias=None, quant_config=None):  # fmt: skip
    """vLLM's ``fused_experts`` on ``moekit.fused_moe_experts``.

    Args (vLLM's; the positional order is vLLM's, the keyword-only ones are the names
    later vLLM versions added):
        hidden_states: [T, K] bf16/f16 (vLLM's K is the hidden size).
        w1: [E, 2N, K], gate rows then up rows; w2: [E, K, N] (E local experts).
        topk_weights: [T, topk] (f32; another float dtype is cast to f32).
        topk_ids: [T, topk] int32 or int64 expert ids (passed as they are): local ones in
            [0, E), or global ones in [0, global_num_experts) with expert_map.
        inplace: write the output into hidden_states and return it (moekit's out=).
        activation: "silu" (silu(gate) * up), "gelu" (exact gelu(gate) * up), "swigluoai"
            (gpt-oss, w1's rows interleaved gate, up) or "relu2_no_mul" (relu(x)^2, w1
            [E, N, K]); others raise NotImplementedError.
        apply_router_weight_on_input: scale the input rows by the weights instead of the
            expert outputs; top-1 only (moekit's op does it).
        global_num_experts: -1 or the number of global experts (E without expert_map,
            expert_map's length with it).
        expert_map: [global_num_experts] int32 global -> local id, -1 = another rank's
            expert (those routes add nothing); passed to moekit's op (an int64 map is
            cast to int32 once).
        allow_deep_gemm, allow_cutlass_block_scaled_grouped_gemm: vLLM's choice of an
            FP8 backend, without effect for unquantized weights (in vLLM too); accepted.
        use_fp8_w8a8, use_int8_w8a8, use_int8_w8a16, use_int4_w4a16, use_mxfp4_w4a4,
        per_channel_quant, w1_scale, w2_scale, w1_zp, w2_zp, a1_scale, a2_scale,
        block_shape, a quantized quant_config: NotImplementedError.
        w1_bias: [E, 2N] ([E, N] for relu2_no_mul), w2_bias: [E, K]: optional biases (f32 or
            the weights' dtype) added to the projections, as vLLM's; where None, those of
            an unquantized quant_config (its w1_bias / w2_bias) when it has them.

    Returns:
        [T, K]: sum over the routes of weight * (w2[e] . act(w1[e] . x + w1_bias[e]) +
        w2_bias[e]); hidden_states itself when inplace.
    """
    fn = "fused_experts"
    if activation not in _ACTIVATIONS:
        _unsupported(fn, "activation", activation,
                     "moekit runs " + ", ".join(repr(a) for a in _ACTIVATIONS))  # fmt: skip
    args = locals()
    for name in _QUANT_FLAGS:
        if args[name]:
            _unsupported(fn, name, args[name], "moekit has no quantized fused_experts path")
    for name in _QUANT_VALUES:
        if args[name] is not None:
            _unsupported(fn, name, "<given>", "moekit has no quantized fused_experts path")
    if quant_config is not None and _is_quantized(quant_config):
        _unsupported(fn, "quant_config", quant_config, "moekit has no quantized path")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"moekit.integrations.vllm.{fn}: topk shape mismatch: topk_weights "
            f"{list(topk_weights.shape)}, topk_ids {list(topk_ids.shape)}"
        )
    if apply_router_weight_on_input and (topk_ids.dim() != 2 or topk_ids.shape[1] != 1):
        _unsupported(fn, "apply_router_weight_on_input", True,
                     f"only with top-1 routing (topk_ids {list(topk_ids.shape)})")  # fmt: skip
    expert_map = _checked_map(expert_map, global_num_experts, w1.shape[0])
    weights = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.float()
    act = _ACTIVATIONS[activation]
    # Newer vLLM passes the biases in quant_config (unquantized: no other field set).
    if quant_config is not None:
        w1_bias = w1_bias if w1_bias is not None else getattr(quant_config, "w1_bias", None)
        w2_bias = w2_bias if w2_bias is not None else getattr(quant_config, "w2_bias", None)
    if apply_router_weight_on_input and w1_bias is not None:
        # vLLM scales the biased first projection; moekit scales the input, which would
        # leave the bias unscaled: a different result.
        _unsupported(fn, "w1_bias", "<given>",
                     "not with apply_router_weight_on_input (vLLM scales x . w1 + w1_bias; "
                     "moekit scales the input)")  # fmt: skip
    out = hidden_states if inplace else None
    return _ops.fused_moe_experts(hidden_states, w1, w2, weights, topk_ids, act, w1_bias, w2_bias,
                                  expert_map, apply_router_weight_on_input, out=out)  # fmt: skip


def _checked_map(expert_map, global_num_experts, num_local):
    """expert_map as moekit's op takes it (int32), after the consistency checks of
    global_num_experts."""
    fn = "moekit.integrations.vllm.fused_experts"
    if expert_map is None:
        if global_num_experts not in (-1, num_local):
            raise ValueError(
                f"{fn}: global_num_experts={global_num_experts} without an expert_map, "
                f"but w1 holds {num_local} experts"
            )
        return None
    if expert_map.dim() != 1 or global_num_experts not in (-1, expert_map.shape[0]):
        raise ValueError(
            f"{fn}: expert_map must be [global_num_experts] (global_num_experts="
            f"{global_num_experts}), got {list(expert_map.shape)}"
        )
    return expert_map.to(torch.int32) if expert_map.dtype == torch.int64 else expert_map


def _is_quantized(quant_config):
    # vLLM's FusedMoEQuantConfig: the unquantized one (FUSED_MOE_UNQUANTIZED_CONFIG) has no
    # activation quant_dtype, no use_* flag, no scales or zero points (weight-only
    # quantization has quant_dtype None but weight scales). Biases are no quantization:
    # fused_experts takes them from the config (w1_bias / w2_bias). An object that does
    # not say (no quant_dtype attribute) counts as quantized.
    if getattr(quant_config, "quant_dtype", "unknown") is not None:
        return True
    if any(getattr(quant_config, f, False) for f in _QUANT_FLAGS):
        return True
    return any(getattr(quant_config, t, None) is not None for t in _QUANT_VALUES)
