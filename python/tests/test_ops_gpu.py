"""moekit's torch ops on an sm_90 GPU against the PyTorch float32 references in
torch_reference.py, on random and edge inputs; CUDA-graph capture of the fused MoE
layer; torch.compile; errors; streams. Skipped, saying why, without such a GPU."""

import math

import pytest

from mk_support import DEVICE, SELFCHECK, gpu_skip_reason, requires_real_gpu

pytestmark = pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))

if gpu_skip_reason() is None:
    import torch

    import moekit
    import torch_reference as ref

    if SELFCHECK:
        import ref_ops as ops
    else:
        ops = moekit
        torch.backends.cuda.matmul.allow_tf32 = False  # f32 references in full f32
    bf16, f16, f32, i32 = torch.bfloat16, torch.float16, torch.float32, torch.int32
    ACC = ref.ACCURACY
else:  # collection still needs the names used in parametrize lists
    bf16 = f16 = f32 = i32 = None


def gen(seed):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def randn(shape, dtype, g, scale=1.0):
    return (torch.randn(shape, generator=g, device=DEVICE) * scale).to(dtype)


def uniform(shape, g, lo=0.0, hi=1.0):
    return torch.rand(shape, generator=g, device=DEVICE) * (hi - lo) + lo


def weights(E, F, H, dtype, g):
    """w_gate_up [E, 2F, H], w_down [E, H, F] ~ N(0, 1/in_features)."""
    return (randn((E, 2 * F, H), dtype, g, 1 / math.sqrt(H)),
            randn((E, H, F), dtype, g, 1 / math.sqrt(F)))  # fmt: skip


def random_counts(E, total, g, zeros=True):
    """total rows split over E experts, some experts empty."""
    # The generator lives on DEVICE, so draw there and bring the cuts back to the host.
    cuts = torch.randint(0, total + 1, (E - 1,), generator=gen(int(total) + E), device=DEVICE)
    cuts = cuts.sort().values.cpu()
    counts = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([total])])).tolist()
    if zeros and E > 2:
        counts[0] += counts[1]
        counts[1] = 0
    return counts


def topk_ids(T, E, K, g, kind="distinct"):
    """[T, K] i32 routes: distinct per row, with duplicates, some -1 and out-of-range
    ids, or all to one expert."""
    if T == 0:
        return torch.zeros((0, K), dtype=i32, device=DEVICE)
    if kind == "distinct":
        ids = uniform((T, E), g).argsort(dim=1)[:, :K]
    elif kind == "dups":
        ids = torch.randint(0, E, (T, K), generator=g, device=DEVICE)
    elif kind == "neg":
        ids = torch.randint(0, E, (T, K), generator=g, device=DEVICE)
        r = uniform((T, K), g)
        ids = torch.where(r < 0.15, torch.full_like(ids, -1), ids)
        ids = torch.where((r >= 0.15) & (r < 0.2), torch.full_like(ids, E + 3), ids)
    elif kind == "one_expert":
        ids = torch.full((T, K), min(3, E - 1), device=DEVICE)
    else:
        raise ValueError(kind)
    return ids.to(i32).contiguous()


# ---------------------------------------------------------------- FusedTopKFwd

TOPK_CASES = [
    # E, K, renormalize, scoring, groups, topk_group, scale, bias
    (8, 2, True, "softmax", 0, 0, 1.0, False),
    (128, 8, False, "softmax", 0, 0, 1.0, False),
    (384, 8, True, "sigmoid", 0, 0, 2.827, True),
    (256, 8, True, "sigmoid", 8, 4, 2.5, True),
    (64, 4, False, "softmax", 4, 2, 1.0, False),
    (160, 6, True, "sigmoid", 0, 0, 1.0, False),
]


@pytest.mark.parametrize("T", [1, 77])
@pytest.mark.parametrize("dtype", [bf16, f16, f32])
@pytest.mark.parametrize("case", TOPK_CASES)
def test_fused_topk(case, dtype, T):
    E, K, renorm, scoring, G, tg, scale, has_bias = case
    g = gen(1000 + E + T)
    logits = randn((T, E), dtype, g)
    bias = randn((E,), f32, g, 0.1) if has_bias else None
    w, ids = ops.fused_topk(logits, K, renorm, scoring, G, tg, scale, bias)
    assert w.shape == (T, K) and ids.shape == (T, K)
    assert w.dtype == f32 and ids.dtype == i32
    _, rids, score, sel = ref.fused_topk(logits, K, renorm, scoring, G, tg, scale, bias)
    got = ids.long()
    assert ((got >= 0) & (got < E)).all(), "ids out of range"
    assert (got.sort(dim=1).values.diff(dim=1) != 0).all(), "an expert chosen twice"
    got_sel, ref_sel = sel.gather(1, got), sel.gather(1, rids)
    assert torch.isfinite(got_sel).all(), "an expert outside the kept groups was chosen"
    # Ids must match; a swap is only allowed between near-equal scores (f32 rounding).
    near = (got_sel - ref_sel).abs() <= 1e-6 * ref_sel.abs().clamp(min=1.0)
    assert ((got == rids) | near).all(), f"ids differ:\n{got}\n{rids}"
    expected_w = ref.topk_weights_for(score, got, renorm, scale)
    torch.testing.assert_close(w, expected_w, rtol=1e-5, atol=1e-7)


def test_fused_topk_no_tokens():
    logits = torch.zeros((0, 64), dtype=bf16, device=DEVICE)
    w, ids = ops.fused_topk(logits, 4, True)
    assert w.shape == (0, 4) and ids.shape == (0, 4)


# ---------------------------------------------------------------- MoEPermuteAlignFwd


