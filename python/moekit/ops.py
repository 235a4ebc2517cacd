"""moekit's twelve operators as PyTorch ops.

Each op is a ``torch.library`` custom op ``torch.ops.moekit.<name>`` with a CUDA
kernel (moekit's C++ op, called through the raw binding on the current CUDA
stream) and a fake (meta) implementation, so ``torch.compile`` traces it and CUDA
graphs capture it. Outputs and workspaces come from PyTorch's caching allocator;
``out=`` (on every op: a tensor, or a tuple with one per output) writes into the
caller's buffers instead, through the out variant ``torch.ops.moekit.<name>_out``.

The functions here (also exported as ``moekit.<name>``) call the C++ op directly in
plain eager mode, skipping the dispatcher's boxing, and go through
``torch.ops.moekit.<name>`` whenever something must see the op: ``torch.compile``,
a dispatch or function mode (FakeTensorMode, make_fx, FlopCounterMode, ...), or a
tensor subclass. ``set_eager_fast_path(False)`` (or ``MOEKIT_EAGER_FAST_PATH=0``)
always takes the dispatcher.

Each op is one entry of the table ``_OPS`` (below): its public function, CUDA kernel,
fake implementation and schema are generated from that entry and from the extension's
own table (docs/python.md, "How the binding is built").

All tensors must be contiguous CUDA tensors on one device. The ops are not
differentiable (inference kernels). Shapes: T tokens, H hidden, E experts, K top_k,
F expert intermediate size, S shared intermediate size, P permuted rows.
"""

import inspect as _inspect
import linecache as _linecache
import os
import threading

import torch

from . import _moekit as _raw
from ._moekit import MoekitError

# The twelve ops' functions are generated from the table _OPS (below).
__all__ = list(_raw.OPS) + [
    "set_eager_fast_path",
    "set_workspace_cache",
    "release_workspaces",
    "TORCH_DTYPES",
]

# torch dtype -> moekit dtype code (the C++ DType values).
TORCH_DTYPES = {
    torch.bfloat16: _raw.DTYPES["bf16"],
    torch.float16: _raw.DTYPES["f16"],
    torch.float32: _raw.DTYPES["f32"],
    torch.int32: _raw.DTYPES["i32"],
    torch.float8_e4m3fn: _raw.DTYPES["fp8e4m3"],
    torch.int64: _raw.DTYPES["i64"],  # expert ids only (the ops that take ids)
}
for _dt, _code in TORCH_DTYPES.items():
    _raw.register_dtype(_dt, _code)  # tuples carry t.dtype itself
_Tensor = torch.Tensor
_empty = torch.empty
_f32, _i32, _u8, _bf16 = torch.float32, torch.int32, torch.uint8, torch.bfloat16

# Stream and device lookups: the raw C entry points cost ~0.1 us; the public
# torch.cuda.current_stream() builds a Python Stream object each call.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
if _raw_stream is None:  # a torch without CUDA: the kernels can never run anyway

    def _raw_stream(device):
        return torch.cuda.current_stream(device).cuda_stream


_current_device = getattr(torch._C, "_cuda_getDevice", lambda: -1)


def _launch_ctx_py(t):
    """(device, stream) where an op whose first tensor is t runs: t's device if it is the
    current one, and torch's current stream of it (an int; never cached: it changes
    under torch.cuda.stream(s) and during capture); None when t is elsewhere."""
    dev = t.get_device()
    if dev < 0 or dev != _current_device():
        return None
    return dev, _raw_stream(dev)


# The extension answers in one C call where torch has the DLPack exchange API (torch's
# current stream from it, the current device from the extension's CUDA runtime) and
# calls _launch_ctx_py for everything else.
_raw._set_launch_ctx_fallback(_launch_ctx_py)
_launch_ctx = _raw._launch_ctx
_is_compiling = torch.compiler.is_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_function_mode_on = torch._C._is_torch_function_mode_enabled

_fast_path = os.environ.get("MOEKIT_EAGER_FAST_PATH", "1") != "0"


def set_eager_fast_path(enabled: bool) -> bool:
    """Call the C++ op directly in plain eager mode (default) or always through
    ``torch.ops.moekit.*``. Returns the previous setting."""
    global _fast_path
    old, _fast_path = _fast_path, bool(enabled)
    return old


def _eager(first):
    # The direct path is only safe when nothing needs to see the op in the dispatcher
    # (tracing and fake tensors run under a mode); a tensor subclass or a non-CUDA
    # first tensor (meta, cpu) also goes there, to its meta or error kernel.
    if not _fast_path or _is_compiling() or _dispatch_stack_len() or _function_mode_on():
        return False
    return type(first) is _Tensor and first.is_cuda


# ---------------------------------------------------------------- helpers


def _v(t):
    # The raw binding's fast tensor form: t.dtype is registered with the binding (an
    # unsupported one is named in the error), and contiguity goes as a flag (a strided
    # view is rejected, never copied). ~0.3 us; t.shape and t.stride() cost more.
    return (t.data_ptr(), t.dtype, t.size(), t.is_contiguous())


def _vo(t):
    return None if t is None else _v(t)


def _fail(op, arg, expected, got):
    raise MoekitError(f"moekit::{op}: argument '{arg}': expected {expected}, got {got}")


def _device(op, names, *tensors):
    """The CUDA device index shared by all (non-None) tensors; raises otherwise."""
    dev = -2
    for t in tensors:
        if t is not None:
            try:
                d = t.get_device()
            except AttributeError:
                d = -3
            if d != dev:
                if dev == -2 and d >= 0:
                    dev = d
                else:
                    _device_error(op, names, tensors)
    return dev


