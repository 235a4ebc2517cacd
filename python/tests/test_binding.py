"""The raw binding (moekit.raw): imports without torch, lists the ops, and turns bad
input into moekit.MoekitError (a ValueError) with the C++ message. Needs no GPU and
no torch; these run in CI.

Every bad-input call below breaks at least one argument, so the C++ op rejects it
before any launch: the fake device pointers are never dereferenced.
"""

import os
import re
import subprocess
import sys

import pytest

import moekit

raw = moekit.raw
PTR = 1 << 20  # a fake, well-aligned device address: only ever seen by validation
WS = 1 << 24  # the workspace at PTR + WS, WS bytes
_slot = [0]


def t(dtype, *shape, ptr=None):
    """A tensor tuple at `ptr`, by default at a fresh fake address (d() below): the only
    overlap is one a test makes on purpose."""
    if ptr is None:
        return d(dtype, *shape)
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
    assert moekit.DTYPES == {"bf16": 1, "f16": 2, "f32": 3, "i32": 4, "fp8e4m3": 5, "i64": 6}
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
        ((PTR, 0, (2,)), r"dtype code 1\.\.6"),
        ((PTR, 9, (2,)), r"dtype code 1\.\.6.*got 9"),
        ((PTR, "torch.float64", (2,)),
         r"dtype bf16, f16, f32, i32, fp8e4m3 or i64, got torch.float64"),
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
    with pytest.raises(moekit.MoekitError, match=r"code: expected 1\.\.6"):
        raw.register_dtype(other, 7)


def test_rejects_host_dlpack_tensors():
    np = pytest.importorskip("numpy", reason="numpy is not installed (DLPack from host arrays)")
    with pytest.raises(moekit.MoekitError, match=r"argument 'gating_output': expected a tensor "
                                                 r"on a CUDA device, got a tensor on cpu"):  # fmt: skip
        raw.fused_topk(np.zeros((4, 8), np.float32), None, t("f32", 4, 2), t("i32", 4, 2), 2)


def _ws(size_fn, *args):
    n = size_fn(*args)
    return (PTR + WS if n else 0), n


