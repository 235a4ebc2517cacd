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
  alloc      the output allocation(s) the eager path makes (part of eager/dispatch).

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
    ws_entry = moekit.ops._ws(torch.cuda.current_device(), stream, x)
    # fused_topk: 2 outputs, no workspace.
    ow, oi = torch.empty(T, K, dtype=f32, device=dev), torch.empty(T, K, dtype=i32, device=dev)
    args = (v(logits), None, v(ow), v(oi), K, True, "softmax", 0, 0, 1.0, stream)
    out["fused_topk"] = dict(
        raw=lambda: raw.fused_topk(*args),
        entry=lambda: raw._t_fused_topk(logits, None, ow, oi, K, True, "softmax", 0, 0, 1.0,
                                        stream),
        eager=lambda: moekit.fused_topk(logits, K, True),
        dispatch=lambda: torch.ops.moekit.fused_topk.default(logits, K, True),
        alloc=lambda: (logits.new_empty((T, K), dtype=f32), logits.new_empty((T, K), dtype=i32)),
    )  # fmt: skip
    # moe_post_permute: 1 output, no workspace.
    oo = torch.empty(T, H, dtype=bf16, device=dev)
    pargs = (v(permuted), v(w), v(inv), v(oo), stream)
    out["moe_post_permute"] = dict(
        raw=lambda: raw.moe_post_permute(*pargs),
        entry=lambda: raw._t_moe_post_permute(permuted, w, inv, oo, stream),
        eager=lambda: moekit.moe_post_permute(permuted, w, inv),
        dispatch=lambda: torch.ops.moekit.moe_post_permute.default(permuted, w, inv),
        alloc=lambda: permuted.new_empty((T, H), dtype=bf16),
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
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "tuple (ptr, dtype, size, contiguous)": lambda: o._v(x),
        "x.__dlpack__()": lambda: x.__dlpack__(),
        "x.get_device()": lambda: x.get_device(),
        "eager-mode check (_eager)": lambda: o._eager(x),
        "current device (_cuda_getDevice)": lambda: o._current_device(),
        "stream (_cuda_getCurrentRawStream)": lambda: o._raw_stream(dev),
        "capture check + workspace lookup (_ws)": lambda: o._ws(dev, stream, x),
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
    cols = ("raw", "entry", "eager", "dispatch", "alloc")
    print(f"# host time per call (us), median of {args.bursts} bursts of {args.burst_len}; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")  # fmt: skip
    print(f"{'op':<26}" + "".join(f"{c:>10}" for c in cols) + f"{'eager-raw':>11}{'disp-raw':>10}")
    for name, fns in cases().items():
        r = {c: host_time_us(fns[c], args.bursts, args.burst_len) for c in cols if c in fns}
        if "raw" in r:
            r["eager_overhead"] = r["eager"] - r["raw"]
            r["dispatch_overhead"] = r["dispatch"] - r["raw"]
        results[name] = r
        line = f"{name:<26}" + "".join(f"{r[c]:>10.2f}" if c in r else f"{'-':>10}" for c in cols)
        if "raw" in r:
            line += f"{r['eager_overhead']:>11.2f}{r['dispatch_overhead']:>10.2f}"
        print(line, flush=True)
    print(f"\n# pieces of the eager path (us per call, median)")
    parts = {}
    for name, fn in pieces().items():
        parts[name] = host_time_us(fn, args.bursts, args.burst_len)
        print(f"{name:<44}{parts[name]:>8.2f}", flush=True)
    results["pieces"] = parts
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