@pytest.mark.parametrize(
    "E,bs,T,K,kind",
    [
        (8, 16, 1, 2, "distinct"),
        (128, 64, 33, 8, "distinct"),
        (384, 64, 512, 8, "distinct"),
        (256, 256, 100, 8, "dups"),
        (16, 16, 64, 4, "neg"),
        (32, 32, 40, 4, "one_expert"),
        (8, 64, 0, 2, "distinct"),
    ],
)
def test_moe_permute_align(E, bs, T, K, kind):
    ids = topk_ids(T, E, K, gen(2000 + E + T), kind)
    sorted_ids, expert_ids, ntpp = ops.moe_permute_align(ids, E, bs)
    size = T * K + E * (bs - 1)
    assert sorted_ids.shape == (size,) and expert_ids.shape == (-(-size // bs),)
    assert ntpp.shape == (1,)
    assert sorted_ids.dtype == expert_ids.dtype == ntpp.dtype == i32
    ref_sorted, ref_blocks = ref.moe_permute_align(ids.cpu(), E, bs)
    n = int(ntpp.item())
    assert n == len(ref_sorted)
    assert sorted_ids[:n].tolist() == ref_sorted
    assert expert_ids[: n // bs].tolist() == ref_blocks
    assert (expert_ids[n // bs :] == -1).all()


# ---------------------------------------------------------------- MoEPrePermuteFwd


@pytest.mark.parametrize("dtype", [bf16, f16])
@pytest.mark.parametrize("T,K,E,A,H,kind", [
    (32, 2, 4, 1, 128, "distinct"), (1, 8, 16, 1, 2048, "distinct"), (37, 2, 4, 8, 128, "neg"),
    (100, 8, 32, 16, 512, "dups"), (256, 1, 8, 128, 256, "distinct"),
    (40, 4, 8, 4, 64, "one_expert"), (0, 2, 4, 1, 128, "distinct")])  # fmt: skip
def test_moe_pre_permute(dtype, T, K, E, A, H, kind):
    g = gen(3000 + T + E)
    x = randn((T, H), dtype, g)
    ids = topk_ids(T, E, K, g, kind)
    permuted, meta, inverse = ops.moe_pre_permute(x, ids, E, A)
    assert permuted.shape == (T * K + E * (A - 1), H) and permuted.dtype == dtype
    assert meta.shape == (E,) and inverse.shape == (T * K,)
    rows, ends, ref_inverse = ref.moe_pre_permute(x.cpu(), ids.cpu(), E, A)
    assert meta.tolist() == ends
    assert inverse.tolist() == ref_inverse
    if rows:
        r = torch.tensor(list(rows.keys()), device=DEVICE)
        t = torch.tensor(list(rows.values()), device=DEVICE)
        assert torch.equal(permuted[r], x[t]), "gathered rows differ from their tokens"


# ---------------------------------------------------------------- MoEPostPermuteFwd


@pytest.mark.parametrize("dtype,out_dtype", [(bf16, None), (f16, None), (bf16, f32), (f16, f32)])
@pytest.mark.parametrize("T,K,H,A", [(32, 2, 128, 1), (1, 8, 2048, 1), (100, 8, 512, 16),
                                     (0, 2, 128, 1)])  # fmt: skip
def test_moe_post_permute(dtype, out_dtype, T, K, H, A):
    E = 8
    g = gen(4000 + T + H)
    ids = topk_ids(T, E, K, g, "neg")
    if T > 2:
        ids[2] = -1  # a token with no route gets zeros
    _, ends, inverse = ref.moe_pre_permute(torch.zeros(T, 1), ids.cpu(), E, A)
    P = T * K + E * (A - 1)
    expert_output = randn((P, H), dtype, g)
    w = uniform((T, K), g)
    inv = torch.tensor(inverse, dtype=i32, device=DEVICE).reshape(T * K)
    out = ops.moe_post_permute(expert_output, w, inv, out_dtype)
    want = out_dtype or dtype
    assert out.shape == (T, H) and out.dtype == want
    expected = ref.moe_post_permute(expert_output, w, inv, out_dtype)
    if T:
        ref.assert_close(out, expected, ACC[want], "moe_post_permute")
    if T > 2:
        assert (out[2] == 0).all()


# ---------------------------------------------------------------- MoEGroupedGemmFwd


@pytest.mark.parametrize("dtype", [bf16, f16])
@pytest.mark.parametrize(
    "E,N,Kd,A,activation,out_f32,total",
    [
        (8, 192, 256, 1, "none", False, 300),
        (8, 200, 264, 64, "none", False, 129),
        (4, 128, 512, 1, "silu_and_mul", False, 200),
        (6, 96, 128, 16, "none", True, 77),
        (16, 64, 2048, 1, "none", False, 16),
        (5, 136, 256, 8, "silu_and_mul", True, 1),
    ],
)
def test_moe_grouped_gemm_contiguous(dtype, E, N, Kd, A, activation, out_f32, total):
    g = gen(5000 + E + N + Kd)
    counts = random_counts(E, total, g)
    _, ends = ref.layout_ends(counts, A)
    P = total + E * (A - 1)
    Nb = 2 * N if activation == "silu_and_mul" else N
    a = randn((P, Kd), dtype, g)
    b = randn((E, Nb, Kd), dtype, g, 1 / math.sqrt(Kd))
    meta = torch.tensor(ends, dtype=i32, device=DEVICE)
    out_dtype = f32 if out_f32 else None
    c = ops.moe_grouped_gemm(a, b, meta, False, A, activation, out_dtype)
    assert c.shape == (P, N) and c.dtype == (out_dtype or dtype)
    expected, valid = ref.moe_grouped_gemm(a, b, meta, False, A, activation, out_dtype)
    ref.assert_close(c[valid], expected[valid], ACC[c.dtype], "moe_grouped_gemm")


@pytest.mark.parametrize("dtype", [bf16, f16])
@pytest.mark.parametrize("activation", ["none", "silu_and_mul"])
def test_moe_grouped_gemm_masked(dtype, activation):
    E, M, N, Kd = 4, 64, 192, 256
    g = gen(5100)
    Nb = 2 * N if activation == "silu_and_mul" else N
    a = randn((E, M, Kd), dtype, g)
    b = randn((E, Nb, Kd), dtype, g, 1 / math.sqrt(Kd))
    meta = torch.tensor([0, 1, 64, 37], dtype=i32, device=DEVICE)
    c = ops.moe_grouped_gemm(a, b, meta, True, 1, activation)
    assert c.shape == (E, M, N) and c.dtype == dtype
    expected, valid = ref.moe_grouped_gemm(a, b, meta, True, 1, activation)
    ref.assert_close(c[valid], expected[valid], ACC[dtype], "moe_grouped_gemm masked")


# ---------------------------------------------------------------- MoEGroupedGemmFP8Fwd


@pytest.mark.parametrize(
    "E,M,N,Kd,counts",
    [
        (4, 64, 256, 384, [0, 5, 64, 33]),
        (2, 128, 272, 208, [128, 77]),
        (8, 16, 128, 128, [16, 1, 0, 16, 9, 3, 16, 2]),
    ],
)
def test_moe_grouped_gemm_fp8(E, M, N, Kd, counts):
    g = gen(6000 + N + Kd)
    fp8 = torch.float8_e4m3fn
    kb, nb = -(-Kd // 128), -(-N // 128)
    a = randn((E, M, Kd), f32, g).to(fp8)
    b = randn((E, N, Kd), f32, g).to(fp8)
    a_scale = uniform((E, M, kb), g, 0.25, 1.75)
    b_scale = uniform((E, nb, kb), g, 0.25, 1.75) / math.sqrt(Kd)
    meta = torch.tensor(counts, dtype=i32, device=DEVICE)
    c = ops.moe_grouped_gemm_fp8(a, a_scale, b, b_scale, meta)
    assert c.shape == (E, M, N) and c.dtype == bf16
    expected, valid = ref.moe_grouped_gemm_fp8(a, a_scale, b, b_scale, meta)
    ref.assert_close(c[valid], expected[valid], ACC["fp8"], "moe_grouped_gemm_fp8")


@pytest.mark.parametrize("masked", [True, False], ids=["masked", "contiguous"])
@pytest.mark.parametrize("scales", ["block", "per_channel", "per_tensor"])
@pytest.mark.parametrize("activation", ["none", "silu_and_mul"])
@pytest.mark.parametrize("fp8_out", [False, True], ids=["bf16", "e4m3"])
def test_moe_grouped_gemm_fp8_modes(masked, scales, activation, fp8_out):
    """Every layout, scale mode, activation and output of moe_grouped_gemm_fp8 against the
    dequantizing reference (an e4m3 c: one e4m3 rounding of the same value, fp8's limit)."""
    g = gen(6100 + 7 * masked + len(scales) + len(activation) + fp8_out)
    fp8 = torch.float8_e4m3fn
    E, N, Kd, counts = 4, 192, 320, [0, 70, 1, 130]
    Bn = 2 * N if activation == "silu_and_mul" else N
    if masked:
        M = 136
        rows = (E, M)
        meta = torch.tensor(counts, dtype=i32, device=DEVICE)
    else:
        alignment, ends, end = 16, [], 0
        for n in counts:
            end = -(-end // alignment) * alignment + n
            ends.append(end)
        rows = (end + 5,)  # rows past the last block too
        meta = torch.tensor(ends, dtype=i32, device=DEVICE)
    kb = -(-Kd // 128)
    a = randn(rows + (Kd,), f32, g).to(fp8)
    b = randn((E, Bn, Kd), f32, g).to(fp8)
    a_scale = {"block": lambda: uniform(rows + (kb,), g, 0.25, 1.75),
               "per_channel": lambda: uniform(rows, g, 0.25, 1.75),
               "per_tensor": lambda: uniform((1,), g, 0.25, 1.75)}[scales]()  # fmt: skip
    b_scale = {"block": lambda: uniform((E, -(-Bn // 128), kb), g, 0.25, 1.75),
               "per_channel": lambda: uniform((E, Bn), g, 0.25, 1.75),
               "per_tensor": lambda: uniform((E,), g, 0.25, 1.75)}[scales]() / math.sqrt(Kd)
    c_scale = None
    if fp8_out:  # outputs O(1) (O(a few) with silu_and_mul) into e4m3's range
        c_scale = torch.tensor([1 / 16 if activation == "silu_and_mul" else 1 / 64],
                               device=DEVICE)  # fmt: skip
    kw = dict(masked=masked, alignment=1 if masked else alignment, scales=scales,
              activation=activation, c_scale=c_scale)  # fmt: skip
    c = ops.moe_grouped_gemm_fp8(a, a_scale, b, b_scale, meta, **kw)
    assert c.shape == rows + (N,) and c.dtype == (fp8 if fp8_out else bf16)
    expected, valid = ref.moe_grouped_gemm_fp8(a, a_scale, b, b_scale, meta, **kw)
    ref.assert_close(c[valid].float(), expected[valid].float(), ACC["fp8"],
                     f"moe_grouped_gemm_fp8 {kw}")  # fmt: skip


# ---------------------------------------------------------------- MoEExpertMLPFwd


@pytest.mark.parametrize("dtype", [bf16, f16])
@pytest.mark.parametrize("E,H,F,A,total", [(8, 256, 128, 1, 300), (4, 512, 96, 16, 77),
                                           (16, 128, 64, 1, 1)])  # fmt: skip
def test_moe_expert_mlp(dtype, E, H, F, A, total):
    g = gen(7000 + E + H + F)
    counts = random_counts(E, total, g)
    _, ends = ref.layout_ends(counts, A)
    P = total + E * (A - 1)
    x = randn((P, H), dtype, g)
    w13, w2 = weights(E, F, H, dtype, g)
    meta = torch.tensor(ends, dtype=i32, device=DEVICE)
    out = ops.moe_expert_mlp(x, meta, w13, w2, A)
    assert out.shape == (P, H) and out.dtype == dtype
    expected, valid = ref.moe_expert_mlp(x, meta, w13, w2, A)
    ref.assert_close(out[valid], expected[valid], ACC[dtype], "moe_expert_mlp")


# ---------------------------------------------------------------- experts / indexed


@pytest.mark.parametrize("op", ["fused_moe_experts", "indexed_expert_mlp"])
@pytest.mark.parametrize("dtype", [bf16, f16])
@pytest.mark.parametrize("T,E,K,H,F,kind", [
    (1, 16, 4, 256, 96, "distinct"), (5, 16, 4, 256, 96, "distinct"),
    (64, 8, 2, 512, 128, "distinct"), (130, 16, 4, 256, 96, "neg"),
    (33, 16, 4, 256, 96, "one_expert"), (20, 8, 8, 128, 64, "dups"),
    (0, 8, 2, 128, 64, "distinct")])  # fmt: skip
def test_routed_experts(op, dtype, T, E, K, H, F, kind):
    g = gen(8000 + T + E + K)
    x = randn((T, H), dtype, g)
    w13, w2 = weights(E, F, H, dtype, g)
    ids = topk_ids(T, E, K, g, kind)
    w = uniform((T, K), g)
    out = getattr(ops, op)(x, w13, w2, w, ids)
    assert out.shape == (T, H) and out.dtype == dtype
    if T:
        expected = ref.fused_moe_experts(x, w13, w2, w, ids)
        ref.assert_close(out, expected, ACC[dtype], op)


# ---------------------------------------------------------------- engine arguments
# expert_map, int64 ids and apply_router_weight_on_input (docs/moe.md, "Engine inputs"):
# against the references, and bit for bit against the same op on the inputs an engine
# would prepare by hand (gathered local int32 ids; scaled rows and unit weights).


def expert_map(G, E, g, kind="shuffled"):
    """[G] int32: E of the G global experts on this rank (local ids 0..E-1), the others -1;
    "remote": none here."""
    m = torch.full((G,), -1, dtype=i32, device=DEVICE)
    if kind == "shuffled":
        m[uniform((G,), g).argsort()[:E]] = torch.arange(E, dtype=i32, device=DEVICE)
    return m


@pytest.mark.parametrize("op", ["fused_moe_experts", "indexed_expert_mlp"])
@pytest.mark.parametrize(
    "T,E,G,K,kind,ids64,map_kind",
    [
        (1, 8, 32, 4, "distinct", False, "shuffled"),
        (37, 16, 64, 8, "neg", True, "shuffled"),
        (64, 8, 32, 2, "dups", False, "remote"),
        (200, 16, 64, 8, "distinct", True, "shuffled"),
        (300, 16, 64, 4, "neg", False, "remote"),
        (0, 8, 32, 2, "distinct", True, "shuffled"),
    ],
)
def test_routed_experts_expert_map_and_int64_ids(op, T, E, G, K, kind, ids64, map_kind):
    g = gen(8500 + T + G)
    x = randn((T, 256), bf16, g)
    w13, w2 = weights(E, 96, 256, bf16, g)
    ids = topk_ids(T, G, K, g, kind)  # global ids
    emap = expert_map(G, E, g, map_kind)
    w = uniform((T, K), g)
    given = ids.long() if ids64 else ids
    out = getattr(ops, op)(x, w13, w2, w, given, expert_map=emap)
    assert out.shape == (T, 256) and out.dtype == bf16
    if not T:
        return
    ref.assert_close(out, ref.fused_moe_experts(x, w13, w2, w, ids, expert_map=emap), ACC[bf16], op)
    local = ref.local_ids(ids, emap, E).to(i32)
    assert torch.equal(out, getattr(ops, op)(x, w13, w2, w, local))
    if map_kind == "remote":
        assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("op", ["fused_moe_experts", "indexed_expert_mlp"])
@pytest.mark.parametrize("T", [1, 40, 250])
@pytest.mark.parametrize("dtype", [bf16, f16])
def test_routed_experts_router_weight_on_input(op, T, dtype):
    g = gen(8600 + T)
    x = randn((T, 256), dtype, g)
    w13, w2 = weights(16, 96, 256, dtype, g)
    ids = topk_ids(T, 16, 1, g, "neg")
    w = uniform((T, 1), g)
    out = getattr(ops, op)(x, w13, w2, w, ids, apply_router_weight_on_input=True)
    want = ref.fused_moe_experts(x, w13, w2, w, ids, apply_router_weight_on_input=True)
    ref.assert_close(out, want, ACC[dtype], op)
    xs = x * w.to(dtype)  # vLLM's scaling, bit for bit
    assert torch.equal(out, getattr(ops, op)(xs, w13, w2, torch.ones_like(w), ids))
    if SELFCHECK:  # the references validate nothing
        return
    with pytest.raises(moekit.MoekitError, match=r"argument 'apply_router_weight_on_input'"):
        getattr(ops, op)(x, w13, w2, w.expand(T, 2).contiguous(), ids.expand(T, 2).contiguous(),
                         apply_router_weight_on_input=True)  # fmt: skip


@pytest.mark.parametrize("T", [1, 37, 200])
@pytest.mark.parametrize("shared", [False, True])
def test_layers_with_expert_map(T, shared):
    G, E = 64, 16
    x, _, w13, w2, sh, p = _layer_inputs(T, bf16, "softmax", 9100 + T, E=E, S=128)
    g = gen(9150 + T)
    logits = randn((T, G), f32, g)
    emap = expert_map(G, E, g)
    if shared:
        out = ops.fused_moe_shared_expert(x, logits, w13, w2, *sh, **p, expert_map=emap)
        want = ref.fused_moe_shared_expert(x, logits, w13, w2, *sh, **p, expert_map=emap)
    else:
        out = ops.fused_moe(x, logits, w13, w2, **p, expert_map=emap)
        want = ref.fused_moe(x, logits, w13, w2, **p, expert_map=emap)
    ref.assert_close(out, want, ACC[bf16], "layer with expert_map")
    p1 = dict(top_k=1)
    out = ops.fused_moe(x, logits, w13, w2, **p1, expert_map=emap,
                        apply_router_weight_on_input=True)  # fmt: skip
    want = ref.fused_moe(x, logits, w13, w2, **p1, expert_map=emap,
                         apply_router_weight_on_input=True)  # fmt: skip
    ref.assert_close(out, want, ACC[bf16], "layer with apply_router_weight_on_input")


@pytest.mark.parametrize("T,K,E,G,bs", [(40, 4, 8, 32, 16), (9000, 8, 32, 256, 64)])
def test_moe_permute_align_expert_map(T, K, E, G, bs):
    g = gen(9200 + T)
    ids = topk_ids(T, G, K, g, "neg")
    emap = expert_map(G, E, g)
    local = ref.local_ids(ids, emap, E).to(i32)
    want = ops.moe_permute_align(local, E, bs)
    for given in (ids, ids.long()):
        got = ops.moe_permute_align(given, E, bs, expert_map=emap)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    ref_sorted, ref_blocks = ref.moe_permute_align(local.cpu(), E, bs)
    n = int(want[2].item())
    assert n == len(ref_sorted) and want[0][:n].tolist() == ref_sorted


@pytest.mark.parametrize("T", [50, 3000])
def test_moe_pre_permute_int64_ids(T):
    g = gen(9300 + T)
    x = randn((T, 128), bf16, g)
    ids = topk_ids(T, 32, 4, g, "neg")
    a = ops.moe_pre_permute(x, ids, 32, 8)
    b = ops.moe_pre_permute(x, ids.long(), 32, 8)
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    rows = a[2][a[2] >= 0].long()
    assert torch.equal(a[0][rows], b[0][rows])


# ---------------------------------------------------------------- whole layers

ROUTING = {
    "softmax": dict(top_k=4, renormalize=True),
    "grouped_bias": dict(top_k=4, renormalize=True, scoring_func="sigmoid", num_expert_group=4,
                         topk_group=2, routed_scaling_factor=2.5),  # fmt: skip
}


def _layer_inputs(T, dtype, routing, seed, E=16, H=256, F=96, S=0):
    g = gen(seed)
    x = randn((T, H), dtype, g)
    logits = randn((T, E), f32, g)
    w13, w2 = weights(E, F, H, dtype, g)
    params = dict(ROUTING[routing])
    if routing == "grouped_bias":
        params["correction_bias"] = randn((E,), f32, g, 0.1)
    shared = weights(1, S, H, dtype, g) if S else None
    if shared:
        shared = (shared[0][0].contiguous(), shared[1][0].contiguous())
    return x, logits, w13, w2, shared, params


@pytest.mark.parametrize("routing", ["softmax", "grouped_bias"])
@pytest.mark.parametrize("dtype", [bf16, f16])
@pytest.mark.parametrize("T", [1, 37, 128])
def test_fused_moe(routing, dtype, T):
    x, logits, w13, w2, _, p = _layer_inputs(T, dtype, routing, 9000 + T)
    out = ops.fused_moe(x, logits, w13, w2, **p)
    assert out.shape == x.shape and out.dtype == dtype
    ref.assert_close(out, ref.fused_moe(x, logits, w13, w2, **p), ACC[dtype], "fused_moe")


@pytest.mark.parametrize("routing", ["softmax", "grouped_bias"])
@pytest.mark.parametrize("dtype", [bf16, f16])
@pytest.mark.parametrize("T", [1, 64])
def test_fused_moe_shared_expert(routing, dtype, T):
    x, logits, w13, w2, (s13, s2), p = _layer_inputs(T, dtype, routing, 9500 + T, S=128)
    out = ops.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p)
    assert out.shape == x.shape and out.dtype == dtype
    expected = ref.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p)
    ref.assert_close(out, expected, ACC[dtype], "fused_moe_shared_expert")


@pytest.mark.parametrize("dtype", [bf16, f16])
@pytest.mark.parametrize("T", [1, 33, 256, 0])
def test_shared_expert_mlp(dtype, T):
    H, S = 256, 192
    g = gen(9900 + T)
    x = randn((T, H), dtype, g)
    w13, w2 = weights(1, S, H, dtype, g)
    w13, w2 = w13[0].contiguous(), w2[0].contiguous()
    out = ops.shared_expert_mlp(x, w13, w2)
    assert out.shape == (T, H) and out.dtype == dtype
    if T:
        ref.assert_close(out, ref.shared_expert_mlp(x, w13, w2), ACC[dtype], "shared_expert_mlp")


# ---------------------------------------------------------------- activations and biases

ACTIVATIONS = ["silu", "gelu", "gelu_tanh", "relu2", "swigluoai"]


def act_weights(E, F, H, dtype, g, activation, biases):
    """w_gate_up [E, 2F, H] ([E, F, H] for relu2), w_down [E, H, F] and, with biases,
    gate_up_bias [E, rows] f32 and down_bias [E, H] in the dtype (both accepted)."""
    w13, w2 = weights(E, F, H, dtype, g)
    if activation == "relu2":
        w13 = w13[:, :F].contiguous()
    if not biases:
        return w13, w2, None, None
    return w13, w2, randn(w13.shape[:2], f32, g, 0.5), randn((E, H), dtype, g, 0.5)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("biases", [False, True])
@pytest.mark.parametrize("op", ["fused_moe_experts", "indexed_expert_mlp"])
@pytest.mark.parametrize("T,E,K,H,F,kind", [(1, 16, 4, 256, 96, "distinct"),
                                            (130, 16, 4, 264, 104, "neg"),
                                            (33, 8, 2, 128, 64, "one_expert"),
                                            (0, 8, 2, 128, 64, "distinct")])  # fmt: skip
def test_routed_experts_activations(activation, biases, op, T, E, K, H, F, kind):
    dtype = bf16
    g = gen(8500 + T + E + K + H)
    x = randn((T, H), dtype, g)
    w13, w2, b13, b2 = act_weights(E, F, H, dtype, g, activation, biases)
    ids = topk_ids(T, E, K, g, kind)
    w = uniform((T, K), g)
    out = getattr(ops, op)(x, w13, w2, w, ids, activation, b13, b2)
    assert out.shape == (T, H) and out.dtype == dtype
    if T:
        expected = ref.fused_moe_experts(x, w13, w2, w, ids, activation, b13, b2)
        ref.assert_close(out, expected, ACC[dtype], f"{op} {activation}")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [bf16, f16])
def test_moe_expert_mlp_activations(activation, dtype):
    E, H, F, A, total = 6, 136, 72, 8, 150
    g = gen(7100 + len(activation))
    counts = random_counts(E, total, g)
    _, ends = ref.layout_ends(counts, A)
    P = total + E * (A - 1)
    x = randn((P, H), dtype, g)
    w13, w2, b13, b2 = act_weights(E, F, H, dtype, g, activation, True)
    meta = torch.tensor(ends, dtype=i32, device=DEVICE)
    out = ops.moe_expert_mlp(x, meta, w13, w2, A, activation, b13, b2)
    expected, valid = ref.moe_expert_mlp(x, meta, w13, w2, A, activation, b13, b2)
    ref.assert_close(out[valid], expected[valid], ACC[dtype], f"moe_expert_mlp {activation}")


@pytest.mark.parametrize("activation", ["gelu", "relu2", "swigluoai"])
@pytest.mark.parametrize("T", [1, 64])
def test_layers_with_activations(activation, T):
    dtype, S = bf16, 128
    x, logits, _, _, _, p = _layer_inputs(T, dtype, "softmax", 9700 + T)
    g = gen(9701 + T)
    w13, w2, b13, b2 = act_weights(16, 96, 256, dtype, g, activation, True)
    s13, s2, sb13, sb2 = act_weights(1, S, 256, dtype, g, activation, True)
    s13, s2, sb13, sb2 = s13[0], s2[0], sb13[0], sb2[0]
    out = ops.fused_moe(x, logits, w13, w2, **p, activation=activation, gate_up_bias=b13,
                        down_bias=b2)  # fmt: skip
    expected = ref.fused_moe(x, logits, w13, w2, **p, activation=activation, gate_up_bias=b13,
                             down_bias=b2)  # fmt: skip
    ref.assert_close(out, expected, ACC[dtype], f"fused_moe {activation}")
    out = ops.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p, activation=activation,
                                      gate_up_bias=b13, down_bias=b2, shared_gate_up_bias=sb13,
                                      shared_down_bias=sb2)  # fmt: skip
    expected = ref.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p,
                                           activation=activation, gate_up_bias=b13,
                                           down_bias=b2, shared_gate_up_bias=sb13,
                                           shared_down_bias=sb2)  # fmt: skip
    ref.assert_close(out, expected, ACC[dtype], f"fused_moe_shared_expert {activation}")
    dense = ops.shared_expert_mlp(x, s13, s2, activation, sb13, sb2)
    ref.assert_close(dense, ref.shared_expert_mlp(x, s13, s2, activation, sb13, sb2), ACC[dtype],
                     f"shared_expert_mlp {activation}")  # fmt: skip


# ---------------------------------------------------------------- graphs, compile, paths


@requires_real_gpu
@pytest.mark.parametrize("fast_path", [True, False])
def test_cuda_graph_fused_moe_shared_expert(fast_path):
    """Capture the whole fused MoE layer (routing, routed experts, shared expert) in a
    CUDA graph, then replay it on new inputs copied into the captured tensors."""
    T, dtype = 48, bf16
    x, logits, w13, w2, (s13, s2), p = _layer_inputs(T, dtype, "grouped_bias", 11, S=128)
    old = moekit.ops.set_eager_fast_path(fast_path)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the capture
            for _ in range(2):
                moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        moekit.ops.release_workspaces()
        with torch.cuda.graph(graph):
            out = moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p)
        # The capture took its workspace from the graph's pool, never from the cache.
        assert moekit.ops._ws_cache == {}
    finally:
        moekit.ops.set_eager_fast_path(old)
    g = gen(12)
    for _ in range(3):
        x.copy_(randn(x.shape, dtype, g))
        logits.copy_(randn(logits.shape, f32, g))
        graph.replay()
        torch.cuda.synchronize()
        expected = ref.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p)
        ref.assert_close(out, expected, ACC[dtype], "graph replay")
        first = out.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first), "replays differ"


@requires_real_gpu
def test_stream_capturing_check():
    """The extension's capture check (moekit.raw._stream_capturing, what the eager fast
    path asks before it uses a cached workspace) agrees with torch's."""
    check = moekit.raw._stream_capturing
    assert not check(torch.cuda.current_stream().cuda_stream)
    assert not check(0)
    x = torch.zeros(8, device=DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    seen = []
    with torch.cuda.graph(graph):
        seen.append(check(torch.cuda.current_stream().cuda_stream))
        seen.append(torch.cuda.is_current_stream_capturing())
        x.add_(1)
    assert seen == [True, True]
    assert not check(torch.cuda.current_stream().cuda_stream)


@requires_real_gpu
def test_launch_context():
    """moekit.raw._launch_ctx (one C call for the eager path's device and stream) gives
    what the Python version (get_device, torch's current device and current stream)
    gives: on the default stream, a side stream, during capture; None for a CPU tensor
    and for a tensor on another GPU than the current one."""
    o = moekit.ops
    x = torch.zeros(4, device=DEVICE)

    def expected():
        return (torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)

    assert o._launch_ctx(x) == o._launch_ctx_py(x) == expected()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert o._launch_ctx(x) == o._launch_ctx_py(x) == expected()
        assert o._launch_ctx(x)[1] == side.cuda_stream
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seen = (o._launch_ctx(x), o._launch_ctx_py(x), expected())
        x.add_(1)
    assert seen[0] == seen[1] == seen[2]
    assert o._launch_ctx(x.cpu()) is None
    if torch.cuda.device_count() > 1:
        y = torch.zeros(4, device="cuda:1")
        assert o._launch_ctx(y) is None and o._launch_ctx_py(y) is None
        with torch.cuda.device(1):
            assert o._launch_ctx(y) == o._launch_ctx_py(y) == expected()
            assert o._launch_ctx(x) is None


def _layer(x, logits, w13, w2, s13, s2):
    y = moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, 4, True, "sigmoid", 4, 2,
                                       2.5)  # fmt: skip
    return y * 0.5 + x


@requires_real_gpu
def test_torch_compile_fullgraph():
    args = _layer_inputs(64, bf16, "softmax", 13, S=128)
    x, logits, w13, w2, (s13, s2), _ = args
    eager = _layer(x, logits, w13, w2, s13, s2)
    torch._dynamo.reset()
    compiled = torch.compile(_layer, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, logits, w13, w2, s13, s2), eager)
    # New shapes: dynamic shapes flow through the fake implementation.
    x2, logits2 = x[:17].contiguous(), logits[:17].contiguous()
    assert torch.equal(compiled(x2, logits2, w13, w2, s13, s2), _layer(x2, logits2, w13, w2, s13,
                                                                        s2))  # fmt: skip


@requires_real_gpu
def test_torch_compile_inductor_cudagraphs():
    x, logits, w13, w2, (s13, s2), _ = _layer_inputs(32, bf16, "softmax", 14, S=128)
    eager = _layer(x, logits, w13, w2, s13, s2)
    torch._dynamo.reset()
    compiled = torch.compile(_layer, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # the third call replays the captured graph
        out = compiled(x, logits, w13, w2, s13, s2).clone()
    torch.testing.assert_close(out, eager, rtol=1.6e-2, atol=1e-2)


@requires_real_gpu
@pytest.mark.parametrize("name", ["fused_topk", "moe_grouped_gemm", "moe_pre_permute",
                                  "fused_moe", "shared_expert_mlp"])  # fmt: skip
def test_opcheck(name):
    g = gen(15)
    T, E, H, F = 24, 8, 128, 64
    x = randn((T, H), bf16, g)
    logits = randn((T, E), f32, g)
    w13, w2 = weights(E, F, H, bf16, g)
    args = {
        "fused_topk": (logits, 2, True),
        # All rows belong to an expert (no uninitialized padding to compare).
        "moe_grouped_gemm": (x, w13, torch.tensor([3, 3, 10, 11, 15, 20, 22, 24], dtype=i32,
                                                  device=DEVICE)),  # fmt: skip
        "moe_pre_permute": (x, topk_ids(T, E, 2, g), E),
        "fused_moe": (x, logits, w13, w2, 2, True),
        "shared_expert_mlp": (x, w13[0].contiguous(), w2[0].contiguous()),
    }[name]
    torch.library.opcheck(getattr(torch.ops.moekit, name).default, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))  # fmt: skip


@requires_real_gpu
def test_paths_agree_and_are_deterministic():
    x, logits, w13, w2, (s13, s2), p = _layer_inputs(40, bf16, "grouped_bias", 16, S=128)
    a = moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p)
    b = torch.ops.moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p)
    old = moekit.ops.set_eager_fast_path(False)
    try:
        c = moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p)
    finally:
        moekit.ops.set_eager_fast_path(old)
    assert torch.equal(a, b) and torch.equal(a, c)