# Each case: op, the argument it breaks, a call that breaks it (its tensors each at their own
# fake address: t()), and the start of the message's "expected ..." (the check meant).
BAD_CALLS = [
    ("fused_topk", "topk_weights",
     lambda: raw.fused_topk(t("f32", 4, 8), None, t("f32", 4, 3), t("i32", 4, 2), 2),
     "expected shape [4, 2]"),
    ("fused_topk", "correction_bias",
     lambda: raw.fused_topk(t("f32", 4, 8), t("bf16", 8), t("f32", 4, 2), t("i32", 4, 2), 2),
     "expected dtype f32"),
    ("fused_topk", "gating_output",
     lambda: raw.fused_topk(t("f32", 4, 8, 2), None, t("f32", 4, 2), t("i32", 4, 2), 2),
     "expected shape [*, *]"),
    ("fused_topk", "top_k",
     lambda: raw.fused_topk(t("f32", 4, 8), None, t("f32", 4, 9), t("i32", 4, 9), 9),
     "expected 1 to min(16, num_experts=8)"),
    ("fused_topk", "scoring_func",
     lambda: raw.fused_topk(t("f32", 4, 8), None, t("f32", 4, 2), t("i32", 4, 2), 2, True, "tanh"),
     "expected 'softmax' or 'sigmoid'"),
    ("moe_permute_align", "block_size",
     lambda: raw.moe_permute_align(t("i32", 4, 2), 8, 48, t("i32", 8 + 8 * 47), t("i32", 9),
                                   t("i32", 1), None, PTR + WS, WS),
     "expected a power of two from 16 to 256"),
    ("moe_permute_align", "sorted_token_ids",
     lambda: raw.moe_permute_align(t("i32", 4, 2), 8, 16, t("i32", 8), t("i32", 8),
                                   t("i32", 1), None, PTR + WS, WS),
     "expected shape [128]"),
    ("moe_permute_align", "expert_map",
     lambda: raw.moe_permute_align(t("i64", 4, 2), 8, 16, t("i32", 8 + 8 * 15), t("i32", 8),
                                   t("i32", 1), t("i64", 32), PTR + WS, WS),
     "expected dtype i32"),
    ("moe_pre_permute", "permuted",
     lambda: raw.moe_pre_permute(t("bf16", 4, 64), t("i32", 4, 2), 4, 8, t("bf16", 8, 64),
                                 t("i32", 4), t("i32", 8), PTR + WS, WS),
     "expected shape [36, 64]"),
    ("moe_post_permute", "inverse_indices",
     lambda: raw.moe_post_permute(t("bf16", 8, 64), t("f32", 4, 2), t("i32", 7),
                                  t("bf16", 4, 64)),
     "expected shape [8]"),
    ("moe_post_permute", "out",
     lambda: raw.moe_post_permute(t("bf16", 8, 64), t("f32", 4, 2), t("i32", 8),
                                  t("f16", 4, 64)),
     "expected dtype bf16 or f32"),
    ("moe_grouped_gemm", "a",
     lambda: raw.moe_grouped_gemm(t("bf16", 32, 128), t("bf16", 4, 64, 256), t("i32", 4),
                                  False, 1, 0, "none", t("bf16", 32, 64)),
     "expected Kd = 256 columns (b's dim 2)"),
    ("moe_grouped_gemm", "activation",
     lambda: raw.moe_grouped_gemm(t("bf16", 32, 256), t("bf16", 4, 64, 256), t("i32", 4),
                                  False, 1, 0, "gelu", t("bf16", 32, 64)),
     "expected 'none' or 'silu_and_mul'"),
    ("moe_grouped_gemm", "c",
     lambda: raw.moe_grouped_gemm(t("bf16", 4, 16, 256), t("bf16", 4, 128, 256), t("i32", 4),
                                  True, 1, 16, "silu_and_mul", t("bf16", 4, 16, 128)),
     "expected shape [4, 16, 64]"),
    ("moe_grouped_gemm", "workspace",
     lambda: raw.moe_grouped_gemm(t("bf16", 32, 256), t("bf16", 4, 64, 256), t("i32", 4),
                                  False, 1, 0, "none", t("bf16", 32, 64), 0, PTR + WS, 8),
     "expected at least 256 bytes"),
    ("moe_grouped_gemm_fp8", "a_scale",
     lambda: raw.moe_grouped_gemm_fp8(t("fp8e4m3", 2, 64, 256), t("f32", 2, 64, 3),
                                      t("fp8e4m3", 2, 128, 256), t("f32", 2, 1, 2), t("i32", 2),
                                      t("bf16", 2, 64, 128)),
     "expected shape [2, 64, 2]"),
    ("moe_grouped_gemm_fp8", "b",
     lambda: raw.moe_grouped_gemm_fp8(t("fp8e4m3", 2, 64, 256), t("f32", 2, 64, 2),
                                      t("bf16", 2, 128, 256), t("f32", 2, 1, 2), t("i32", 2),
                                      t("bf16", 2, 64, 128)),
     "expected dtype fp8e4m3"),
    ("moe_expert_mlp", "expert_output",
     lambda: raw.moe_expert_mlp(t("bf16", 32, 128), t("i32", 4), 1, t("bf16", 4, 128, 128),
                                t("bf16", 4, 128, 64), t("bf16", 31, 128), "silu", None, None,
                                PTR + WS, WS),
     "expected shape [32, 128]"),
    ("fused_moe_experts", "topk_weights",
     lambda: raw.fused_moe_experts(t("bf16", 4, 128), t("bf16", 8, 128, 128),
                                   t("bf16", 8, 128, 64), t("bf16", 4, 2), t("i32", 4, 2),
                                   t("bf16", 4, 128), "silu", None, None, None, False, PTR + WS, WS),
     "expected dtype f32"),
    ("fused_moe_experts", "apply_router_weight_on_input",
     lambda: raw.fused_moe_experts(t("bf16", 4, 128), t("bf16", 8, 128, 128),
                                   t("bf16", 8, 128, 64), t("f32", 4, 2), t("i64", 4, 2),
                                   t("bf16", 4, 128), "silu", None, None, t("i32", 32), True, PTR + WS, WS),
     "expected top_k 1 (the input row is scaled by its one route's weight)"),
    ("indexed_expert_mlp", "w_down",
     lambda: raw.indexed_expert_mlp(t("bf16", 4, 128), t("bf16", 8, 128, 128),
                                    t("bf16", 8, 128, 32), t("f32", 4, 2), t("i32", 4, 2),
                                    t("bf16", 4, 128), "silu", None, None, None, False, PTR + WS, WS),
     "expected shape [8, 128, 64]"),
    ("fused_moe", "gating_output",
     lambda: raw.fused_moe(t("bf16", 4, 128), t("f32", 5, 8), None, t("bf16", 8, 128, 128),
                           t("bf16", 8, 128, 64), t("bf16", 4, 128), 2, True, "softmax", 0, 0,
                           1.0, "silu", None, None, None, False, PTR + WS, WS),
     "expected shape [4, 8]"),
    ("fused_moe", "w_gate_up",
     lambda: raw.fused_moe(t("bf16", 4, 128), t("f32", 4, 8), None, t("f16", 8, 128, 128),
                           t("bf16", 8, 128, 64), t("bf16", 4, 128), 2, True, "softmax", 0, 0,
                           1.0, "silu", None, None, None, False, PTR + WS, WS),
     "expected dtype bf16 (that of 'hidden_states')"),
    ("fused_moe_shared_expert", "shared_w_down",
     lambda: raw.fused_moe_shared_expert(
         t("bf16", 4, 128), t("f32", 4, 8), None, t("bf16", 8, 128, 128), t("bf16", 8, 128, 64),
         t("bf16", 256, 128), t("bf16", 128, 64), t("bf16", 4, 128), 2, True, "softmax", 0, 0,
         1.0, "silu", None, None, None, None, None, False, PTR + WS, WS),
     "expected shape [128, 128]"),
    ("fused_moe", "gating_output",
     lambda: raw.fused_moe(t("bf16", 4, 128), t("f32", 4, 8), None, t("bf16", 8, 128, 128),
                           t("bf16", 8, 128, 64), t("bf16", 4, 128), 2, True, "softmax", 0, 0,
                           1.0, "silu", None, None, t("i32", 16), False, PTR + WS, WS),
     "expected one column per global expert (expert_map has 16 entries)"),
    ("shared_expert_mlp", "w_gate_up",
     lambda: raw.shared_expert_mlp(t("bf16", 4, 128), t("bf16", 256, 64), t("bf16", 128, 128),
                                   t("bf16", 4, 128), "silu", None, None, PTR + WS, WS),
     "expected shape [*, 128]"),
    ("fused_moe_experts", "activation",
     lambda: raw.fused_moe_experts(t("bf16", 4, 128), t("bf16", 8, 128, 128),
                                   t("bf16", 8, 128, 64), t("f32", 4, 2), t("i32", 4, 2),
                                   t("bf16", 4, 128), "swiglu", None, None, None, False, PTR + WS, WS),
     "expected 'silu', 'gelu', 'gelu_tanh', 'relu2' or 'swigluoai'"),
    ("shared_expert_mlp", "down_bias",
     lambda: raw.shared_expert_mlp(t("bf16", 4, 128), t("bf16", 128, 128), t("bf16", 128, 64),
                                   t("bf16", 4, 128), "swigluoai", None, t("f16", 128), PTR + WS,
                                   WS),
     "expected dtype f32 or bf16"),
]  # fmt: skip


