#!/usr/bin/env python3
"""Host overhead of moekit's Python layer per call, in eager mode (needs a GPU).

For each op, on tiny shapes (so that the GPU never holds the host back), it times
bursts of back-to-back calls on the host clock (no synchronization inside a burst,
the queue never fills) and reports the median per call of:

  raw        moekit.raw.<op>(...) with ready-made (ptr, dtype, shape, strides) tuples,
             preallocated outputs and workspace: the C++ op itself (validation and
             kernel launches) plus the binding's argument conversion;
  entry      the torch layer's extension entry point (moekit.raw._t_<op>) with
             preallocated outputs and the cached workspace: raw plus reading the
             torch tensors in C++ (get_device, data_ptr, dtype, shape, is_contiguous);
  eager      moekit.<op>(...): the default path (direct call in plain eager mode);
  dispatch   torch.ops.moekit.<op>.default(...): through the PyTorch dispatcher
             (what torch.compile'd graphs and modes call);
  alloc      the output allocation(s) the eager path makes (part of eager/dispatch);
  py         moekit.<op>(...) with the extension call (moekit.ops._t_<op>) replaced by a
             Python no-op: the Python layer alone, allocations included, nothing launched
             (so without the launch-time noise of the other columns).

The columns' bursts are interleaved (raw, entry, eager, ..., raw, entry, eager, ...), and
eager - raw and dispatch - raw are the medians of the per-round differences: a drift of
the host's speed or a slow round shifts all columns alike.

The Python layer's own overhead is eager - raw (and dispatch - raw), i.e. everything
but the C++ op: reading the tensors, allocating outputs through the caching allocator,
the eager-mode check, the workspace-cache lookup and the stream lookup. A second table
times those pieces alone.

--attribute then splits each op's eager - raw into rows measured in the same interleaved
rounds (one more table per op, at burst lengths 20 and --attr-long-burst):

  read       entry - raw: the C++ reading the torch tensors;
  call       eager - (py - noop) - entry (+ the loop): what the C++ call costs inside the
             eager path beyond the entry column alone (cache effects, argument passing;
             noop: the Python no-op standing in for it in py, timed with its arguments);
  alloc      py - (py with the allocations replaced by preallocated outputs, through the
             module names moekit.ops._empty_like / _new_empty), plus the stubs' own cost;
  check      moekit.ops._eager(first) alone;
  ctx        moekit.raw._launch_ctx(first) alone;
  ws         moekit.ops._ws(ctx, first) alone (ops with a workspace);
  rest       the Python layer without those: frames, argument passing, glue;

so that read + call + alloc + check + ctx + ws + rest = eager - raw (per round; the
medians' sum approximately). The pieces have the burst loop's own cost per call (an
empty lambda, "loop") subtracted. Before the rows, a path report per op: the launch
context (C fast path, Python fallback, or None -> the slow _elsewhere path), whether it
equals the Python version, the capture check, the workspace entry, and over three calls
how many went through _elsewhere, the dispatcher, fused_topk's prototype miss, a
workspace allocation or the launch context's Python fallback (FAST: none of them).
--cpu (no GPU needed) runs only the rows of the Python layer (py and its split) on CPU
tensors, for comparing changes of the eager path on a development machine.

Usage: python overhead.py [--json FILE] [--bursts N] [--burst-len N]
                          [--attribute [--attr-long-burst N]] [--cpu]
"""

import argparse
import collections
import gc
import itertools
import json
import os
import statistics
import sys
import sysconfig
import time

import torch

import moekit
from moekit import raw


def host_time_us(fn, bursts, burst_len):
    for _ in range(3 * burst_len):  # warm up: caching allocator, lazy module loads
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(bursts):
        t0 = time.perf_counter()
        for _ in range(burst_len):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()  # outside the timed region
        per_call.append((t1 - t0) / burst_len * 1e6)
    return statistics.median(per_call)


