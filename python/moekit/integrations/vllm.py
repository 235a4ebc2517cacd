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
- FP8 weights (``use_fp8_w8a8=True``, or an FP8 ``quant_config``) map to moekit's
  ``weight_quant`` (docs/python.md, "vLLM"): ``block_shape`` [128, 128] ->
  "fp8_block128" (``w1_scale`` / ``w2_scale`` the block scales as they are);
  ``per_channel_quant`` (``per_out_ch_quant`` with ``per_act_token_quant``) ->
  "fp8_per_channel" (``w1_scale`` [E, 2N, 1] viewed as [E, 2N]); otherwise
  "fp8_per_tensor" (``w1_scale`` [E]) with ``a1_scale`` / ``a2_scale`` as static activation
  scales where given. activation "silu" and no biases with them (moekit's FP8 kernels);
- other activations (the other ``*_no_mul``), other quantization (int8, int4, mxfp4, zero
  points, other block shapes, per-channel weights with per-tensor activations or the
  reverse, static activation scales with per-token or block quantization):
  ``NotImplementedError`` with the reason.

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
            FP8 backend; accepted (moekit runs its own FP8 path).
        use_fp8_w8a8: float8_e4m3fn w1 / w2 with w1_scale / w2_scale: block_shape
            [128, 128] -> weight_quant "fp8_block128" (block scales as they are);
            per_channel_quant -> "fp8_per_channel" ([E, 2N, 1] scales viewed as [E, 2N]);
            otherwise "fp8_per_tensor" ([E] scales) with a1_scale / a2_scale ([1]) as
            static activation scales. activation "silu", no biases.
        quant_config: unquantized (its biases are used), or an FP8 one (quant_dtype
            torch.float8_e4m3fn) mapped as the arguments above.
        use_int8_w8a8, use_int8_w8a16, use_int4_w4a16, use_mxfp4_w4a4, w1_zp, w2_zp,
        another quant_dtype, block shapes other than [128, 128], FP8 arguments without
        use_fp8_w8a8: NotImplementedError with the reason.
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
    # The quantization arguments by name (spelled out: torch.compile's tracer in torch 2.11
    # cannot trace locals()).
    args = dict(use_fp8_w8a8=use_fp8_w8a8, use_int8_w8a8=use_int8_w8a8,
                use_int8_w8a16=use_int8_w8a16, use_int4_w4a16=use_int4_w4a16,
                use_mxfp4_w4a4=use_mxfp4_w4a4, per_channel_quant=per_channel_quant,
                w1_scale=w1_scale, w2_scale=w2_scale, w1_zp=w1_zp, w2_zp=w2_zp,
                a1_scale=a1_scale, a2_scale=a2_scale, block_shape=block_shape,
                quant_config=quant_config)  # fmt: skip
    quant = _fp8_quant(fn, args)
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
    if quant:
        _check_fp8_mlp(fn, w1, w2, activation, w1_bias, w2_bias)
    out = hidden_states if inplace else None
    return _ops.fused_moe_experts(hidden_states, w1, w2, weights, topk_ids, act, w1_bias, w2_bias,
                                  expert_map, apply_router_weight_on_input, **quant,
                                  out=out)  # fmt: skip


# vLLM's quantization flags other than FP8's (use_fp8_w8a8 and per_channel_quant).
_OTHER_QUANT_FLAGS = ("use_int8_w8a8", "use_int8_w8a16", "use_int4_w4a16", "use_mxfp4_w4a4")


def _fp8_quant(fn, args):
    """moekit's weight_quant keyword arguments for vLLM's quantization arguments (or an
    FP8 quant_config): {} when unquantized; NotImplementedError naming what does not map."""
    for name in _OTHER_QUANT_FLAGS:
        if args[name]:
            _unsupported(fn, name, args[name],
                         "moekit's quantized weights are FP8 (use_fp8_w8a8)")  # fmt: skip
    for name in ("w1_zp", "w2_zp"):
        if args[name] is not None:
            _unsupported(fn, name, "<given>", "zero points: moekit's FP8 scales are symmetric")
    qc = args["quant_config"]
    if qc is not None and _is_quantized(qc):
        if args["use_fp8_w8a8"]:
            _unsupported(fn, "quant_config", qc, "use_fp8_w8a8 given too: pass one of them")
        dtype = getattr(qc, "quant_dtype", None)
        if dtype is not torch.float8_e4m3fn:
            _unsupported(fn, "quant_config", qc,
                         f"quant_dtype {dtype!r}: moekit maps FP8 (torch.float8_e4m3fn) "
                         "weights and activations only")  # fmt: skip
        for name in _OTHER_QUANT_FLAGS:
            if getattr(qc, name, False) is True:
                _unsupported(fn, "quant_config", qc, f"its {name} does not map to moekit")
        for name in ("w1_zp", "w2_zp"):
            if getattr(qc, name, None) is not None:
                _unsupported(fn, "quant_config", qc, f"its {name} does not map to moekit")
        q = {n: getattr(qc, n, None) for n in ("w1_scale", "w2_scale", "a1_scale", "a2_scale",
                                               "block_shape")}  # fmt: skip
        return _fp8_mapping(fn, q, bool(getattr(qc, "per_out_ch_quant", False)),
                            bool(getattr(qc, "per_act_token_quant", False)),
                            "quant_config.per_out_ch_quant")  # fmt: skip
    if not args["use_fp8_w8a8"]:
        for name in _QUANT_VALUES + ("per_channel_quant",):
            if name not in ("w1_zp", "w2_zp") and args[name] is not None and args[name] is not False:
                _unsupported(fn, name, "<given>" if name != "per_channel_quant" else True,
                             "without use_fp8_w8a8 (moekit maps vLLM's FP8 arguments)")  # fmt: skip
        return {}
    q = {n: args[n] for n in ("w1_scale", "w2_scale", "a1_scale", "a2_scale", "block_shape")}
    pc = bool(args["per_channel_quant"])
    return _fp8_mapping(fn, q, pc, pc, "per_channel_quant")


def _fp8_mapping(fn, q, per_out_ch, per_act_token, per_channel_name):
    """The scheme and scales of vLLM's FP8 description q (w1_scale, w2_scale, a1_scale,
    a2_scale, block_shape) with per-output-channel weight / per-token activation scales."""
    for name in ("w1_scale", "w2_scale"):
        if q[name] is None:
            raise ValueError(f"moekit.integrations.vllm.{fn}: FP8 weights need {name}")
    w1s, w2s = _f32(q["w1_scale"]), _f32(q["w2_scale"])
    E = w1s.shape[0] if w1s.dim() > 0 else 1
    static = {n: q[n] for n in ("a1_scale", "a2_scale") if q[n] is not None}
    if q["block_shape"] is not None:
        if list(q["block_shape"]) != [128, 128]:
            _unsupported(fn, "block_shape", list(q["block_shape"]),
                         "moekit's FP8 blocks are [128, 128]")  # fmt: skip
        scheme = "fp8_block128"
        why = "block quantization (activations per token group)"
    elif per_out_ch or per_act_token:
        if not (per_out_ch and per_act_token):
            _unsupported(fn, per_channel_name, True,
                         "moekit's fp8_per_channel pairs per-channel weight scales with "
                         "per-token activation scales (one without the other does not map)")  # fmt: skip
        scheme = "fp8_per_channel"
        why = "per-channel quantization (activations per token)"
        # vLLM's [E, 2N, 1] / [E, K, 1]: moekit's [E, 2N] / [E, K] (a view).
        w1s = w1s.reshape(w1s.shape[0], -1) if w1s.dim() == 3 else w1s
        w2s = w2s.reshape(w2s.shape[0], -1) if w2s.dim() == 3 else w2s
    else:
        scheme = "fp8_per_tensor"
        why = None
        for name, s in (("w1_scale", w1s), ("w2_scale", w2s)):
            if s.numel() != E:
                _unsupported(fn, name, f"<shape {list(s.shape)}>",
                             "per-tensor FP8 takes one scale per expert [E] (per-channel "
                             "scales go with per_channel_quant)")  # fmt: skip
        w1s = w1s if tuple(w1s.shape) == (E,) else w1s.reshape(E)
        w2s = w2s if tuple(w2s.shape) == (E,) else w2s.reshape(E)
        for name, s in static.items():
            if s.numel() != 1:
                _unsupported(fn, name, f"<shape {list(s.shape)}>",
                             "a static activation scale is one value (per-expert input "
                             "scales are merged by vLLM's loader, to their maximum)")  # fmt: skip
    if why is not None and static:
        _unsupported(fn, next(iter(static)), "<given>",
                     f"static activation scales go with per-tensor FP8 only, not {why}")
    kwargs = {"weight_quant": scheme, "w_gate_up_scale": w1s, "w_down_scale": w2s}
    if "a1_scale" in static:
        kwargs["a_gate_up_scale"] = _f32(static["a1_scale"]).reshape(1)
    if "a2_scale" in static:
        kwargs["a_down_scale"] = _f32(static["a2_scale"]).reshape(1)
    return kwargs


def _f32(t):
    return t if t.dtype == torch.float32 else t.float()


def _check_fp8_mlp(fn, w1, w2, activation, w1_bias, w2_bias):
    """What moekit's FP8 kernels run: float8_e4m3fn weights, silu, no biases."""
    for name, w in (("w1", w1), ("w2", w2)):
        if w.dtype != torch.float8_e4m3fn:
            _unsupported(fn, name, f"<{w.dtype}>",
                         "FP8 quantization needs torch.float8_e4m3fn weights")  # fmt: skip
    if activation != "silu":
        _unsupported(fn, "activation", activation,
                     "moekit's FP8 kernels run silu_and_mul only")  # fmt: skip
    for name, b in (("w1_bias", w1_bias), ("w2_bias", w2_bias)):
        if b is not None:
            _unsupported(fn, name, "<given>", "moekit's FP8 kernels run without biases")


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