def _device_error(op, names, tensors):
    dev, first = None, None
    for name, t in zip(names, tensors):
        if t is None:
            continue
        if not isinstance(t, _Tensor):
            _fail(op, name, "a torch.Tensor", type(t).__name__)
        d = t.get_device()
        if d < 0:
            _fail(op, name, "a CUDA tensor", f"a tensor on {t.device}")
        if dev is None:
            dev, first = d, name
        elif d != dev:
            _fail(op, name, f"a tensor on cuda:{dev} (the device of '{first}')", f"cuda:{d}")
    raise AssertionError("unreachable")


def _dims(t, n):
    """t.shape as exactly n sizes (zeros where t has fewer dims), so that outputs
    can be allocated before the C++ op rejects a wrong rank with a clear message."""
    s = t.shape
    if len(s) == n:
        return s
    return (tuple(s) + (0,) * n)[:n]


def _workspace(nbytes, device):
    """A scratch buffer from the caching allocator and its 256-byte aligned address
    (the caching allocator's blocks are 512-byte aligned; others may not be)."""
    if nbytes == 0:
        return None, 0
    w = _empty(nbytes, dtype=_u8, device=device)
    ptr = w.data_ptr()
    if ptr & 255:
        w = _empty(nbytes + 255, dtype=_u8, device=device)
        ptr = (w.data_ptr() + 255) & ~255
    return w, ptr


def _nonneg(x):
    return x if x > 0 else 0


# ---------------------------------------------------------------- workspaces
# Ops that need scratch memory get it from a workspace cached per (device, stream) and
# grown on demand (through _grow, called from C++ when the op needs more than the
# cached capacity): no allocation and no separate size query per call. Reusing one
# buffer is safe because ops enqueued on one stream run in order; each stream has its
# own buffer. During CUDA-graph capture a fresh buffer is allocated per call (from the
# graph's private pool, as any other allocation there), so a graph never shares
# memory with eager calls. release_workspaces() gives the cached buffers back to the
# caching allocator; set_workspace_cache(False) (or MOEKIT_WORKSPACE_CACHE=0)
# allocates per call. Only the eager fast path uses the cache: a call through the
# dispatcher (torch.ops.moekit.*, so every torch.compile'd graph) allocates per call,
# because inductor's CUDA-graph trees run their warm-up outside stream capture but
# inside the graph's private memory pool, and a cached buffer from that pool would
# outlive the graph ("tensors in the cudagraph pool not tracked as outputs").

_ws_cache = {}  # (device index, stream) -> entry


class _Local(threading.local):
    # True inside a dispatcher-registered kernel. A class default, so that reading it in
    # a thread that never set it is a plain attribute read (a missing threading.local
    # attribute costs an AttributeError raised and caught, ~0.45 us).
    uncached = False


_tls = _Local()
_ws_cache_on = os.environ.get("MOEKIT_WORKSPACE_CACHE", "1") != "0"
# Whether a stream (the current one, as an int) is capturing a CUDA graph: the
# extension's cudaStreamIsCapturing on it, cheaper than torch's current-stream check
# (which looks up the current device, its primary context and its stream again).
_is_capturing = _raw._stream_capturing
_MiB = 1 << 20


def _grow(entry, nbytes):
    """Called by the C++ op when the entry [ptr, capacity, tensor, torch.device, cached]
    holds fewer than nbytes: allocates on the current stream and updates the entry."""
    if entry[4]:
        nbytes = (nbytes + _MiB - 1) & ~(_MiB - 1)  # cached: round up, fewer regrowths
    entry[2] = None  # the old buffer goes back to the allocator (stream-ordered)
    w, ptr = _workspace(nbytes, entry[3])
    entry[0], entry[1], entry[2] = ptr, nbytes, w


def _ws(ctx, like):
    """The workspace entry for an op about to run in the launch context ctx (device,
    stream)."""
    if _ws_cache_on and not _tls.uncached and not _is_capturing(ctx[1]):
        e = _ws_cache.get(ctx)
        if e is None:
            e = _ws_cache[ctx] = [0, 0, None, like.device, True]
        return e
    return [0, 0, None, like.device, False]  # per call: lives until the op is enqueued


def release_workspaces():
    """Return the cached workspaces to PyTorch's caching allocator (after the ops that
    used them were enqueued; the allocator keeps stream order), and fused_topk's output
    prototypes."""
    _ws_cache.clear()
    _topk_protos.clear()
    _topk_bases.clear()


def set_workspace_cache(enabled: bool) -> bool:
    """Cache workspaces per (device, stream) (default) or allocate them per call.
    Returns the previous setting."""
    global _ws_cache_on
    old, _ws_cache_on = _ws_cache_on, bool(enabled)
    if not enabled:
        _ws_cache.clear()
    return old


# The extension reads torch tensors through torch's DLPack C exchange API where this
# torch has it (one C call per tensor), else through TensorBase's attribute descriptors;
# MOEKIT_DLPACK_EXCHANGE=0 forces the latter.
_raw._register_torch(torch.Tensor, _grow, os.environ.get("MOEKIT_DLPACK_EXCHANGE", "1") != "0")
# The eager path's allocations go through these module names (python/tools/overhead.py's
# attribution mode replaces them to time the path without its allocations).
_empty_like = torch.empty_like
_new_empty = torch.Tensor.new_empty

# ---------------------------------------------------------------- output rules
# An op's output rule allocates its outputs from its arguments: rule(ctx, <the arguments
# it names>). ctx is the launch context (device, stream) in the CUDA kernel and None in
# the fake (meta) implementation; both allocate with the first tensor's new_empty, so the
# CUDA kernel's outputs have the fake's shapes and dtypes. The sizes go as separate ints
# (cheaper than a shape tuple: docs/python.md) and come from _dims, so that a wrong rank
# still gets outputs, and then the C++ op's message naming the argument.