@requires_real_gpu
@pytest.mark.parametrize("fast_path", [True, False])
def test_shared_expert_op_without_shared_weights_is_the_routed_layer(fast_path):
    x, logits, w13, w2, _, p = _layer_inputs(40, bf16, "grouped_bias", 20, S=128)
    old = moekit.ops.set_eager_fast_path(fast_path)
    try:
        a = moekit.fused_moe_shared_expert(x, logits, w13, w2, None, None, **p)
        b = moekit.fused_moe(x, logits, w13, w2, **p)
    finally:
        moekit.ops.set_eager_fast_path(old)
    assert torch.equal(a, b)


@requires_real_gpu
def test_workspace_cache_serves_many_shapes_and_streams():
    """The cached workspace grows with the shapes, per stream; results never depend on
    what an earlier call left in it."""
    x, logits, w13, w2, (s13, s2), p = _layer_inputs(200, bf16, "softmax", 21, S=128)
    moekit.ops.release_workspaces()
    expected = {T: moekit.fused_moe_shared_expert(x[:T], logits[:T], w13, w2, s13, s2, **p)
                for T in (1, 7, 64, 200)}  # fmt: skip
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for T in (200, 1, 64, 7):
        with torch.cuda.stream(side):
            got_side = moekit.fused_moe_shared_expert(x[:T], logits[:T], w13, w2, s13, s2, **p)
        got = moekit.fused_moe_shared_expert(x[:T], logits[:T], w13, w2, s13, s2, **p)
        torch.cuda.synchronize()
        assert torch.equal(got, expected[T]) and torch.equal(got_side, expected[T]), T
    assert len(moekit.ops._ws_cache) >= 2


