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

Usage: python overhead.py [--json FILE] [--bursts N] [--burst-len N]
"""

import argparse
import json
import statistics
import sys
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


def interleaved_us(fns, bursts, burst_len):
    """Per column, the host time per call (median over bursts), with the columns' bursts
    interleaved (raw, entry, eager, ... raw, entry, eager, ...) so that a drift of the
    host (clock, other load) shifts every column alike; and, for each column, the median
    over rounds of its burst minus the raw burst of the same round (the differences the
    table reports, robust to a slow round). A column given as (fn, enter, leave) calls
    enter() before and leave() after each of its bursts, outside the timed region."""
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
    torch.cuda.synchronize()
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
            torch.cuda.synchronize()  # outside the timed region
            times[name].append((t1 - t0) / burst_len * 1e6)
    med = {name: statistics.median(t) for name, t in times.items()}
    diff = {}
    if "raw" in times:
        for name, t in times.items():
            diff[name] = statistics.median(a - b for a, b in zip(t, times["raw"]))
    return med, diff


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
    )
    # fused_moe: 1 output + workspace.
    fo = torch.empty(T, H, dtype=bf16, device=dev)
    fargs = (v(x), v(logits), None, v(w13), v(w2), v(fo), K, True, "softmax", 0, 0, 1.0)
    n = raw.fused_moe_workspace_size(*fargs)
    fws = ws(n)
    out["fused_moe"] = dict(
        raw=lambda: raw.fused_moe(*fargs, fws.data_ptr(), n, stream),
        entry=lambda: raw._t_fused_moe(x, logits, None, w13, w2, fo, K, True, "softmax", 0, 0,
                                       1.0, ws_entry, stream),
        eager=lambda: moekit.fused_moe(x, logits, w13, w2, K, True),
        py=(lambda: moekit.fused_moe(x, logits, w13, w2, K, True), *swapped("_t_fused_moe", _noop)),
        dispatch=lambda: torch.ops.moekit.fused_moe.default(x, logits, w13, w2, K, True),
        alloc=lambda: torch.empty_like(x),
    )  # fmt: skip
    # fused_moe_shared_expert: the largest argument list.
    so = torch.empty(T, H, dtype=bf16, device=dev)
    sargs = (v(x), v(logits), None, v(w13), v(w2), v(s13), v(s2), v(so), K, True, "softmax", 0,
             0, 1.0)  # fmt: skip
    ns = raw.fused_moe_shared_expert_workspace_size(*sargs)
    sws = ws(ns)
    out["fused_moe_shared_expert"] = dict(
        raw=lambda: raw.fused_moe_shared_expert(*sargs, sws.data_ptr(), ns, stream),
        entry=lambda: raw._t_fused_moe_shared_expert(x, logits, None, w13, w2, s13, s2, so, K,
                                                     True, "softmax", 0, 0, 1.0, ws_entry,
                                                     stream),
        eager=lambda: moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, K, True),
        py=(lambda: moekit.fused_moe_shared_expert(x, logits, w13, w2, s13, s2, K, True),
            *swapped("_t_fused_moe_shared_expert", _noop)),
        dispatch=lambda: torch.ops.moekit.fused_moe_shared_expert.default(
            x, logits, w13, w2, s13, s2, K, True),
        alloc=lambda: torch.empty_like(x),
    )  # fmt: skip
    # shared_expert_mlp.
    mo = torch.empty(T, H, dtype=bf16, device=dev)
    margs = (v(x), v(s13), v(s2), v(mo))
    nm = raw.shared_expert_mlp_workspace_size(*margs)
    mws = ws(nm)
    out["shared_expert_mlp"] = dict(
        raw=lambda: raw.shared_expert_mlp(*margs, mws.data_ptr(), nm, stream),
        entry=lambda: raw._t_shared_expert_mlp(x, s13, s2, mo, ws_entry, stream),
        eager=lambda: moekit.shared_expert_mlp(x, s13, s2),
        py=(lambda: moekit.shared_expert_mlp(x, s13, s2), *swapped("_t_shared_expert_mlp", _noop)),
        dispatch=lambda: torch.ops.moekit.shared_expert_mlp.default(x, s13, s2),
        alloc=lambda: torch.empty_like(x),
    )
    # A plain torch op, for scale: one small kernel through the dispatcher.
    out["(torch.add, for scale)"] = dict(eager=lambda: torch.add(x, x))
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
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("overhead: no CUDA GPU", file=sys.stderr)
        return 2
    results = {}
    cols = ("raw", "entry", "eager", "dispatch", "alloc", "py")
    print(f"# host time per call (us), median of {args.bursts} bursts of {args.burst_len}, the "
          f"columns' bursts interleaved; {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}")  # fmt: skip
    print(f"{'op':<26}" + "".join(f"{c:>10}" for c in cols) + f"{'eager-raw':>11}{'disp-raw':>10}")
    for name, fns in cases().items():
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