@pytest.mark.parametrize("op,arg,call,expected", BAD_CALLS,
                         ids=[f"{o}-{a}" for o, a, _, _ in BAD_CALLS])  # fmt: skip
def test_rejects_bad_input_with_the_cpp_message(op, arg, call, expected):
    with pytest.raises(moekit.MoekitError) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(f"moekit::{op}: argument '{arg}': {expected}, got "), msg


def test_workspace_size_queries_take_shapes_only():
    # Null pointers are fine: the size depends on shapes and dtypes only.
    args = (t("bf16", 64, 128, ptr=0), t("f32", 64, 16, ptr=0), None,
            t("bf16", 16, 256, 128, ptr=0), t("bf16", 16, 128, 128, ptr=0),
            t("bf16", 64, 128, ptr=0), 4, True, "softmax", 0, 0, 1.0, "silu", None, None, None,
            False)  # fmt: skip
    n = raw.fused_moe_workspace_size(*args)
    assert isinstance(n, int) and n >= 0
    assert raw.fused_moe_workspace_size(*args) == n


def test_activations_by_name_and_their_workspace():
    """The MLP ops take vLLM's activation names; other activations and biases run the
    general path, whose workspace holds the f32 pre-activations (docs/moe.md)."""
    def size(activation, gate_up_bias=None, rows=256):
        return raw.fused_moe_workspace_size(
            t("bf16", 64, 128, ptr=0), t("f32", 64, 16, ptr=0), None,
            t("bf16", 16, rows, 128, ptr=0), t("bf16", 16, 128, 128, ptr=0),
            t("bf16", 64, 128, ptr=0), 4, True, "softmax", 0, 0, 1.0, activation, gate_up_bias,
            None, None, False)  # fmt: skip

    silu = size("silu")
    for name in ("gelu", "gelu_tanh", "swigluoai"):
        assert size(name) > silu, name
    assert size("relu2", rows=128) > 0
    assert size("silu", t("f32", 16, 256, ptr=0)) > silu  # a bias: the general path too
    with pytest.raises(moekit.MoekitError, match=re.escape(
            "moekit::fused_moe: argument 'activation': expected 'silu', 'gelu', 'gelu_tanh', "
            "'relu2' or 'swigluoai', got 'silu_and_mul'")):  # fmt: skip
        size("silu_and_mul")
    with pytest.raises(moekit.MoekitError, match=re.escape(
            "moekit::fused_moe: argument 'gate_up_bias': expected shape [16, 128], got "
            "f32[16, 256]")):  # fmt: skip
        size("relu2", t("f32", 16, 256, ptr=0), rows=128)