def interleaved_us(fns, bursts, burst_len, sync=None):
    """Per column, the host time per call (median over bursts), with the columns' bursts
    interleaved (raw, entry, eager, ... raw, entry, eager, ...) so that a drift of the
    host (clock, other load) shifts every column alike; and, for each column, the median
    over rounds of its burst minus the raw burst of the same round (the differences the
    table reports, robust to a slow round). A column given as (fn, enter, leave) calls
    enter() before and leave() after each of its bursts, outside the timed region."""
    times = interleaved_times(fns, bursts, burst_len, sync)
    med = {name: statistics.median(t) for name, t in times.items()}
    diff = {}
    if "raw" in times:
        for name, t in times.items():
            diff[name] = statistics.median(a - b for a, b in zip(t, times["raw"]))
    return med, diff


def interleaved_times(fns, bursts, burst_len, sync=None):
    """interleaved_us's measurement: per column, the list of its bursts' times per call
    (us), round by round."""
    sync = sync or torch.cuda.synchronize
    cols = {}
    for name, f in fns.items():
        cols[name] = f if isinstance(f, tuple) else (f, None, None)
    for fn, enter, leave in cols.values():
        if enter:
            enter()
        for _ in range(3 * burst_len):  # warm up: caching allocator, lazy module loads
            fn()
        if leave:
            leave()
    sync()
    times = {name: [] for name in cols}
    for _ in range(bursts):
        for name, (fn, enter, leave) in cols.items():
            if enter:
                enter()
            t0 = time.perf_counter()
            for _ in range(burst_len):
                fn()
            t1 = time.perf_counter()
            if leave:
                leave()
            sync()  # outside the timed region
            times[name].append((t1 - t0) / burst_len * 1e6)
    return times


def swapped(name, fake):
    """(enter, leave) that replace moekit.ops.<name> with fake for a burst."""
    real = getattr(moekit.ops, name)
    return (lambda: setattr(moekit.ops, name, fake), lambda: setattr(moekit.ops, name, real))


def _noop(*args):
    return None


def v(t):
    return moekit.ops._v(t)


