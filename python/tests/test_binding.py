"""The raw binding (moekit.raw): imports without torch, lists the ops, and turns bad
input into moekit.MoekitError (a ValueError) with the C++ message. Needs no GPU and
no torch; these run in CI.

Every bad-input call below breaks at least one argument, so the C++ op rejects it
before any launch: the fake device pointers are never dereferenced.
"""

import os
import subprocess
import sys

import pytest

import moekit

raw = moekit.raw
PTR = 1 << 20  # a fake, well-aligned device address: only ever seen by validation
WS = 1 << 24


def t(dtype, *shape, ptr=PTR):
    return (ptr, moekit.DTYPES[dtype], shape)


def test_import_and_op_list():
    assert moekit.__version__
    assert moekit.OPS == (
        "fused_topk", "moe_permute_align", "moe_pre_permute", "moe_post_permute",
        "moe_grouped_gemm", "moe_grouped_gemm_fp8", "moe_expert_mlp", "fused_moe_experts",
        "indexed_expert_mlp", "fused_moe", "fused_moe_shared_expert", "shared_expert_mlp",
    )  # fmt: skip
    for name in moekit.OPS:
        assert callable(getattr(raw, name)), name
        assert getattr(raw, name).__doc__, name
    for name in ("permute_align", "pre_permute", "grouped_gemm", "expert_mlp", "fused_moe_experts",
                 "indexed_expert_mlp", "fused_moe", "fused_moe_shared_expert",
                 "shared_expert_mlp"):  # fmt: skip
        assert callable(getattr(raw, name + "_workspace_size")), name
    assert issubclass(moekit.MoekitError, ValueError)
    assert moekit.DTYPES == {"bf16": 1, "f16": 2, "f32": 3, "i32": 4, "fp8e4m3": 5}
    assert [raw.dtype_size(c) for c in range(1, 6)] == [2, 2, 4, 4, 1]
    assert raw.dtype_name(5) == "fp8e4m3"