def _eager_calls(T=4, E=16, K=4, H=256, F=128, S=128):
    """Eager calls of eleven ops (all but the FP8 GEMM) on small CUDA inputs: a list of
    (op name, first tensor, call)."""
    x, logits, w13, w2, (s13, s2), _ = _layer_inputs(T, bf16, "softmax", 31, E, H, F, S)
    w, ids = moekit.fused_topk(logits, K, True)
    permuted, meta, inv = moekit.moe_pre_permute(x, ids, E)
    return [
        ("fused_topk", logits, lambda: moekit.fused_topk(logits, K, True)),
        ("moe_permute_align", ids, lambda: moekit.moe_permute_align(ids, E)),
        ("moe_pre_permute", x, lambda: moekit.moe_pre_permute(x, ids, E)),
        ("moe_post_permute", permuted, lambda: moekit.moe_post_permute(permuted, w, inv)),
        ("moe_grouped_gemm", permuted, lambda: moekit.moe_grouped_gemm(permuted, w13, meta)),
        ("moe_expert_mlp", permuted, lambda: moekit.moe_expert_mlp(permuted, meta, w13, w2)),
        ("fused_moe_experts", x, lambda: moekit.fused_moe_experts(x, w13, w2, w, ids)),
        ("indexed_expert_mlp", x, lambda: moekit.indexed_expert_mlp(x, w13, w2, w, ids)),
        ("fused_moe", x, lambda: moekit.fused_moe(x, logits, w13, w2, K, True)),
        ("fused_moe_shared_expert", x,
         lambda: moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, K, True)),
        ("shared_expert_mlp", x, lambda: moekit.shared_expert_mlp(x, s13, s2)),
    ]  # fmt: skip