def cases():
    dev = "cuda"
    bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32
    T, E, K, H, F, S = 1, 16, 4, 256, 128, 128
    x = torch.randn(T, H, dtype=bf16, device=dev)
    logits = torch.randn(T, E, device=dev)
    w13 = torch.randn(E, 2 * F, H, dtype=bf16, device=dev) * 0.05
    w2 = torch.randn(E, H, F, dtype=bf16, device=dev) * 0.05
    s13 = torch.randn(2 * S, H, dtype=bf16, device=dev) * 0.05
    s2 = torch.randn(H, S, dtype=bf16, device=dev) * 0.05
    w, ids = moekit.fused_topk(logits, K, True)
    permuted, meta, inv = moekit.moe_pre_permute(x, ids, E)
    stream = torch.cuda.current_stream().cuda_stream

    def ws(n):
        return torch.empty(max(n, 1), dtype=torch.uint8, device=dev)

    out = {}
    ws_entry = moekit.ops._ws((torch.cuda.current_device(), stream), x)
    # fused_topk: 2 outputs, no workspace.
    ow, oi = torch.empty(T, K, dtype=f32, device=dev), torch.empty(T, K, dtype=i32, device=dev)
    args = (v(logits), None, v(ow), v(oi), K, True, "softmax", 0, 0, 1.0, stream)
    out["fused_topk"] = dict(
        raw=lambda: raw.fused_topk(*args),
        entry=lambda: raw._t_fused_topk(logits, None, ow, oi, K, True, "softmax", 0, 0, 1.0,
                                        stream),
        eager=lambda: moekit.fused_topk(logits, K, True),
        py=(lambda: moekit.fused_topk(logits, K, True), *swapped("_t_fused_topk", _noop)),
        dispatch=lambda: torch.ops.moekit.fused_topk.default(logits, K, True),
        alloc=lambda: (logits.new_empty(T, K, dtype=f32), logits.new_empty(T, K, dtype=i32)),
        meta=meta_case("fused_topk", lambda: moekit.fused_topk(logits, K, True), logits),
    )  # fmt: skip
    # moe_post_permute: 1 output, no workspace.
    oo = torch.empty(T, H, dtype=bf16, device=dev)
    pargs = (v(permuted), v(w), v(inv), v(oo), stream)
    out["moe_post_permute"] = dict(
        raw=lambda: raw.moe_post_permute(*pargs),
        entry=lambda: raw._t_moe_post_permute(permuted, w, inv, oo, stream),
        eager=lambda: moekit.moe_post_permute(permuted, w, inv),
        py=(lambda: moekit.moe_post_permute(permuted, w, inv),
            *swapped("_t_moe_post_permute", _noop)),
        dispatch=lambda: torch.ops.moekit.moe_post_permute.default(permuted, w, inv),
        alloc=lambda: permuted.new_empty(T, H, dtype=bf16),
        meta=meta_case("moe_post_permute", lambda: moekit.moe_post_permute(permuted, w, inv),
                       permuted),
    )  # fmt: skip
    # fused_moe: 1 output + workspace.
    fo = torch.empty(T, H, dtype=bf16, device=dev)
    fargs = (v(x), v(logits), None, v(w13), v(w2), v(fo), K, True, "softmax", 0, 0, 1.0, "silu",
             None, None, None, False)  # fmt: skip
    n = raw.fused_moe_workspace_size(*fargs)
    fws = ws(n)
    out["fused_moe"] = dict(
        raw=lambda: raw.fused_moe(*fargs, fws.data_ptr(), n, stream),
        entry=lambda: raw._t_fused_moe(x, logits, None, w13, w2, fo, K, True, "softmax", 0, 0,
                                       1.0, "silu", None, None, None, False, ws_entry,
                                       stream),
        eager=lambda: moekit.fused_moe(x, logits, w13, w2, K, True),
        py=(lambda: moekit.fused_moe(x, logits, w13, w2, K, True), *swapped("_t_fused_moe", _noop)),
        dispatch=lambda: torch.ops.moekit.fused_moe.default(x, logits, w13, w2, K, True),
        alloc=lambda: torch.empty_like(x),
        meta=meta_case("fused_moe", lambda: moekit.fused_moe(x, logits, w13, w2, K, True), x),
    )  # fmt: skip
    # fused_moe_shared_expert: the largest argument list.
    so = torch.empty(T, H, dtype=bf16, device=dev)
    sargs = (v(x), v(logits), None, v(w13), v(w2), v(s13), v(s2), v(so), K, True, "softmax", 0,
             0, 1.0, "silu", None, None, None, None, None, False)  # fmt: skip
    ns = raw.fused_moe_shared_expert_workspace_size(*sargs)
    sws = ws(ns)
    out["fused_moe_shared_expert"] = dict(
        raw=lambda: raw.fused_moe_shared_expert(*sargs, sws.data_ptr(), ns, stream),
        entry=lambda: raw._t_fused_moe_shared_expert(x, logits, None, w13, w2, s13, s2, so, K,
                                                     True, "softmax", 0, 0, 1.0, "silu", None,
                                                     None, None, None, None, False,
                                                     ws_entry, stream),
        eager=lambda: moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, K, True),
        py=(lambda: moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, K, True),
            *swapped("_t_fused_moe_shared_expert", _noop)),
        dispatch=lambda: torch.ops.moekit.fused_moe_shared_expert.default(
            x, logits, w13, w2, s13, s2, K, True),
        alloc=lambda: torch.empty_like(x),
        meta=meta_case("fused_moe_shared_expert",
                       lambda: moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, K, True),
                       x),
    )  # fmt: skip
    # shared_expert_mlp.
    mo = torch.empty(T, H, dtype=bf16, device=dev)
    margs = (v(x), v(s13), v(s2), v(mo), "silu", None, None)
    nm = raw.shared_expert_mlp_workspace_size(*margs)
    mws = ws(nm)
    out["shared_expert_mlp"] = dict(
        raw=lambda: raw.shared_expert_mlp(*margs, mws.data_ptr(), nm, stream),
        entry=lambda: raw._t_shared_expert_mlp(x, s13, s2, mo, "silu", None, None, ws_entry,
                                               stream),
        eager=lambda: moekit.shared_expert_mlp(x, s13, s2),
        py=(lambda: moekit.shared_expert_mlp(x, s13, s2), *swapped("_t_shared_expert_mlp", _noop)),
        dispatch=lambda: torch.ops.moekit.shared_expert_mlp.default(x, s13, s2),
        alloc=lambda: torch.empty_like(x),
        meta=meta_case("shared_expert_mlp", lambda: moekit.shared_expert_mlp(x, s13, s2), x),
    )
    # A plain torch op, for scale: one small kernel through the dispatcher.
    out["(torch.add, for scale)"] = dict(eager=lambda: torch.add(x, x))
    return out


