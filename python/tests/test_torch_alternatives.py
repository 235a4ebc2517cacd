"""bench/torch_alternatives.py without a GPU: its row selection on the seed workload
list, and a smoke run of every op's setup and torch compositions on tiny shapes on the
CPU (the timing itself needs a GPU)."""

import json
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