def _topk_rule(ctx, gating_output, top_k):
    if ctx is not None:  # eager: empty_like of cached prototypes (below)
        # Keyed by the logits' shape as it is (a torch.Size) and top_k as given: a hit
        # computes no sizes.
        key = (gating_output.shape, top_k, ctx[0])
        p = _topk_protos.get(key)
        if p is not None:
            return _empty_like(p[0]), _empty_like(p[1])
        s = gating_output.shape
        T = s[0] if len(s) == 2 else _dims(gating_output, 2)[0]
        return _topk_outputs(gating_output, T, _nonneg(top_k), ctx[0], ctx[1], key)
    T, _ = _dims(gating_output, 2)
    K = _nonneg(top_k)
    return gating_output.new_empty(T, K, dtype=_f32), gating_output.new_empty(T, K, dtype=_i32)


# fused_topk's two outputs, [T, K] f32 and i32, are the most expensive part of its eager
# call. torch.empty_like(prototype) is the cheapest allocation torch offers from Python
# (one positional argument: ~0.8 us on the dev VM, against ~1.0 for new_empty(T, K,
# dtype=) and ~1.5 for new_empty((T, K), dtype=)), so the eager path keeps a prototype
# pair per (T, K, device): stride-0 views of a one-element tensor per (device, dtype),
# which hold no memory of their own (empty_like of an overlapping tensor allocates a
# fresh contiguous one; a prototype of at most one element is a real [T, K] tensor, so
# that empty_like copies its contiguous strides). A prototype is only made outside a
# dispatcher-registered kernel and outside a capture, so that its base never comes from
# a CUDA graph's private pool; the cache is cleared past _TOPK_PROTOS_MAX shapes.
_topk_protos = {}  # (logits shape, top_k, device index) -> (f32 prototype, i32 prototype)
_topk_bases = {}  # (device index, dtype) -> one-element tensor
_TOPK_PROTOS_MAX = 4096


def _topk_outputs(gating_output, T, K, dev, stream, key=None):
    """fused_topk's outputs on a prototype miss; makes the prototypes, under key (default
    (T, K, dev)), where that is safe."""
    weights = gating_output.new_empty(T, K, dtype=_f32)
    ids = gating_output.new_empty(T, K, dtype=_i32)
    if not _tls.uncached and not _is_capturing(stream):
        if T * K <= 1:
            protos = (weights.new_empty(T, K), ids.new_empty(T, K))
        else:
            protos = []
            for out in (weights, ids):
                base = _topk_bases.get((dev, out.dtype))
                if base is None:
                    base = _topk_bases[(dev, out.dtype)] = out.new_empty(1)
                protos.append(base.expand(T, K))
        if len(_topk_protos) >= _TOPK_PROTOS_MAX:
            _topk_protos.clear()
        _topk_protos[key if key is not None else (T, K, dev)] = tuple(protos)
    return weights, ids