# ---------------------------------------------------------------- attribution (--attribute)

WS_OPS = ("fused_moe", "fused_moe_shared_expert", "shared_expert_mlp")


def meta_case(name, call, first):
    """What the attribution mode needs of an op: its eager call and first tensor."""
    return dict(name=name, call=call, first=first)


class _FakeCuda(torch.Tensor):
    """--cpu: a CPU tensor the eager-mode check takes for a CUDA one (no __torch_function__
    overhead: torch functions and methods on it return plain tensors)."""

    is_cuda = True
    __torch_function__ = torch._C._disabled_torch_function_impl


def cpu_cases():
    """--cpu: the five ops' eager calls on CPU tensors, for the columns that need no GPU
    (the C++ entry is always stubbed there; _launch_ctx answers (0, 0))."""
    bf16, f32 = torch.bfloat16, torch.float32
    T, E, K, H, F, S = 1, 16, 4, 256, 128, 128

    def t(*shape, dtype=bf16):
        return torch.zeros(*shape, dtype=dtype).as_subclass(_FakeCuda)

    x, logits = t(T, H), t(T, E, dtype=f32)
    w13, w2, s13, s2 = t(E, 2 * F, H), t(E, H, F), t(2 * S, H), t(H, S)
    w, inv, permuted = t(T, K, dtype=f32), t(T * K, dtype=torch.int32), t(T * K, H)
    return {
        "fused_topk": dict(meta=meta_case(
            "fused_topk", lambda: moekit.fused_topk(logits, K, True), logits)),
        "moe_post_permute": dict(meta=meta_case(
            "moe_post_permute", lambda: moekit.moe_post_permute(permuted, w, inv), permuted)),
        "fused_moe": dict(meta=meta_case(
            "fused_moe", lambda: moekit.fused_moe(x, logits, w13, w2, K, True), x)),
        "fused_moe_shared_expert": dict(meta=meta_case(
            "fused_moe_shared_expert",
            lambda: moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, K, True), x)),
        "shared_expert_mlp": dict(meta=meta_case(
            "shared_expert_mlp", lambda: moekit.shared_expert_mlp(x, s13, s2), x)),
    }  # fmt: skip


def path_report(m, sync):
    """Which way the eager call of m goes, end to end: the launch context (the C fast path,
    the Python fallback, or None: every call then goes through _elsewhere and
    torch.cuda.device), and over three calls after two warm-up calls, how often it went
    through _elsewhere, the dispatcher, fused_topk's prototype miss (two new_empty) and a
    workspace allocation; the capture check, the workspace entry."""
    o = moekit.ops
    name, first = m["name"], m["first"]
    counts = collections.Counter()

    def counting(key, fn):
        def wrapper(*args, **kwargs):
            counts[key] += 1
            return fn(*args, **kwargs)

        return wrapper

    raw._set_launch_ctx_fallback(counting("ctx_fallback", o._launch_ctx_py))
    try:
        ctx = o._launch_ctx(first)
    finally:
        raw._set_launch_ctx_fallback(o._launch_ctx_py)
    py_ctx = o._launch_ctx_py(first)
    if ctx is None:
        how = "None -> _elsewhere (slow: torch.cuda.device per call)"
    elif counts["ctx_fallback"]:
        how = "Python fallback (_launch_ctx_py)"
    else:
        how = "C fast path"
    rep = {"eager_check": bool(o._eager(first)), "launch_ctx": how,
           "launch_ctx_equals_python": ctx == py_ctx,
           "capturing": bool(o._is_capturing(ctx[1])) if ctx else None,
           "tls_uncached": bool(o._tls.uncached), "ws_cache_on": bool(o._ws_cache_on)}  # fmt: skip
    counts.clear()
    swaps = {"_elsewhere": "elsewhere", "_op_" + name: "dispatcher",
             "_topk_outputs": "topk_proto_miss", "_workspace": "workspace_alloc"}  # fmt: skip
    saved = {attr: getattr(o, attr) for attr in swaps}
    raw._set_launch_ctx_fallback(counting("ctx_fallback", o._launch_ctx_py))
    try:
        for attr, key in swaps.items():
            setattr(o, attr, counting(key, saved[attr]))
        m["call"]()
        m["call"]()
        sync()
        counts.clear()
        for _ in range(3):
            m["call"]()
        sync()
    finally:
        for attr, fn in saved.items():
            setattr(o, attr, fn)
        raw._set_launch_ctx_fallback(o._launch_ctx_py)
    for key in ("ctx_fallback", "elsewhere", "dispatcher", "topk_proto_miss", "workspace_alloc"):
        rep["calls_" + key] = counts[key]
    if name in WS_OPS and ctx is not None:
        e = o._ws(ctx, first)
        rep["ws_entry"] = "cached" if e[4] else "per call"
    rep["fast"] = (rep["eager_check"] and how == "C fast path" and rep["launch_ctx_equals_python"]
                   and not any(counts.values()))  # fmt: skip
    return rep