@pytest.mark.skipif(raw.device_count() > 0, reason="a CUDA device is present (would launch)")
def test_valid_call_without_a_gpu_raises_a_cuda_error():
    with pytest.raises(moekit.MoekitError, match="moekit::fused_topk: argument 'stream': "
                       "expected a CUDA device to launch on"):  # fmt: skip
        raw.fused_topk(t("f32", 4, 8), None, t("f32", 4, 2, ptr=PTR + 4096),
                       t("i32", 4, 2, ptr=PTR + 8192), 2)  # fmt: skip


# ---- the bad-input table (docs/bad-inputs.md): representative rows per op ----
#
# Each tensor gets its own fake address (slot k at (k + 1) * 2^40), so the only overlap
# is the one a row makes on purpose. The messages are the C++ ones, exactly.

def d(dtype, *shape):
    """A tensor tuple at a fresh fake device address."""
    _slot[0] += 1
    return (_slot[0] << 40, moekit.DTYPES[dtype], shape)


def at(tensor, other, offset=0):
    """`tensor` moved onto `other`'s address (+ offset bytes)."""
    return (other[0] + offset,) + tensor[1:]


WSP = 1 << 52  # a fake workspace, away from every slot


def _topk(**kw):
    a = dict(gating_output=d("f32", 4, 8), correction_bias=None, topk_weights=d("f32", 4, 2),
             topk_ids=d("i32", 4, 2), top_k=2)
    a.update(kw)
    return lambda: raw.fused_topk(**a)


def _experts(op, T=4, E=8, **kw):
    a = dict(hidden_states=d("bf16", T, 64), w_gate_up=d("bf16", E, 64, 64),
             w_down=d("bf16", E, 64, 32), topk_weights=d("f32", T, 2), topk_ids=d("i32", T, 2),
             output=d("bf16", T, 64), activation="silu", gate_up_bias=None, down_bias=None,
             expert_map=None, apply_router_weight_on_input=False, workspace=WSP, workspace_bytes=1 << 40)
    a.update(kw)
    return lambda: getattr(raw, op)(**a)


