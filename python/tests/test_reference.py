"""The PyTorch references themselves, on hand-computed cases (CPU; needs torch). The
GPU tests trust these, so they are checked against numbers worked out by hand."""

import math

import pytest

from mk_support import requires_torch, torch_skip_reason

pytestmark = requires_torch

if torch_skip_reason() is None:
    import torch

    import torch_reference as ref


def test_topk_softmax_renormalize():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    w, ids, _, _ = ref.fused_topk(logits, 2, renormalize=True)
    assert ids.tolist() == [[1, 2]]
    e = [math.exp(3.0), math.exp(2.0)]
    assert w[0].tolist() == pytest.approx([e[0] / sum(e), e[1] / sum(e)], rel=1e-6)


def test_topk_ties_go_to_the_lower_id_and_scale_applies():
    logits = torch.tensor([[0.5, 2.0, 2.0, 2.0]])
    w, ids, score, _ = ref.fused_topk(logits, 2, routed_scaling_factor=2.0)
    assert ids.tolist() == [[1, 2]]
    assert w[0].tolist() == pytest.approx((score[0, 1:3] * 2.0).tolist())


def test_topk_grouped_with_bias():
    # 8 experts in 4 groups of 2; with a bias a group scores the sum of its two best.
    logits = torch.zeros(1, 8)
    bias = torch.tensor([0.0, 0.0, 0.9, -0.5, 0.3, 0.3, 0.1, 0.0])
    w, ids, score, sel = ref.fused_topk(logits, 2, False, "sigmoid", 4, 2, 1.0, bias)
    # group sums: g0 = 1.0, g1 = 0.5+1.4-... (sel = 0.5 + bias): g0 1.0, g1 1.4, g2 1.6, g3 1.1
    # -> keep g2 (experts 4, 5) and g1 (2, 3); best sel: 2 (1.4), then 4 (0.8, lower id).
    assert ids.tolist() == [[2, 4]]
    assert w[0].tolist() == pytest.approx([0.5, 0.5])  # unbiased sigmoid(0)
    assert torch.isinf(sel[0, [0, 1, 6, 7]]).all()


def test_topk_grouped_without_bias_uses_the_group_max():
    logits = torch.tensor([[5.0, -9.0, 4.0, 4.0, 0.0, 0.0]])
    _, ids, _, _ = ref.fused_topk(logits, 2, False, "softmax", 3, 1)
    assert ids.tolist() == [[0, 1]]  # group 0 (max 5) beats group 1 (max 4)


def test_permute_align_by_hand():
    ids = torch.tensor([[0, 2], [2, 1]], dtype=torch.int32)
    sorted_ids, blocks = ref.moe_permute_align(ids, 4, 4)
    assert sorted_ids == [0, 4, 4, 4, 3, 4, 4, 4, 1, 2, 4, 4]
    assert blocks == [0, 1, 2]  # expert 3 has no route: no block


def test_permute_align_drops_negative_and_out_of_range_ids():
    ids = torch.tensor([[-1, 1], [7, 1]], dtype=torch.int32)
    sorted_ids, blocks = ref.moe_permute_align(ids, 2, 2)
    assert sorted_ids == [1, 3] and blocks == [1]


def test_pre_permute_by_hand():
    x = torch.arange(2 * 8, dtype=torch.float32).view(2, 8)
    ids = torch.tensor([[1, 0], [1, -1]], dtype=torch.int32)
    rows, ends, inverse = ref.moe_pre_permute(x, ids, 2, 4)
    # counts [1, 2]; starts [0, 4]; ends [1, 6]
    assert ends == [1, 6]
    assert inverse == [4, 0, 5, -1]
    assert rows == {4: 0, 0: 0, 5: 1}


def test_post_permute_by_hand():
    eo = torch.tensor([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]])
    w = torch.tensor([[0.5, 2.0], [1.0, 1.0]])
    inv = torch.tensor([2, 0, -1, -1], dtype=torch.int32)
    out = ref.moe_post_permute(eo, w, inv)
    assert out.tolist() == [[52.0, 104.0], [0.0, 0.0]]


def test_grouped_gemm_contiguous_alignment_and_silu():
    a = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [2.0, 1.0]])
    b = torch.tensor([[[1.0, 1.0], [0.0, 1.0]], [[3.0, 0.0], [1.0, 1.0]]])
    meta = torch.tensor([1, 5], dtype=torch.int32)  # expert 1 starts at align_up(1, 4) = 4
    c, valid = ref.moe_grouped_gemm(a, b, meta, alignment=4)
    assert valid.tolist() == [True, False, False, False, True]
    assert c[0].tolist() == [1.0, 0.0] and c[4].tolist() == [6.0, 3.0]
    c2, _ = ref.moe_grouped_gemm(a, b, meta, alignment=4, activation="silu_and_mul")
    assert c2[4].tolist() == pytest.approx([6.0 / (1 + math.exp(-6.0)) * 3.0])


def test_grouped_gemm_fp8_block_scales():
    fp8 = torch.float8_e4m3fn
    a = torch.ones(1, 2, 256).to(fp8)
    b = torch.ones(1, 130, 256).to(fp8)
    a_scale = torch.tensor([[[1.0, 2.0], [0.5, 0.5]]])
    b_scale = torch.tensor([[[1.0, 1.0], [3.0, 0.0]]])
    c, valid = ref.moe_grouped_gemm_fp8(a, a_scale, b, b_scale, torch.tensor([1], dtype=torch.int32))
    assert valid.tolist() == [[True, False]]
    # n < 128: 128*1*1 + 128*2*1 = 384; n >= 128: 128*1*3 + 128*2*0 = 384 too.
    assert c[0, 0, 0].item() == 384.0 and c[0, 0, 129].item() == 384.0


def test_mlp_rounds_the_activation_and_experts_weight_routes():
    x = torch.tensor([[1.0, 2.0]])
    w13 = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])  # F = 1
    w2 = torch.tensor([[[1.0], [2.0]], [[3.0], [1.0]]])
    # expert 0: gate 1, up 2 -> silu(1)*2; expert 1: gate 2, up 1 -> silu(2)
    s1 = 1.0 / (1 + math.exp(-1.0)) * 2.0
    s2 = 2.0 / (1 + math.exp(-2.0))
    out = ref.fused_moe_experts(x, w13, w2, torch.tensor([[0.25, 1.0]]),
                                torch.tensor([[0, 1]], dtype=torch.int32))  # fmt: skip
    assert out[0].tolist() == pytest.approx([0.25 * s1 + 3 * s2, 0.25 * 2 * s1 + s2], rel=1e-6)
    xb = x.to(torch.bfloat16)
    h = ref.mlp(xb, w13[0].to(torch.bfloat16), w2[0].to(torch.bfloat16))
    assert h[0, 0].item() == torch.tensor(s1).to(torch.bfloat16).item()
