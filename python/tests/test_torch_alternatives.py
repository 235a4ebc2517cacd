"""bench/torch_alternatives.py without a GPU: its row selection on the seed workload
list, and a smoke run of every op's setup and torch compositions on tiny shapes on the
CPU (the timing itself needs a GPU)."""

import json
import math
import os
import sys

import pytest

from mk_support import requires_torch, torch_skip_reason

pytestmark = requires_torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
MINI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "mini_workloads.json")

if torch_skip_reason() is None:
    sys.path.insert(0, BENCH)
    try:
        import torch_alternatives as ta
    finally:
        sys.path.remove(BENCH)


def _seed():
    for p in (os.path.join(BENCH, "workloads", "seed1.json"),
              os.path.join(ROOT, "..", "shared", "workloads", "seed1.json")):  # fmt: skip
        if os.path.exists(p):
            return p
    pytest.skip("no seed1.json workload list here")


def test_selects_the_seed_rows(capsys):
    assert ta.main(["--list", "--workloads", _seed()]) == 0
    rows = capsys.readouterr().out.split()
    assert len(rows) == 132 and len(set(rows)) == 132
    assert ta.main(["--list", "--quick", "--workloads", _seed()]) == 0
    quick = capsys.readouterr().out.split()
    assert len(quick) == len(ta.QUICK) and set(quick) == ta.QUICK
    assert ta.main(["--list", "--op", "FP8", "--workloads", _seed()]) == 0
    assert all("FP8" in r for r in capsys.readouterr().out.split())


def test_smoke_run_of_every_op_on_the_cpu(capsys):
    assert ta.main(["--device", "cpu", "--smoke", "--workloads", MINI]) == 0
    out = capsys.readouterr().out
    with open(MINI) as f:
        ops = {o["op"] for o in json.load(f)["ops"]}
    assert len(ops) == 12 and all(op in out for op in ops)
    assert "FAILED" not in out
    # A shared-expert row without shared weights (the page's qwen3-235b-t512): the
    # routed layer alone.
    assert "FusedMoESharedExpertFwd|mini-no-shared|bf16" in out