def _layer(op="fused_moe", **kw):
    a = dict(hidden_states=d("bf16", 4, 64), gating_output=d("f32", 4, 8), correction_bias=None,
             w_gate_up=d("bf16", 8, 64, 64), w_down=d("bf16", 8, 64, 32),
             output=d("bf16", 4, 64), top_k=2, renormalize=True, scoring_func="softmax",
             num_expert_group=0, topk_group=0, routed_scaling_factor=1.0, activation="silu",
             gate_up_bias=None, down_bias=None, expert_map=None,
             apply_router_weight_on_input=False, workspace=WSP, workspace_bytes=1 << 40)
    if op == "fused_moe_shared_expert":
        a.update(shared_w_gate_up=d("bf16", 64, 64), shared_w_down=d("bf16", 64, 32),
                 shared_gate_up_bias=None, shared_down_bias=None)
    a.update(kw)
    return lambda: getattr(raw, op)(**a)


_g = d("f32", 4, 8)
_x = d("bf16", 4, 64)
_eo = d("bf16", 8, 64)
_pin = d("bf16", 32, 64)
_lg = d("f32", 4, 8)
_sx = d("bf16", 4, 64)
_px = d("bf16", 4, 64)

TABLE = [
    ("fused_topk", _topk(top_k=0),
     "argument 'top_k': expected 1 to min(16, num_experts=8), got 0"),
    ("fused_topk", _topk(num_expert_group=3, topk_group=1),
     "argument 'num_expert_group': expected 0 or a positive divisor of num_experts=8, got 3"),
    ("fused_topk", _topk(gating_output=d("f32", 1 << 31, 8), topk_weights=d("f32", 1 << 31, 2),
                         topk_ids=d("i32", 1 << 31, 2)),
     "argument 'gating_output': expected at most 2^31-1 tokens, got f32[2147483648, 8]"),
    ("fused_topk", _topk(gating_output=_g, topk_ids=at(d("i32", 4, 2), _g)),
     "argument 'topk_ids': expected memory disjoint from 'gating_output', got i32[4, 2] at "),
    ("moe_permute_align",
     lambda: raw.moe_permute_align(d("i32", 4, 2), 1025, 16, d("i32", 8 + 1025 * 15),
                                   d("i32", 8), d("i32", 1), None, WSP, 1 << 30),
     "argument 'num_experts': expected 1 to 1024, got 1025"),
    ("moe_permute_align",
     lambda: raw.moe_permute_align(d("i32", 32768, 2), 8, 16, d("i32", 65536 + 8 * 15),
                                   d("i32", (65536 + 8 * 15 + 15) // 16), d("i32", 1), None, WSP,
                                   16),
     "argument 'workspace': expected at least "),
    ("moe_pre_permute",
     lambda: raw.moe_pre_permute(d("bf16", 4, 64), d("i32", 4, 2), 8, 0, d("bf16", 8, 64),
                                 d("i32", 8), d("i32", 8), 0, 0),
     "argument 'layout.alignment': expected >= 1, got 0"),
    ("moe_pre_permute",
     lambda: raw.moe_pre_permute(_px, d("i32", 4, 2), 8, 1, at(d("bf16", 8, 64), _px),
                                 d("i32", 8), d("i32", 8), 0, 0),
     "argument 'permuted': expected memory disjoint from 'hidden_states', got bf16[8, 64] at "),
    ("moe_post_permute",
     lambda: raw.moe_post_permute(_eo, d("f32", 4, 2), d("i32", 8), at(d("bf16", 4, 64), _eo)),
     "argument 'out': expected memory disjoint from 'expert_output', got bf16[4, 64] at "),
    ("moe_grouped_gemm",
     lambda: raw.moe_grouped_gemm(d("bf16", 1 << 31, 64), d("bf16", 4, 128, 64), d("i32", 4),
                                  False, 1, 0, "silu_and_mul", d("bf16", 1 << 31, 64)),
     "argument 'a': expected at most 2^31-1 rows (dim 0) (the kernels index them in 32 bits), "
     "got bf16[2147483648, 64]"),
    ("moe_grouped_gemm",
     lambda: raw.moe_grouped_gemm(d("bf16", 32, 64), d("bf16", 1025, 128, 64), d("i32", 1025),
                                  False, 1, 0, "silu_and_mul", d("bf16", 32, 64)),
     "argument 'b': expected at most 1024 experts (dim 0), got bf16[1025, 128, 64]"),
    ("moe_grouped_gemm_fp8",
     lambda: raw.moe_grouped_gemm_fp8(d("fp8e4m3", 1025, 64, 256), d("f32", 1025, 64, 2),
                                      d("fp8e4m3", 1025, 128, 256), d("f32", 1025, 1, 2),
                                      d("i32", 1025), d("bf16", 1025, 64, 128)),
     "argument 'a': expected at most 1024 experts (dim 0), got fp8e4m3[1025, 64, 256]"),
    ("moe_expert_mlp",
     lambda: raw.moe_expert_mlp(_pin, d("i32", 8), 1, d("bf16", 8, 64, 64), d("bf16", 8, 64, 32),
                                at(d("bf16", 32, 64), _pin, 128), "silu", None, None, WSP,
                                1 << 40),
     "argument 'expert_output': expected memory disjoint from 'expert_input' or 'expert_input' "
     "itself (in place), got bf16[32, 64] at "),
    ("fused_moe_experts", _experts("fused_moe_experts", E=1025),
     "argument 'w_gate_up': expected at most 1024 experts (dim 0), got bf16[1025, 64, 64]"),
    ("indexed_expert_mlp", _experts("indexed_expert_mlp", E=5000),
     "argument 'w_gate_up': expected at most 4096 experts (dim 0), got bf16[5000, 64, 64]"),
    ("indexed_expert_mlp", _experts("indexed_expert_mlp", T=65, E=1025),
     "argument 'w_gate_up': expected at most 1024 experts (dim 0) on the sorted path, which this "
     "call takes because T = 65 > 64 (the direct path takes up to 4096 experts at T <= 64, "
     "T*top_k <= 1024 and 2*F*H < 2^31), got bf16[1025, 64, 64]"),
    ("fused_moe_experts", _experts("fused_moe_experts", expert_map=d("i64", 16)),
     "argument 'expert_map': expected dtype i32, got i64[16]"),
    ("indexed_expert_mlp", _experts("indexed_expert_mlp", topk_ids=d("f32", 4, 2)),
     "argument 'topk_ids': expected dtype i32 or i64, got f32[4, 2]"),
    ("fused_moe", _layer(expert_map=d("i32", 16)),
     "argument 'gating_output': expected one column per global expert (expert_map has 16 "
     "entries), got f32[4, 8]"),
    ("fused_moe", _layer(apply_router_weight_on_input=True),
     "argument 'apply_router_weight_on_input': expected top_k 1 (the input row is scaled by its "
     "one route's weight), got true with top_k 2"),
    ("fused_moe", _layer(top_k=9),
     "argument 'top_k': expected 1 to min(16, num_experts=8), got 9"),
    ("fused_moe", _layer(gating_output=_lg, output=at(d("bf16", 4, 64), _lg)),
     "argument 'output': expected memory disjoint from 'gating_output', got bf16[4, 64] at "),
    ("fused_moe_shared_expert", _layer("fused_moe_shared_expert", shared_w_down=None),
     "argument 'shared_w_down': expected bf16 or f16 tensor of shape [64, 32], got an "
     "undefined tensor"),
    ("shared_expert_mlp",
     lambda: raw.shared_expert_mlp(_sx, d("bf16", 64, 64), d("bf16", 64, 32), _sx, "silu", None,
                                   None, WSP, 1 << 40),
     "argument 'output': expected memory disjoint from 'hidden_states', got bf16[4, 64] at "),
]  # fmt: skip


@pytest.mark.parametrize("op,call,message", TABLE, ids=[f"{o}-{i}" for i, (o, _, _) in
                                                        enumerate(TABLE)])
def test_bad_input_table_gives_the_cpp_messages(op, call, message):
    with pytest.raises(moekit.MoekitError) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(f"moekit::{op}: {message}"), msg


def test_workspace_size_queries_refuse_bad_shapes():
    def q(T):
        return raw.fused_moe_experts_workspace_size(
            t("bf16", T, 64, ptr=0), t("bf16", 8, 64, 64, ptr=0), None, None,
            t("i32", 4, 2, ptr=0), None, "silu", None, None, None, False)  # fmt: skip

    with pytest.raises(moekit.MoekitError, match=re.escape(
            "moekit::fused_moe_experts: argument 'hidden_states': expected non-negative sizes, "
            "got bf16[-4, 64]")):  # fmt: skip
        q(-4)
    with pytest.raises(moekit.MoekitError, match=re.escape(
            "moekit::fused_moe_experts: argument 'hidden_states': expected sizes of at most "
            "2^48, got bf16[4611686018427387904, 64]")):  # fmt: skip
        q(1 << 62)
    assert q(4) > 0


@pytest.mark.skipif(raw.device_count() > 0, reason="a CUDA device is present (would launch)")
@pytest.mark.parametrize("op,call", [
    ("fused_topk", _topk()),
    ("fused_moe_experts", _experts("fused_moe_experts")),
    ("indexed_expert_mlp", _experts("indexed_expert_mlp")),
    ("fused_moe", _layer()),
    ("fused_moe_shared_expert", _layer("fused_moe_shared_expert")),
])  # fmt: skip
def test_table_valid_arguments_stop_at_the_launch_target(op, call):
    """The valid arguments the table's rows break pass every check: without a GPU the call
    stops at the launch target."""
    with pytest.raises(moekit.MoekitError, match=re.escape(
            f"moekit::{op}: argument 'stream': expected a CUDA device to launch on")):  # fmt: skip
        call()


@pytest.mark.skipif(raw.device_count() > 0, reason="a CUDA device is present (would launch)")
def test_valid_layer_call_without_a_gpu_names_the_layer():
    # fused_moe's first step is the FusedTopK kernel; the error names the op called.
    with pytest.raises(moekit.MoekitError, match=re.escape(
            "moekit::fused_moe: argument 'stream': expected a CUDA device to launch on, got "
            "none: cudaGetDevice says")):  # fmt: skip
        _layer()()


TUNING_HEADER = (
    "device | op | dtype | E | H | F | top_k | routing | S | experts | tokens | plan | time_us"
    " | default_us\n"
)
TUNING_ROW = (
    "NVIDIA H200 | fused_moe | bf16 | 128 | 2048 | 768 | 8 | softmax | 0 | all | 1-16,24 | direct"
    " | 10.5 | 11\n"
)


def test_tuning_tables(tmp_path):
    raw.clear_tuning_tables()
    builtin = len(raw.tuning_entries())
    raw.load_tuning_table_text(TUNING_HEADER + TUNING_ROW, "mine")
    entries = raw.tuning_entries()
    assert len(entries) == builtin + 1
    e = entries[0]
    assert (e["device"], e["op"], e["E"], e["routing"]) == ("NVIDIA H200", "fused_moe", 128, "softmax")
    assert (e["dtype"], e["quant"]) == ("bf16", "none")
    assert e["tokens"] == [(1, 16), (24, 24)]
    assert (e["plan"], e["time_us"], e["default_us"], e["source"]) == ("direct", 10.5, 11, "mine:2")
    bad = tmp_path / "bad.table"
    bad.write_text(TUNING_HEADER + TUNING_ROW.replace("| direct |", "| direkt |"))
    with pytest.raises(moekit.MoekitError, match=re.escape(str(bad) + ":2: field 'plan'")):
        raw.load_tuning_table(str(bad))
    assert len(raw.tuning_entries()) == builtin + 1  # a refused table adds nothing
    good = tmp_path / "good.table"
    good.write_text(TUNING_HEADER + TUNING_ROW.replace("1-16,24", "32"))
    raw.load_tuning_table(str(good))
    assert raw.tuning_entries()[0]["tokens"] == [(32, 32)]
    # FP8 weights: the scheme follows the dtype in its column.
    fp8_row = TUNING_ROW.replace("| bf16 |", "| bf16 fp8_per_channel |")
    raw.load_tuning_table_text(TUNING_HEADER + fp8_row)
    assert raw.tuning_entries()[0]["quant"] == "fp8_per_channel"
    raw.clear_tuning_tables()
    assert len(raw.tuning_entries()) == builtin


def test_gpu_check_runs_every_test_file():
    """python/gpu-check.sh (the GPU machine's Python run) names every test file here."""
    here = os.path.dirname(os.path.abspath(__file__))
    script = open(os.path.join(here, "..", "gpu-check.sh")).read()
    files = sorted(f for f in os.listdir(here) if re.fullmatch(r"test_\w+\.py", f))
    missing = [f for f in files if f not in script]
    assert files and not missing, f"python/gpu-check.sh does not run {missing}"