@requires_real_gpu
@pytest.mark.parametrize("side_stream", [False, True])
def test_eager_fast_path_end_to_end(monkeypatch, side_stream):
    """In plain eager mode, for CUDA tensors on the current device and the current stream
    (the default one, or a side stream), every op takes the fast path end to end: the
    launch context from the extension's C path (not its Python fallback, not None, which
    would send every call through _elsewhere and torch.cuda.device), equal to the Python
    version; after two warm-up calls no call through _elsewhere or the dispatcher, no
    fused_topk prototype miss, no workspace allocation. A silent slow-path regression
    passes every correctness test; this one fails."""
    o = moekit.ops
    monkeypatch.setattr(o, "_fast_path", True)
    monkeypatch.setattr(o, "_ws_cache_on", True)
    # Without torch's DLPack exchange API (torch < 2.9, MOEKIT_DLPACK_EXCHANGE=0) the
    # launch context is the Python version by design.
    c_ctx = moekit.raw._tensor_protocol() == "dlpack-exchange"
    counts = {}

    def counting(key, fn):
        def wrapper(*args, **kwargs):
            counts[key] = counts.get(key, 0) + 1
            return fn(*args, **kwargs)

        return wrapper

    calls = _eager_calls()
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        expected = (torch.cuda.current_device(), stream.cuda_stream)
        for _, first, call in calls:  # warm up: prototypes, workspace growth
            call()
            call()
        for name in {name for name, _, _ in calls}:
            monkeypatch.setattr(o, "_op_" + name, counting("dispatcher:" + name,
                                                           getattr(o, "_op_" + name)))
        monkeypatch.setattr(o, "_elsewhere", counting("_elsewhere", o._elsewhere))
        monkeypatch.setattr(o, "_topk_outputs", counting("topk prototype miss", o._topk_outputs))
        monkeypatch.setattr(o, "_workspace", counting("workspace allocation", o._workspace))
        if c_ctx:
            moekit.raw._set_launch_ctx_fallback(counting("launch ctx fallback", o._launch_ctx_py))
        try:
            for name, first, call in calls:
                assert o._eager(first), name
                ctx = o._launch_ctx(first)
                assert counts == {}, f"{name}: the launch context took {counts}"
                assert ctx == o._launch_ctx_py(first) == expected, name
                assert not o._is_capturing(ctx[1]), name
                counts.clear()
                out = call()
                out = call()
                assert counts == {}, f"{name}: the eager call took a slow path: {counts}"
                assert out is not None
            assert o._ws(expected, calls[0][1])[4], "the workspace entry is not the cached one"
        finally:
            moekit.raw._set_launch_ctx_fallback(o._launch_ctx_py)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


