"""The raw binding's weight quantization (docs/python.md "Quantized weights"): the keyword
arguments every expert-MLP and layer op takes after its others, their defaults, and the C++
messages of what they refuse. CPU only (validation stops before any launch)."""

import re

import pytest

import moekit

raw = moekit.raw

PTR = 1 << 20  # a fake, well-aligned device address: only ever seen by validation
WS = 1 << 24  # the workspace at PTR + WS, WS bytes
QUANT = ("weight_quant", "w_gate_up_scale", "w_down_scale", "a_gate_up_scale", "a_down_scale")
# The positional activation fields (activation, gate_up_bias, down_bias) and engine fields
# (expert_map, apply_router_weight_on_input) at their defaults.
ACT = ("silu", None, None)
ENGINE = (None, False)


FP8_GEMM_KEYWORDS = ("masked", "alignment", "scales", "activation", "c_scale")


_slot = [0]


def t(dtype, *shape, ptr=None):
    """A tensor tuple at `ptr`, by default at a fresh fake address (slot k at (k + 1) * 2^40,
    away from the workspace): the only overlap is one a test makes on purpose."""
    if ptr is None:
        _slot[0] += 1
        ptr = _slot[0] << 40
    return (ptr, moekit.DTYPES[dtype], shape)


def experts(T=4, scheme="fp8_block128", act=ACT, engine=ENGINE, ids="i32", K=2, **kw):
    """indexed_expert_mlp's arguments: E = 8, H = 256, F = 128, K = 2, FP8 weights."""
    args = (t("bf16", T, 256), t("fp8e4m3", 8, 256, 256), t("fp8e4m3", 8, 256, 128),
            t("f32", T, K), t(ids, T, K), t("bf16", T, 256)) + act + engine  # fmt: skip
    q = dict(weight_quant=scheme, w_gate_up_scale=t("f32", 8, 2, 2),
             w_down_scale=t("f32", 8, 2, 1))  # fmt: skip
    q.update(kw)
    return args, q


def test_every_expert_op_takes_the_quantization_as_keywords():
    keywords = raw._ENTRY_KEYWORDS
    for op in ("moe_expert_mlp", "fused_moe_experts", "indexed_expert_mlp", "fused_moe",
               "shared_expert_mlp"):  # fmt: skip
        assert keywords[op] == QUANT, op
    assert keywords["fused_moe_shared_expert"] == QUANT + tuple("shared_" + k for k in QUANT)
    for op in ("fused_topk", "moe_grouped_gemm"):
        assert keywords[op] == (), op
    assert keywords["moe_grouped_gemm_fp8"] == FP8_GEMM_KEYWORDS


def test_fp8_workspace_query_and_defaults():
    args, q = experts()
    assert raw.indexed_expert_mlp_workspace_size(*args, **q) > 0
    # Without the keywords the weights are bf16 / f16 (quant none): e4m3 ones are refused.
    with pytest.raises(moekit.MoekitError, match="argument 'w_gate_up': expected bf16 / f16 "
                       "weights \\(e4m3 weights need a FP8 scheme in quant.scheme\\)"):
        raw.indexed_expert_mlp_workspace_size(*args)


@pytest.mark.skipif(raw.device_count() > 0, reason="a CUDA device is present (would launch)")
def test_valid_fp8_calls_stop_at_the_launch_target():
    """The valid arguments the rejections below break pass every C++ check: without a GPU
    the call stops at the launch target."""
    stop = "argument 'stream': expected a CUDA device to launch on"
    args, q = experts()
    with pytest.raises(moekit.MoekitError, match="moekit::indexed_expert_mlp: " + stop):
        raw.indexed_expert_mlp(*args, PTR + WS, WS, **q)
    base, shared_q = shared_layer()
    with pytest.raises(moekit.MoekitError, match="moekit::fused_moe_shared_expert: " + stop):
        raw.fused_moe_shared_expert(*base, PTR + WS, WS, **shared_q)


