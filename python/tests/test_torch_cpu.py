"""The torch layer without a GPU: op registration, fake (meta) implementations,
torch.compile / make_fx tracing, and errors for non-CUDA tensors. Skipped, saying
so, where PyTorch is not installed."""

import pytest

from mk_support import requires_torch, stubbed_devices, torch_skip_reason  # noqa: F401

pytestmark = requires_torch

if torch_skip_reason() is None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    import moekit

    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    i32, i64 = torch.int32, torch.int64


def meta(*shape, dtype=None):
    return torch.empty(shape, dtype=dtype or bf16, device="meta")


def test_all_ops_registered_with_docstrings():
    for name in moekit.OPS:
        op = getattr(torch.ops.moekit, name).default
        assert op._schema.name == "moekit::" + name
        fn = getattr(moekit, name)
        assert fn is getattr(moekit.ops, name)
        assert "Returns" in fn.__doc__ or "Same shapes" in fn.__doc__, name
    assert moekit.ops.TORCH_DTYPES[torch.float8_e4m3fn] == moekit.DTYPES["fp8e4m3"]


def test_schema_argument_names_match_the_functions():
    import inspect

    for name in moekit.OPS:
        schema = getattr(torch.ops.moekit, name).default._schema
        params = inspect.signature(getattr(moekit, name)).parameters
        assert [a.name for a in schema.arguments] + ["out"] == list(params), name
        assert params["out"].kind == inspect.Parameter.KEYWORD_ONLY
        assert params["out"].default is None