def attribution_columns(m, case, cpu):
    """The interleaved columns of one op's attribution."""
    o = moekit.ops
    name, first, call = m["name"], m["first"], m["call"]
    ext = "_t_" + name
    real_ext = getattr(o, ext)
    ext_args = []
    setattr(o, ext, lambda *a: ext_args.append(a))
    try:
        outs = call()  # outputs as the eager path allocates them (nothing launched)
    finally:
        setattr(o, ext, real_ext)
    ext_args = ext_args[0]
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    if len(outs) == 1:
        out0 = outs[0]

        def stub(t, *args, **kwargs):
            return out0

    else:
        nxt = itertools.cycle(outs).__next__

        def stub(t, *args, **kwargs):
            return nxt()

    el, ne = o._empty_like, getattr(o, "_new_empty", torch.Tensor.new_empty)
    real = {ext: real_ext, "_empty_like": el, "_new_empty": ne}  # (an older ops.py: no _new_empty)

    def enter_py():
        setattr(o, ext, _noop)

    def enter_noalloc():
        setattr(o, ext, _noop)
        o._empty_like = o._new_empty = stub

    def leave():
        for attr, fn in real.items():
            setattr(o, attr, fn)

    ctx = o._launch_ctx(first) or (max(first.get_device(), 0), 0)  # None: see the path report
    T, N = outs[0].shape
    p = None  # fused_topk's prototypes of this shape and device (whatever the cache's key)
    if name == "fused_topk":
        for key, protos in o._topk_protos.items():
            if key[-1] == ctx[0] and tuple(protos[0].shape) == (T, N):
                p = protos
    f32, i32 = torch.float32, torch.int32

    def alloc_protos():
        return el(p[0]), el(p[1])

    def alloc_topk_miss():  # the prototype miss path (see the path report)
        return first.new_empty(T, N, dtype=f32), first.new_empty(T, N, dtype=i32)

    def alloc_post():
        return ne(first, T, N)

    def alloc_like():
        return el(first)

    if name == "fused_topk":
        alloc = alloc_protos if p is not None else alloc_topk_miss
    else:
        alloc = alloc_post if name == "moe_post_permute" else alloc_like
    eager_chk, launch_ctx, ws = o._eager, o._launch_ctx, o._ws
    cols = {}
    if not cpu:
        cols.update(raw=case["raw"], entry=case["entry"], eager=call)
    inference = []

    def enter_inference():
        inference.append(torch.inference_mode())
        inference[-1].__enter__()

    def leave_inference():
        inference.pop().__exit__(None, None, None)

    cols.update(
        py=(call, enter_py, leave),
        noalloc=(call, enter_noalloc, leave),
        loop=lambda: None,
        noop=lambda: _noop(*ext_args),  # the no-op standing in for the C++ call in py
        stub=lambda: stub(first),
        alloc=alloc,
        check=lambda: eager_chk(first),
        ctx=lambda: launch_ctx(first),
    )
    if name in WS_OPS:
        cols["ws"] = lambda: ws(ctx, first)
    # For scale, not a row of the sum: the whole eager call (cpu: py) under
    # torch.inference_mode(), as inference servers run (no autograd metadata on outputs).
    cols["inference"] = (call, enter_inference, leave_inference) if not cpu else (
        call, lambda: (enter_py(), enter_inference()), lambda: (leave_inference(), leave()))
    return cols, len(outs)


