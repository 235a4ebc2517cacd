"""moekit's torch ops with FP8 weights (weight_quant, docs/python.md "Quantized weights") on
an sm_90 GPU: every scheme through indexed_expert_mlp, fused_moe_shared_expert and
shared_expert_mlp against a float32 reference on the dequantized weights (the FP8 direct kernels
do not quantize activations: bf16's tolerance); with the engine inputs (expert_map, int64
ids, apply_router_weight_on_input); past the direct kernels (routed: 128 tokens) the FP8 GEMMs
against a reference that quantizes the activations as they do (fp8 tolerance); torch.compile's
fake implementations.
Skipped, saying why, without such a GPU."""

import math

import pytest

from mk_support import DEVICE, gpu_skip_reason, requires_real_gpu

pytestmark = [
    pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason())),
    requires_real_gpu,
]

if gpu_skip_reason() is None:
    import torch

    import moekit

    bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32

SCHEMES = ("fp8_per_tensor", "fp8_per_channel", "fp8_block128")


def quantized(E, N, K, scheme, g, dense=False):
    """e4m3 weights [E, N, K] (codes ~ N(0, 48^2)), the scheme's f32 scales (around
    1 / (48 sqrt(K))) and the dequantized f32 weights."""
    codes = (torch.randn((E, N, K), generator=g, device=DEVICE) * 48).clamp(-448, 448)
    w = codes.to(torch.float8_e4m3fn)
    base = 1.0 / (48 * math.sqrt(K))
    shape = {"fp8_per_tensor": (E,), "fp8_per_channel": (E, N),
             "fp8_block128": (E, -(-N // 128), -(-K // 128))}[scheme]  # fmt: skip
    s = (torch.rand(shape, generator=g, device=DEVICE) + 0.5) * base
    if scheme == "fp8_per_tensor":
        sx = s.view(E, 1, 1)
    elif scheme == "fp8_per_channel":
        sx = s.view(E, N, 1)
    else:
        sx = s.repeat_interleave(128, 1)[:, :N].repeat_interleave(128, 2)[:, :, :K]
    deq = w.float() * sx
    if dense:
        w, deq = w[0], deq[0]
        s = s.reshape(1) if scheme == "fp8_per_tensor" else s[0]
    return w.contiguous(), s.contiguous(), deq


def mlp_ref(x, w13, w2):
    """One gated MLP in f32, the activation rounded to bf16 (the op's rounding point)."""
    F = w13.shape[0] // 2
    h = x.float() @ w13.t()
    act = (torch.nn.functional.silu(h[:, :F]) * h[:, F:]).to(bf16).float()
    return act @ w2.t()


def experts_ref(x, d13, d2, w, ids):
    out = torch.zeros(x.shape[0], x.shape[1], dtype=f32, device=DEVICE)
    E = d13.shape[0]
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if 0 <= e < E:
                out[t] += w[t, k] * mlp_ref(x[t:t + 1], d13[e], d2[e])[0]
    return out


def close(got, ref, limit=1e-2):
    """SPEC's check: finite, rel_l2 and err_ratio (elements outside limit + limit |ref|)
    within the limit (bf16's; fp8's where the activations are quantized)."""
    assert torch.isfinite(got).all()
    diff = got.float() - ref
    rel = (diff.norm() / ref.norm().clamp(min=1e-30)).item()
    assert rel < limit, rel
    ratio = (diff.abs() > limit + limit * ref.abs()).float().mean().item()
    assert ratio <= limit, (ratio, rel)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("T", [1, 7, 64])
def test_indexed_expert_mlp_fp8(scheme, T):
    g = torch.Generator(device=DEVICE).manual_seed(T)
    E, H, F, K = 9, 256, 128, 3
    x = torch.randn((T, H), generator=g, device=DEVICE).to(bf16)
    q13, s13, d13 = quantized(E, 2 * F, H, scheme, g)
    q2, s2, d2 = quantized(E, H, F, scheme, g)
    w = torch.rand((T, K), generator=g, device=DEVICE)
    ids = torch.randint(-1, E, (T, K), generator=g, device=DEVICE).to(i32)
    got = moekit.indexed_expert_mlp(x, q13, q2, w, ids, weight_quant=scheme, w_gate_up_scale=s13,
                                    w_down_scale=s2)  # fmt: skip
    close(got, experts_ref(x, d13, d2, w, ids))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_shared_expert_mlp_fp8(scheme):
    g = torch.Generator(device=DEVICE).manual_seed(5)
    T, H, S = 5, 384, 256
    x = torch.randn((T, H), generator=g, device=DEVICE).to(bf16)
    q13, s13, d13 = quantized(1, 2 * S, H, scheme, g, dense=True)
    q2, s2, d2 = quantized(1, H, S, scheme, g, dense=True)
    got = moekit.shared_expert_mlp(x, q13, q2, weight_quant=scheme, w_gate_up_scale=s13,
                                   w_down_scale=s2)  # fmt: skip
    close(got, mlp_ref(x, d13, d2))


def test_fused_moe_shared_expert_fp8_matches_reference_and_compiles():
    g = torch.Generator(device=DEVICE).manual_seed(11)
    T, E, H, F, S = 8, 16, 256, 128, 128
    x = torch.randn((T, H), generator=g, device=DEVICE).to(bf16)
    logits = torch.randn((T, E), generator=g, device=DEVICE)
    q13, s13, d13 = quantized(E, 2 * F, H, "fp8_block128", g)
    q2, s2, d2 = quantized(E, H, F, "fp8_block128", g)
    r13, t13, e13 = quantized(1, 2 * S, H, "fp8_per_channel", g, dense=True)
    r2, t2, e2 = quantized(1, H, S, "fp8_per_channel", g, dense=True)
    kw = dict(weight_quant="fp8_block128", w_gate_up_scale=s13, w_down_scale=s2,
              shared_weight_quant="fp8_per_channel", shared_w_gate_up_scale=t13,
              shared_w_down_scale=t2)  # fmt: skip

    def layer(x, logits):
        return moekit.fused_moe_shared_expert(x, logits, q13, q2, r13, r2, 4, True, **kw)

    eager = layer(x, logits)
    # Softmax top-4, renormalized (no ties in random logits), the routed experts and the
    # shared expert on the dequantized weights (T = 8: the FP8 direct kernels, bf16's tolerance).
    p = torch.softmax(logits.float(), dim=-1)
    w, ids = p.topk(4, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    close(eager, experts_ref(x, d13, d2, w, ids) + mlp_ref(x, e13, e2))
    compiled = torch.compile(layer, fullgraph=True)(x, logits)
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_indexed_expert_mlp_fp8_engine_inputs(scheme):
    """FP8 weights with an expert map over int64 global ids, and with the router weight on
    the input (top-1): the translated ids / scaled rows feed the FP8 direct kernels."""
    g = torch.Generator(device=DEVICE).manual_seed(21)
    T, E, E_global, H, F, K = 19, 8, 20, 256, 128, 2
    x = torch.randn((T, H), generator=g, device=DEVICE).to(bf16)
    q13, s13, d13 = quantized(E, 2 * F, H, scheme, g)
    q2, s2, d2 = quantized(E, H, F, scheme, g)
    kw = dict(weight_quant=scheme, w_gate_up_scale=s13, w_down_scale=s2)
    w = torch.rand((T, K), generator=g, device=DEVICE)
    gids = torch.randint(-1, E_global, (T, K), generator=g, device=DEVICE)  # int64
    emap = torch.full((E_global,), -1, dtype=i32, device=DEVICE)
    held = torch.randperm(E_global, generator=g, device=DEVICE)[:E]
    emap[held] = torch.arange(E, dtype=i32, device=DEVICE)
    local = torch.where(gids >= 0, emap[gids.clamp(min=0)], -1)
    got = moekit.indexed_expert_mlp(x, q13, q2, w, gids, expert_map=emap, **kw)
    close(got, experts_ref(x, d13, d2, w, local))
    w1 = torch.rand((T, 1), generator=g, device=DEVICE)
    ids1 = torch.randint(-1, E, (T, 1), generator=g, device=DEVICE).to(i32)
    got1 = moekit.indexed_expert_mlp(x, q13, q2, w1, ids1, apply_router_weight_on_input=True,
                                     **kw)  # fmt: skip
    scaled = x * w1.to(bf16)  # round(round(w) * x), vLLM's x * w.to(x.dtype)
    close(got1, experts_ref(scaled, d13, d2, torch.ones_like(w1), ids1))


def test_fp8_with_another_activation_raises():
    g = torch.Generator(device=DEVICE).manual_seed(3)
    E, H, F, T = 4, 128, 128, 3
    x = torch.randn((T, H), generator=g, device=DEVICE).to(bf16)
    q13, s13, _ = quantized(E, 2 * F, H, "fp8_block128", g)
    q2, s2, _ = quantized(E, H, F, "fp8_block128", g)
    w = torch.rand((T, 2), generator=g, device=DEVICE)
    ids = torch.randint(0, E, (T, 2), generator=g, device=DEVICE).to(i32)
    with pytest.raises(moekit.MoekitError,
                       match="argument 'activation': expected silu_and_mul with FP8 weights"):
        moekit.indexed_expert_mlp(x, q13, q2, w, ids, activation="gelu",
                                  weight_quant="fp8_block128", w_gate_up_scale=s13,
                                  w_down_scale=s2)  # fmt: skip


def quant_act(a, scheme):
    """a (rows x cols) quantized to e4m3 and back as the FP8 GEMM paths do: scales
    max(amax, 1e-10) / 448 per 128 columns (blocks), per row (channel) or over a (tensor)."""
    a = a.float()
    if scheme == "fp8_per_tensor":
        groups = a.reshape(1, -1)
    elif scheme == "fp8_per_channel":
        groups = a
    else:
        groups = a.reshape(a.shape[0] * (a.shape[1] // 128), 128)
    m = groups.abs().amax(dim=1, keepdim=True).clamp(min=1e-10)
    # A tensor divisor: on CUDA, `m / 448.0` runs as m * fl(1/448), one ulp off m / 448
    # (amax 3.0625: 0.006835938 for 0.0068359375), and e4m3 ties then round the other way.
    s = m / torch.full_like(m, 448.0)
    q = (groups / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
    return q.reshape(a.shape)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_indexed_expert_mlp_fp8_past_the_decode_kernels(scheme):
    """T = 129 and 300 (the routed FP8 direct kernels take T <= 128): the sorted path's FP8
    GEMMs, activations quantized by the scheme."""
    g = torch.Generator(device=DEVICE).manual_seed(8)
    E, H, F, K = 9, 256, 128, 4
    q13, s13, d13 = quantized(E, 2 * F, H, scheme, g)
    q2, s2, d2 = quantized(E, H, F, scheme, g)
    for T in (129, 300):
        x = torch.randn((T, H), generator=g, device=DEVICE).to(bf16)
        w = torch.rand((T, K), generator=g, device=DEVICE)
        ids = torch.randint(-1, E, (T, K), generator=g, device=DEVICE).to(i32)
        got = moekit.indexed_expert_mlp(x, q13, q2, w, ids, weight_quant=scheme,
                                        w_gate_up_scale=s13, w_down_scale=s2)  # fmt: skip
        xq = quant_act(x, scheme)
        valid = [(t, k) for t in range(T) for k in range(K) if 0 <= int(ids[t, k]) < E]
        acts = torch.stack([
            (lambda h: (torch.nn.functional.silu(h[:F]) * h[F:]).to(bf16).float())(
                d13[int(ids[t, k])] @ xq[t]) for t, k in valid])  # fmt: skip
        acts = quant_act(acts, scheme)
        ref = torch.zeros((T, H), dtype=f32, device=DEVICE)
        for i, (t, k) in enumerate(valid):
            ref[t] += w[t, k] * (d2[int(ids[t, k])] @ acts[i])
        close(got, ref, 3e-2)
