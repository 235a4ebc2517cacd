"""moekit.integrations.vllm: vLLM's fused_topk / fused_experts on moekit's ops.

On the CPU (torch, no GPU): the signatures are vLLM's (names, order, defaults); each
argument maps to the right moekit call (the ops replaced by spies that check moekit's
contract and compute it with the f32 references), every NotImplementedError names its
argument, and, with the device checks stubbed, the real C++ op accepts what the adapter
passes. On an sm_90 GPU: the adapter against a plain torch implementation of vLLM's
semantics on random shapes (expert_map, apply_router_weight_on_input, int64 ids,
inplace), and with FP8 weights (each of vLLM's FP8 schemes, static activation scales)
against a torch implementation of vLLM's FP8 semantics (dequantized weights, activations
quantized as vLLM's fused_experts quantizes them). Without torch only the import test runs
(the module says it needs torch).
"""

import os
import subprocess
import sys
import types

import pytest

import moekit
from mk_support import SELFCHECK, requires_gpu, requires_torch, torch_skip_reason
from mk_support import stubbed_devices  # noqa: F401  (a fixture)

if torch_skip_reason() is None:
    import torch

    import ref_ops
    import torch_reference as ref
    from moekit.integrations import vllm as mkv

    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    i32, i64 = torch.int32, torch.int64


def test_import_without_torch_says_why():
    """moekit.integrations imports anywhere; its vllm module needs the torch layer and
    says so (here forced with MOEKIT_NO_TORCH=1, as CI without torch has it)."""
    env = dict(os.environ, MOEKIT_NO_TORCH="1", PYTHONPATH=os.pathsep.join(sys.path))
    code = "import moekit.integrations\nimport moekit.integrations.vllm"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode != 0
    assert "ImportError: moekit.integrations.vllm needs PyTorch" in run.stderr, run.stderr


# ---------------------------------------------------------------- vLLM's semantics in torch

_EMPTY = object()  # no default