@pytest.mark.parametrize("kw,arg,expected", [
    (dict(weight_quant="fp8"), "weight_quant",
     "expected 'none', 'fp8_per_tensor', 'fp8_per_channel' or 'fp8_block128', got 'fp8'"),
    (dict(w_gate_up_scale=t("f32", 8, 2, 1)), "quant.w_gate_up_scale",
     "expected shape [8, 2, 2], got f32[8, 2, 1]"),
    (dict(w_down_scale=None), "quant.w_down_scale", "got an undefined tensor"),
    (dict(a_gate_up_scale=t("f32", 1)), "quant.a_gate_up_scale",
     "static activation scales go with fp8_per_tensor only"),
])  # fmt: skip
def test_bad_quantization_gives_the_cpp_message(kw, arg, expected):
    args, q = experts(**kw)
    with pytest.raises(moekit.MoekitError) as info:
        raw.indexed_expert_mlp(*args, PTR + WS, WS, **q)
    msg = str(info.value)
    assert msg.startswith(f"moekit::indexed_expert_mlp: argument '{arg}': "), msg
    assert expected in msg, msg


def test_fp8_past_the_decode_kernels_needs_sm90():
    """Past T = 128 FP8 weights run the FP8 GEMMs: sized on an sm_90 device, else refused."""
    args, q = experts(T=129)
    try:
        assert raw.indexed_expert_mlp_workspace_size(*args, **q) > 0
    except moekit.MoekitError as e:
        assert "fp8_sm90 needs an sm_90 device" in str(e), str(e)


def shared_layer():
    """fused_moe_shared_expert's arguments: bf16 routed experts (E = 8, H = 256, F = 128), a
    fp8_per_channel shared expert (S = 128); and the shared expert's quantization keywords."""
    base = (t("bf16", 4, 256), t("f32", 4, 8), None, t("bf16", 8, 256, 256),
            t("bf16", 8, 256, 128), t("fp8e4m3", 256, 256), t("fp8e4m3", 256, 128),
            t("bf16", 4, 256), 2, True, "softmax", 0, 0,
            1.0) + ACT + (None, None) + ENGINE  # fmt: skip
    q = dict(shared_weight_quant="fp8_per_channel", shared_w_gate_up_scale=t("f32", 256),
             shared_w_down_scale=t("f32", 256))  # fmt: skip
    return base, q


def test_shared_expert_quantization():
    base, q = shared_layer()
    n = raw.fused_moe_shared_expert_workspace_size(*base, **q)
    assert n > 0
    with pytest.raises(moekit.MoekitError, match="argument 'shared_quant.w_gate_up_scale': "
                       "expected shape \\[256\\], got f32\\[8, 256\\]"):  # fmt: skip
        raw.fused_moe_shared_expert(*base, PTR + WS, WS,
                                    **dict(q, shared_w_gate_up_scale=t("f32", 8, 256)))


@pytest.mark.parametrize("act,arg,got", [
    (("gelu", None, None), "activation", "got gelu_and_mul"),
    (("relu2", None, None), "activation", "got relu2"),
    (("silu", t("f32", 8, 256), None), "gate_up_bias", "got f32[8, 256]"),
    (("silu", None, t("bf16", 8, 256)), "down_bias", "got bf16[8, 256]"),
])  # fmt: skip
def test_fp8_refuses_another_activation_or_a_bias(act, arg, got):
    """The FP8 kernels run silu_and_mul without biases: the rest is refused, naming it."""
    args, q = experts(act=act)
    for call in (lambda: raw.indexed_expert_mlp_workspace_size(*args, **q),
                 lambda: raw.indexed_expert_mlp(*args, PTR + WS, WS, **q)):  # fmt: skip
        with pytest.raises(moekit.MoekitError) as info:
            call()
        msg = str(info.value)
        assert msg.startswith(f"moekit::indexed_expert_mlp: argument '{arg}': expected "), msg
        assert "with FP8 weights (scheme fp8_block128: the FP8 kernels run silu_and_mul " \
            "without biases)" in msg, msg
        assert got in msg, msg


def test_fp8_takes_the_engine_inputs():
    """An expert map with int64 ids, and the router weight on the input (top-1): valid."""
    args, q = experts(engine=(t("i32", 32), False), ids="i64")
    assert raw.indexed_expert_mlp_workspace_size(*args, **q) > 0
    args1, q1 = experts(engine=(None, True), K=1)
    assert raw.indexed_expert_mlp_workspace_size(*args1, **q1) > 0