ATTR_ROWS = (
    ("total", "eager - raw (what the summary reports)"),
    ("read", "  = C++ reads the torch tensors (entry - raw)"),
    ("call", "  + the C++ call inside eager, beyond entry alone"),
    ("alloc", "  + output allocation(s) (py - py with preallocated outputs)"),
    ("check", "  + eager-mode check (_eager) alone"),
    ("ctx", "  + launch context (_launch_ctx) alone"),
    ("ws", "  + workspace lookup (_ws) alone"),
    ("rest", "  + the rest: frames, argument passing, glue"),
    ("sum", "  = sum of the rows above"),
    ("py", "py - noop: the Python layer alone (= the rows from alloc on)"),
    ("noop", "noop: the no-op standing in for the C++ call in py"),
    ("inference", "under torch.inference_mode(): eager - raw (--cpu: py - noop)"),
    ("alloc_alone", "allocation(s) alone, as the eager path makes them"),
    ("loop", "burst loop per call (subtracted from the pieces)"),
)


def attribution_rows(t, n_alloc, cpu):
    """Per-round decomposition of eager - raw (medians of per-round values):
    eager - raw = (entry - raw) + (eager - (py - noop) - entry + loop) + (py - noop - loop),
    and py - noop - loop = allocations + check + ctx + ws + rest, the allocations being
    py - noalloc plus what the stubs that replaced them cost (noop: the Python no-op that
    stands in for the C++ call in py, with the same arguments)."""
    med = statistics.median
    rounds = range(len(t["py"]))
    lp = t["loop"]

    def piece(k):
        return [t[k][i] - lp[i] for i in rounds] if k in t else [0.0 for _ in rounds]

    check, ctx, ws, stub = piece("check"), piece("ctx"), piece("ws"), piece("stub")
    noop = piece("noop")
    alloc = [t["py"][i] - t["noalloc"][i] + n_alloc * stub[i] for i in rounds]
    rest = [t["noalloc"][i] - lp[i] - n_alloc * stub[i] - check[i] - ctx[i] - ws[i] - noop[i]
            for i in rounds]  # fmt: skip
    r = {"alloc": med(alloc), "check": med(check), "ctx": med(ctx), "rest": med(rest),
         "py": med(a - b for a, b in zip(piece("py"), noop)), "noop": med(noop),
         "alloc_alone": med(piece("alloc")), "loop": med(lp)}  # fmt: skip
    if "ws" in t:
        r["ws"] = med(ws)
    parts = ["alloc", "check", "ctx", "ws", "rest"]
    if not cpu:
        r["total"] = med(t["eager"][i] - t["raw"][i] for i in rounds)
        r["read"] = med(t["entry"][i] - t["raw"][i] for i in rounds)
        r["call"] = med(t["eager"][i] - t["py"][i] + noop[i] - t["entry"][i] + lp[i]
                        for i in rounds)  # fmt: skip
        parts = ["read", "call"] + parts
    r["sum"] = sum(r.get(k, 0.0) for k in parts)
    if cpu:  # the Python layer under inference mode, as the py row
        r["inference"] = med(t["inference"][i] - lp[i] - noop[i] for i in rounds)
    else:
        r["inference"] = med(t["inference"][i] - t["raw"][i] for i in rounds)
    return r