def vllm_fused_topk(gating_output, topk, renormalize, scoring_func="softmax"):
    """vLLM's fused_topk: scores in f32 over E, the topk largest (descending), optionally
    renormalized; int32 ids; token_expert_indices[t, k] = k * T + t."""
    g = gating_output.float()
    score = torch.softmax(g, dim=-1) if scoring_func == "softmax" else torch.sigmoid(g)
    w, ids = torch.topk(score, topk, dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    T = g.shape[0]
    tei = torch.tensor([[k * T + t for k in range(topk)] for t in range(T)], dtype=torch.int32)
    return w, ids.int(), tei.reshape(T, topk).to(g.device)


def vllm_activation(h, activation):
    """vLLM's fused_experts activations of h = x . w1^T (+ w1_bias)."""
    if activation == "relu2_no_mul":
        return torch.square(torch.relu(h))
    if activation == "swigluoai":  # vLLM's swigluoai_and_mul: gate x[..., ::2], up x[..., 1::2]
        gate, up = h[..., ::2].clamp(max=7.0), h[..., 1::2].clamp(min=-7.0, max=7.0)
        return (up + 1) * (gate * torch.sigmoid(gate * 1.702))
    N = h.shape[-1] // 2
    if activation == "gelu":
        return torch.nn.functional.gelu(h[:, :N]) * h[:, N:]
    return ref.silu(h[:, :N]) * h[:, N:]


def vllm_fused_experts(x, w1, w2, topk_weights, topk_ids, apply_router_weight_on_input=False,
                       expert_map=None, activation="silu", w1_bias=None,
                       w2_bias=None):  # fmt: skip
    """vLLM's fused_experts in f32: per route, h = x . w1[e]^T + w1_bias[e], with x first
    scaled as vLLM's prepare step does when apply_router_weight_on_input (top-1:
    x * w.to(x.dtype)), the activation rounded to x's dtype, . w2[e]^T + w2_bias[e] (times
    the weight otherwise), summed over the routes; a global id whose expert_map entry is -1
    adds nothing."""
    T, H = x.shape
    ids = topk_ids.long()
    local = expert_map.long()[ids] if expert_map is not None else ids
    if apply_router_weight_on_input:
        x = x * topk_weights.to(x.dtype)
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    for e in range(w1.shape[0]):
        t, k = torch.nonzero(local == e, as_tuple=True)
        if t.numel() == 0:
            continue
        w = topk_weights[t, k].float().unsqueeze(1)
        h = x[t].float() @ w1[e].float().t()
        if w1_bias is not None:
            h = h + w1_bias[e].float()
        act = vllm_activation(h, activation).to(x.dtype).float()
        y = act @ w2[e].float().t()
        if w2_bias is not None:
            y = y + w2_bias[e].float()
        if not apply_router_weight_on_input:
            y = y * w
        out.index_add_(0, t, y)
    return out.to(x.dtype)


def _problem(T, E, H, N, K, dtype=None, device="cpu", global_experts=None, seed=0):
    """Random inputs: x [T, H], w1 [E, 2N, H], w2 [E, H, N], weights [T, K] f32, distinct
    ids per token in [0, global_experts or E) (int32), and with global_experts an
    expert_map placing E of them on this rank (the others -1)."""
    gen = torch.Generator().manual_seed(seed)
    dtype = dtype or bf16

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    G = global_experts or E
    x = rnd(T, H)
    w1, w2 = rnd(E, 2 * N, H, scale=H**-0.5), rnd(E, H, N, scale=N**-0.5)
    ids = torch.stack([torch.randperm(G, generator=gen)[:K] for _ in range(T)]) if T else (
        torch.zeros(0, K, dtype=i64))
    weights = torch.rand(T, K, generator=gen).to(device)
    expert_map = None
    if global_experts:
        expert_map = torch.full((G,), -1, dtype=i32)
        expert_map[torch.randperm(G, generator=gen)[:E]] = torch.arange(E, dtype=i32)
        expert_map = expert_map.to(device)
    return x, w1, w2, weights, ids.to(i32).to(device), expert_map


# ---------------------------------------------------------------- FP8 (vLLM's and moekit's)

FP8_SCHEMES = ("per_tensor", "per_channel", "block")
FP8_LIMIT = 3e-2  # SPEC.md's fp8 limit: activations quantized to e4m3


def quant_act(a, groups, static=None):
    """a [R, C] quantized to e4m3 and back, as vLLM's fused_experts quantizes its FP8
    inputs (and moekit's FP8 GEMM paths, docs/moe.md "Activations"): the scale is the
    static one, else max(amax, 1e-10) / 448 over the tensor ("tensor"), each row
    ("token") or each row's 128-column groups ("group"); q = e4m3(x / s), saturated."""
    a = a.float()
    if static is not None:
        s = static.float().reshape(1, 1)
        g = a.reshape(1, -1)
    else:
        g = {"tensor": lambda: a.reshape(1, -1), "token": lambda: a,
             "group": lambda: a.reshape(-1, 128)}[groups]()  # fmt: skip
        m = g.abs().amax(dim=1, keepdim=True).clamp(min=1e-10)
        # A tensor divisor: on CUDA, `m / 448.0` runs as m * fl(1/448), one ulp off m / 448
        # (amax 3.0625: 0.006835938 for 0.0068359375), and e4m3 ties then round the other way.
        s = m / torch.full_like(m, 448.0)
    q = (g / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
    return q.reshape(a.shape)


def fp8_weights(E, rows, cols, scheme, gen, device="cpu"):
    """e4m3 weights [E, rows, cols] (codes ~ N(0, 48^2)), their scales in vLLM's layouts
    (per tensor [E]; per channel [E, rows, 1]; block [E, ceil(rows/128), ceil(cols/128)])
    around 1 / (48 sqrt(cols)), and the dequantized f32 weights."""
    w = (torch.randn(E, rows, cols, generator=gen) * 48).clamp(-448, 448).to(torch.float8_e4m3fn)
    shape = {"per_tensor": (E,), "per_channel": (E, rows, 1),
             "block": (E, -(-rows // 128), -(-cols // 128))}[scheme]  # fmt: skip
    s = (torch.rand(shape, generator=gen) + 0.5) / (48 * cols**0.5)
    if scheme == "per_tensor":
        full = s.view(E, 1, 1)
    elif scheme == "per_channel":
        full = s
    else:
        full = s.repeat_interleave(128, 1)[:, :rows].repeat_interleave(128, 2)[:, :, :cols]
    return w.to(device), s.to(device), (w.float() * full).to(device)


def vllm_dequant(w, s, scheme):
    """vLLM's FP8 weight in f32 from its layouts (fp8_weights' scales)."""
    E, rows, cols = w.shape
    if scheme == "per_tensor":
        return w.float() * s.float().view(E, 1, 1)
    if scheme == "per_channel":
        return w.float() * s.float().view(E, rows, 1)
    full = s.float().repeat_interleave(128, 1)[:, :rows].repeat_interleave(128, 2)[:, :, :cols]
    return w.float() * full


def vllm_fused_experts_fp8(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, scheme,
                           a1_scale=None, a2_scale=None, expert_map=None,
                           apply_router_weight_on_input=False):  # fmt: skip
    """vLLM's fused_experts with use_fp8_w8a8 in f32: x (scaled first when
    apply_router_weight_on_input) quantized over all T rows (per tensor, a1_scale when
    given), per token (per_channel_quant) or per token in 128-column groups (block_shape
    [128, 128]); each local route's silu_and_mul activation rounded to x's dtype, then all
    of them quantized likewise (a2_scale); both GEMMs on the dequantized weights; the
    routes weighted (unless on input) and summed."""
    groups = {"per_tensor": "tensor", "per_channel": "token", "block": "group"}[scheme]
    d1, d2 = vllm_dequant(w1, w1_scale, scheme), vllm_dequant(w2, w2_scale, scheme)
    T, H = x.shape
    N = w1.shape[1] // 2
    ids = topk_ids.long()
    local = expert_map.long()[ids] if expert_map is not None else ids
    if apply_router_weight_on_input:
        x = x * topk_weights.to(x.dtype)
    xq = quant_act(x, groups, a1_scale)
    t, k = torch.nonzero(local >= 0, as_tuple=True)
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    if t.numel() == 0:
        return out.to(x.dtype)
    e = local[t, k]
    h = torch.bmm(d1[e], xq[t].unsqueeze(2)).squeeze(2)
    act = (ref.silu(h[:, :N]) * h[:, N:]).to(x.dtype)
    aq = quant_act(act, groups, a2_scale)
    y = torch.bmm(d2[e], aq.unsqueeze(2)).squeeze(2)
    if not apply_router_weight_on_input:
        y = y * topk_weights[t, k].float().unsqueeze(1)
    out.index_add_(0, t, y)
    return out.to(x.dtype)


def moekit_fp8_contract(hidden_states, w_gate_up, w_down, topk_weights, topk_ids, expert_map,
                        apply_router_weight_on_input, weight_quant, w_gate_up_scale,
                        w_down_scale, a_gate_up_scale, a_down_scale):  # fmt: skip
    """moekit's fused_moe_experts with FP8 weights (docs/moe.md "Quantized weights"), from
    moekit's layouts (per tensor [E], per channel [E, 2F] / [E, H], blocks): checks them
    and computes the op's result (its FP8 GEMM path quantizes both GEMM inputs)."""
    E, F2, H = w_gate_up.shape
    assert w_gate_up.dtype == w_down.dtype == torch.float8_e4m3fn
    for s in (w_gate_up_scale, w_down_scale, a_gate_up_scale, a_down_scale):
        assert s is None or (s.dtype == f32 and s.is_contiguous())
    shapes = {"fp8_per_tensor": ((E,), (E,)), "fp8_per_channel": ((E, F2), (E, H)),
              "fp8_block128": ((E, -(-F2 // 128), -(-H // 128)),
                               (E, -(-H // 128), -(-(F2 // 2) // 128)))}[weight_quant]  # fmt: skip
    assert (tuple(w_gate_up_scale.shape), tuple(w_down_scale.shape)) == shapes
    statics = (a_gate_up_scale, a_down_scale)
    assert weight_quant == "fp8_per_tensor" or statics == (None, None)
    assert all(s is None or tuple(s.shape) == (1,) for s in statics)
    scheme = {"fp8_per_tensor": "per_tensor", "fp8_per_channel": "per_channel",
              "fp8_block128": "block"}[weight_quant]  # fmt: skip
    # moekit's per-channel scales are vLLM's without the trailing 1: the same f32 math.
    s1 = w_gate_up_scale.view(E, F2, 1) if scheme == "per_channel" else w_gate_up_scale
    s2 = w_down_scale.view(E, H, 1) if scheme == "per_channel" else w_down_scale
    x, w, ids = ref.engine_inputs(hidden_states, topk_weights, topk_ids, expert_map,
                                  apply_router_weight_on_input, E)  # fmt: skip
    return vllm_fused_experts_fp8(x, w_gate_up, w_down, s1, s2, w, ids, scheme, a_gate_up_scale,
                                  a_down_scale)  # fmt: skip


# ---------------------------------------------------------------- spies (moekit's contract)


def _contract_experts(calls):
    def fused_moe_experts(hidden_states, w_gate_up, w_down, topk_weights, topk_ids,
                          activation="silu", gate_up_bias=None, down_bias=None,
                          expert_map=None, apply_router_weight_on_input=False,
                          weight_quant="none", w_gate_up_scale=None, w_down_scale=None,
                          a_gate_up_scale=None, a_down_scale=None, *,
                          out=None):  # fmt: skip
        quant = dict(weight_quant=weight_quant, w_gate_up_scale=w_gate_up_scale,
                     w_down_scale=w_down_scale, a_gate_up_scale=a_gate_up_scale,
                     a_down_scale=a_down_scale)  # fmt: skip
        calls.append(dict(op="fused_moe_experts", x=hidden_states, w1=w_gate_up, w2=w_down,
                          w=topk_weights, ids=topk_ids, map=expert_map,
                          on_input=apply_router_weight_on_input, out=out, activation=activation,
                          b1=gate_up_bias, b2=down_bias, **quant))  # fmt: skip
        # What moekit's C++ op checks: its dtypes and layouts.
        assert topk_ids.dtype in (i32, i64) and topk_weights.dtype == f32
        assert topk_ids.shape == topk_weights.shape == (hidden_states.shape[0], topk_ids.shape[1])
        assert expert_map is None or (expert_map.dtype == i32 and expert_map.dim() == 1)
        assert not apply_router_weight_on_input or topk_ids.shape[1] == 1
        for t in (hidden_states, w_gate_up, w_down, topk_weights, topk_ids, expert_map):
            assert t is None or t.is_contiguous()
        assert activation in ("silu", "gelu", "gelu_tanh", "relu2", "swigluoai")
        if weight_quant != "none":
            assert activation == "silu" and gate_up_bias is None and down_bias is None
            y = moekit_fp8_contract(hidden_states, w_gate_up, w_down, topk_weights, topk_ids,
                                    expert_map, apply_router_weight_on_input, **quant)  # fmt: skip
            return y if out is None else out.copy_(y)
        assert all(v is None for k, v in quant.items() if k != "weight_quant")
        y = ref.fused_moe_experts(hidden_states, w_gate_up, w_down, topk_weights, topk_ids,
                                  activation, gate_up_bias, down_bias, expert_map,
                                  apply_router_weight_on_input)  # fmt: skip
        return y if out is None else out.copy_(y)

    return fused_moe_experts


def _contract_topk(calls):
    def fused_topk(gating_output, top_k, renormalize=False, scoring_func="softmax", *rest,
                   out=None):  # fmt: skip
        calls.append(dict(op="fused_topk", args=(gating_output, top_k, renormalize,
                                                 scoring_func) + rest, out=out))  # fmt: skip
        return ref_ops.fused_topk(gating_output, top_k, renormalize, scoring_func, *rest)

    return fused_topk


@pytest.fixture
def spy(monkeypatch):
    """moekit.ops.fused_moe_experts / fused_topk replaced by spies: they record each call,
    check moekit's contract and compute it with the f32 references."""
    calls = []
    monkeypatch.setattr(moekit.ops, "fused_moe_experts", _contract_experts(calls))
    monkeypatch.setattr(moekit.ops, "fused_topk", _contract_topk(calls))
    return calls


# ---------------------------------------------------------------- signatures

_FUSED_EXPERTS_PARAMS = [  # vLLM's fused_experts, in order
    ("hidden_states", _EMPTY), ("w1", _EMPTY), ("w2", _EMPTY), ("topk_weights", _EMPTY),
    ("topk_ids", _EMPTY), ("inplace", False), ("activation", "silu"),
    ("apply_router_weight_on_input", False), ("use_fp8_w8a8", False), ("use_int8_w8a8", False),
    ("use_int8_w8a16", False), ("use_int4_w4a16", False), ("per_channel_quant", False),
    ("global_num_experts", -1), ("expert_map", None), ("w1_scale", None), ("w2_scale", None),
    ("w1_zp", None), ("w2_zp", None), ("a1_scale", None), ("a2_scale", None),
    ("block_shape", None), ("allow_deep_gemm", False),
]  # fmt: skip
_FUSED_EXPERTS_KEYWORDS = [  # names later vLLM versions added
    ("use_mxfp4_w4a4", False), ("allow_cutlass_block_scaled_grouped_gemm", False),
    ("w1_bias", None), ("w2_bias", None), ("quant_config", None),
]  # fmt: skip
_FUSED_TOPK_PARAMS = [
    ("hidden_states", _EMPTY), ("gating_output", _EMPTY), ("topk", _EMPTY),
    ("renormalize", _EMPTY), ("indices_type", None), ("scoring_func", "softmax"),
]  # fmt: skip


def _params(fn, kind):
    import inspect

    empty = inspect.Parameter.empty
    return [(p.name, _EMPTY if p.default is empty else p.default)
            for p in inspect.signature(fn).parameters.values() if p.kind == kind]  # fmt: skip


@requires_torch
def test_signatures_are_vllms():
    import inspect

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    keyword = inspect.Parameter.KEYWORD_ONLY
    assert _params(mkv.fused_experts, positional) == _FUSED_EXPERTS_PARAMS
    assert _params(mkv.fused_experts, keyword) == _FUSED_EXPERTS_KEYWORDS
    assert _params(mkv.fused_topk, positional) == _FUSED_TOPK_PARAMS
    assert _params(mkv.fused_topk, keyword) == []
    assert mkv.__all__ == ["fused_topk", "fused_experts"]


# ---------------------------------------------------------------- the mapping (CPU)

T_, E_, H_, N_, K_ = 7, 4, 32, 16, 2


def _check_result(out, x, w1, w2, w, ids, **semantics):
    ref.assert_close(out, vllm_fused_experts(x, w1, w2, w, ids, **semantics),
                     ref.ACCURACY[x.dtype], "fused_experts")  # fmt: skip


@requires_torch
def test_fused_experts_passes_its_tensors_unchanged(spy):
    x, w1, w2, w, ids, _ = _problem(T_, E_, H_, N_, K_)
    out = mkv.fused_experts(x, w1, w2, w, ids)
    assert len(spy) == 1
    c = spy[0]
    assert c["x"] is x and c["w1"] is w1 and c["w2"] is w2 and c["w"] is w and c["ids"] is ids
    assert c["map"] is None and c["on_input"] is False
    assert c["out"] is None and out is not x
    _check_result(out, x, w1, w2, w, ids)
    # The same call by keywords, with the arguments that change nothing here given.
    out2 = mkv.fused_experts(hidden_states=x, w1=w1, w2=w2, topk_weights=w, topk_ids=ids,
                             inplace=False, activation="silu", global_num_experts=E_,
                             allow_deep_gemm=True, allow_cutlass_block_scaled_grouped_gemm=True,
                             quant_config=types.SimpleNamespace(
                                 quant_dtype=None, use_fp8_w8a8=False, w1_scale=None,
                                 w1_bias=None))  # fmt: skip
    assert len(spy) == 2 and spy[1]["x"] is x and spy[1]["ids"] is ids
    assert torch.equal(out, out2)


@requires_torch
def test_int64_ids_pass_unchanged(spy):
    x, w1, w2, w, ids, _ = _problem(T_, E_, H_, N_, K_, seed=1)
    ids64 = ids.long()
    out = mkv.fused_experts(x, w1, w2, w, ids64)
    assert spy[0]["ids"] is ids64  # moekit's op reads int64 ids: no cast, no copy
    _check_result(out, x, w1, w2, w, ids)


@requires_torch
def test_non_f32_weights_cast(spy):
    x, w1, w2, w, ids, _ = _problem(T_, E_, H_, N_, K_, seed=2)
    out = mkv.fused_experts(x, w1, w2, w.to(bf16), ids)
    got = spy[0]["w"]
    assert got.dtype == f32 and torch.equal(got, w.to(bf16).float())
    _check_result(out, x, w1, w2, w.to(bf16), ids)


@requires_torch
@pytest.mark.parametrize("ids_dtype", ["int32", "int64"])
@pytest.mark.parametrize("map_dtype", ["int32", "int64"])
def test_expert_map_goes_to_the_op(spy, ids_dtype, map_dtype):
    G = 10
    x, w1, w2, w, ids, emap = _problem(T_, E_, H_, N_, K_, global_experts=G, seed=3)
    emap = emap.to(getattr(torch, map_dtype))
    given = ids.to(getattr(torch, ids_dtype))
    out = mkv.fused_experts(x, w1, w2, w, given, global_num_experts=G,
                            expert_map=emap)  # fmt: skip
    c = spy[0]
    assert c["ids"] is given and c["w"] is w and c["x"] is x  # the global ids, no gather
    if map_dtype == "int32":
        assert c["map"] is emap
    else:  # vLLM's maps are int32; an int64 one is cast once (E_global ints)
        assert c["map"].dtype == i32 and torch.equal(c["map"], emap.int())
    local = emap.long()[ids.long()]
    assert (local == -1).any() and (local >= 0).any()  # both kinds of route in the case
    _check_result(out, x, w1, w2, w, ids, expert_map=emap)
    # global_num_experts=-1 takes the map's length.
    mkv.fused_experts(x, w1, w2, w, ids, expert_map=emap)
    assert spy[1]["ids"] is ids and torch.equal(spy[1]["map"], emap.int())


@requires_torch
def test_apply_router_weight_on_input_goes_to_the_op(spy):
    x, w1, w2, w, ids, _ = _problem(T_, E_, H_, N_, 1, seed=4)
    out = mkv.fused_experts(x, w1, w2, w, ids, apply_router_weight_on_input=True)
    c = spy[0]
    assert c["x"] is x and c["w"] is w and c["ids"] is ids and c["on_input"] is True
    assert c["out"] is None
    _check_result(out, x, w1, w2, w, ids, apply_router_weight_on_input=True)
    # moekit's scaling is vLLM's x * w.to(x.dtype), bit for bit.
    xs, ones, _ = ref.engine_inputs(x, w, ids, None, True, E_)
    assert torch.equal(xs, x * w.to(x.dtype)) and torch.equal(ones, torch.ones_like(w))


@requires_torch
def test_inplace_writes_hidden_states(spy):
    x, w1, w2, w, ids, emap = _problem(T_, E_, H_, N_, 1, global_experts=6, seed=5)
    for kwargs in ({}, {"apply_router_weight_on_input": True, "expert_map": emap}):
        h = x.clone()
        routes = ids if kwargs else ids % E_  # local ids without the map
        want = vllm_fused_experts(x, w1, w2, w, routes, **kwargs)
        got = mkv.fused_experts(h, w1, w2, w, routes, inplace=True, **kwargs)
        c = spy[-1]
        assert got is h and c["out"] is h and c["x"] is h  # moekit's op reads, then writes h
        ref.assert_close(h, want, ref.ACCURACY[bf16], f"inplace {kwargs}")


_NOT_IMPLEMENTED = [
    ({"activation": "silu_no_mul"}, "activation='silu_no_mul'"),
    ({"activation": "gelu_no_mul"}, "activation='gelu_no_mul'"),
    ({"activation": "gelu_tanh"}, "activation='gelu_tanh'"),
    ({"use_int8_w8a8": True}, "use_int8_w8a8=True"),
    ({"use_int8_w8a16": True}, "use_int8_w8a16=True"),
    ({"use_int4_w4a16": True}, "use_int4_w4a16=True"),
    ({"use_mxfp4_w4a4": True}, "use_mxfp4_w4a4=True"),
    ({"per_channel_quant": True}, "per_channel_quant=True"),
    ({"block_shape": [128, 128]}, "block_shape="),
    ({"quant_config": types.SimpleNamespace(quant_dtype="fp8")}, "quant_config="),
    ({"quant_config": object()}, "quant_config="),
    ({"quant_config": types.SimpleNamespace(quant_dtype=None, w2_scale="T")}, "quant_config="),
    ({"quant_config": types.SimpleNamespace(quant_dtype=None, use_int4_w4a16=True)},
     "quant_config="),
] + [({name: "T"}, f"{name}=") for name in ("w1_scale", "w2_scale", "w1_zp", "w2_zp",
                                             "a1_scale", "a2_scale")]  # fmt: skip


@requires_torch
@pytest.mark.parametrize("case", _NOT_IMPLEMENTED, ids=[c[1] for c in _NOT_IMPLEMENTED])
def test_unsupported_arguments_raise_naming_them(spy, case):
    kwargs, name = case
    x, w1, w2, w, ids, _ = _problem(T_, E_, H_, N_, K_)
    if any(isinstance(v, str) and v == "T" for v in kwargs.values()):
        kwargs = {k: torch.ones(2) for k in kwargs}
    with pytest.raises(NotImplementedError, match=r"moekit.integrations.vllm.fused_experts: "
                                                  + name.replace("[", r"\[")):  # fmt: skip
        mkv.fused_experts(x, w1, w2, w, ids, **kwargs)
    assert spy == []


@requires_torch
@pytest.mark.parametrize("activation,moekit_name", [
    ("silu", "silu"), ("gelu", "gelu"), ("swigluoai", "swigluoai"), ("relu2_no_mul", "relu2")])
@pytest.mark.parametrize("biases", [False, True])
def test_activations_and_biases_map_to_moekit(spy, activation, moekit_name, biases):
    """vLLM's activation names map to moekit's; w1_bias / w2_bias go through unchanged
    (f32 or the weights' dtype), with the result of vLLM's semantics."""
    x, w1, w2, w, ids, _ = _problem(T_, E_, H_, N_, K_, seed=6)
    if activation == "relu2_no_mul":
        w1 = w1[:, :N_].contiguous()  # [E, N, K]: not gated
    gen = torch.Generator().manual_seed(7)
    b1 = torch.randn(E_, w1.shape[1], generator=gen) if biases else None
    b2 = torch.randn(E_, H_, generator=gen).to(bf16) if biases else None
    out = mkv.fused_experts(x, w1, w2, w, ids, activation=activation, w1_bias=b1, w2_bias=b2)
    c = spy[0]
    assert c["activation"] == moekit_name and c["b1"] is b1 and c["b2"] is b2
    ref.assert_close(out, vllm_fused_experts(x, w1, w2, w, ids, activation=activation,
                                             w1_bias=b1, w2_bias=b2),
                     ref.ACCURACY[bf16], activation)  # fmt: skip


@requires_torch
def test_biases_of_an_unquantized_quant_config_are_used(spy):
    x, w1, w2, w, ids, _ = _problem(T_, E_, H_, N_, K_, seed=8)
    b1, b2 = torch.randn(E_, 2 * N_), torch.randn(E_, H_)
    qc = types.SimpleNamespace(quant_dtype=None, w1_bias=b1, w2_bias=b2)
    mkv.fused_experts(x, w1, w2, w, ids, quant_config=qc)
    assert spy[0]["b1"] is b1 and spy[0]["b2"] is b2
    mine = torch.randn(E_, H_)  # the argument wins over the config's
    mkv.fused_experts(x, w1, w2, w, ids, w2_bias=mine, quant_config=qc)
    assert spy[1]["b1"] is b1 and spy[1]["b2"] is mine


@requires_torch
def test_w1_bias_with_router_weight_on_input_is_refused(spy):
    x, w1, w2, w, ids, _ = _problem(T_, E_, H_, N_, 1, seed=9)
    with pytest.raises(NotImplementedError, match=r"w1_bias='<given>' is not supported: not "
                                                  r"with apply_router_weight_on_input"):
        mkv.fused_experts(x, w1, w2, w, ids, apply_router_weight_on_input=True,
                          w1_bias=torch.zeros(E_, 2 * N_))  # fmt: skip
    assert spy == []
    # w2_bias alone is vLLM's too: the second projection takes no weight there.
    out = mkv.fused_experts(x, w1, w2, w, ids, apply_router_weight_on_input=True,
                            w2_bias=torch.ones(E_, H_))  # fmt: skip
    ref.assert_close(out, vllm_fused_experts(x, w1, w2, w, ids, apply_router_weight_on_input=True,
                                             w2_bias=torch.ones(E_, H_)),
                     ref.ACCURACY[bf16], "w2_bias on input")  # fmt: skip


@requires_torch
def test_apply_router_weight_on_input_needs_top1(spy):
    x, w1, w2, w, ids, _ = _problem(T_, E_, H_, N_, 2)
    msg = r"apply_router_weight_on_input=True is not supported: only with top-1 routing"
    with pytest.raises(NotImplementedError, match=msg):
        mkv.fused_experts(x, w1, w2, w, ids, apply_router_weight_on_input=True)
    assert spy == []


@requires_torch
def test_inconsistent_arguments_raise(spy):
    x, w1, w2, w, ids, emap = _problem(T_, E_, H_, N_, K_, global_experts=8)
    with pytest.raises(ValueError, match=r"global_num_experts=8 without an expert_map, but w1 "
                                         r"holds 4 experts"):  # fmt: skip
        mkv.fused_experts(x, w1, w2, w, ids, global_num_experts=8)
    with pytest.raises(ValueError, match=r"expert_map must be \[global_num_experts\] "
                                         r"\(global_num_experts=9\), got \[8\]"):  # fmt: skip
        mkv.fused_experts(x, w1, w2, w, ids, global_num_experts=9, expert_map=emap)
    with pytest.raises(ValueError, match=r"topk shape mismatch"):
        mkv.fused_experts(x, w1, w2, w[:, :1], ids)
    assert spy == []


# ---------------------------------------------------------------- FP8 mapping (CPU)

FP8_T, FP8_E, FP8_H, FP8_N, FP8_K = 9, 4, 256, 128, 2


def _fp8_problem(scheme, T=FP8_T, E=FP8_E, H=FP8_H, N=FP8_N, K=FP8_K, dtype=None, device="cpu",
                 global_experts=None, seed=0):  # fmt: skip
    """_problem's inputs with FP8 weights: (x, w1, w2, w1_scale, w2_scale, weights, ids,
    expert_map), the scales in vLLM's layouts."""
    x, _, _, w, ids, emap = _problem(T, E, H, N, K, dtype=dtype, device=device,
                                     global_experts=global_experts, seed=seed)  # fmt: skip
    gen = torch.Generator().manual_seed(seed + 100)
    w1, s1, _ = fp8_weights(E, 2 * N, H, scheme, gen, device)
    w2, s2, _ = fp8_weights(E, H, N, scheme, gen, device)
    return x, w1, w2, s1, s2, w, ids, emap


def _static_scales(device="cpu"):
    """Static a1 / a2 scales near max|x| / 448 of the test's inputs (some saturate)."""
    return (torch.tensor([4.5 / 448], device=device), torch.tensor([0.5 / 448], device=device))


_FP8_MAPPING = [  # (scheme, vLLM's arguments beyond the scales, moekit's weight_quant)
    ("per_tensor", {}, "fp8_per_tensor"),
    ("per_tensor", {"static": "a1"}, "fp8_per_tensor"),
    ("per_tensor", {"static": "a1+a2"}, "fp8_per_tensor"),
    ("per_channel", {"per_channel_quant": True}, "fp8_per_channel"),
    ("block", {"block_shape": [128, 128]}, "fp8_block128"),
]


def _fp8_call_args(scheme, opts, s1, s2, device="cpu", config=False):
    """fused_experts' keywords for one FP8 mapping case: the legacy arguments, or (config)
    an FP8 quant_config as vLLM's fp8_w8a8_moe_quant_config builds it."""
    opts = dict(opts)
    static = opts.pop("static", "")
    a1, a2 = _static_scales(device)
    q = {"w1_scale": s1, "w2_scale": s2, "a1_scale": a1 if "a1" in static else None,
         "a2_scale": a2 if "a2" in static else None,
         "block_shape": opts.get("block_shape")}  # fmt: skip
    if not config:
        kw = {"use_fp8_w8a8": True, **opts}
        kw.update({k: v for k, v in q.items() if v is not None})
        return kw, q
    pc = bool(opts.get("per_channel_quant"))
    qc = types.SimpleNamespace(quant_dtype=torch.float8_e4m3fn, per_act_token_quant=pc,
                               per_out_ch_quant=pc, w1_zp=None, w2_zp=None, w1_bias=None,
                               w2_bias=None, **q)  # fmt: skip
    return {"quant_config": qc}, q


@requires_torch
@pytest.mark.parametrize("config", [False, True], ids=["arguments", "quant_config"])
@pytest.mark.parametrize("case", _FP8_MAPPING, ids=[f"{c[0]}-{c[1].get('static', '')}"
                                                    for c in _FP8_MAPPING])  # fmt: skip
def test_fp8_maps_to_weight_quant(spy, case, config):
    """vLLM's FP8 arguments (or an FP8 quant_config) become moekit's weight_quant with the
    scales as they are (per channel: [E, 2N, 1] viewed as [E, 2N], no copy), and the result
    is vLLM's FP8 semantics (at the fp8 limit)."""
    scheme, opts, weight_quant = case
    x, w1, w2, s1, s2, w, ids, _ = _fp8_problem(scheme, seed=11)
    kw, q = _fp8_call_args(scheme, opts, s1, s2, config=config)
    out = mkv.fused_experts(x, w1, w2, w, ids, **kw)
    c = spy[0]
    assert c["weight_quant"] == weight_quant and c["w1"] is w1 and c["w2"] is w2
    if scheme == "per_channel":
        assert c["w_gate_up_scale"].shape == (FP8_E, 2 * FP8_N)
        assert c["w_gate_up_scale"].data_ptr() == s1.data_ptr()  # a view
        assert c["w_down_scale"].shape == (FP8_E, FP8_H)
        assert c["w_down_scale"].data_ptr() == s2.data_ptr()
    else:
        assert c["w_gate_up_scale"] is s1 and c["w_down_scale"] is s2
    for mine, theirs in (("a_gate_up_scale", "a1_scale"), ("a_down_scale", "a2_scale")):
        if q[theirs] is None:
            assert c[mine] is None
        else:
            assert c[mine].shape == (1,) and c[mine].data_ptr() == q[theirs].data_ptr()
    want = vllm_fused_experts_fp8(x, w1, w2, s1, s2, w, ids, scheme, q["a1_scale"], q["a2_scale"])
    ref.assert_close(out, want, FP8_LIMIT, f"fp8 {case}")


@requires_torch
def test_fp8_with_engine_inputs(spy):
    """expert_map, int64 ids, apply_router_weight_on_input and inplace with FP8 weights."""
    G = 10
    x, w1, w2, s1, s2, w, ids, emap = _fp8_problem("block", K=1, global_experts=G, seed=12)
    h = x.clone()
    out = mkv.fused_experts(h, w1, w2, w, ids.long(), inplace=True, use_fp8_w8a8=True,
                            apply_router_weight_on_input=True, global_num_experts=G,
                            expert_map=emap, w1_scale=s1, w2_scale=s2,
                            block_shape=[128, 128])  # fmt: skip
    c = spy[0]
    assert out is h and c["out"] is h and c["map"] is emap and c["on_input"] is True
    want = vllm_fused_experts_fp8(x, w1, w2, s1, s2, w, ids, "block", expert_map=emap,
                                  apply_router_weight_on_input=True)  # fmt: skip
    ref.assert_close(out, want, FP8_LIMIT, "fp8 engine inputs")


def _fp8_refusals():
    """{case name: (fused_experts keywords given the scales, the message's start)} (torch
    tensors: built in the test, not at collection)."""
    a1, a2 = _static_scales()

    def fp8(**kw):
        return lambda s1, s2: {"use_fp8_w8a8": True, "w1_scale": s1, "w2_scale": s2, **kw}

    def config(**kw):
        def make(s1, s2):
            q = dict(quant_dtype=torch.float8_e4m3fn, per_act_token_quant=False,
                     per_out_ch_quant=False, w1_scale=s1, w2_scale=s2, a1_scale=None,
                     a2_scale=None, block_shape=None, w1_zp=None, w2_zp=None)  # fmt: skip
            q.update(kw)
            return {"quant_config": types.SimpleNamespace(**q)}

        return make

    cases = [
        ("block 64x64", fp8(block_shape=[64, 64]), r"block_shape=\[64, 64\] is not supported: "
         r"moekit's FP8 blocks are \[128, 128\]"),
        ("block 128x64", fp8(block_shape=[128, 64]), r"block_shape=\[128, 64\]"),
        ("static with blocks", fp8(block_shape=[128, 128], a1_scale=a1),
         r"a1_scale='<given>' is not supported: static activation scales go with per-tensor"),
        ("static with per-channel", fp8(per_channel_quant=True, a2_scale=a2),
         r"a2_scale='<given>' is not supported: static activation scales"),
        ("per-channel weights, per-tensor acts", config(per_out_ch_quant=True),
         r"quant_config.per_out_ch_quant=True is not supported: moekit's fp8_per_channel pairs"),
        ("per-token acts, per-tensor weights", config(per_act_token_quant=True),
         r"quant_config.per_out_ch_quant=True is not supported"),
        ("per-expert a1_scale", fp8(a1_scale=torch.ones(4)),
         r"a1_scale='<shape \[4\]>' is not supported: a static activation scale is one value"),
        ("zero points", fp8(w1_zp=torch.zeros(4)), r"w1_zp='<given>' is not supported: zero"),
        ("int8 with fp8", fp8(use_int8_w8a8=True), r"use_int8_w8a8=True is not supported"),
        ("int8 config", config(quant_dtype=torch.int8),
         r"quant_config=.* is not supported: quant_dtype torch.int8: moekit maps FP8"),
        ("mxfp4 config", config(quant_dtype="mxfp4"), r"quant_config=.* quant_dtype 'mxfp4'"),
        ("config zero points", config(w2_zp=torch.zeros(4)),
         r"quant_config=.* is not supported: its w2_zp does not map"),
        ("flags and config", lambda s1, s2: {**fp8()(s1, s2), **config()(s1, s2)},
         r"quant_config=.* is not supported: use_fp8_w8a8 given too"),
        ("gelu", fp8(activation="gelu"), r"activation='gelu' is not supported: moekit's FP8 "
         r"kernels run silu_and_mul only"),
        ("w1_bias", fp8(w1_bias=torch.zeros(4, 256)), r"w1_bias='<given>' is not supported: "
         r"moekit's FP8 kernels run without biases"),
        ("config bias", config(w2_bias=torch.zeros(4, 256)), r"w2_bias='<given>'"),
    ]  # fmt: skip
    assert [c[0] for c in cases] == _FP8_REFUSALS
    return {name: (make, msg) for name, make, msg in cases}


_FP8_REFUSALS = ["block 64x64", "block 128x64", "static with blocks", "static with per-channel",
                 "per-channel weights, per-tensor acts", "per-token acts, per-tensor weights",
                 "per-expert a1_scale", "zero points", "int8 with fp8", "int8 config",
                 "mxfp4 config", "config zero points", "flags and config", "gelu", "w1_bias",
                 "config bias"]  # fmt: skip


@requires_torch
@pytest.mark.parametrize("case", _FP8_REFUSALS)
def test_fp8_arguments_that_do_not_map_raise(spy, case):
    make, msg = _fp8_refusals()[case]
    x, w1, w2, s1, s2, w, ids, _ = _fp8_problem("per_tensor")
    with pytest.raises(NotImplementedError, match=r"moekit.integrations.vllm.fused_experts: "
                                                  + msg):  # fmt: skip
        mkv.fused_experts(x, w1, w2, w, ids, **make(s1, s2))
    assert spy == []


@requires_torch
def test_fp8_scale_shapes_and_dtypes(spy):
    x, w1, w2, s1, s2, w, ids, _ = _fp8_problem("per_channel")
    # Per-channel scales without per_channel_quant: per-tensor takes one per expert.
    with pytest.raises(NotImplementedError, match=r"w1_scale='<shape \[4, 256, 1\]>' is not "
                                                  r"supported: per-tensor FP8 takes one scale"):
        mkv.fused_experts(x, w1, w2, w, ids, use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2)
    # bf16 weights with use_fp8_w8a8.
    xb, w1b, w2b, wb, idsb, _ = _problem(FP8_T, FP8_E, FP8_H, FP8_N, FP8_K)
    with pytest.raises(NotImplementedError, match=r"w1='<torch.bfloat16>' is not supported: FP8"):
        mkv.fused_experts(xb, w1b, w2b, wb, idsb, use_fp8_w8a8=True, w1_scale=torch.ones(4),
                          w2_scale=torch.ones(4))  # fmt: skip
    with pytest.raises(ValueError, match=r"FP8 weights need w1_scale"):
        mkv.fused_experts(x, w1, w2, w, ids, use_fp8_w8a8=True, w2_scale=torch.ones(4))
    assert spy == []
    # [E, 1, 1] per-tensor scales and f64 ones (cast once to f32) map too.
    _, _, _, t1, t2, _, _, _ = _fp8_problem("per_tensor")
    mkv.fused_experts(x, w1, w2, w, ids, use_fp8_w8a8=True, w1_scale=t1.view(4, 1, 1),
                      w2_scale=t2.double(), a1_scale=torch.tensor(0.01))  # fmt: skip
    c = spy[0]
    assert c["weight_quant"] == "fp8_per_tensor" and c["w_gate_up_scale"].shape == (4,)
    assert c["w_down_scale"].dtype == f32 and torch.equal(c["w_down_scale"], t2.double().float())
    assert c["a_gate_up_scale"].shape == (1,) and c["a_down_scale"] is None


@requires_torch
@pytest.mark.parametrize("scoring_func", ["softmax", "sigmoid"])
def test_fused_topk_maps_to_moekit(spy, scoring_func):
    T, E, K = 9, 12, 3
    g = torch.randn(T, E, generator=torch.Generator().manual_seed(6))  # f32: no ties
    x = torch.empty(T, 16, dtype=bf16)
    w, ids, tei = mkv.fused_topk(x, g, K, True, scoring_func=scoring_func)
    assert len(spy) == 1 and spy[0]["args"][0] is g
    assert spy[0]["args"][1:] == (K, True, scoring_func) and spy[0]["out"] is None
    rw, rids, rtei = vllm_fused_topk(g, K, True, scoring_func)
    assert ids.dtype == i32 and torch.equal(ids, rids)
    assert w.dtype == f32 and torch.allclose(w, rw, rtol=1e-6, atol=1e-7)
    assert tei.dtype == i32 and tei.is_contiguous() and torch.equal(tei, rtei)
    _, ids64, _ = mkv.fused_topk(x, g, K, False, indices_type=i64)
    assert ids64.dtype == i64 and torch.equal(ids64, vllm_fused_topk(g, K, False)[1].long())
    _, ids32, _ = mkv.fused_topk(x, g, K, False, torch.int32)
    assert ids32.dtype == i32


@requires_torch
def test_fused_topk_errors(spy):
    g = torch.randn(4, 8)
    with pytest.raises(NotImplementedError, match=r"fused_topk: indices_type=torch.int16 is not "
                                                  r"supported"):  # fmt: skip
        mkv.fused_topk(torch.empty(4, 8), g, 2, False, indices_type=torch.int16)
    with pytest.raises(ValueError, match=r"number of tokens mismatch: hidden_states has 3, "
                                         r"gating_output 4"):  # fmt: skip
        mkv.fused_topk(torch.empty(3, 8), g, 2, False)
    assert spy == []


# ---------------------------------------------------------------- the real C++ op (no GPU)

_NO_GPU = pytest.mark.skipif(
    moekit.raw.device_count() > 0 if torch_skip_reason() is None else False,
    reason="a CUDA device is present: these calls would launch kernels",
)


_CPP_CASES = {
    "plain": {},
    "int64 ids": {"ids64": True},
    "expert_map": {"expert_map": True},
    "bf16 weights": {"weights": "bf16"},
    "apply_router_weight_on_input": {"top1": True, "apply_router_weight_on_input": True},
    "inplace": {"inplace": True, "expert_map": True, "ids64": True},
    "inplace + on input": {"inplace": True, "top1": True, "apply_router_weight_on_input": True},
    "swigluoai + biases": {"activation": "swigluoai", "biases": True},
    "relu2_no_mul": {"activation": "relu2_no_mul"},
}


def _with_activation(w1, w2, opts, seed):
    """w1 for opts' activation (relu2_no_mul: its first N rows, [E, N, K]) and the biases
    opts asks for (w1_bias f32, w2_bias in the weights' dtype), popped from opts; as
    fused_experts keywords."""
    act = opts.pop("activation", "silu")
    if act == "relu2_no_mul":
        w1 = w1[:, : w1.shape[1] // 2].contiguous()
    kw = {"activation": act}
    if opts.pop("biases", False):
        gen = torch.Generator().manual_seed(seed)
        kw["w1_bias"] = torch.randn(w1.shape[:2], generator=gen).to(w1.device)
        kw["w2_bias"] = torch.randn(w2.shape[:2], generator=gen).to(w2.dtype).to(w2.device)
    return w1, kw


@requires_torch
@_NO_GPU
@pytest.mark.parametrize("case", list(_CPP_CASES))
def test_cpp_op_accepts_what_the_adapter_passes(stubbed_devices, case):
    """With the device checks stubbed (mk_support.stubbed_devices), moekit's C++ op gets
    the adapter's arguments and passes every validation (dtypes, shapes, contiguity,
    in-place aliasing): only the launch fails without a GPU."""
    opts = dict(_CPP_CASES[case])
    K = 1 if opts.pop("top1", False) else 2
    x, w1, w2, w, ids, emap = _problem(6, 4, 64, 32, K, global_experts=8, seed=7)
    kwargs = {}
    if opts.pop("expert_map", False):
        kwargs["expert_map"] = emap
    else:
        ids = ids % 4
    if opts.pop("ids64", False):
        ids = ids.long()
    if opts.pop("weights", None) == "bf16":
        w = w.to(bf16)
    w1, act = _with_activation(w1, w2, opts, 9)
    kwargs.update(opts, **act)
    with pytest.raises(moekit.MoekitError) as info:
        mkv.fused_experts(x, w1, w2, w, ids, **kwargs)
    msg = str(info.value)
    assert ("argument '" not in msg or "argument 'stream'" in msg) and "CUDA" in msg, msg


@requires_torch
@_NO_GPU
@pytest.mark.parametrize("case", _FP8_MAPPING, ids=[f"{c[0]}-{c[1].get('static', '')}"
                                                    for c in _FP8_MAPPING])  # fmt: skip
def test_cpp_op_accepts_the_fp8_arguments(stubbed_devices, case):
    """The FP8 mapping's arguments pass the C++ op's validation (weight_quant, the scales'
    shapes and dtypes), with expert_map and int64 ids too: only the device is missing. At
    this shape (F = 128, 4.5 routes an expert) per-tensor / per-channel weights plan the
    weight-only GEMMs, which stop at the launch target; block scales the FP8 GEMMs, whose
    plan is refused off sm_90 after every argument check."""
    scheme, opts, _ = case
    x, w1, w2, s1, s2, w, ids, emap = _fp8_problem(scheme, global_experts=8, seed=13)
    kw, _ = _fp8_call_args(scheme, opts, s1, s2)
    with pytest.raises(moekit.MoekitError) as info:
        mkv.fused_experts(x, w1, w2, w, ids.long(), expert_map=emap, **kw)
    msg = str(info.value)
    if scheme == "block":
        assert msg.endswith("got the FP8 expert MLP: the FP8 gate_up GEMM: fp8_sm90 needs an "
                            "sm_90 device"), msg
    else:
        assert msg.startswith("moekit::fused_moe_experts: argument 'stream': expected a CUDA "
                              "device to launch on"), msg


@requires_torch
@_NO_GPU
def test_cpp_topk_accepts_what_the_adapter_passes(stubbed_devices):
    g = torch.randn(5, 16)
    with pytest.raises(moekit.MoekitError) as info:
        mkv.fused_topk(torch.empty(5, 64, dtype=bf16), g, 4, True)
    msg = str(info.value)
    assert ("argument '" not in msg or "argument 'stream'" in msg) and "CUDA" in msg, msg


# ---------------------------------------------------------------- GPU: against vLLM's semantics
# MOEKIT_TEST_SELFCHECK=1 runs these on the CPU with the ops replaced by the contract
# spies (the tests' own logic, not moekit).

_DEVICE = "cpu" if SELFCHECK else "cuda"

_GPU_CASES = [  # (T, E, H, N, K, dtype, options)
    (1, 8, 128, 64, 2, "bf16", {}),
    (7, 16, 256, 128, 4, "bf16", {"ids64": True}),
    (64, 8, 128, 256, 2, "f16", {"expert_map": 24}),
    (300, 32, 512, 128, 8, "bf16", {"expert_map": 128, "ids64": True}),
    (33, 16, 256, 64, 1, "bf16", {"apply_router_weight_on_input": True}),
    (200, 8, 256, 128, 1, "bf16", {"apply_router_weight_on_input": True, "expert_map": 16}),
    (17, 16, 128, 64, 2, "bf16", {"inplace": True}),
    (129, 16, 256, 128, 1, "f16", {"inplace": True, "apply_router_weight_on_input": True,
                                    "expert_map": 40, "ids64": True}),
    (0, 8, 128, 64, 2, "bf16", {"expert_map": 16}),
    (9, 8, 128, 64, 2, "bf16", {"activation": "swigluoai", "biases": True}),
    (70, 16, 256, 128, 4, "bf16", {"activation": "gelu", "biases": True, "expert_map": 24}),
    (5, 8, 128, 64, 2, "f16", {"activation": "relu2_no_mul", "ids64": True}),
    (90, 8, 256, 64, 1, "bf16", {"activation": "swigluoai", "biases": True, "inplace": True,
                                  "expert_map": 16}),
]  # fmt: skip


@pytest.fixture
def gpu_ops(monkeypatch):
    if SELFCHECK:
        calls = []
        monkeypatch.setattr(moekit.ops, "fused_moe_experts", _contract_experts(calls))
        monkeypatch.setattr(moekit.ops, "fused_topk", _contract_topk(calls))


@requires_gpu
@pytest.mark.parametrize("case", _GPU_CASES, ids=[f"T{c[0]}-E{c[1]}-K{c[4]}-{c[5]}-"
                                                  + "-".join(sorted(c[6])) for c in _GPU_CASES])
def test_fused_experts_against_vllm_semantics(gpu_ops, case):  # fmt: skip
    T, E, H, N, K, dtype, opts = case
    opts = dict(opts)
    G = opts.pop("expert_map", None)
    x, w1, w2, w, ids, emap = _problem(T, E, H, N, K, dtype={"bf16": bf16, "f16": f16}[dtype],
                                       device=_DEVICE, global_experts=G, seed=T * 31 + E)
    kwargs = {"expert_map": emap, "global_num_experts": G} if G else {}
    semantics = {"expert_map": emap,
                 "apply_router_weight_on_input": opts.get("apply_router_weight_on_input", False)}
    if opts.pop("ids64", False):
        ids = ids.long()
    w1, act = _with_activation(w1, w2, opts, T + 5)
    want = vllm_fused_experts(x, w1, w2, w, ids, **semantics, **act)
    h = x.clone()
    out = mkv.fused_experts(h, w1, w2, w, ids, **kwargs, **opts, **act)
    if opts.get("inplace"):
        assert out is h
    else:
        assert out is not h and torch.equal(h, x)  # the input is left as it was
    ref.assert_close(out, want, ref.ACCURACY[x.dtype], f"fused_experts {case}")
    if G and T:  # remote routes add nothing: all routes remote gives zeros
        remote = (emap < 0).nonzero()[0].item()
        none_local = torch.full_like(ids, remote)
        z = mkv.fused_experts(x, w1, w2, w, none_local, expert_map=emap, **act)
        assert torch.equal(z, torch.zeros_like(x))


_GPU_FP8_CASES = [  # (T, E, H, N, K, dtype, mapping case (_FP8_MAPPING index), options)
    (1, 8, 256, 128, 2, "bf16", 0, {}),
    (7, 16, 512, 256, 4, "bf16", 1, {"ids64": True}),
    (64, 8, 256, 128, 2, "f16", 2, {"expert_map": 24}),
    (300, 32, 512, 256, 8, "bf16", 3, {"expert_map": 64, "ids64": True}),
    (65, 16, 256, 128, 4, "bf16", 4, {}),
    (200, 8, 384, 256, 1, "bf16", 4, {"apply_router_weight_on_input": True, "expert_map": 16}),
    (33, 8, 256, 128, 1, "f16", 3, {"inplace": True, "apply_router_weight_on_input": True}),
    (129, 16, 256, 128, 2, "bf16", 2, {"inplace": True, "expert_map": 40}),
    (0, 8, 256, 128, 2, "bf16", 4, {}),
    (17, 4, 1024, 512, 2, "bf16", 4, {"quant_config": True}),
    (40, 8, 256, 128, 3, "bf16", 3, {"quant_config": True}),
]  # fmt: skip


@requires_gpu
@pytest.mark.parametrize("case", _GPU_FP8_CASES, ids=[
    f"T{c[0]}-E{c[1]}-K{c[4]}-{c[5]}-{_FP8_MAPPING[c[6]][0]}{_FP8_MAPPING[c[6]][1].get('static', '')}"
    + "-".join([""] + sorted(c[7])) for c in _GPU_FP8_CASES])  # fmt: skip
def test_fused_experts_fp8_against_vllm_semantics(gpu_ops, case):
    """FP8 weights through the adapter against vLLM's FP8 semantics in torch (dequantized
    weights, activations quantized as vLLM does): SPEC.md's fp8 limit."""
    T, E, H, N, K, dtype, mapping, opts = case
    scheme, call_opts, _ = _FP8_MAPPING[mapping]
    opts = dict(opts)
    G = opts.pop("expert_map", None)
    x, w1, w2, s1, s2, w, ids, emap = _fp8_problem(
        scheme, T, E, H, N, K, dtype={"bf16": bf16, "f16": f16}[dtype], device=_DEVICE,
        global_experts=G, seed=T * 17 + E)  # fmt: skip
    kw, q = _fp8_call_args(scheme, call_opts, s1, s2, _DEVICE, opts.pop("quant_config", False))
    if G:
        kw.update(expert_map=emap, global_num_experts=G)
    on_input = opts.get("apply_router_weight_on_input", False)
    args = (x, w1, w2, s1, s2, w, ids, scheme, q["a1_scale"], q["a2_scale"], emap, on_input)
    want = vllm_fused_experts_fp8(*args)
    if opts.pop("ids64", False):
        ids = ids.long()
    h = x.clone()
    out = mkv.fused_experts(h, w1, w2, w, ids, **kw, **opts)
    if opts.get("inplace"):
        assert out is h
    else:
        assert out is not h and torch.equal(h, x)
    assert torch.isfinite(out).all(), f"fused_experts fp8 {case}: non-finite output"
    # fused_experts runs fused_moe_experts, the sorted path only: its FP8 GEMMs quantize both
    # inputs as vLLM does, at every T.
    ref.assert_close(out, want, FP8_LIMIT, f"fused_experts fp8 {case}")


@requires_gpu
@pytest.mark.parametrize("T,E,K", [(1, 8, 2), (37, 64, 6), (512, 128, 8), (0, 16, 4)])
@pytest.mark.parametrize("renormalize", [False, True])
def test_fused_topk_against_vllm_semantics(gpu_ops, T, E, K, renormalize):
    g = torch.randn(T, E, generator=torch.Generator().manual_seed(T + E)).to(_DEVICE)
    x = torch.empty(T, 64, dtype=bf16, device=_DEVICE)
    for indices_type in (None, i64):
        w, ids, tei = mkv.fused_topk(x, g, K, renormalize, indices_type=indices_type)
        rw, rids, rtei = vllm_fused_topk(g, K, renormalize)
        assert ids.dtype == (indices_type or i32) and ids.device == g.device
        assert torch.equal(ids.long(), rids.long())
        ref.assert_close(w, rw, 1e-5, "topk_weights")
        assert torch.equal(tei, rtei)


@requires_torch
def test_traces_as_moekit_ops():
    """make_fx and torch.compile(fullgraph=True) see moekit's custom op (the out variant
    for inplace) with the engine arguments, and no torch op around it, on meta tensors."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def meta(*shape, dtype=bf16):
        return torch.empty(shape, dtype=dtype, device="meta")

    args = (meta(6, 64), meta(4, 64, 64), meta(4, 64, 32), meta(6, 1, dtype=f32),
            meta(6, 1, dtype=i64), meta(8, dtype=i32))  # fmt: skip

    def layer(x, w1, w2, w, ids, emap):
        return mkv.fused_experts(x, w1, w2, w, ids, inplace=True, expert_map=emap,
                                 apply_router_weight_on_input=True)  # fmt: skip

    code = make_fx(layer, tracing_mode="fake")(*args).code
    assert "moekit.fused_moe_experts_out" in code, code
    for op in ("aten.index_select", "aten.mul", "aten._to_copy"):  # no shim around the op
        assert op not in code, code
    torch._dynamo.reset()
    out = torch.compile(layer, fullgraph=True, backend="aot_eager")(*args)
    assert out.shape == (6, 64) and out.device.type == "meta"
    topk = torch.compile(lambda x, g: mkv.fused_topk(x, g, 2, True, indices_type=i64),
                         fullgraph=True, backend="aot_eager")  # fmt: skip
    w, ids, tei = topk(args[0], meta(6, 8, dtype=f32))
    assert (w.dtype, ids.dtype, tei.dtype) == (f32, i64, i32) and ids.shape == (6, 2)