def test_imports_without_torch():
    code = (
        "import sys, moekit\n"
        "assert not moekit.HAS_TORCH and 'torch' not in sys.modules\n"
        "assert len(moekit.OPS) == 12 and moekit.raw.describe(None) == 'undefined'\n"
        "try:\n    moekit.fused_moe\nexcept ImportError as e:\n    print(e)\n"
        "else:\n    raise SystemExit('no ImportError')\n"
    )
    env = dict(os.environ, MOEKIT_NO_TORCH="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "needs PyTorch" in out.stdout and "moekit.raw.fused_moe" in out.stdout


def test_size_helpers():
    assert raw.permuted_rows(100, 8, 32, 16) == 800 + 32 * 15
    assert raw.permute_align_sorted_size(512 * 8, 384, 64) == 4096 + 384 * 63
    assert raw.permute_align_num_blocks(512 * 8, 384, 64) == -(-(4096 + 384 * 63) // 64)


def test_describe_tensor_forms():
    assert raw.describe(t("bf16", 512, 4096)) == "bf16[512, 4096]"
    assert raw.describe((PTR, 3, [2, 3], [3, 1])) == "f32[2, 3]"
    assert raw.describe((PTR, 4, ())) == "i32[]"
    assert raw.describe(None) == "undefined"


@pytest.mark.parametrize(
    "value,match",
    [
        ((PTR, 1), r"\(data_ptr, dtype, shape\[, strides\]\) tuple.*2 items"),
        (("x", 1, (2,)), r"an int data pointer, got str"),
        ((PTR, 0, (2,)), r"dtype code 1\.\.5"),
        ((PTR, 9, (2,)), r"dtype code 1\.\.5.*got 9"),
        ((PTR, "torch.float64", (2,)), r"dtype bf16, f16, f32, i32 or fp8e4m3, got torch.float64"),
        ((PTR, 1, 5), r"a tuple of ints as shape, got int"),
        ((PTR, 1, (1, 2, 3, 4, 5)), r"at most 4 dimensions"),
        ((PTR, 1, (2, "a")), r"an int shape, got str"),
        ((PTR, 1, (2, 3), (1,)), r"as many strides as dimensions"),
        ("not a tensor", r"a CUDA tensor \(DLPack\).*got an object of type str"),
        (3.5, r"got an object of type float"),
    ],
)
def test_rejects_malformed_tensor_arguments(value, match):
    with pytest.raises(moekit.MoekitError, match=r"moekit::describe: argument 't': expected "):
        raw.describe(value)
    with pytest.raises(ValueError, match=match):
        raw.describe(value)


def test_registered_dtype_objects_and_contiguity_flags():
    class FakeDType:
        def __str__(self):
            return "fake.float32"

    f32_obj, other = FakeDType(), FakeDType()
    raw.register_dtype(f32_obj, moekit.DTYPES["f32"])
    assert raw.describe((PTR, f32_obj, (2, 3), True)) == "f32[2, 3]"
    assert raw.describe((PTR, f32_obj, (2, 3), None)) == "f32[2, 3]"
    with pytest.raises(moekit.MoekitError, match=r"got fake\.float32"):
        raw.describe((PTR, other, (2, 3)))
    with pytest.raises(moekit.MoekitError,
                       match=r"expected a contiguous row-major tensor, got a non-contiguous one"):
        raw.describe((PTR, f32_obj, (2, 3), False))
    with pytest.raises(moekit.MoekitError, match=r"code: expected 1\.\.5"):
        raw.register_dtype(other, 7)


def test_rejects_host_dlpack_tensors():
    np = pytest.importorskip("numpy", reason="numpy is not installed (DLPack from host arrays)")
    with pytest.raises(moekit.MoekitError, match=r"argument 'gating_output': expected a tensor "
                                                 r"on a CUDA device, got a tensor on cpu"):  # fmt: skip
        raw.fused_topk(np.zeros((4, 8), np.float32), None, t("f32", 4, 2), t("i32", 4, 2), 2)


def _ws(size_fn, *args):
    n = size_fn(*args)
    return (PTR + WS if n else 0), n


# Each case: op, the argument it breaks, and a call that breaks it.
BAD_CALLS = [
    ("fused_topk", "topk_weights",
     lambda: raw.fused_topk(t("f32", 4, 8), None, t("f32", 4, 3), t("i32", 4, 2), 2)),
    ("fused_topk", "correction_bias",
     lambda: raw.fused_topk(t("f32", 4, 8), t("bf16", 8), t("f32", 4, 2), t("i32", 4, 2), 2)),
    ("fused_topk", "gating_output",
     lambda: raw.fused_topk(t("f32", 4, 8, 2), None, t("f32", 4, 2), t("i32", 4, 2), 2)),
    ("fused_topk", "top_k",
     lambda: raw.fused_topk(t("f32", 4, 8), None, t("f32", 4, 9), t("i32", 4, 9), 9)),
    ("fused_topk", "scoring_func",
     lambda: raw.fused_topk(t("f32", 4, 8), None, t("f32", 4, 2), t("i32", 4, 2), 2, True, "tanh")),
    ("moe_permute_align", "block_size",
     lambda: raw.moe_permute_align(t("i32", 4, 2), 8, 48, t("i32", 8 + 8 * 47), t("i32", 9),
                                   t("i32", 1), PTR + WS, WS)),
    ("moe_permute_align", "sorted_token_ids",
     lambda: raw.moe_permute_align(t("i32", 4, 2), 8, 16, t("i32", 8), t("i32", 8),
                                   t("i32", 1), PTR + WS, WS)),
    ("moe_pre_permute", "permuted",
     lambda: raw.moe_pre_permute(t("bf16", 4, 64), t("i32", 4, 2), 4, 8, t("bf16", 8, 64),
                                 t("i32", 4), t("i32", 8), PTR + WS, WS)),
    ("moe_post_permute", "inverse_indices",
     lambda: raw.moe_post_permute(t("bf16", 8, 64), t("f32", 4, 2), t("i32", 7),
                                  t("bf16", 4, 64))),
    ("moe_post_permute", "out",
     lambda: raw.moe_post_permute(t("bf16", 8, 64), t("f32", 4, 2), t("i32", 8),
                                  t("f16", 4, 64))),
    ("moe_grouped_gemm", "a",
     lambda: raw.moe_grouped_gemm(t("bf16", 32, 128), t("bf16", 4, 64, 256), t("i32", 4),
                                  False, 1, 0, "none", t("bf16", 32, 64))),
    ("moe_grouped_gemm", "activation",
     lambda: raw.moe_grouped_gemm(t("bf16", 32, 256), t("bf16", 4, 64, 256), t("i32", 4),
                                  False, 1, 0, "gelu", t("bf16", 32, 64))),
    ("moe_grouped_gemm", "c",
     lambda: raw.moe_grouped_gemm(t("bf16", 4, 16, 256), t("bf16", 4, 128, 256), t("i32", 4),
                                  True, 1, 16, "silu_and_mul", t("bf16", 4, 16, 128))),
    ("moe_grouped_gemm", "workspace",
     lambda: raw.moe_grouped_gemm(t("bf16", 32, 256), t("bf16", 4, 64, 256), t("i32", 4),
                                  False, 1, 0, "none", t("bf16", 32, 64), 0, PTR + WS, 8)),
    ("moe_grouped_gemm_fp8", "a_scale",
     lambda: raw.moe_grouped_gemm_fp8(t("fp8e4m3", 2, 64, 256), t("f32", 2, 64, 3),
                                      t("fp8e4m3", 2, 128, 256), t("f32", 2, 1, 2), t("i32", 2),
                                      t("bf16", 2, 64, 128))),
    ("moe_grouped_gemm_fp8", "b",
     lambda: raw.moe_grouped_gemm_fp8(t("fp8e4m3", 2, 64, 256), t("f32", 2, 64, 2),
                                      t("bf16", 2, 128, 256), t("f32", 2, 1, 2), t("i32", 2),
                                      t("bf16", 2, 64, 128))),
    ("moe_expert_mlp", "expert_output",
     lambda: raw.moe_expert_mlp(t("bf16", 32, 128), t("i32", 4), 1, t("bf16", 4, 128, 128),
                                t("bf16", 4, 128, 64), t("bf16", 31, 128), PTR + WS, WS)),
    ("fused_moe_experts", "topk_weights",
     lambda: raw.fused_moe_experts(t("bf16", 4, 128), t("bf16", 8, 128, 128),
                                   t("bf16", 8, 128, 64), t("bf16", 4, 2), t("i32", 4, 2),
                                   t("bf16", 4, 128), PTR + WS, WS)),
    ("indexed_expert_mlp", "w_down",
     lambda: raw.indexed_expert_mlp(t("bf16", 4, 128), t("bf16", 8, 128, 128),
                                    t("bf16", 8, 128, 32), t("f32", 4, 2), t("i32", 4, 2),
                                    t("bf16", 4, 128), PTR + WS, WS)),
    ("fused_moe", "gating_output",
     lambda: raw.fused_moe(t("bf16", 4, 128), t("f32", 5, 8), None, t("bf16", 8, 128, 128),
                           t("bf16", 8, 128, 64), t("bf16", 4, 128), 2, True, "softmax", 0, 0,
                           1.0, PTR + WS, WS)),
    ("fused_moe", "w_gate_up",
     lambda: raw.fused_moe(t("bf16", 4, 128), t("f32", 4, 8), None, t("f16", 8, 128, 128),
                           t("bf16", 8, 128, 64), t("bf16", 4, 128), 2, True, "softmax", 0, 0,
                           1.0, PTR + WS, WS)),
    ("fused_moe_shared_expert", "shared_w_down",
     lambda: raw.fused_moe_shared_expert(
         t("bf16", 4, 128), t("f32", 4, 8), None, t("bf16", 8, 128, 128), t("bf16", 8, 128, 64),
         t("bf16", 256, 128), t("bf16", 128, 64), t("bf16", 4, 128), 2, True, "softmax", 0, 0,
         1.0, PTR + WS, WS)),
    ("shared_expert_mlp", "w_gate_up",
     lambda: raw.shared_expert_mlp(t("bf16", 4, 128), t("bf16", 256, 64), t("bf16", 128, 128),
                                   t("bf16", 4, 128), PTR + WS, WS)),
]  # fmt: skip


@pytest.mark.parametrize("op,arg,call", BAD_CALLS, ids=[f"{o}-{a}" for o, a, _ in BAD_CALLS])
def test_rejects_bad_input_with_the_cpp_message(op, arg, call):
    with pytest.raises(moekit.MoekitError) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(f"moekit::{op}: argument '"), msg
    assert f"'{arg}'" in msg or f"'params.{arg}'" in msg, msg
    assert "expected" in msg and "got" in msg, msg


def test_workspace_size_queries_take_shapes_only():
    # Null pointers are fine: the size depends on shapes and dtypes only.
    args = (t("bf16", 64, 128, ptr=0), t("f32", 64, 16, ptr=0), None,
            t("bf16", 16, 256, 128, ptr=0), t("bf16", 16, 128, 128, ptr=0),
            t("bf16", 64, 128, ptr=0), 4, True, "softmax", 0, 0, 1.0)  # fmt: skip
    n = raw.fused_moe_workspace_size(*args)
    assert isinstance(n, int) and n >= 0
    assert raw.fused_moe_workspace_size(*args) == n


@pytest.mark.skipif(raw.device_count() > 0, reason="a CUDA device is present (would launch)")
def test_valid_call_without_a_gpu_raises_a_cuda_error():
    with pytest.raises(moekit.MoekitError, match=r"moekit::fused_topk"):
        raw.fused_topk(t("f32", 4, 8), None, t("f32", 4, 2, ptr=PTR + 4096),
                       t("i32", 4, 2, ptr=PTR + 8192), 2)  # fmt: skip