def test_routing_compositions_match_the_reference():
    import torch

    import torch_reference as ref

    torch.manual_seed(0)
    for T, K, E, bs in [(5, 2, 8, 16), (33, 8, 128, 64), (64, 4, 16, 16)]:
        ids = torch.randint(-1, E, (T, K), dtype=torch.int32)
        s, e, n = ta.torch_permute_align(ids, E, bs)
        rs, rb = ref.moe_permute_align(ids, E, bs)
        n = int(n.item())
        assert n == len(rs) and s[:n].tolist() == rs and e[: n // bs].tolist() == rb
        assert (e[n // bs :] == -1).all()
        x = torch.randn(T, 16)
        ids2 = torch.randint(0, E, (T, K), dtype=torch.int32)
        p, m, inv = ta.torch_pre_permute(x, ids2, E)
        rows, ends, rinv = ref.moe_pre_permute(x, ids2, E, 1)
        assert m.tolist() == ends and inv.tolist() == rinv
        assert all(torch.equal(p[r], x[t]) for r, t in rows.items())
        logits, bias = torch.randn(T, E), torch.randn(E) * 0.1
        w1, i1 = ta.torch_topk(logits, 4, True, "sigmoid", 4, 2, 2.5, bias)
        w2, i2, _, _ = ref.fused_topk(logits, 4, True, "sigmoid", 4, 2, 2.5, bias)
        assert torch.equal(i1.long(), i2) and torch.allclose(w1, w2)


def test_sample_counts_follow_moekit_bench():
    # n = clamp(max_ms / t, 3, 100), at least 30 when 30 samples fit in max_ms.
    assert ta.n_samples(0.01, 200, 30) == 100
    assert ta.n_samples(5.0, 200, 30) == 40
    assert ta.n_samples(6.0, 200, 30) == 33
    assert ta.n_samples(7.0, 200, 30) == 28  # 30 calls would take 210 ms
    assert ta.n_samples(40.0, 200, 30) == 5
    assert ta.n_samples(300.0, 200, 30) == 3


def test_scaled_mm_per_expert_matches_the_dequantized_layer():
    """The cuBLASLt per-expert FP8 alternative's routing, per-expert loop and scale handling,
    with its GEMM emulated on the CPU (dequantized operands): every scheme within FP8 noise
    of the dequantized bf16 composition; experts without routes and -1 ids skipped."""
    import torch

    torch.manual_seed(3)
    T, E, H, F, K = 9, 6, 256, 128, 2
    x = torch.randn(T, H).to(torch.bfloat16)
    ids = torch.randint(-1, E - 1, (T, K), dtype=torch.int32)  # expert E-1 gets no route
    w = torch.rand(T, K)

    def emulated(scheme):
        def mm(a, wq, sw):
            N, Kd = wq.shape
            if scheme == "fp8_block128":
                q, sa = ta._quant_groups(a)
                aq = q.float() * sa.repeat_interleave(128, 1)[:, :Kd]
                wd = wq.float() * sw.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :Kd]
            else:
                q, sa = ta._quant_rows(a)
                aq = q.float() * sa.unsqueeze(1)
                wd = wq.float() * sw.view(N, 1)
            return (aq @ wd.t()).to(torch.bfloat16)
        return mm

    # Rows past the last offset are not written by torch._grouped_mm (torch 2.11 left NaN
    # there): poison them, so that the invalid routes' rows must be masked on every version.
    real_grouped_mm = ta._grouped_mm

    def poisoning_grouped_mm(a, b, offs):
        out = real_grouped_mm(a, b, offs=offs)
        out[int(offs[-1]):] = float("nan")
        return out

    ta._grouped_mm = poisoning_grouped_mm
    try:
        _check_schemes(ta, x, ids, w, E, H, F, emulated)
    finally:
        ta._grouped_mm = real_grouped_mm


def _check_schemes(ta, x, ids, w, E, H, F, emulated):
    import torch

    for scheme in ("fp8_per_tensor", "fp8_per_channel", "fp8_block128"):
        shape13 = {"fp8_per_tensor": (E,), "fp8_per_channel": (E, 2 * F),
                   "fp8_block128": (E, 2 * F // 128, H // 128)}[scheme]  # fmt: skip
        shape2 = {"fp8_per_tensor": (E,), "fp8_per_channel": (E, H),
                  "fp8_block128": (E, H // 128, F // 128)}[scheme]  # fmt: skip
        q13 = torch.randn(E, 2 * F, H).to(torch.float8_e4m3fn)
        q2 = torch.randn(E, H, F).to(torch.float8_e4m3fn)
        s13 = (torch.rand(shape13) + 0.5) / math.sqrt(H)
        s2 = (torch.rand(shape2) + 0.5) / math.sqrt(F)
        got = ta.scaled_mm_per_expert(x, q13, q2, s13, s2, w, ids, scheme, mm=emulated(scheme))
        want = ta.grouped_experts(x.float(), ta.dequant(q13, s13, scheme, torch.float32),
                                  ta.dequant(q2, s2, scheme, torch.float32), w, ids)  # fmt: skip
        err = float((got - want).norm() / want.norm())
        assert 1e-4 < err < 8e-2, f"{scheme}: rel_l2 {err:.3g}"


def test_tokens_rows_are_named_and_shaped_as_moekit_bench_does(capsys):
    """--tokens: each layer row at each count, named name@T=N as moekit-bench --tokens names
    it (its --extra-alternatives merge matches on the name), the token tensors rescaled; ops
    --tokens does not rescale here are left out; a CPU smoke run of the rescaled rows."""
    tune = os.path.join(BENCH, "workloads", "tune_seed.json")
    assert ta.main(["--list", "--workloads", tune, "--workload", "qwen3-30b",
                    "--tokens", "1-2,8"]) == 0  # fmt: skip
    # --workload matches substrings: the bf16 layer, its ep8 rank and the two FP8 layers.
    names = ("qwen3-30b", "qwen3-30b-ep8", "qwen3-30b-fp8-channel", "qwen3-30b-fp8-tensor")
    assert capsys.readouterr().out.split() == [
        f"FusedMoEFwd|{name}@T={n}|bf16" for name in names for n in (1, 2, 8)]  # fmt: skip
    assert ta.parse_counts("1-3,5") == [1, 2, 3, 5]
    with pytest.raises(ValueError):
        ta.parse_counts("4-2")
    w = {"name": "x", "dtypes": ["bf16"], "results": {"bf16": {}},
         "tensors": {"hidden_states": {"shape": ["4", "64"]}, "w_down": {"shape": ["8", "64", "32"]},
                     "gating_output": {"shape": ["4", "8"]}}}  # fmt: skip
    s = ta.with_tokens(w, 7)
    assert s["name"] == "x@T=7" and "results" not in s
    assert s["tensors"]["hidden_states"]["shape"] == ["7", "64"]
    assert s["tensors"]["gating_output"]["shape"] == ["7", "8"]
    assert s["tensors"]["w_down"]["shape"] == ["8", "64", "32"]
    assert w["tensors"]["hidden_states"]["shape"] == ["4", "64"]  # the original untouched
    with open(MINI) as f:
        ops = {o["op"] for o in json.load(f)["ops"]}
    assert ta.main(["--list", "--workloads", MINI, "--tokens", "3"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed and all("@T=3|" in k and k.split("|")[0] in ta.TOKEN_OPS for k in listed)
    assert {k.split("|")[0] for k in listed} == ops & set(ta.TOKEN_OPS)
    assert ta.main(["--device", "cpu", "--smoke", "--workloads", MINI, "--tokens", "3"]) == 0
    assert "FAILED" not in capsys.readouterr().out