def host_info():
    """The interpreter's build and the CPU: what makes one host's Python layer slower."""
    cfg = sysconfig.get_config_var("CONFIG_ARGS") or ""
    opt = [f for f in ("--enable-optimizations", "--with-lto") if f in cfg]
    cflags = [f for f in (sysconfig.get_config_var("OPT") or "").split() if f.startswith("-O")]
    cpu, mhz = "?", "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and cpu == "?":
                    cpu = line.split(":", 1)[1].strip()
                if line.startswith("cpu MHz") and mhz == "?":
                    mhz = line.split(":", 1)[1].strip()
    except OSError:
        pass
    # What slows every Python call down when on: dev mode, a debug allocator, tracemalloc,
    # a trace or profile hook.
    slow = [name for name, on in (
        ("dev mode", sys.flags.dev_mode), ("PYTHONMALLOC=" + os.environ.get("PYTHONMALLOC", ""),
                                           os.environ.get("PYTHONMALLOC")),
        ("tracemalloc", "tracemalloc" in sys.modules and sys.modules["tracemalloc"].is_tracing()),
        ("trace hook", sys.gettrace()), ("profile hook", sys.getprofile())) if on]  # fmt: skip
    return (f"Python {sys.version.split()[0]} ({' '.join(opt) or 'no PGO/LTO flags'}, "
            f"{' '.join(cflags) or '?'}; gc {gc.get_threshold()}; "
            f"{', '.join(slow) if slow else 'no debug hooks'}), torch {torch.__version__} "
            f"(grad mode {torch.is_grad_enabled()}), tensor protocol {raw._tensor_protocol()}; "
            f"CPU {cpu} at {mhz} MHz, {os.cpu_count()} cores")  # fmt: skip