def _meta_cases():
    T, E, K, H, F, S = 6, 8, 2, 64, 32, 48
    x, logits = meta(T, H), meta(T, E, dtype=f32)
    w13, w2 = meta(E, 2 * F, H), meta(E, H, F)
    ids, w = meta(T, K, dtype=i32), meta(T, K, dtype=f32)
    fp8 = torch.float8_e4m3fn
    return [
        ("fused_topk", (logits, K), [((T, K), f32), ((T, K), i32)]),
        ("moe_permute_align", (ids, E, 16),
         [((T * K + E * 15,), i32), ((-(-(T * K + E * 15) // 16),), i32), ((1,), i32)]),
        ("moe_pre_permute", (x, ids, E, 4), [((T * K + E * 3, H), bf16), ((E,), i32),
                                             ((T * K,), i32)]),
        ("moe_post_permute", (meta(20, H), w, meta(T * K, dtype=i32), f32), [((T, H), f32)]),
        ("moe_grouped_gemm", (meta(20, H), w13, meta(E, dtype=i32)), [((20, 2 * F), bf16)]),
        ("moe_grouped_gemm", (meta(20, H), w13, meta(E, dtype=i32), False, 1, "silu_and_mul",
                              f32), [((20, F), f32)]),
        ("moe_grouped_gemm", (meta(E, 16, H, dtype=f16), meta(E, 40, H, dtype=f16),
                              meta(E, dtype=i32), True), [((E, 16, 40), f16)]),
        ("moe_grouped_gemm_fp8", (meta(E, 16, 256, dtype=fp8), meta(E, 16, 2, dtype=f32),
                                  meta(E, 384, 256, dtype=fp8), meta(E, 3, 2, dtype=f32),
                                  meta(E, dtype=i32)), [((E, 16, 384), bf16)]),
        # Contiguous rows, silu_and_mul (b holds 2N rows), an e4m3 c with its scale.
        ("moe_grouped_gemm_fp8", (meta(40, 256, dtype=fp8), meta(40, dtype=f32),
                                  meta(E, 256, 256, dtype=fp8), meta(E, 256, dtype=f32),
                                  meta(E, dtype=i32), False, 8, "per_channel", "silu_and_mul",
                                  meta(1, dtype=f32)), [((40, 128), fp8)]),
        ("moe_grouped_gemm_fp8", (meta(E, 16, 256, dtype=fp8), meta(1, dtype=f32),
                                  meta(E, 64, 256, dtype=fp8), meta(E, dtype=f32),
                                  meta(E, dtype=i32), True, 1, "per_tensor", "silu_and_mul"),
         [((E, 16, 32), bf16)]),
        ("moe_expert_mlp", (meta(20, H), meta(E, dtype=i32), w13, w2), [((20, H), bf16)]),
        ("fused_moe_experts", (x, w13, w2, w, ids), [((T, H), bf16)]),
        ("indexed_expert_mlp", (x, w13, w2, w, ids), [((T, H), bf16)]),
        ("fused_moe", (x, logits, w13, w2, K), [((T, H), bf16)]),
        ("fused_moe_shared_expert", (x, logits, w13, w2, meta(2 * S, H), meta(H, S), K),
         [((T, H), bf16)]),
        ("shared_expert_mlp", (x, meta(2 * S, H), meta(H, S)), [((T, H), bf16)]),
        # The engine arguments: int64 global ids, an expert map, the input-side weight.
        ("moe_permute_align", (meta(T, K, dtype=i64), E, 16, meta(4 * E, dtype=i32)),
         [((T * K + E * 15,), i32), ((-(-(T * K + E * 15) // 16),), i32), ((1,), i32)]),
        ("moe_pre_permute", (x, meta(T, K, dtype=i64), E, 4),
         [((T * K + E * 3, H), bf16), ((E,), i32), ((T * K,), i32)]),
        ("fused_moe_experts", (x, w13, w2, meta(T, 1, dtype=f32), meta(T, 1, dtype=i64),
                               "silu", None, None, meta(4 * E, dtype=i32), True), [((T, H), bf16)]),
        ("fused_moe", (x, meta(T, 4 * E, dtype=f32), w13, w2, 1, False, "softmax", 0, 0, 1.0,
                       None, "silu", None, None, meta(4 * E, dtype=i32), True), [((T, H), bf16)]),
    ]  # fmt: skip


_META_CASES = _meta_cases() if torch_skip_reason() is None else []


@pytest.mark.parametrize("case", _META_CASES, ids=[c[0] for c in _META_CASES])
def test_fake_implementations_on_meta_tensors(case):
    name, args, expected = case
    for call in (getattr(moekit, name), getattr(torch.ops.moekit, name).default):
        out = call(*args)
        outs = out if isinstance(out, tuple) else (out,)
        assert [(tuple(o.shape), o.dtype) for o in outs] == expected, name
        assert all(o.device.type == "meta" for o in outs)


def test_fake_tensor_mode_with_cuda_tensors():
    with FakeTensorMode():
        x = torch.empty(5, 64, dtype=bf16, device="cuda")
        logits = torch.empty(5, 16, device="cuda")
        w13 = torch.empty(16, 64, 64, dtype=bf16, device="cuda")
        w2 = torch.empty(16, 64, 32, dtype=bf16, device="cuda")
        out = moekit.fused_moe(x, logits, w13, w2, 4, True, "sigmoid", 4, 2, 2.5)
        assert out.shape == (5, 64) and out.device.type == "cuda" and out.dtype == bf16
        w, ids = moekit.fused_topk(logits, 3)
        assert w.device.type == "cuda" and ids.dtype == i32 and w.shape == (5, 3)


def _layer(x, logits, w13, w2, s13, s2):
    y = moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, 2, True)
    return y * 0.5 + x


def test_make_fx_records_the_custom_op():
    args = (meta(4, 64), meta(4, 8, dtype=f32), meta(8, 32, 64), meta(8, 64, 16),
            meta(32, 64), meta(64, 16))  # fmt: skip
    gm = make_fx(_layer, tracing_mode="fake")(*args)
    assert "torch.ops.moekit.fused_moe_shared_expert.default" in gm.code


def test_torch_compile_fullgraph_traces_through():
    args = (meta(4, 64), meta(4, 8, dtype=f32), meta(8, 32, 64), meta(8, 64, 16),
            meta(32, 64), meta(64, 16))  # fmt: skip
    torch._dynamo.reset()
    compiled = torch.compile(_layer, fullgraph=True, backend="aot_eager")
    out = compiled(*args)
    assert out.shape == (4, 64) and out.device.type == "meta"
    # A second token count reuses or recompiles the graph; either way no graph break.
    args2 = (meta(9, 64), meta(9, 8, dtype=f32)) + args[2:]
    assert compiled(*args2).shape == (9, 64)


@pytest.mark.parametrize("use_dispatcher", [False, True])
def test_cpu_tensors_are_rejected_naming_the_argument(use_dispatcher):
    x = torch.zeros(4, 64, dtype=bf16)
    logits = torch.zeros(4, 8)
    w13, w2 = torch.zeros(8, 32, 64, dtype=bf16), torch.zeros(8, 64, 16, dtype=bf16)
    fn = torch.ops.moekit.fused_moe.default if use_dispatcher else moekit.fused_moe
    with pytest.raises(moekit.MoekitError,
                       match=r"moekit::fused_moe: argument 'hidden_states': expected a CUDA "
                             r"tensor, got a tensor on cpu"):  # fmt: skip
        fn(x, logits, w13, w2, 2)
    with pytest.raises(ValueError, match=r"moekit::fused_topk: argument 'gating_output'"):
        (torch.ops.moekit.fused_topk.default if use_dispatcher else moekit.fused_topk)(logits, 2)


def test_non_tensor_arguments_are_rejected():
    with pytest.raises((TypeError, RuntimeError)):
        moekit.shared_expert_mlp("x", None, None)


def test_fast_path_switch():
    old = moekit.ops.set_eager_fast_path(False)
    try:
        assert moekit.ops.set_eager_fast_path(True) is False
    finally:
        moekit.ops.set_eager_fast_path(old)


def _valid_calls():
    """One valid call of each op's CUDA implementation (CPU tensors stand in)."""
    o = moekit.ops
    return {case: (lambda n=name, a=args: getattr(o, f"_{n}_cuda")(*a))
            for case, (name, args) in _valid_args().items()}  # fmt: skip


def _valid_args():
    """Valid arguments of each op (CPU tensors stand in): case -> (op name, args)."""
    T, E, K, H, F, S = 6, 8, 2, 64, 32, 48
    x, lg = torch.randn(T, H, dtype=bf16), torch.randn(T, E)
    w13, w2 = torch.randn(E, 2 * F, H, dtype=bf16), torch.randn(E, H, F, dtype=bf16)
    ids, w = torch.randint(0, E, (T, K), dtype=i32), torch.rand(T, K)
    s13, s2 = torch.randn(2 * S, H, dtype=bf16), torch.randn(H, S, dtype=bf16)
    ends = torch.tensor([2, 4, 6, 8, 10, 12, 14, 20], dtype=i32)
    fp8 = torch.float8_e4m3fn
    ids64 = torch.randint(0, 4 * E, (T, K), dtype=torch.int64)  # global ids of 4 ranks
    emap = torch.full((4 * E,), -1, dtype=i32)
    emap[E : 2 * E] = torch.arange(E, dtype=i32)
    return {
        "fused_topk": ("fused_topk", (lg, K, True, "sigmoid", 4, 2, 2.5, torch.zeros(E))),
        "moe_permute_align": ("moe_permute_align", (ids, E, 16)),
        "moe_pre_permute": ("moe_pre_permute", (x, ids, E, 4)),
        "moe_post_permute": ("moe_post_permute", (
            torch.randn(T * K, H, dtype=bf16), w, torch.arange(T * K, dtype=i32), f32)),
        "moe_grouped_gemm": ("moe_grouped_gemm", (
            torch.randn(20, H, dtype=bf16), w13, ends, False, 1, "silu_and_mul", f32)),
        "moe_grouped_gemm-masked": ("moe_grouped_gemm", (
            torch.randn(E, 16, H, dtype=bf16), w13, torch.full((E,), 3, dtype=i32), True)),
        "moe_grouped_gemm_fp8": ("moe_grouped_gemm_fp8", (
            torch.zeros(E, 16, 256, dtype=fp8), torch.ones(E, 16, 2),
            torch.zeros(E, 384, 256, dtype=fp8), torch.ones(E, 3, 2),
            torch.full((E,), 3, dtype=i32))),
        "moe_grouped_gemm_fp8-contiguous": ("moe_grouped_gemm_fp8", (
            torch.zeros(40, 256, dtype=fp8), torch.ones(40), torch.zeros(E, 256, 256, dtype=fp8),
            torch.ones(E, 256), torch.tensor([2, 4, 6, 8, 10, 12, 14, 20], dtype=i32), False, 2,
            "per_channel", "silu_and_mul", torch.ones(1))),
        "moe_grouped_gemm_fp8-per-tensor": ("moe_grouped_gemm_fp8", (
            torch.zeros(E, 16, 256, dtype=fp8), torch.ones(1), torch.zeros(E, 128, 256, dtype=fp8),
            torch.ones(E), torch.full((E,), 3, dtype=i32), True, 1, "per_tensor")),
        "moe_expert_mlp": ("moe_expert_mlp", (torch.randn(20, H, dtype=bf16), ends, w13, w2)),
        "fused_moe_experts": ("fused_moe_experts", (x, w13, w2, w, ids)),
        "indexed_expert_mlp": ("indexed_expert_mlp", (x, w13, w2, w, ids)),
        "fused_moe": ("fused_moe", (x, lg, w13, w2, K, True, "sigmoid", 4, 2, 2.5,
                                    torch.zeros(E))),
        "fused_moe_shared_expert": ("fused_moe_shared_expert",
                                    (x, lg, w13, w2, s13, s2, K, True)),
        "shared_expert_mlp": ("shared_expert_mlp", (x, s13, s2)),
        # The engine arguments: int64 global ids, an expert map, the input-side weight.
        "moe_permute_align-engine": ("moe_permute_align", (ids64, E, 16, emap)),
        "moe_pre_permute-int64": ("moe_pre_permute", (x, ids.long(), E, 4)),
        "fused_moe_experts-engine": ("fused_moe_experts",
                                     (x, w13, w2, w[:, :1].contiguous(), ids64[:, :1].contiguous(),
                                      "silu", None, None, emap, True)),
        "indexed_expert_mlp-engine": ("indexed_expert_mlp", (x, w13, w2, w, ids64, "silu", None, None, emap)),
        "fused_moe_shared_expert-engine": ("fused_moe_shared_expert",
                                           (x, torch.randn(T, 4 * E), w13, w2, s13, s2, 1, False,
                                            "softmax", 0, 0, 1.0, None, "silu", None, None, None,
                                            None, emap, True)),
    }  # fmt: skip


@pytest.mark.skipif(moekit.raw.device_count() > 0 if torch_skip_reason() is None else False,
                    reason="a CUDA device is present: these calls would launch kernels")
@pytest.mark.parametrize("name", list(_valid_calls()) if torch_skip_reason() is None else [])
def test_the_torch_layer_passes_valid_arguments(name, monkeypatch):
    """Each op's CUDA implementation, fed valid (CPU) tensors with the device checks
    stubbed, gets through every C++ validation: the only error left is the launch
    failing on a machine without a GPU. Checks shapes, dtypes, parameter order and
    workspace plumbing of the torch layer without a GPU."""
    monkeypatch.setattr(moekit.ops, "_device", lambda op, names, *ts: 0)
    # CPU tensors report device -1: make that the launch context's device, and let them
    # past the extension's device check, so that the call goes down the direct path.
    monkeypatch.setattr(moekit.ops, "_launch_ctx", lambda t: (-1, 0))
    monkeypatch.setattr(moekit.ops, "_is_capturing", lambda stream: False)
    old = moekit.raw._set_device_check(False)
    try:
        with pytest.raises(moekit.MoekitError) as info:
            _valid_calls()[name]()
    finally:
        moekit.raw._set_device_check(old)
        moekit.ops.release_workspaces()
    # Every argument check passed: what is left is the launch target (the stream's device,
    # checked last, before any launch) or the launch itself failing without a GPU.
    msg = str(info.value)
    assert "argument '" not in msg or "argument 'stream'" in msg, msg
    assert "CUDA" in msg, msg


def test_raw_binding_dlpack_rejects_host_torch_tensors():
    with pytest.raises(moekit.MoekitError, match=r"expected a tensor on a CUDA device, got a "
                                                 r"tensor on cpu"):  # fmt: skip
        moekit.raw.describe(torch.zeros(2, 3, dtype=bf16))
    # The tuple form the torch layer builds: t.dtype is registered with the binding.
    t = torch.zeros(4, 6, dtype=bf16)
    assert moekit.raw.describe(moekit.ops._v(t)) == "bf16[4, 6]"
    with pytest.raises(moekit.MoekitError, match=r"got torch.int16"):
        moekit.raw.describe(moekit.ops._v(torch.zeros(2, dtype=torch.int16)))
    with pytest.raises(moekit.MoekitError, match=r"non-contiguous"):
        moekit.raw.describe(moekit.ops._v(t.t()))


@pytest.mark.skipif(moekit.raw.device_count() > 0 if torch_skip_reason() is None else False,
                    reason="a CUDA device is present: these calls would launch kernels")
def test_workspace_cached_per_stream_grown_on_demand(monkeypatch):
    """The torch layer's workspace: one entry per (device, stream), grown (through the
    C++ callback) only when an op needs more, and never cached during graph capture.
    CPU tensors stand in, as above; each call fails at the launch, after the op has
    taken its workspace."""
    o = moekit.ops
    monkeypatch.setattr(o, "_is_capturing", lambda stream: False)
    stream = [7]
    monkeypatch.setattr(o, "_launch_ctx", lambda t: (-1, stream[0]))
    old = moekit.raw._set_device_check(False)
    E, K, H, F = 8, 2, 64, 32
    w13, w2 = torch.randn(E, 2 * F, H, dtype=bf16), torch.randn(E, H, F, dtype=bf16)

    def call(T):
        x, lg = torch.randn(T, H, dtype=bf16), torch.randn(T, E)
        with pytest.raises(moekit.MoekitError, match="CUDA"):
            o._fused_moe_cuda(x, lg, w13, w2, K, True)
        out = torch.empty_like(x)
        v = o._v
        return moekit.raw.fused_moe_workspace_size(v(x), v(lg), None, v(w13), v(w2), v(out), K,
                                                   True, "softmax", 0, 0, 1.0, "silu", None,
                                                   None, None, False)  # fmt: skip

    try:
        o.release_workspaces()
        need = call(6)
        entry = o._ws_cache[(-1, 7)]
        assert need > 0 and entry[1] >= need and entry[0] % 256 == 0
        assert entry[2].numel() >= entry[1] and entry[2].data_ptr() <= entry[0]
        buf = entry[2]
        call(3)  # needs less: same buffer
        assert o._ws_cache[(-1, 7)][2] is buf
        need = call(5000)  # needs more: grown
        assert o._ws_cache[(-1, 7)][1] >= need and o._ws_cache[(-1, 7)][2] is not buf
        stream[0] = 9  # another stream: its own entry
        call(6)
        assert set(o._ws_cache) == {(-1, 7), (-1, 9)}
        o.release_workspaces()
        monkeypatch.setattr(o, "_is_capturing", lambda stream: True)  # capture: never cached
        call(6)
        assert o._ws_cache == {}
        monkeypatch.setattr(o, "_is_capturing", lambda stream: False)
        assert o.set_workspace_cache(False) is True
        call(6)
        assert o._ws_cache == {}
        assert o.set_workspace_cache(True) is False
    finally:
        moekit.raw._set_device_check(old)
        o.release_workspaces()


@pytest.mark.skipif(moekit.raw.device_count() > 0 if torch_skip_reason() is None else False,
                    reason="a CUDA device is present: these calls would launch kernels")
def test_fused_topk_output_prototypes(monkeypatch):
    """fused_topk's eager path allocates its outputs as empty_like of cached prototypes
    (stride-0 views of a one-element base): fresh contiguous [T, K] f32 / i32 tensors of
    their own for every shape, and no prototype made during a capture or inside a
    dispatcher-registered kernel. CPU tensors stand in, as above."""
    o = moekit.ops
    monkeypatch.setattr(o, "_launch_ctx", lambda t: (-1, 0))
    capturing = [False]
    monkeypatch.setattr(o, "_is_capturing", lambda stream: capturing[0])
    old = moekit.raw._set_device_check(False)
    try:
        o.release_workspaces()
        for T, K in [(5, 3), (0, 4), (1, 1), (1, 8), (8, 1), (3, 0), (5, 3), (1, 8)]:
            lg = torch.randn(T, 8)
            w, ids = o._topk_outputs(lg, T, K, -1, 0)  # a miss: plain allocations
            p = o._topk_protos[(T, K, -1)]
            outs = [w, ids, torch.empty_like(p[0]), torch.empty_like(p[1])]
            for out, dtype in zip(outs, (f32, i32, f32, i32)):
                assert out.shape == (T, K) and out.dtype == dtype and out.is_contiguous()
                assert out.stride() == torch.empty(T, K).stride(), (T, K, out.stride())
                assert out.untyped_storage().nbytes() == T * K * 4
            if T * K > 1:  # hit: distinct fresh storage per call, prototypes hold none
                a, b = torch.empty_like(p[0]), torch.empty_like(p[0])
                assert a.data_ptr() != b.data_ptr() and p[0].untyped_storage().nbytes() == 4
            if T:  # through the op: the outputs get past the C++ checks, the launch fails
                with pytest.raises(moekit.MoekitError, match="CUDA"):
                    o._fused_topk_cuda(lg, K if K else 1)
            else:  # nothing to launch
                w, ids = o._fused_topk_cuda(lg, K)
                assert w.shape == ids.shape == (0, K) and (w.dtype, ids.dtype) == (f32, i32)
        assert len(o._topk_bases) == 2  # one base per (device, dtype)
        o.release_workspaces()
        capturing[0] = True
        o._topk_outputs(torch.randn(5, 8), 5, 3, -1, 0)
        assert o._topk_protos == {}
        capturing[0] = False
        o._tls.uncached = True
        try:
            o._topk_outputs(torch.randn(5, 8), 5, 3, -1, 0)
        finally:
            o._tls.uncached = False
        assert o._topk_protos == {}
    finally:
        moekit.raw._set_device_check(old)
        o.release_workspaces()


def test_fused_topk_prototype_cache_keys(monkeypatch):
    """fused_topk's eager path looks its prototypes up by (logits shape, top_k, device):
    a second call of one shape and top_k hits (no _topk_outputs), another T, E, top_k or
    device misses, and every call's outputs are fresh [T, K] f32 / i32 tensors."""
    o = moekit.ops
    dev = [-1]
    monkeypatch.setattr(o, "_launch_ctx", lambda t: (dev[0], 0))
    monkeypatch.setattr(o, "_is_capturing", lambda stream: False)
    monkeypatch.setattr(o, "_t_fused_topk", lambda *args: None)
    misses = []
    real = o._topk_outputs
    monkeypatch.setattr(o, "_topk_outputs", lambda *a: misses.append(a[1:3]) or real(*a))
    o.release_workspaces()
    try:
        ptrs, alive = set(), []  # the outputs stay alive: their addresses stay distinct
        for (T, E), K, d in [((5, 8), 3, -1), ((5, 8), 3, -1), ((6, 8), 3, -1), ((5, 9), 3, -1),
                             ((5, 8), 2, -1), ((5, 8), 3, -2), ((1, 8), 1, -1), ((1, 8), 1, -1),
                             ((0, 8), 4, -1), ((0, 8), 4, -1)]:  # fmt: skip
            dev[0] = d
            w, ids = o._fused_topk_cuda(torch.randn(T, E), K)
            assert w.shape == ids.shape == (T, K) and (w.dtype, ids.dtype) == (f32, i32)
            assert w.is_contiguous() and ids.is_contiguous()
            if T * K > 1:
                assert w.data_ptr() not in ptrs and ids.data_ptr() not in ptrs
                ptrs |= {w.data_ptr(), ids.data_ptr()}
                alive.append((w, ids))
        assert misses == [(5, 3), (6, 3), (5, 3), (5, 2), (5, 3), (1, 1), (0, 4)]
    finally:
        o.release_workspaces()


def test_launch_context_without_a_gpu():
    """moekit.raw._launch_ctx (the eager path's device and stream lookup): a CPU or meta
    first tensor never gets a launch context (the caller then checks the devices and
    names the argument at fault); a tensor subclass goes to the Python version."""
    o = moekit.ops
    assert o._launch_ctx(torch.zeros(2, 3)) is None
    assert o._launch_ctx(torch.zeros(2, 3, device="meta")) is None
    seen = []
    moekit.raw._set_launch_ctx_fallback(lambda t: seen.append(t) or (5, 6))
    try:
        p = torch.nn.Parameter(torch.zeros(2))
        assert o._launch_ctx(p) == (5, 6) and seen == [p]
    finally:
        moekit.raw._set_launch_ctx_fallback(o._launch_ctx_py)


def test_torch_entry_points_reject_non_tensors_and_check_devices():
    """The extension's torch entry points: a non-tensor is named with its type; CPU
    tensors are rejected naming the argument (the device check runs in C++)."""
    x = torch.zeros(4, 64, dtype=bf16)
    w, ids = torch.empty(4, 2), torch.empty(4, 2, dtype=i32)
    with pytest.raises(moekit.MoekitError,
                       match=r"moekit::fused_topk: argument 'gating_output': expected a "
                             r"torch.Tensor, got str"):  # fmt: skip
        moekit.raw._t_fused_topk("x", None, w, ids, 2, False, "softmax", 0, 0, 1.0, 0)
    with pytest.raises(moekit.MoekitError,
                       match=r"moekit::fused_topk: argument 'gating_output': expected a CUDA "
                             r"tensor, got a tensor on cpu"):  # fmt: skip
        moekit.raw._t_fused_topk(x, None, w, ids, 2, False, "softmax", 0, 0, 1.0, 0)


@pytest.mark.parametrize("exchange", [True, False])
def test_torch_entry_points_read_tensors_exactly(exchange):
    """Both ways the extension reads a torch tensor (torch's DLPack C exchange API, the
    attribute descriptors) give its data pointer, dtype and shape: views with a storage
    offset, nn.Parameter with requires_grad, size-1 dims with odd strides, empty
    tensors; strided views and unsupported dtypes are rejected, named."""
    raw = moekit.raw
    raw._register_torch(torch.Tensor, moekit.ops._grow, exchange)
    old = raw._set_device_check(False)
    try:
        if exchange and hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
            assert raw._tensor_protocol() == "dlpack-exchange"
        if not exchange:
            assert raw._tensor_protocol() == "attributes"
        base = torch.arange(6 * 64, dtype=torch.float32).view(6, 64)
        cases = [
            base, base[2:], base[1:3], torch.nn.Parameter(torch.zeros(4, 8, dtype=bf16)),
            torch.zeros(5, 1, 7, dtype=f16).transpose(0, 1).contiguous(),
            torch.zeros(3, 1, 8)[:, 0], torch.zeros(0, 16, dtype=i32),
            torch.zeros(2, 3, 32).to(torch.float8_e4m3fn), base.view(-1)[5:17].view(3, 4),
            torch.zeros(4, 2, dtype=torch.int64),
        ]
        for t in cases:
            code = moekit.ops.TORCH_DTYPES[t.dtype]
            assert raw._t_view(t) == (t.data_ptr(), code, tuple(t.shape)), (t.shape, t.dtype)
        with pytest.raises(moekit.MoekitError, match="non-contiguous"):
            raw._t_view(base.t())
        with pytest.raises(moekit.MoekitError, match="torch.int16"):
            raw._t_view(torch.zeros(3, dtype=torch.int16))
        with pytest.raises(moekit.MoekitError, match="a torch.Tensor, got int"):
            raw._t_view(3)
    finally:
        raw._set_device_check(old)
        moekit.ops._raw._register_torch(
            torch.Tensor, moekit.ops._grow,
            moekit.ops.os.environ.get("MOEKIT_DLPACK_EXCHANGE", "1") != "0")  # fmt: skip


# ---------------------------------------------------------------- out=

_NO_GPU = pytest.mark.skipif(
    moekit.raw.device_count() > 0 if torch_skip_reason() is None else False,
    reason="a CUDA device is present: these calls would launch kernels")  # fmt: skip


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _buffers(name, args, fill=True):
    """Output buffers of the right shapes and dtypes for a call of op name (from its fake
    implementation), filled with random bytes."""
    outs = _as_tuple(getattr(moekit.ops, f"_{name}_fake")(*args))
    if fill:
        for t in outs:
            t.view(torch.uint8).copy_(torch.randint(0, 256, (t.nbytes,), dtype=torch.uint8)
                                      .view(t.view(torch.uint8).shape))  # fmt: skip
    return outs


def _out_arg(bufs):
    return bufs[0] if len(bufs) == 1 else bufs


def test_out_variants_registered_as_mutating_ops():
    """torch.ops.moekit.<name>_out: the functional op's arguments, then one keyword-only
    mutated tensor per output, named after it; it returns nothing."""
    for name in moekit.OPS:
        functional = getattr(torch.ops.moekit, name).default._schema
        schema = getattr(torch.ops.moekit, name + "_out").default._schema
        n = len(functional.returns)
        assert schema.is_mutable and len(schema.returns) == 0, name
        head, tail = schema.arguments[:-n], schema.arguments[-n:]
        params = str(functional)[str(functional).index("(") : str(functional).rindex(") ->")]
        assert str(schema).startswith(f"moekit::{name}_out{params}, *, Tensor(a!) "), name
        assert [a.name for a in head] == [a.name for a in functional.arguments], name
        assert all(a.kwarg_only and a.alias_info.is_write for a in tail), name
        assert not any(a.alias_info and a.alias_info.is_write for a in head), name
        assert len({a.alias_info.before_set.pop() for a in tail}) == n, name
    assert [a.name for a in torch.ops.moekit.fused_topk_out.default._schema.arguments[-2:]] == [
        "topk_weights", "topk_ids"]


@pytest.mark.parametrize("case", _META_CASES, ids=[c[0] for c in _META_CASES])
def test_fake_implementations_with_out(case):
    """out= on meta tensors: the given buffers come back (one tensor, or a tuple of them),
    through both the public function and the out variant."""
    name, args, expected = case
    bufs = tuple(meta(*shape, dtype=dtype) for shape, dtype in expected)
    got = getattr(moekit, name)(*args, out=_out_arg(bufs))
    assert all(a is b for a, b in zip(_as_tuple(got), bufs)) and len(_as_tuple(got)) == len(bufs)
    if len(bufs) == 1:
        assert got is bufs[0]
    kw = dict(zip(moekit.ops._OPS[moekit.OPS.index(name)].outputs, bufs))
    assert getattr(torch.ops.moekit, name + "_out").default(*args, **kw) is None


@pytest.mark.parametrize("use_dispatcher", [False, True])
def test_fake_out_errors_name_the_argument(use_dispatcher):
    logits = meta(6, 8, dtype=f32)
    good = (meta(6, 2, dtype=f32), meta(6, 2, dtype=i32))

    def topk(out):
        if use_dispatcher:
            return torch.ops.moekit.fused_topk_out(logits, 2, topk_weights=out[0],
                                                   topk_ids=out[1])  # fmt: skip
        return moekit.fused_topk(logits, 2, out=out)

    for bad, msg in [
        ((good[0], meta(6, 3, dtype=i32)), r"argument 'out\[1\]' \(topk_ids\): expected "
                                           r"shape \[6, 2\], got i32\[6, 3\]"),
        ((meta(6, 2, dtype=bf16), good[1]), r"argument 'out\[0\]' \(topk_weights\): expected "
                                            r"dtype f32, got bf16\[6, 2\]"),
        ((meta(2, 6, dtype=f32).t(), good[1]), r"argument 'out\[0\]' \(topk_weights\): expected a "
                                               r"contiguous tensor"),
    ]:  # fmt: skip
        with pytest.raises(moekit.MoekitError, match=r"moekit::fused_topk: " + msg):
            topk(bad)
    x = meta(6, 64)
    s13, s2 = meta(96, 64), meta(64, 48)
    with pytest.raises(moekit.MoekitError, match=r"moekit::shared_expert_mlp: argument 'out': "
                                                 r"expected dtype bf16, got f16\[6, 64\]"):
        if use_dispatcher:
            torch.ops.moekit.shared_expert_mlp_out(x, s13, s2, output=meta(6, 64, dtype=f16))
        else:
            moekit.shared_expert_mlp(x, s13, s2, out=meta(6, 64, dtype=f16))


def test_out_must_be_tensors():
    logits, x = meta(6, 8, dtype=f32), meta(6, 64)
    s13, s2 = meta(96, 64), meta(64, 48)
    w, ids = meta(6, 2, dtype=f32), meta(6, 2, dtype=i32)
    for bad, msg in [
        (w, r"argument 'out': expected a tuple of 2 tensors \(topk_weights, topk_ids\), "
            r"got Tensor"),
        ((w,), r"argument 'out': expected a tuple of 2 tensors .*, got a tuple of 1"),
        ((w, ids, ids), r"argument 'out': .*got a tuple of 3"),
        ((w, "ids"), r"argument 'out\[1\]': expected a torch.Tensor, got str"),
    ]:  # fmt: skip
        with pytest.raises(moekit.MoekitError, match=r"moekit::fused_topk: " + msg):
            moekit.fused_topk(logits, 2, out=bad)
    assert moekit.fused_topk(logits, 2, out=[w, ids]) == (w, ids)  # a list is taken too
    with pytest.raises(moekit.MoekitError, match=r"moekit::shared_expert_mlp: argument 'out': "
                                                 r"expected a torch.Tensor, got tuple"):
        moekit.shared_expert_mlp(x, s13, s2, out=(x,))


def test_out_dtype_follows_the_buffer():
    """With out=, out_dtype None takes the buffer's dtype; another out_dtype is an error."""
    eo, w, inv = meta(12, 64), meta(6, 2, dtype=f32), meta(12, dtype=i32)
    for dtype in (bf16, f32):
        buf = meta(6, 64, dtype=dtype)
        assert moekit.moe_post_permute(eo, w, inv, out=buf) is buf
        assert moekit.moe_post_permute(eo, w, inv, dtype, out=buf) is buf
    with pytest.raises(moekit.MoekitError, match=r"moekit::moe_post_permute: argument "
                                                 r"'out_dtype': expected None or the dtype of "
                                                 r"out, got torch.bfloat16"):
        moekit.moe_post_permute(eo, w, inv, bf16, out=meta(6, 64, dtype=f32))
    a, b, ends = meta(20, 64), meta(8, 64, 64), meta(8, dtype=i32)
    c = meta(20, 32, dtype=f32)
    assert moekit.moe_grouped_gemm(a, b, ends, activation="silu_and_mul", out=c) is c


def _out_layer(x, logits, w13, w2, s13, s2, buf):
    moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, 2, True, out=buf)
    return buf * 0.5 + x


def test_make_fx_records_the_out_variant():
    args = (meta(4, 64), meta(4, 8, dtype=f32), meta(8, 32, 64), meta(8, 64, 16),
            meta(32, 64), meta(64, 16), meta(4, 64))  # fmt: skip
    gm = make_fx(_out_layer, tracing_mode="fake")(*args)
    assert "torch.ops.moekit.fused_moe_shared_expert_out.default" in gm.code
    assert "torch.ops.moekit.fused_moe_shared_expert.default" not in gm.code


def test_torch_compile_fullgraph_with_out():
    """torch.compile traces out= (the out variant, functionalized) without a graph break,
    and the buffer is still the one returned."""
    args = (meta(4, 64), meta(4, 8, dtype=f32), meta(8, 32, 64), meta(8, 64, 16),
            meta(32, 64), meta(64, 16))  # fmt: skip
    torch._dynamo.reset()

    def topk_into(logits, w, ids):
        got = moekit.fused_topk(logits, 2, True, out=(w, ids))
        return got[0] + 1, got[1]

    compiled = torch.compile(_out_layer, fullgraph=True, backend="aot_eager")
    assert compiled(*args, meta(4, 64)).shape == (4, 64)
    out = torch.compile(topk_into, fullgraph=True, backend="aot_eager")(
        meta(4, 8, dtype=f32), meta(4, 2, dtype=f32), meta(4, 2, dtype=i32))  # fmt: skip
    assert out[0].shape == (4, 2) and out[1].dtype == i32


def test_cpu_out_tensors_are_rejected_naming_the_argument():
    x = torch.zeros(4, 64, dtype=bf16)
    s13, s2 = torch.zeros(96, 64, dtype=bf16), torch.zeros(64, 48, dtype=bf16)
    with pytest.raises(moekit.MoekitError, match=r"moekit::shared_expert_mlp: argument "
                                                 r"'hidden_states': expected a CUDA tensor"):
        moekit.shared_expert_mlp(x, s13, s2, out=torch.empty_like(x))
    lg = torch.zeros(4, 8)
    with pytest.raises(moekit.MoekitError, match=r"moekit::fused_topk: argument "
                                                 r"'gating_output': expected a CUDA tensor"):
        moekit.fused_topk(lg, 2, out=(torch.empty(4, 2), torch.empty(4, 2, dtype=i32)))


@_NO_GPU
@pytest.mark.parametrize("case", list(_valid_args()) if torch_skip_reason() is None else [])
def test_out_buffers_reach_the_cpp_op(case, stubbed_devices, monkeypatch):
    """moekit.<op>(..., out=) hands the given buffers to the C++ entry point (their data
    pointers where the outputs go, nothing allocated), returns them, and the real C++ op
    accepts them: every argument check passes, only the launch fails without a GPU."""
    o = stubbed_devices
    name, args = _valid_args()[case]
    bufs = _buffers(name, args)
    outputs = o._OPS[moekit.OPS.index(name)].outputs
    fields = moekit.raw._ENTRY_ARGS[name]
    seen = []
    monkeypatch.setattr(o, f"_t_{name}", lambda *a: seen.append(a))
    allocations = []
    monkeypatch.setattr(o, "_empty_like", lambda *a, **k: allocations.append(a))
    monkeypatch.setattr(o, "_new_empty", lambda *a, **k: allocations.append(a))
    got = getattr(moekit, name)(*args, out=_out_arg(bufs))
    assert _as_tuple(got) == bufs and all(a is b for a, b in zip(_as_tuple(got), bufs))
    assert len(seen) == 1 and allocations == []
    for field, buf in zip(outputs, bufs):
        assert seen[0][fields.index(field)].data_ptr() == buf.data_ptr(), field
    monkeypatch.undo()  # the real entry point: C++ checks the buffers
    monkeypatch.setattr(o, "_device", lambda op, names, *ts: 0)
    monkeypatch.setattr(o, "_launch_ctx", lambda t: (-1, 0))
    monkeypatch.setattr(o, "_is_capturing", lambda stream: False)
    monkeypatch.setattr(o, "_eager", lambda first: True)
    with pytest.raises(moekit.MoekitError) as info:
        getattr(moekit, name)(*args, out=_out_arg(bufs))
    msg = str(info.value)
    assert ("argument '" not in msg or "argument 'stream'" in msg) and "CUDA" in msg, msg


@_NO_GPU
def test_wrong_out_buffers_rejected_by_the_cpp_op(stubbed_devices):
    """The C++ op's checks of the buffers, their messages naming out (or out[i]):
    shape, dtype, contiguity, overlap with an input and with each other."""
    name, args = _valid_args()["fused_topk"]
    w, ids = _buffers(name, args)
    lg = args[0]
    topk = moekit.fused_topk
    cases = [
        ((w, torch.empty(6, 1, dtype=i32)),
         r"argument 'out\[1\]' \(topk_ids\): expected .*\[6, 2\]"),
        ((w.to(bf16), ids), r"argument 'out\[0\]' \(topk_weights\): expected .*f32"),
        ((torch.empty(2, 6).t(), ids), r"argument 'out\[0\]' \(topk_weights\)"),
        ((lg.view(-1)[:12].view(6, 2), ids),
         r"argument 'out\[0\]' \(topk_weights\): expected memory disjoint from 'gating_output'"),
        ((w, w.view(i32)), r"argument 'out\[1\]' \(topk_ids\): expected memory "
                                 r"disjoint from 'out\[0\]' \(topk_weights\)"),
    ]  # fmt: skip
    for bad, msg in cases:
        with pytest.raises(moekit.MoekitError, match=r"moekit::fused_topk: " + msg):
            topk(*args, out=bad)
    name, args = _valid_args()["shared_expert_mlp"]
    x = args[0]
    for bad, msg in [
        (torch.empty(6, 32, dtype=bf16), r"argument 'out': expected shape \[6, 64\], got "
                                         r"bf16\[6, 32\]"),
        (torch.empty(6, 64, dtype=f16), r"argument 'out': expected dtype bf16.*, got f16"),
        (args[1][:6], r"argument 'out': expected memory disjoint from 'w_gate_up'"),
    ]:  # fmt: skip
        with pytest.raises(moekit.MoekitError, match=r"moekit::shared_expert_mlp: " + msg):
            moekit.shared_expert_mlp(*args, out=bad)
    assert x.shape == (6, 64)


@_NO_GPU
def test_in_place_out_where_the_op_allows_it(stubbed_devices):
    """out=hidden_states: the layer ops accept it (C++ allows in place: only the launch
    fails here), shared_expert_mlp does not; the docstrings say which."""
    name, args = _valid_args()["fused_moe"]
    with pytest.raises(moekit.MoekitError) as info:
        moekit.fused_moe(*args, out=args[0])
    msg = str(info.value)
    assert ("argument '" not in msg or "argument 'stream'" in msg) and "CUDA" in msg, msg
    assert "or hidden_states itself" in moekit.fused_moe.__doc__
    name, args = _valid_args()["shared_expert_mlp"]
    with pytest.raises(moekit.MoekitError, match=r"moekit::shared_expert_mlp: argument 'out': "
                                                 r"expected memory disjoint from 'hidden_states'"):
        moekit.shared_expert_mlp(*args, out=args[0])
    assert "itself" not in moekit.shared_expert_mlp.__doc__