def _permute_align_rule(ctx, topk_ids, num_experts, block_size):
    if block_size <= 0 and ctx is None:  # the CUDA kernel leaves the message to C++
        _fail("moe_permute_align", "block_size", "a power of two in [16, 256]", block_size)
    T, K = _dims(topk_ids, 2)
    bs = block_size if block_size > 0 else 1
    sorted_size = T * K + _nonneg(num_experts) * (bs - 1)
    return (
        topk_ids.new_empty(sorted_size, dtype=_i32),
        topk_ids.new_empty((sorted_size + bs - 1) // bs, dtype=_i32),
        topk_ids.new_empty(1, dtype=_i32),
    )


def _pre_permute_rule(ctx, hidden_states, local_expert_ids, num_local_experts, alignment):
    T, K = _dims(local_expert_ids, 2)
    _, H = _dims(hidden_states, 2)
    E = _nonneg(num_local_experts)
    return (
        hidden_states.new_empty(T * K + E * _nonneg(alignment - 1), H),
        hidden_states.new_empty(E, dtype=_i32),
        hidden_states.new_empty(T * K, dtype=_i32),
    )


def _post_permute_rule(ctx, expert_output, topk_weights, out_dtype):
    sw, se = topk_weights.shape, expert_output.shape  # no _dims call for the right ranks
    T = sw[0] if len(sw) == 2 else _dims(topk_weights, 2)[0]
    H = se[1] if len(se) == 2 else _dims(expert_output, 2)[1]
    if out_dtype is None:  # no dtype keyword unless asked
        return _new_empty(expert_output, T, H)
    return _new_empty(expert_output, T, H, dtype=out_dtype)


def _grouped_gemm_rule(ctx, a, b, masked, activation, out_dtype):
    _, Nb, _ = _dims(b, 3)
    N = Nb // 2 if activation == "silu_and_mul" else Nb
    shape = tuple(_dims(a, 3)[:2]) + (N,) if masked else (_dims(a, 2)[0], N)
    return a.new_empty(*shape, dtype=out_dtype if out_dtype is not None else a.dtype)


def _grouped_gemm_fp8_rule(ctx, a, b, masked, activation, c_scale):
    _, Nb, _ = _dims(b, 3)
    N = Nb // 2 if activation == "silu_and_mul" else Nb
    shape = tuple(_dims(a, 3)[:2]) + (N,) if masked else (_dims(a, 2)[0], N)
    # An e4m3 c with its scale, else bf16.
    return a.new_empty(*shape, dtype=_bf16 if c_scale is None else torch.float8_e4m3fn)


# ---------------------------------------------------------------- the op table


class _Op:
    """One op: everything its Python functions are generated from (see _define).

    name: moekit.<name>, torch.ops.moekit.<name>, moekit.raw._t_<name>.
    params: its arguments as in a torch schema, in the public order, with the defaults.
    outputs: the names of its outputs (those of the C++ args struct's fields).
    rule: its output rule (above), or "like:<arg>" for one output that is empty_like
        that tensor argument (a fake: [rows, cols] of it).
    derived: C++ fields that are no public argument, as Python expressions of them.
    doc: the public function's docstring (a paragraph on out= is added).
    in_place: the input that out= may also be exactly (the C++ op allows it), or None;
        for the docstring.
    """

    def __init__(self, name, params, outputs, rule, doc, derived=None, in_place=None):
        self.name, self.params, self.outputs, self.rule = name, params, outputs, rule
        self.doc, self.derived, self.in_place = doc, derived or {}, in_place


_TOPK_PARAMS = (
    'int top_k, bool renormalize=False, str scoring_func="softmax", int num_expert_group=0, '
    "int topk_group=0, float routed_scaling_factor=1.0, Tensor? correction_bias=None"
)
# The MLP ops' activation (vLLM's names) and optional biases (docs/python.md).
_ACT_PARAMS = 'str activation="silu", Tensor? gate_up_bias=None, Tensor? down_bias=None'
# The engine inputs of the routed ops (docs/moe.md, "Engine inputs").
_ENGINE_PARAMS = "Tensor? expert_map=None, bool apply_router_weight_on_input=False"
_EXPERTS_PARAMS = (
    "Tensor hidden_states, Tensor w_gate_up, Tensor w_down, Tensor topk_weights, Tensor topk_ids, "
    + _ACT_PARAMS + ", " + _ENGINE_PARAMS
)
_ACT_DOC = """activation: "silu" (silu_and_mul, the default), "gelu" (gelu_and_mul, erf),
                "gelu_tanh" (gelu_and_mul, tanh approximation), "relu2" (relu(x)^2, not
                gated: w_gate_up holds F rows) or "swigluoai" (gpt-oss: gate and up rows
                interleaved, 2j gate j, 2j+1 up j; min(g, 7) * sigmoid(1.702 min(g, 7)) *
                (clamp(u, -7, 7) + 1)).
            gate_up_bias: optional [E, 2F] ([E, F] for relu2), f32 or the weights' dtype,
                added to the gate/up projections before the activation.
            down_bias: optional [E, H], f32 or the weights' dtype, added to the down
                projection (before the routing weight)."""
_ENGINE_DOC = """expert_map: optional [E_global] int32: topk_ids are global expert ids and
                expert_map[id] the local one (the index into w_gate_up), -1 for an expert
                on another rank: such routes (and ids or local ids out of range) add
                nothing, so the output is this rank's partial sum. One translation pass
                of the T*K ids runs only when a map or int64 ids are given.
            apply_router_weight_on_input: top_k must be 1; the input row is scaled by
                its route weight, x' = round(round(w) * x) (vLLM's x * w.to(x.dtype)),
                and the expert output is not weighted."""


def _quant_params(prefix=""):
    """The weights' quantization (moekit.raw's keyword arguments, docs/python.md)."""
    return (f'str {prefix}weight_quant="none", Tensor? {prefix}w_gate_up_scale=None, '
            f"Tensor? {prefix}w_down_scale=None, Tensor? {prefix}a_gate_up_scale=None, "
            f"Tensor? {prefix}a_down_scale=None")  # fmt: skip


_QUANT_DOC = """
            weight_quant: "none" (w_gate_up / w_down in hidden_states' dtype),
                "fp8_per_tensor", "fp8_per_channel" or "fp8_block128" (float8_e4m3fn
                weights; docs/moe.md "Quantized weights"): activation "silu" and no
                biases.
            w_gate_up_scale, w_down_scale: f32 scales of the scheme: per tensor [E] ([1]
                dense), per channel [E, 2F] / [E, H], 128 x 128 blocks
                [E, ceil(2F/128), ceil(H/128)] / [E, ceil(H/128), ceil(F/128)].
            a_gate_up_scale, a_down_scale: optional [1] f32 static activation scales
                (fp8_per_tensor only)."""

_OPS = [
    _Op("fused_topk", "Tensor gating_output, " + _TOPK_PARAMS, ("topk_weights", "topk_ids"),
        _topk_rule, """FusedTopKFwd: route each token to its top_k experts.

        Args:
            gating_output: [T, E] bf16, f16 or f32 router logits.
            top_k: K, experts per token (1 <= K <= E).
            renormalize: divide the K weights by their sum.
            scoring_func: "softmax" (over E) or "sigmoid".
            num_expert_group, topk_group: grouped routing (DeepSeek-V3): split E into
                num_expert_group groups, keep the topk_group best; 0 = no grouping.
            routed_scaling_factor: multiplies the final weights.
            correction_bias: optional [E] f32 added to the scores for selection only.

        Returns:
            (topk_weights [T, K] f32, topk_ids [T, K] i32), ids by descending score,
            ties to the lower id; weights are the unbiased scores.
        """),
    _Op("moe_permute_align",
        "Tensor topk_ids, int num_experts, int block_size=64, Tensor? expert_map=None",
        ("sorted_token_ids", "expert_ids", "num_tokens_post_padded"), _permute_align_rule,
        """MoEPermuteAlignFwd (vLLM's moe_align_block_size).

        Args:
            topk_ids: [T, K] int32 or int64, ids in [0, num_experts) or -1 (dropped).
            num_experts: E (with expert_map: the local experts, E_local).
            block_size: a power of two in [16, 256].
            expert_map: optional [E_global] int32: topk_ids are global ids, sorted by
                expert_map[id]; routes whose local id is -1 (or out of range) are dropped.

        Returns:
            (sorted_token_ids [T*K + E*(block_size-1)] i32: per expert in id order, the
            flat route indices t*K+k that chose it, ascending, padded with T*K to a
            multiple of block_size; expert_ids [ceil(len(sorted_token_ids)/block_size)]
            i32: the expert of each block, -1 past the last used one;
            num_tokens_post_padded [1] i32). Entries past num_tokens_post_padded are
            unspecified.
        """),
    _Op("moe_pre_permute",
        "Tensor hidden_states, Tensor local_expert_ids, int num_local_experts, int alignment=1",
        ("permuted", "layout_metadata", "inverse_indices"), _pre_permute_rule,
        """MoEPrePermuteFwd: gather token rows into an expert-grouped buffer.

        Args:
            hidden_states: [T, H] bf16 or f16.
            local_expert_ids: [T, K] int32 or int64, ids in [0, num_local_experts) or -1.
            num_local_experts: E.
            alignment: each expert's block starts at a multiple of this many rows.

        Returns:
            (permuted [P, H] with P = T*K + E*(alignment-1) (padding rows are left
            uninitialized), layout_metadata [E] i32 (inclusive end row of each expert's
            block), inverse_indices [T*K] i32 (the row of route t*K+k, or -1)).
        """),
    _Op("moe_post_permute",
        "Tensor expert_output, Tensor topk_weights, Tensor inverse_indices, "
        "ScalarType? out_dtype=None", ("out",), _post_permute_rule,
        """MoEPostPermuteFwd: weighted combine back to token order.

        Args:
            expert_output: [P, H] bf16 or f16.
            topk_weights: [T, K] f32.
            inverse_indices: [T*K] i32, the row of each route in expert_output, or -1.
            out_dtype: expert_output's dtype (default) or torch.float32.

        Returns:
            out [T, H]: out[t] = sum over k with inverse >= 0 of
            w[t,k] * expert_output[inverse[t*K+k]], in f32 and k order (zeros for a token
            without routes).
        """),
    _Op("moe_grouped_gemm",
        "Tensor a, Tensor b, Tensor layout_metadata, bool masked=False, int alignment=1, "
        'str activation="none", ScalarType? out_dtype=None', ("c",), _grouped_gemm_rule,
        """MoEGroupedGemmFwd: one GEMM per expert, c rows = a rows . b[e]^T.

        Args:
            a: contiguous layout: [P, Kd] bf16/f16 with expert e's rows in
                [align_up(end_{e-1}, alignment), end_e); masked layout: [E, max_m, Kd].
            b: [E, N, Kd] ([E, 2N, Kd], gate rows then up rows, with silu_and_mul).
            layout_metadata: [E] i32: inclusive end rows (contiguous) or row counts
                <= max_m (masked).
            masked: use the masked layout.
            alignment: contiguous layout block alignment.
            activation: "none" or "silu_and_mul" (c = silu(a.gate^T) * (a.up^T)).
            out_dtype: a's dtype (default) or torch.float32.

        Returns:
            c: [P, N] (contiguous) or [E, max_m, N] (masked). Rows outside every
            expert's block are left uninitialized.
        """,
        derived={"max_m": "a.shape[1] if masked and a.dim() == 3 else 0"}),
    _Op("moe_grouped_gemm_fp8",
        "Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor layout_metadata, "
        'bool masked=True, int alignment=1, str scales="block", str activation="none", '
        "Tensor? c_scale=None", ("c",), _grouped_gemm_fp8_rule,
        """MoEGroupedGemmFP8Fwd: e4m3 x e4m3 grouped GEMM with f32 scales (docs/gemm.md).

        Args:
            a: masked layout (the default, DeepGEMM-style): [E, max_m, Kd]
                float8_e4m3fn; contiguous layout: [P, Kd] with expert e's rows in
                [align_up(end_{e-1}, alignment), end_e). Kd % 16 == 0.
            a_scale: f32 per `scales`, over a's rows R.. ([E, max_m] masked, [P]
                contiguous): "block" [R.., ceil(Kd/128)] (per row, per 128 columns);
                "per_channel" [R..] (per row); "per_tensor" [1].
            b: [E, N, Kd] float8_e4m3fn ([E, 2N, Kd], gate rows then up rows, with
                silu_and_mul).
            b_scale: f32 per `scales`, Bn = b's rows per expert: "block"
                [E, ceil(Bn/128), ceil(Kd/128)] (per 128x128 block); "per_channel" [E, Bn];
                "per_tensor" [E].
            layout_metadata: [E] i32: masked row counts (<= max_m), or contiguous
                inclusive end rows.
            masked: the masked layout (True) or the contiguous one.
            alignment: the contiguous layout's block alignment.
            scales: "block", "per_channel" or "per_tensor".
            activation: "none" or "silu_and_mul" (c = silu(gate) * up, each scaled
                first; with "block" scales N % 64 == 0).
            c_scale: optional [1] f32: c is float8_e4m3fn, e4m3(value / c_scale[0])
                (rounded to nearest even, saturated at +-448); without it c is bf16.

        Returns:
            c: [E, max_m, N] (masked) or [P, N] (contiguous), bf16 (float8_e4m3fn with
            c_scale). Rows outside every expert's block are left uninitialized.
        """),
    _Op("moe_expert_mlp",
        "Tensor expert_input, Tensor layout_metadata, Tensor w_gate_up, Tensor w_down, "
        "int alignment=1, " + _ACT_PARAMS + ", " + _quant_params(), ("expert_output",),
        "like:expert_input",
        """MoEExpertMLPFwd: each expert's gated MLP on its rows of a permuted buffer.

        Args:
            expert_input: [P, H] bf16/f16, contiguous(alignment) layout.
            layout_metadata: [E] i32 inclusive end rows.
            w_gate_up: [E, 2F, H] (gate rows then up rows).
            w_down: [E, H, F].
            alignment: block alignment of the layout.
            """ + _ACT_DOC + _QUANT_DOC + """

        Returns:
            expert_output [P, H]: row r of expert e = w_down[e] . act(w_gate_up[e] . x)
            (+ biases); padding rows are left uninitialized.
        """),
    _Op("fused_moe_experts", _EXPERTS_PARAMS + ", " + _quant_params(), ("output",),
        "like:hidden_states",
        """FusedMoEExpertsFwd: the experts half of a MoE layer.

        Args:
            hidden_states: [T, H] bf16/f16.
            w_gate_up: [E, 2F, H]; w_down: [E, H, F] (same dtype).
            topk_weights: [T, K] f32; topk_ids: [T, K] int32 or int64 in [0, E) or -1.
            {act}
            {engine}{quant}

        Returns:
            output [T, H] = sum over k with id >= 0 of w[t,k] * MLP_id(x_t).
        """.format(act=_ACT_DOC, engine=_ENGINE_DOC, quant=_QUANT_DOC)),
    _Op("indexed_expert_mlp", _EXPERTS_PARAMS + ", " + _quant_params(), ("output",),
        "like:hidden_states",
        """IndexedExpertMLPFwd: fused_moe_experts' contract, built for T <= 64 (routes
        read straight from topk_ids, no sort); correct for every T. Same shapes as
        fused_moe_experts."""),
    _Op("fused_moe",
        "Tensor hidden_states, Tensor gating_output, Tensor w_gate_up, Tensor w_down, "
        + _TOPK_PARAMS + ", " + _ACT_PARAMS + ", " + _ENGINE_PARAMS + ", " + _quant_params(),
        ("output",), "like:hidden_states",
        """FusedMoEFwd: a whole routed MoE layer (fused_topk then fused_moe_experts).

        Args:
            hidden_states: [T, H] bf16/f16.
            gating_output: [T, E] bf16/f16/f32 router logits ([T, E_global] with
                expert_map: the routing picks global experts).
            w_gate_up: [E, 2F, H]; w_down: [E, H, F].
            top_k, renormalize, scoring_func, num_expert_group, topk_group,
            routed_scaling_factor, correction_bias ([E] f32 or None): as in fused_topk.
            {act}
            {engine}{quant}

        Returns:
            output [T, H].
        """.format(act=_ACT_DOC, engine=_ENGINE_DOC, quant=_QUANT_DOC), in_place="hidden_states"),
    _Op("fused_moe_shared_expert",
        "Tensor hidden_states, Tensor gating_output, Tensor w_gate_up, Tensor w_down, "
        "Tensor? shared_w_gate_up, Tensor? shared_w_down, " + _TOPK_PARAMS + ", " + _ACT_PARAMS
        + ", Tensor? shared_gate_up_bias=None, Tensor? shared_down_bias=None, " + _ENGINE_PARAMS
        + ", " + _quant_params() + ", " + _quant_params("shared_"),
        ("output",), "like:hidden_states",
        """FusedMoESharedExpertFwd: fused_moe(...) + SharedMLP(x) (shared weight 1).

        Args:
            as fused_moe, plus shared_w_gate_up [2S, H] ([S, H] for relu2) and
            shared_w_down [H, S]; both None = no shared expert (the routed layer alone, as
            fused_moe). The shared expert runs the routed activation, with optional
            shared_gate_up_bias [2S] ([S]) and shared_down_bias [H] (f32 or the dtype); it
            reads the unscaled x and is added once (with expert_map: on every rank that
            calls the layer).
            weight_quant, w_gate_up_scale, ...: the routed experts' quantization, as in
                fused_moe; shared_weight_quant, shared_w_gate_up_scale, ...: the shared
                expert's (no E axis: per tensor [1], per channel [2S] / [H], blocks
                [ceil(2S/128), ceil(H/128)] / [ceil(H/128), ceil(S/128)]).

        Returns:
            output [T, H].
        """, in_place="hidden_states"),
    _Op("shared_expert_mlp", "Tensor hidden_states, Tensor w_gate_up, Tensor w_down, "
        + _ACT_PARAMS + ", " + _quant_params(), ("output",), "like:hidden_states",
        """SharedExpertMLPFwd: a dense gated MLP.

        Args:
            hidden_states: [T, H] bf16/f16.
            w_gate_up: [2S, H] (gate rows then up rows); w_down: [H, S].
            activation, gate_up_bias ([2S]), down_bias ([H]): as in fused_moe_experts,
                without the expert axis.
            weight_quant, w_gate_up_scale, ...: as in fused_moe, without the E axis
                (per tensor [1], per channel [2S] / [H], blocks [ceil(2S/128),
                ceil(H/128)] / [ceil(H/128), ceil(S/128)]).

        Returns:
            output [T, H] = w_down . (silu(gate . x) * (up . x)).
        """),
]  # fmt: skip


# ---------------------------------------------------------------- generation
# An op's three functions are compiled from this template (as collections.namedtuple
# builds its classes), so that they take the schema's arguments by name and cost what
# hand-written ones cost: no *args, no table lookup per call. Every name they use is a
# module global looked up at call time (tests and python/tools/overhead.py replace some).
#   <name>: the public function; the C++ op directly in plain eager mode (see _eager),
#       else through the dispatcher (_op_<name>, torch.ops.moekit.<name>.default).
#   _<name>_cuda: the CUDA kernel: allocates the outputs (the op's rule), then enqueues
#       the op on the current stream through the extension's torch entry point _t_<name>
#       (the tensors go as they are: C++ reads them and checks that all are CUDA tensors
#       on one device). The device of the first tensor must be the current device;
#       otherwise (another GPU, a CPU tensor) _elsewhere checks the devices, naming the
#       argument at fault, and calls again under that device.
#   _<name>_fake: the fake (meta) implementation: the op's rule without a launch context.
#   _<name>_into: the public function with out= given: the buffers unpacked and checked to
#       be tensors (naming out), then the out variant, directly or through the dispatcher
#       (_op_<name>_out, torch.ops.moekit.<name>_out.default); returns the given buffers.
#   _<name>_out_cuda: the out variant's CUDA kernel: as _<name>_cuda with the given
#       buffers instead of allocated ones (C++ checks them: dtype, shape, contiguity,
#       device, overlap); an error about an output names the out argument.
#   _<name>_out_fake: the out variant's fake implementation: the buffers checked against
#       the op's fake outputs (shape, dtype, device, contiguity); returns nothing.
_TEMPLATE = """
def {name}({sig}, *, out=None):
    if out is not None:
        return _{name}_into(out, {call})
    if _eager({first}):
        return _{name}_cuda({call})
    return _op_{name}({call})


def _{name}_cuda({sig}):
    ctx = _launch_ctx({first})
    if ctx is None:
        return _elsewhere("{name}", {tensor_names}, ({tensors},), _{name}_cuda, {call})
    {outs} = {alloc}
    _t_{name}({entry}, ctx[1]{keywords})
    return {outs}


def _{name}_fake({sig}):
    return {fake}


def _{name}_into(out, {call}):
    {outs}, = _unpack_out("{name}", out, {nout})
    {out_dtype}if _eager({first}):
        _{name}_out_cuda({call}, {out_kw})
    else:
        _op_{name}_out({call}, {out_kw})
    return {ret}


def _{name}_out_cuda({sig}, *, {outs}):
    ctx = _launch_ctx({first})
    if ctx is None:
        return _elsewhere("{name}", {tensor_names} + {out_names}, ({tensors}, {outs}),
                          _{name}_out_cuda, {call}, {out_kw})
    try:
        _t_{name}({entry}, ctx[1]{keywords})
    except MoekitError as e:
        _out_error("{name}", e)


def _{name}_out_fake({sig}, *, {outs}):
    _check_out_fake("{name}", ({outs},), {fake})
"""


def _elsewhere(op, names, tensors, fn, *args, **kwargs):
    dev = _device(op, names, *tensors)  # raises unless all are CUDA tensors on one device
    with torch.cuda.device(dev):
        return fn(*args, **kwargs)


# ---------------------------------------------------------------- out=
# With out=, an op writes into the caller's buffers (one tensor, or a tuple with one
# tensor per output, in the order of the outputs) and returns them: no allocation, no
# copy. Its out variant is a separate custom op, torch.ops.moekit.<name>_out, whose
# schema marks the buffers as mutated (keyword-only "Tensor(a!) <output name>", returning
# nothing: what torch.compile's auto_functionalize handles), so the functional op keeps
# its schema. The C++ op checks the buffers as it checks the outputs it is given
# (dtype, shape, contiguity, one device, no overlap with the inputs or each other);
# _out_labels turns the names of its messages into the out argument's.

_out_labels = {}  # op -> [(C++ output field, the argument holding it, as messages name it)]
_dtype_names = {code: name for name, code in _raw.DTYPES.items()}


def _describe(t):
    name = _dtype_names.get(TORCH_DTYPES.get(t.dtype), str(t.dtype))
    return f"{name}{list(t.shape)}"


def _unpack_out(op, out, n):
    """The buffers of out= as a tuple of n tensors; raises naming out otherwise."""
    if n == 1:
        if isinstance(out, _Tensor):
            return (out,)
        _fail(op, "out", "a torch.Tensor", type(out).__name__)
    if type(out) in (tuple, list) and len(out) == n:
        for i, t in enumerate(out):
            if not isinstance(t, _Tensor):
                _fail(op, f"out[{i}]", "a torch.Tensor", type(t).__name__)
        return tuple(out)
    names = ", ".join(f for f, _ in _out_labels[op])
    got = type(out).__name__
    if type(out) in (tuple, list):
        got = f"a {got} of {len(out)}"
    _fail(op, "out", f"a tuple of {n} tensors ({names})", got)


def _out_error(op, e):
    """Re-raises the C++ op's error e with each output's name replaced by the out
    argument that holds it."""
    msg = str(e)
    for field, label in _out_labels[op]:
        msg = msg.replace(f"'{field}'", label)
    raise MoekitError(msg) from None


def _check_out_fake(op, outs, expected):
    """The fake implementation's checks of out=: what the C++ op checks on the device,
    except overlap (fake tensors have no memory)."""
    if not isinstance(expected, tuple):
        expected = (expected,)
    for t, e, (_, label) in zip(outs, expected, _out_labels[op]):
        if t.device != e.device:
            want, got = f"a tensor on {e.device}", f"a tensor on {t.device}"
        elif t.dtype != e.dtype:  # the C++ op's wording
            want, got = f"dtype {_describe(e).split('[')[0]}", _describe(t)
        elif t.shape != e.shape:
            want, got = f"shape {list(e.shape)}", _describe(t)
        elif not t.is_contiguous():
            want, got = "a contiguous tensor", f"{_describe(t)} with strides {t.stride()}"
        else:
            continue
        raise MoekitError(f"moekit::{op}: argument {label}: expected {want}, got {got}")


def _define(op):
    """Compiles op's functions into this module; returns its schema."""
    params = []  # (type, name, default source or None)
    for p in op.params.split(", "):
        decl, _, default = p.partition("=")
        typ, name = decl.rsplit(" ", 1)
        params.append((typ, name, default or None))
    names = [n for _, n, _ in params]
    tensors = [n for t, n, _ in params if t.startswith("Tensor")]
    if isinstance(op.rule, str):  # "like:<arg>"
        like = op.rule.split(":")[1]
        alloc, fake = f"_empty_like({like})", f"{like}.new_empty(_dims({like}, 2))"
    else:
        globals()["_rule_" + op.name] = op.rule
        rule_args = ", ".join(list(_inspect.signature(op.rule).parameters)[1:])
        alloc = f"_rule_{op.name}(ctx, {rule_args})"
        fake = f"_rule_{op.name}(None, {rule_args})"
    # The entry point's arguments (moekit.raw._ENTRY_ARGS: the C++ args struct's fields,
    # then "ws" for the workspace entry), each an argument, an output or derived.
    entry = []
    for field in _raw._ENTRY_ARGS[op.name]:
        if field in names or field in op.outputs:
            entry.append(field)
        elif field == "ws":
            entry.append(f"_ws(ctx, {names[0]})")
        elif field in op.derived:
            entry.append(op.derived[field])
        else:
            raise AssertionError(f"moekit.ops: {op.name}: C++ field {field!r} not in the table")
    # The entry point's keyword arguments (after the stream), passed in their order
    # (positionally: cheaper to convert than keywords).
    keywords = ""
    for k in getattr(_raw, "_ENTRY_KEYWORDS", {}).get(op.name, ()):
        assert k in names, f"moekit.ops: {op.name}: C++ keyword {k!r} not in the table"
        keywords += f", {k}"
    # out=: the buffers go to the out variant as keywords named after the outputs.
    assert not set(op.outputs) & set(names), f"{op.name}: an output named as an argument"
    nout = len(op.outputs)
    _out_labels[op.name] = [
        (o, "'out'" if nout == 1 else f"'out[{i}]' ({o})") for i, o in enumerate(op.outputs)
    ]
    out_dtype = ""
    if "out_dtype" in names:  # the buffer's dtype decides; a different out_dtype is an error
        out_dtype = (
            f"if out_dtype is None:\n        out_dtype = {op.outputs[0]}.dtype\n"
            f"    elif out_dtype != {op.outputs[0]}.dtype:\n"
            f'        _fail("{op.name}", "out_dtype", "None or the dtype of out", out_dtype)\n    '
        )
    src = _TEMPLATE.format(
        nout=nout,
        ret=op.outputs[0] if nout == 1 else f"({', '.join(op.outputs)})",
        out_kw=", ".join(f"{o}={o}" for o in op.outputs),
        out_names=repr(("out",) if nout == 1 else tuple(f"out[{i}]" for i in range(nout))),
        out_dtype=out_dtype,
        name=op.name,
        sig=", ".join(n if d is None else f"{n}={d}" for _, n, d in params),
        call=", ".join(names),
        first=names[0],
        tensor_names=repr(tuple(tensors)),
        tensors=", ".join(tensors),
        outs=", ".join(op.outputs),
        alloc=alloc,
        fake=fake,
        entry=", ".join(entry),
        keywords=keywords,
    )
    filename = f"<moekit.ops {op.name}>"
    _linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # tracebacks
    exec(compile(src, filename, "exec"), globals())
    in_place = f", or {op.in_place} itself" if op.in_place else ""
    globals()[op.name].__doc__ = op.doc.rstrip() + (
        "\n\n        out: a tensor to write the output into (shape, dtype and device as the"
        f"\n            output would have; contiguous, overlapping no input{in_place}),"
        "\n            returned as it is."
        if nout == 1
        else f"\n\n        out: a tuple of {nout} tensors ({', '.join(op.outputs)}) to write the"
        "\n            outputs into (each shaped as that output would be; contiguous, overlapping"
        "\n            no input nor each other), returned as a tuple of them."
    )
    globals()["_t_" + op.name] = getattr(_raw, "_t_" + op.name)
    outputs = ", ".join("Tensor " + o for o in op.outputs)
    schema = f"({op.params}) -> " + ("Tensor" if nout == 1 else f"({outputs})")
    mutated = ", ".join(f"Tensor({chr(97 + i)}!) {o}" for i, o in enumerate(op.outputs))
    return schema, f"({op.params}, *, {mutated}) -> ()"


# ---------------------------------------------------------------- registration


def _cpu_kernel(name, op):
    # name: the registered op (op or op + "_out"); messages name op and out=.
    labels = {f: label for f, label in _out_labels[op]} if name != op else {}

    def kernel(*args, **kwargs):
        schema = getattr(torch.ops.moekit, name).default._schema
        for a, value in zip(schema.arguments, list(args) + list(kwargs.values())):
            if isinstance(value, _Tensor) and value.device.type != "cuda":
                arg = labels.get(a.name, f"'{a.name}'")
                raise MoekitError(f"moekit::{op}: argument {arg}: expected a CUDA tensor, "
                                  f"got a tensor on {value.device}")
        _fail(op, schema.arguments[0].name, "CUDA tensors", "tensors on the CPU")

    return kernel


def _dispatched(fn):
    # The CUDA kernel as registered with the dispatcher: a workspace per call (see _ws).
    def kernel(*args, **kwargs):
        before = _tls.uncached
        _tls.uncached = True
        try:
            return fn(*args, **kwargs)
        finally:
            _tls.uncached = before

    kernel.__name__ = fn.__name__
    return kernel


_lib = torch.library.Library("moekit", "DEF")
for _op in _OPS:
    # The functional op <name> and its out variant <name>_out (out=, see _unpack_out).
    for _name, _schema in zip((_op.name, _op.name + "_out"), _define(_op)):
        _lib.define(_name + _schema)
        _lib.impl(_name, _dispatched(globals()[f"_{_name}_cuda"]), "CUDA")
        _lib.impl(_name, _cpu_kernel(_name, _op.name), "CPU")
        torch.library.register_fake(f"moekit::{_name}", globals()[f"_{_name}_fake"], lib=_lib)
        globals()["_op_" + _name] = getattr(torch.ops.moekit, _name).default
assert [o.name for o in _OPS] == list(_raw.OPS), "the torch layer and the extension disagree"