@requires_real_gpu
def test_dispatcher_calls_never_use_the_workspace_cache():
    """torch.ops.moekit.* (what compiled graphs call) allocates its workspace per call:
    a cached buffer from a CUDA-graph tree's private pool would outlive the graph."""
    x, logits, w13, w2, (s13, s2), p = _layer_inputs(24, bf16, "softmax", 22, S=128)
    moekit.ops.release_workspaces()
    got = torch.ops.moekit.fused_moe_shared_expert.default(x, logits, w13, w2, s13, s2, **p)
    assert len(moekit.ops._ws_cache) == 0
    old = moekit.ops.set_eager_fast_path(True)
    try:
        eager = moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p)
    finally:
        moekit.ops.set_eager_fast_path(old)
    assert len(moekit.ops._ws_cache) == 1
    assert torch.equal(got, eager)


@requires_real_gpu
def test_runs_on_the_current_stream():
    H, S = 256, 128
    g = gen(17)
    x = randn((64, H), bf16, g)
    w13, w2 = weights(1, S, H, bf16, g)
    w13, w2 = w13[0].contiguous(), w2[0].contiguous()
    x2 = torch.full_like(x, float("nan"))
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        # x2 gets its values only after a long sleep on this stream: an op launched on
        # any other stream would read the NaNs.
        torch.cuda._sleep(50_000_000)
        x2.copy_(x)
        out = moekit.shared_expert_mlp(x2, w13, w2)
        done = torch.cuda.Event()
        done.record(stream)
    torch.cuda.current_stream().wait_event(done)
    ref.assert_close(out, ref.shared_expert_mlp(x, w13, w2), ACC[bf16], "on a side stream")