def attribute(all_cases, args, cpu):
    """--attribute: per op, which path the eager call takes, and its eager - raw split
    into rows measured in the same interleaved rounds (see attribution_rows)."""
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    lens = [args.burst_len] + ([args.attr_long_burst] if args.attr_long_burst else [])
    print(f"\n# attribution of eager - raw (us per call, medians of per-round values; columns "
          f"interleaved per op; burst length {' and '.join(map(str, lens))})")  # fmt: skip
    print("# " + host_info())
    out = {}
    for name, case in all_cases.items():
        m = case.get("meta")
        if m is None:
            continue
        rec = {}
        if cpu:
            print(f"\n{name}: --cpu (the C++ entry stubbed, _launch_ctx answers (0, 0))")
        else:
            rep = path_report(m, sync)
            rec["path"] = rep
            flags = [k[6:] + "=" + str(v) for k, v in rep.items() if k.startswith("calls_") and v]
            print(f"\n{name}: {'FAST' if rep['fast'] else 'SLOW'} path; launch ctx: "
                  f"{rep['launch_ctx']} (= Python's: {rep['launch_ctx_equals_python']}); "
                  f"eager check {rep['eager_check']}; capturing {rep['capturing']}; "
                  f"ws {rep.get('ws_entry', '-')}; slow calls in 3: "
                  f"{', '.join(flags) if flags else 'none'}")  # fmt: skip
        rows = {}
        for n in lens:
            cols, n_alloc = attribution_columns(m, case, cpu)
            bursts = args.bursts if n == args.burst_len else max(20, args.bursts // 4)
            t = interleaved_times(cols, bursts, n, sync)
            rows[n] = attribution_rows(t, n_alloc, cpu)
        rec["rows"] = rows
        print("  " + f"{'':<62}" + "".join(f"{'b' + str(n):>9}" for n in lens))
        for key, label in ATTR_ROWS:
            if key in rows[lens[0]]:
                print(f"  {label:<62}" + "".join(f"{rows[n][key]:>9.2f}" for n in lens))
        out[name] = rec
    return out


def pieces():
    """Host time of the pieces of the eager path, and of alternatives to them."""
    dev = torch.cuda.current_device()
    x = torch.randn(1, 256, dtype=torch.bfloat16, device="cuda")
    o = moekit.ops
    stream = torch.cuda.current_stream().cuda_stream
    return {
        "torch.empty(shape, dtype=, device=)": lambda: torch.empty(
            (1, 256), dtype=torch.bfloat16, device=x.device),
        "x.new_empty(shape)": lambda: x.new_empty((1, 256)),
        "x.new_empty(shape, dtype=)": lambda: x.new_empty((1, 256), dtype=torch.float32),
        "x.new_empty(1, 256, dtype=) (sizes as ints)": lambda: x.new_empty(1, 256,
                                                                           dtype=torch.float32),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "tuple (ptr, dtype, size, contiguous)": lambda: o._v(x),
        "x.__dlpack__()": lambda: x.__dlpack__(),
        "x.get_device()": lambda: x.get_device(),
        "eager-mode check (_eager)": lambda: o._eager(x),
        "current device (_cuda_getDevice)": lambda: o._current_device(),
        "stream (_cuda_getCurrentRawStream)": lambda: o._raw_stream(dev),
        "capture check, torch's (is_current_stream_capturing)":
            torch._C._cuda_isCurrentStreamCapturing,
        "capture check, moekit's (raw._stream_capturing)": lambda: raw._stream_capturing(stream),
        "capture check + workspace lookup (_ws)": lambda: o._ws((dev, stream), x),
        "launch context, moekit's (raw._launch_ctx)": lambda: o._launch_ctx(x),
        "launch context, Python (get_device, device, stream)": lambda: o._launch_ctx_py(x),
        "raw.describe(tuple): binding call + convert": (lambda t: lambda: raw.describe(t))(o._v(x)),
    }  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--bursts", type=int, default=200)
    ap.add_argument("--burst-len", type=int, default=20)
    ap.add_argument("--attribute", action="store_true",
                    help="after the tables, split each op's eager - raw into its pieces")
    ap.add_argument("--attr-long-burst", type=int, default=100,
                    help="--attribute also at this burst length (0: only --burst-len)")
    ap.add_argument("--cpu", action="store_true",
                    help="no GPU: only the attribution rows of the Python layer (py), on CPU "
                         "tensors, the C++ entry stubbed and _launch_ctx answering (0, 0)")
    args = ap.parse_args()
    if args.cpu:
        o = moekit.ops
        o._Tensor, o._launch_ctx = _FakeCuda, lambda t: (0, 0)
        results = {"attribution": attribute(cpu_cases(), args, cpu=True)}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return 0
    if not torch.cuda.is_available():
        print("overhead: no CUDA GPU", file=sys.stderr)
        return 2
    results = {}
    all_cases = cases()
    cols = ("raw", "entry", "eager", "dispatch", "alloc", "py")
    print(f"# host time per call (us), median of {args.bursts} bursts of {args.burst_len}, the "
          f"columns' bursts interleaved; {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}")  # fmt: skip
    print(f"{'op':<26}" + "".join(f"{c:>10}" for c in cols) + f"{'eager-raw':>11}{'disp-raw':>10}")
    for name, fns in all_cases.items():
        r, diff = interleaved_us({c: fns[c] for c in cols if c in fns}, args.bursts, args.burst_len)
        if "raw" in r:
            # Medians of the per-round differences (each round's bursts back to back).
            r["eager_overhead"] = diff["eager"]
            r["dispatch_overhead"] = diff["dispatch"]
        results[name] = r
        line = f"{name:<26}" + "".join(f"{r[c]:>10.2f}" if c in r else f"{'-':>10}" for c in cols)
        if "raw" in r:
            line += f"{r['eager_overhead']:>11.2f}{r['dispatch_overhead']:>10.2f}"
        print(line, flush=True)
    target = 5.0
    print(f"\n# eager - raw: the Python layer's overhead per call (target < {target:g} us); "
          "py: the same eager call with the extension call replaced by a no-op (no launch)")
    for name, r in results.items():
        if "eager_overhead" in r:
            ok = "ok" if r["eager_overhead"] < target else "OVER"
            print(f"{name:<26}{r['eager_overhead']:>8.2f} us  {ok:<5} (py {r['py']:.2f} us)")
    print(f"\n# pieces of the eager path (us per call, median)")
    parts = {}
    for name, fn in pieces().items():
        parts[name] = host_time_us(fn, args.bursts, args.burst_len)
        print(f"{name:<54}{parts[name]:>8.2f}", flush=True)
    results["pieces"] = parts
    if args.attribute:
        results["attribution"] = attribute(all_cases, args, cpu=False)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