# ---- moe_grouped_gemm_fp8's layout, scale mode, activation and e4m3 output (keywords)


def fp8_gemm(masked=True, scales="block", silu=False, c="bf16", N=128, **kw):
    """moe_grouped_gemm_fp8's arguments: E = 2, Kd = 256, masked max_m 64 or contiguous
    P = 100; the scales' shapes of `scales`."""
    rows = (2, 64) if masked else (100,)
    Bn = 2 * N if silu else N
    a_scale = {"block": t("f32", *rows, 2, ptr=2 * PTR), "per_channel": t("f32", *rows, ptr=2 * PTR),
               "per_tensor": t("f32", 1, ptr=2 * PTR)}[scales]  # fmt: skip
    b_scale = {"block": t("f32", 2, -(-Bn // 128), 2, ptr=3 * PTR),
               "per_channel": t("f32", 2, Bn, ptr=3 * PTR),
               "per_tensor": t("f32", 2, ptr=3 * PTR)}[scales]  # fmt: skip
    args = (t("fp8e4m3", *rows, 256, ptr=4 * PTR), a_scale, t("fp8e4m3", 2, Bn, 256, ptr=5 * PTR),
            b_scale, t("i32", 2, ptr=6 * PTR), t(c, *rows, N, ptr=7 * PTR))  # fmt: skip
    k = dict(masked=masked, scales=scales, activation="silu_and_mul" if silu else "none")
    if c == "fp8e4m3":
        k["c_scale"] = t("f32", 1, ptr=8 * PTR)
    k.update(kw)
    return args, k


@pytest.mark.skipif(raw.device_count() > 0, reason="a CUDA device is present (would launch)")
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("scales", ["block", "per_channel", "per_tensor"])
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("c", ["bf16", "fp8e4m3"])
def test_fp8_gemm_modes_pass_validation(masked, scales, silu, c):
    """Every layout, scale mode, activation and output passes the C++ checks: the call
    fails only at the launch (no GPU here)."""
    args, k = fp8_gemm(masked, scales, silu, c, alignment=1 if masked else 4)
    with pytest.raises(moekit.MoekitError, match="moekit::moe_grouped_gemm_fp8: argument "
                       "'stream': expected a CUDA device to launch on"):  # fmt: skip
        raw.moe_grouped_gemm_fp8(*args, **k)


@pytest.mark.parametrize("case", [
    (dict(scales="row"), "scales", "'block', 'per_channel' or 'per_tensor', got 'row'"),
    (dict(activation="silu"), "activation", "'none' or 'silu_and_mul', got 'silu'"),
    (dict(c_scale=None, c="fp8e4m3"), "c_scale", "got an undefined tensor"),
    (dict(c_scale=t("f32", 1, ptr=8 * PTR)), "c_scale", "undefined with a bf16 c"),
    (dict(silu=True, N=96), "b", "N a multiple of 64 (silu_and_mul with block scales)"),
    (dict(masked=False, scales="per_channel", a_scale=t("f32", 100, 2)), "a_scale",
     "shape [100], got f32[100, 2]"),
    (dict(scales="per_tensor", b_scale=t("f32", 2, 128)), "b_scale", "shape [2], got f32[2, 128]"),
], ids=["scales", "activation", "no c_scale", "c_scale with bf16", "silu block N",
        "per-channel a_scale", "per-tensor b_scale"])  # fmt: skip
def test_fp8_gemm_keywords_are_checked(case):
    kw, arg, text = case
    kw = dict(kw)
    shape_kw = {k: kw.pop(k) for k in ("masked", "silu", "c", "N") if k in kw}
    if kw.get("scales") in ("block", "per_channel", "per_tensor"):  # else: the keyword only
        shape_kw["scales"] = kw.pop("scales")
    args, k = fp8_gemm(**shape_kw)
    args = list(args)
    for i, name in ((1, "a_scale"), (3, "b_scale")):
        if name in kw:
            args[i] = kw.pop(name)
    k.update(kw)
    if "c_scale" in kw and kw["c_scale"] is None:
        k.pop("c_scale")
    with pytest.raises(moekit.MoekitError, match=f"argument '{arg}': expected .*{re.escape(text)}"):
        raw.moe_grouped_gemm_fp8(*args, **k)