@requires_real_gpu
@pytest.mark.parametrize("fast_path", [True, False])
def test_bad_input_raises_moekit_error(fast_path):
    T, E = 8, 8
    x, logits, w13, w2, _, _ = _layer_inputs(T, bf16, "softmax", 18, E=E, H=128, F=64)
    old = moekit.ops.set_eager_fast_path(fast_path)
    try:
        with pytest.raises(moekit.MoekitError, match=r"moekit::fused_moe: argument 'gating_output'"):
            moekit.fused_moe(x, logits[:5], w13, w2, 2)
        with pytest.raises(ValueError, match=r"argument 'w_down'.*contiguous"):
            moekit.fused_moe(x, logits, w13, w2.transpose(1, 2).contiguous().transpose(1, 2), 2)
        with pytest.raises(moekit.MoekitError, match=r"argument 'topk_ids'.*torch.int16"):
            moekit.fused_moe_experts(x, w13, w2, torch.ones(T, 2, device=DEVICE),
                                     torch.zeros(T, 2, dtype=torch.int16, device=DEVICE))
        with pytest.raises(moekit.MoekitError, match=r"argument 'w_down'.*CUDA tensor"):
            moekit.fused_moe(x, logits, w13, w2.cpu(), 2)
        with pytest.raises(moekit.MoekitError, match=r"argument 'scoring_func'"):
            moekit.fused_topk(logits, 2, scoring_func="tanh")
        with pytest.raises(moekit.MoekitError, match=r"moekit::fused_topk: argument 'top_k'"):
            moekit.fused_topk(logits, E + 1)
    finally:
        moekit.ops.set_eager_fast_path(old)


@requires_real_gpu
def test_raw_binding_takes_dlpack_tensors():
    g = gen(19)
    T, E, K = 33, 64, 4
    logits = randn((T, E), bf16, g)
    w = torch.empty(T, K, dtype=f32, device=DEVICE)
    ids = torch.empty(T, K, dtype=i32, device=DEVICE)
    stream = torch.cuda.current_stream().cuda_stream
    moekit.raw.fused_topk(logits, None, w, ids, K, True, "softmax", 0, 0, 1.0, stream)
    w2, ids2 = moekit.fused_topk(logits, K, True)
    assert torch.equal(w, w2) and torch.equal(ids, ids2)
    with pytest.raises(moekit.MoekitError, match=r"argument 'gating_output'.*contiguous"):
        moekit.raw.fused_topk(logits.t(), None, w, ids, K, True, "softmax", 0, 0, 1.0, stream)


# ---------------------------------------------------------------- out=


def _out_cases():
    """One call of each op whose outputs it writes whole (no padding rows): case ->
    (op name, args, kwargs, trim), trim(outputs) giving what the op specifies (entries of
    moe_permute_align past num_tokens_post_padded are not)."""
    g = gen(41)
    T, E, K, H, F = 24, 8, 2, 128, 64
    x, logits = randn((T, H), bf16, g), randn((T, E), f32, g)
    w13, w2 = weights(E, F, H, bf16, g)
    s13, s2 = w13[1].contiguous(), w2[1].contiguous()
    ids, w = topk_ids(T, E, K, g), uniform((T, K), g)  # distinct valid ids: every row used
    permuted, ends, inv = moekit.moe_pre_permute(x, ids, E)
    masked_counts = torch.full((E,), 16, dtype=i32, device=DEVICE)
    fp8 = torch.float8_e4m3fn
    a8, b8 = randn((E, 16, 256), f32, g).to(fp8), randn((E, 256, 256), f32, g).to(fp8)
    a8s, b8s = uniform((E, 16, 2), g, 0.25, 1.75), uniform((E, 2, 2), g, 0.25, 1.75) / 16

    def whole(outs):
        return outs

    def aligned(outs):
        n = int(outs[2].item())
        return outs[0][:n], outs[1][: n // 16], outs[2]

    return {
        "fused_topk": ("fused_topk", (logits, K, True, "sigmoid", 4, 2, 2.5), {}, whole),
        "moe_permute_align": ("moe_permute_align", (ids, E, 16), {}, aligned),
        "moe_pre_permute": ("moe_pre_permute", (x, ids, E), {}, whole),
        "moe_post_permute": ("moe_post_permute", (permuted, w, inv), {}, whole),
        "moe_post_permute-f32": ("moe_post_permute", (permuted, w, inv, f32), {}, whole),
        "moe_grouped_gemm": ("moe_grouped_gemm", (permuted, w13, ends), {}, whole),
        "moe_grouped_gemm-silu-f32": ("moe_grouped_gemm", (permuted, w13, ends),
                                      dict(activation="silu_and_mul", out_dtype=f32), whole),
        "moe_grouped_gemm-masked": ("moe_grouped_gemm", (randn((E, 16, H), bf16, g), w13,
                                                         masked_counts, True), {}, whole),
        "moe_grouped_gemm_fp8": ("moe_grouped_gemm_fp8", (a8, a8s, b8, b8s, masked_counts), {},
                                 whole),
        "moe_expert_mlp": ("moe_expert_mlp", (permuted, ends, w13, w2), {}, whole),
        "fused_moe_experts": ("fused_moe_experts", (x, w13, w2, w, ids), {}, whole),
        "indexed_expert_mlp": ("indexed_expert_mlp", (x, w13, w2, w, ids), {}, whole),
        "fused_moe": ("fused_moe", (x, logits, w13, w2, K, True), {}, whole),
        "fused_moe_shared_expert": ("fused_moe_shared_expert",
                                    (x, logits, w13, w2, s13, s2, K, True), {}, whole),
        "shared_expert_mlp": ("shared_expert_mlp", (x, s13, s2), {}, whole),
    }  # fmt: skip


_OUT_CASES = ["fused_topk", "moe_permute_align", "moe_pre_permute", "moe_post_permute",
              "moe_post_permute-f32", "moe_grouped_gemm", "moe_grouped_gemm-silu-f32",
              "moe_grouped_gemm-masked", "moe_grouped_gemm_fp8", "moe_expert_mlp",
              "fused_moe_experts", "indexed_expert_mlp", "fused_moe", "fused_moe_shared_expert",
              "shared_expert_mlp"]  # fmt: skip


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _poisoned_like(t):
    b = torch.empty_like(t)
    b.view(-1).view(torch.uint8).fill_(0xA5)  # no entry left as the op would write it
    return b


def _same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


@requires_real_gpu
@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("case", _OUT_CASES)
def test_out_equals_the_allocating_call_bit_for_bit(case, fast_path):
    """out= writes the caller's buffers (the returned tensors are the given ones, at the
    same addresses) with the allocating call's results, bit for bit; also through the out
    variant torch.ops.moekit.<name>_out."""
    name, args, kwargs, trim = _out_cases()[case]
    fn = getattr(moekit, name)
    old = moekit.ops.set_eager_fast_path(fast_path)
    try:
        expected = _tuple(fn(*args, **kwargs))
        bufs = tuple(_poisoned_like(e) for e in expected)
        ptrs = [b.data_ptr() for b in bufs]
        got = fn(*args, **kwargs, out=bufs[0] if len(bufs) == 1 else bufs)
        variant = tuple(_poisoned_like(e) for e in expected)
        outputs = moekit.ops._OPS[moekit.OPS.index(name)].outputs
        assert getattr(torch.ops.moekit, name + "_out")(*args, **kwargs,
                                                        **dict(zip(outputs, variant))) is None
    finally:
        moekit.ops.set_eager_fast_path(old)
    torch.cuda.synchronize()
    got = _tuple(got)
    assert len(got) == len(bufs) and all(a is b for a, b in zip(got, bufs))
    assert [t.data_ptr() for t in got] == ptrs
    for e, b, v in zip(trim(expected), trim(bufs), trim(variant)):
        assert _same_bits(e, b) and _same_bits(e, v), case


@requires_real_gpu
@pytest.mark.parametrize("fast_path", [True, False])
def test_out_keeps_the_callers_padding_rows_and_takes_empty_batches(fast_path):
    """out= on a padded layout (alignment 16) writes the experts' rows as the allocating call
    does and leaves every other row as the caller had it (moe_pre_permute's permuted rows,
    moe_grouped_gemm's and moe_expert_mlp's outputs); with T = 0 the layer ops and
    fused_topk take out= buffers of zero rows and return them."""
    g = gen(43)
    T, E, K, H, F, A = 20, 6, 2, 128, 64, 16
    x = randn((T, H), bf16, g)
    w13, w2 = weights(E, F, H, bf16, g)
    ids = topk_ids(T, E, K, g)
    old = moekit.ops.set_eager_fast_path(fast_path)
    try:
        permuted, ends, inv = moekit.moe_pre_permute(x, ids, E, A)
        valid = torch.zeros(permuted.shape[0], dtype=torch.bool, device=DEVICE)
        prev = 0
        for e in range(E):  # expert e's rows: [align_up(end_{e-1}, A), end_e)
            end = int(ends[e])
            valid[-(-prev // A) * A:end] = True
            prev = end
        assert (~valid).any()  # the case has padding rows

        def check(expected, buf):
            assert _same_bits(expected[valid], buf[valid])
            assert (buf[~valid].reshape(-1).view(torch.uint8) == 0xA5).all(), "padding written"

        bufs = (_poisoned_like(permuted), _poisoned_like(ends), _poisoned_like(inv))
        assert moekit.moe_pre_permute(x, ids, E, A, out=bufs)[0] is bufs[0]
        check(permuted, bufs[0])
        for name, args in (("moe_grouped_gemm", (permuted, w13, ends, False, A)),
                           ("moe_expert_mlp", (permuted, ends, w13, w2, A))):
            fn = getattr(moekit, name)
            expected = fn(*args)
            buf = _poisoned_like(expected)
            assert fn(*args, out=buf) is buf
            check(expected, buf)
        x0, logits0 = x[:0], randn((0, E), f32, g)
        for name, args in (("fused_moe", (x0, logits0, w13, w2, K, True)),
                           ("fused_moe_experts", (x0, w13, w2, uniform((0, K), g), ids[:0])),
                           ("shared_expert_mlp", (x0, w13[0], w2[0]))):
            buf = torch.empty((0, H), dtype=bf16, device=DEVICE)
            assert getattr(moekit, name)(*args, out=buf) is buf, name
        w0, ids0 = torch.empty((0, K), dtype=f32, device=DEVICE), ids[:0].clone()
        got = moekit.fused_topk(logits0, K, True, out=(w0, ids0))
        assert got[0] is w0 and got[1] is ids0
    finally:
        moekit.ops.set_eager_fast_path(old)


@requires_real_gpu
@pytest.mark.parametrize("fast_path", [True, False])
def test_out_in_place_layer(fast_path):
    """fused_moe(..., out=hidden_states) (allowed in place) equals the allocating call."""
    x, logits, w13, w2, (s13, s2), p = _layer_inputs(40, bf16, "grouped_bias", 42, S=128)
    old = moekit.ops.set_eager_fast_path(fast_path)
    try:
        for name, extra in (("fused_moe", ()), ("fused_moe_shared_expert", (s13, s2))):
            fn = getattr(moekit, name)
            xs = x.clone()
            expected = fn(xs, logits, w13, w2, *extra, **p)
            assert fn(xs, logits, w13, w2, *extra, **p, out=xs) is xs
            torch.cuda.synchronize()
            assert _same_bits(xs, expected), name
    finally:
        moekit.ops.set_eager_fast_path(old)


@requires_real_gpu
@pytest.mark.parametrize("fast_path", [True, False])
def test_out_rejects_bad_buffers_on_the_gpu(fast_path):
    name, args, kwargs, _ = _out_cases()["fused_topk"]
    w, ids = moekit.fused_topk(*args)
    old = moekit.ops.set_eager_fast_path(fast_path)
    try:
        with pytest.raises(moekit.MoekitError, match=r"moekit::fused_topk: argument 'out\[1\]' "
                                                     r"\(topk_ids\): expected .*\[24, 2\]"):
            moekit.fused_topk(*args, out=(w, ids[:12]))
        with pytest.raises(moekit.MoekitError, match=r"argument 'out\[0\]' \(topk_weights\): "
                                                     r"expected a CUDA tensor, got a tensor on "
                                                     r"cpu"):
            moekit.fused_topk(*args, out=(w.cpu(), ids))
        x = _out_cases()["shared_expert_mlp"][1][0]
        with pytest.raises(moekit.MoekitError, match=r"moekit::shared_expert_mlp: argument "
                                                     r"'out': expected memory disjoint"):
            moekit.shared_expert_mlp(x, *_out_cases()["shared_expert_mlp"][1][1:], out=x)
    finally:
        moekit.ops.set_eager_fast_path(old)


@requires_real_gpu
@pytest.mark.parametrize("case", ["fused_topk", "moe_pre_permute", "moe_grouped_gemm",
                                  "fused_moe", "shared_expert_mlp"])  # fmt: skip
def test_opcheck_out_variants(case):
    name, args, kwargs, _ = _out_cases()[case]
    outputs = moekit.ops._OPS[moekit.OPS.index(name)].outputs
    expected = _tuple(getattr(moekit, name)(*args, **kwargs))
    bufs = {o: _poisoned_like(e) for o, e in zip(outputs, expected)}
    torch.library.opcheck(getattr(torch.ops.moekit, name + "_out").default, args,
                          {**kwargs, **bufs},
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))  # fmt: skip


def _layer_into(x, logits, w13, w2, s13, s2, buf):
    moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, 4, True, "sigmoid", 4, 2, 2.5,
                                   out=buf)  # fmt: skip
    return buf * 0.5 + x


@requires_real_gpu
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_with_out(backend):
    """A compiled function writing the layer into a caller's buffer: the buffer holds the
    eager result bit for bit afterwards, and so does the function's result."""
    x, logits, w13, w2, (s13, s2), _ = _layer_inputs(64, bf16, "softmax", 43, S=128)
    eager_buf = torch.empty_like(x)
    eager = _layer_into(x, logits, w13, w2, s13, s2, eager_buf)
    torch._dynamo.reset()
    compiled = torch.compile(_layer_into, fullgraph=True, backend=backend)
    buf = _poisoned_like(x)
    got = compiled(x, logits, w13, w2, s13, s2, buf)
    torch.cuda.synchronize()
    assert _same_bits(buf, eager_buf)
    if backend == "aot_eager":
        assert _same_bits(got, eager)
    else:  # inductor fuses the epilogue: rounding may differ
        torch.testing.assert_close(got, eager, rtol=1.6e-2, atol=1e-2)


@requires_real_gpu
@pytest.mark.parametrize("fast_path", [True, False])
def test_cuda_graph_with_out(fast_path):
    """A CUDA graph writing the layer into a caller's static buffer (what an engine's
    graph runner does): replays on new inputs equal the allocating call bit for bit."""
    x, logits, w13, w2, (s13, s2), p = _layer_inputs(48, bf16, "grouped_bias", 44, S=128)
    buf = torch.empty_like(x)
    old = moekit.ops.set_eager_fast_path(fast_path)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the capture
            moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p, out=buf)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p, out=buf)
        assert got is buf
        g = gen(45)
        for _ in range(2):
            x.copy_(randn(x.shape, bf16, g))
            logits.copy_(randn(logits.shape, f32, g))
            buf.view(torch.uint8).fill_(0xA5)
            graph.replay()
            expected = moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, **p)
            torch.cuda.synchronize()
            assert _same_bits(buf, expected)
    finally:
        moekit.ops.set_eager_fast_path(old)
