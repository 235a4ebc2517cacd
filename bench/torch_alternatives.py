#!/usr/bin/env python3
"""The PyTorch alternatives of moekit's benchmark (BENCH.md), measured on the same
workload rows as moekit-bench, interleaved with moekit's own op called through the
Python package.

Alternatives (each where it applies to the op):
  torch-ref         eager PyTorch composition of the op (sort/scatter routing, gathers,
                    per-expert loops for the routed experts)
  torch-grouped-mm  torch grouped GEMMs (F.grouped_mm / torch._grouped_mm) for the GEMM
                    and MLP ops; for FP8, F.scaled_grouped_mm with the op's 1x128 / 128x128
                    block scales, else torch-grouped-mm-rowwise (torch._scaled_grouped_mm
                    with per-row scales: a cheaper contract, reported under its own name)
  torch-cublas      dense matmuls (cuBLAS) for SharedExpertMLPFwd
  torch-scaled-mm-per-expert
                    FP8 layers: cuBLASLt FP8 GEMMs per active expert (torch._scaled_mm;
                    row-wise scales for per-tensor / per-channel weights, 1x128 / 128x128
                    block scales where this torch takes them), activations quantized as the
                    scheme implies

Timing (BENCH.md): warm-up; ops whose ideal time is under 20 us run as a CUDA graph of
many back-to-back calls over rotating input copies (eager when an alternative cannot be
captured; a graph is captured once per row and replayed in every round); working sets
under 2x L2 are flushed from L2 before every call; otherwise back-to-back calls. Each
sample (a call, or a graph replay) is timed with CUDA events. Samples per implementation
and round follow moekit-bench's plan: one timed call after the warm-up estimates the
sample time t, then n = clamp(--max-ms / t, 3, 100), and at least 30 when 30 fit in
--max-ms ("at least 30 timed calls or 200 ms"): a 40 ms torch-ref composition gets 5
calls per round, a 10 us kernel 100. Implementations interleaved (ABAB) for --rounds
rounds; median of the round medians. A full 132-row run takes ~2-3 minutes on the H200.

Output: a JSON list of records {"op", "workload", "dtype", "alternatives": {name: ms},
"moekit_py_ms": ms, ...} that `moekit-bench --extra-alternatives FILE` merges into its
table (it reads op, workload, dtype and alternatives; the other fields are for people).

Inputs: deterministic per (seed, op, workload, dtype); activations ~ N(0,1), weights ~
N(0, 1/in_features), logits ~ N(0,1) f32 (the row's dtype for FusedTopKFwd), correction
bias ~ N(0, 0.1^2); routed inputs from torch routing of such logits; ops that take a
permuted layout get equal per-expert counts (the page's convention).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
L2_BYTES = 60 * 2**20  # H200 (BENCH.md): flush when the working set is under 2x this
PEAK_BW = 4.5e12
PEAK_FLOPS = {"bf16": 760e12, "f16": 760e12, "fp8e4m3": 1395e12, "f32": 60e12, "i32": 60e12}

QUICK = {  # moekit-bench's --quick rows
    "FusedMoEFwd|qwen3-30b-decode-b32|bf16", "FusedMoEFwd|qwen3-235b-decode|f16",
    "FusedMoESharedExpertFwd|glm45-t32|bf16", "FusedMoESharedExpertFwd|kimi-k2-t1|bf16",
    "FusedTopKFwd|qwen3-235b-t512|bf16", "FusedTopKFwd|ds-v3-grouped-t64|f32",
    "MoEPrePermuteFwd|ds-v3-ep8-t100|bf16", "MoEPrePermuteFwd|decode-t32|f16",
    "MoEPermuteAlignFwd|ds-v3-t4096|i32", "MoEPermuteAlignFwd|qwen3-235b-t32|i32",
    "MoEPostPermuteFwd|ds-v3-ep8-t100|bf16", "MoEPostPermuteFwd|decode-t32|bf16/bf16",
    "MoEGroupedGemmFwd|ds-v3-decode-mlp-up|bf16", "MoEGroupedGemmFwd|qwen3-30b-ep8-routed256|bf16",
    "MoEGroupedGemmFwd|ds-v3-ep8-masked|bf16", "MoEGroupedGemmFP8Fwd|qwen3-235b-dec-b64-up|fp8e4m3",
    "MoEGroupedGemmFP8Fwd|ds-v3-e8-up-masked|fp8e4m3", "MoEExpertMLPFwd|qwen3-235b-decode|bf16",
    "FusedMoEExpertsFwd|qwen3-235b-decode|bf16", "IndexedExpertMLPFwd|ds-v3-t1|bf16",
    "IndexedExpertMLPFwd|qwen3-235b-t32|bf16", "SharedExpertMLPFwd|ds-v3-t32|bf16",
    "SharedExpertMLPFwd|kimi-k2-t512|bf16",
}  # fmt: skip

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
          "i32": torch.int32, "fp8e4m3": torch.float8_e4m3fn}  # fmt: skip

_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
DEVICE = "cuda"  # --device cpu: a smoke run of the setup code on small workloads


# ---------------------------------------------------------------- workloads


def eval_dim(expr):
    expr = str(expr)
    if not all(c in "0123456789+-*/() " for c in expr):
        raise ValueError(f"bad shape expression {expr!r}")
    return int(eval(expr, {"__builtins__": {}}))  # digits and + - * / ( ) only


class Row:
    def __init__(self, op, w, dtype):
        self.op, self.name, self.dtype = op, w["name"], dtype
        self.shapes = {k: [eval_dim(d) for d in v["shape"]] for k, v in w["tensors"].items()}
        self.tensor_dtypes = {k: v.get("dtype") for k, v in w["tensors"].items()}
        self.params = dict(w.get("params", {}))
        self.in_dtype = dtype.split("/")[0]
        self.out_dtype = dtype.split("/")[-1]

    def key(self):
        return f"{self.op}|{self.name}|{self.dtype}"

    def int_param(self, k, default):
        return int(self.params.get(k, default))

    def float_param(self, k, default):
        return float(self.params.get(k, default))

    def bool_param(self, k, default):
        v = self.params.get(k)
        return default if v is None else str(v).lower() in ("1", "true", "yes")

    def layout(self):
        """('contiguous', alignment) or ('masked', max_m) from the layout param."""
        s = self.params.get("layout", "contiguous(alignment=1)")
        if s.startswith("masked"):
            return "masked", int(s.split("max_m=")[1].rstrip(")"))
        align = 1
        if "alignment=" in s:
            align = int(s.split("alignment=")[1].split(",")[0].rstrip(")"))
        return "contiguous", align


# The tensors whose first dimension is the token count (bench/src/workload.cpp kTokenTensors),
# and the ops whose every token-shaped tensor is one of them: --tokens rescales those.
TOKEN_TENSORS = ("hidden_states", "gating_output", "topk_ids", "topk_weights", "output",
                 "local_expert_ids")  # fmt: skip
TOKEN_OPS = ("FusedTopKFwd", "FusedMoEFwd", "FusedMoESharedExpertFwd", "FusedMoEExpertsFwd",
             "IndexedExpertMLPFwd", "SharedExpertMLPFwd")  # fmt: skip


def parse_counts(text):
    """'1-16,24,32' -> [1, ..., 16, 24, 32] (moekit-bench's --tokens)."""
    out = []
    for part in str(text).split(","):
        lo, _, hi = part.strip().partition("-")
        first, last = int(lo), int(hi or lo)
        if first < 1 or last < first:
            raise ValueError(f"--tokens: bad range {part!r}")
        out.extend(range(first, last + 1))
    return out


def with_tokens(w, tokens):
    """Workload dict w at `tokens` tokens, named as moekit-bench --tokens names it
    ("name@T=N", so that its --extra-alternatives merge finds the row); None for ops whose
    rows --tokens does not rescale here. The page's figures are dropped (other shapes)."""
    out = json.loads(json.dumps(w))
    out["name"] = f"{w['name']}@T={tokens}"
    out.pop("results", None)
    for name, t in out["tensors"].items():
        if name in TOKEN_TENSORS and t.get("shape"):
            t["shape"] = [str(tokens)] + list(t["shape"][1:])
    return out


def load_rows(path, args):
    with open(path) as f:
        doc = json.load(f)
    counts = parse_counts(args.tokens) if getattr(args, "tokens", None) else None
    rows = []
    for op in doc["ops"]:
        for w0 in op["workloads"]:
            if counts is not None and op["op"] not in TOKEN_OPS:
                continue
            for w in [with_tokens(w0, n) for n in counts] if counts is not None else [w0]:
                for dt in w["dtypes"]:
                    rows.append(Row(op["op"], w, dt))

    def match(field, flt):
        return not flt or any(s and s in field for s in flt.split(","))

    rows = [r for r in rows if match(r.op, args.op) and match(r.name, args.workload)
            and match(r.dtype, args.dtype)]  # fmt: skip
    if args.quick:
        picked_ops = {r.op for r in rows if r.key() in QUICK}
        seen, out = set(), []
        for r in rows:
            first = r.op not in seen
            seen.add(r.op)
            if r.key() in QUICK or (first and r.op not in picked_ops):
                out.append(r)
        rows = out
    if args.limit:
        rows = rows[: args.limit]
    return rows


# ---------------------------------------------------------------- inputs


class Gen:
    def __init__(self, seed):
        self.g = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(self, shape, dtype, scale=1.0):
        # Floating dtypes are drawn directly (no f32 temporary: expert weights reach 20+ GB).
        direct = dtype in (torch.bfloat16, torch.float16, torch.float32)
        x = torch.randn(shape, generator=self.g, device=DEVICE,
                        dtype=dtype if direct else torch.float32)  # fmt: skip
        if scale != 1.0:
            x.mul_(scale)
        return x if direct else x.to(dtype)

    def rand(self, shape, lo=0.0, hi=1.0):
        return torch.rand(shape, generator=self.g, device=DEVICE) * (hi - lo) + lo


def row_seed(seed, row):
    h = 1469598103934665603
    for ch in f"{seed}|{row.key()}".encode():
        h = ((h ^ ch) * 1099511628211) % 2**63
    return h


def routing_params(row):
    return dict(
        top_k=row.int_param("top_k", 8),
        renormalize=row.bool_param("renormalize", False),
        scoring_func=row.params.get("scoring_func", "softmax"),
        num_expert_group=row.int_param("num_expert_group", 0),
        topk_group=row.int_param("topk_group", 0),
        routed_scaling_factor=row.float_param("routed_scaling_factor", 1.0),
    )


def equal_ends(total, E, alignment=1):
    """Inclusive ends of `total` rows split evenly over E experts (remainder first)."""
    base, rem = divmod(total, E)
    ends, end = [], 0
    for e in range(E):
        start = -(-end // alignment) * alignment
        end = start + base + (1 if e < rem else 0)
        ends.append(end)
    return torch.tensor(ends, dtype=torch.int32, device=DEVICE)


# ---------------------------------------------------------------- torch compositions


def torch_topk(logits, top_k, renormalize=False, scoring_func="softmax", num_expert_group=0,
               topk_group=0, routed_scaling_factor=1.0, correction_bias=None):  # fmt: skip
    s = logits.float()
    score = torch.softmax(s, dim=-1) if scoring_func == "softmax" else torch.sigmoid(s)
    sel = score + correction_bias if correction_bias is not None else score
    if num_expert_group > 0:
        T, E = sel.shape
        grouped = sel.view(T, num_expert_group, E // num_expert_group)
        if correction_bias is not None:
            gs = grouped.topk(2, dim=-1).values.sum(dim=-1)
        else:
            gs = grouped.amax(dim=-1)
        keep = gs.topk(topk_group, dim=-1).indices
        mask = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, keep, True)
        mask = mask.unsqueeze(-1).expand_as(grouped).reshape(T, E)
        sel = sel.masked_fill(~mask, float("-inf"))
    ids = sel.topk(top_k, dim=-1).indices
    w = score.gather(1, ids)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        w = w * routed_scaling_factor
    return w, ids.to(torch.int32)


def torch_permute_align(topk_ids, num_experts, block_size):
    flat = topk_ids.flatten().long()
    TK = flat.numel()
    E, bs = num_experts, block_size
    valid = (flat >= 0) & (flat < E)
    key = torch.where(valid, flat, torch.full_like(flat, E))
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(E + 1, dtype=torch.long, device=flat.device)
    counts.index_add_(0, key, torch.ones_like(key))
    counts = counts[:E]
    padded = (counts + bs - 1) // bs * bs
    pend = torch.cumsum(padded, 0)
    pstart = pend - padded
    cstart = torch.cumsum(counts, 0) - counts
    sk = key[order]
    ok = sk < E
    e = sk.clamp(max=E - 1)
    pos = pstart[e] + torch.arange(TK, device=flat.device) - cstart[e]
    size = TK + E * (bs - 1)
    sorted_ids = torch.full((size,), TK, dtype=torch.int32, device=flat.device)
    sorted_ids.index_put_((torch.where(ok, pos, torch.full_like(pos, size - 1)),),
                          torch.where(ok, order, torch.full_like(order, TK)).to(torch.int32))
    nb = -(-size // bs)
    starts = torch.arange(nb, device=flat.device) * bs
    expert_ids = torch.searchsorted(pend, starts, right=True).to(torch.int32)
    expert_ids = torch.where(starts < pend[-1], expert_ids, torch.full_like(expert_ids, -1))
    return sorted_ids, expert_ids, pend[-1:].to(torch.int32)


def torch_pre_permute(x, ids, num_local_experts):
    T, K = ids.shape
    E = num_local_experts
    flat = ids.flatten().long()
    valid = (flat >= 0) & (flat < E)
    key = torch.where(valid, flat, torch.full_like(flat, E))
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(E + 1, dtype=torch.long, device=x.device).index_add_(
        0, key, torch.ones_like(key))
    permuted = x[order // K]
    inverse = torch.empty_like(flat)
    inverse[order] = torch.arange(T * K, device=x.device)
    inverse = torch.where(valid, inverse, torch.full_like(inverse, -1)).to(torch.int32)
    return permuted, torch.cumsum(counts[:E], 0).to(torch.int32), inverse


def torch_post_permute(expert_output, w, inverse, out_dtype):
    T, K = w.shape
    inv = inverse.long()
    rows = expert_output[inv.clamp(min=0)].view(T, K, -1).float()
    ww = torch.where(inv.view(T, K) >= 0, w, torch.zeros_like(w))
    return (rows * ww.unsqueeze(-1)).sum(dim=1).to(out_dtype)


def silu_mul(h, n):
    return F.silu(h[..., :n]) * h[..., n:]


class Mlp:
    """A row's MLP activation (docs/python.md names) and optional per-expert biases
    (b13 [E, rows of w13], b2 [E, H]); the default is moekit's silu_and_mul."""

    def __init__(self, activation="silu", b13=None, b2=None):
        self.activation, self.b13, self.b2 = activation, b13, b2

    def width(self, w13):
        """F of w_gate_up [.., rows, H] (relu2 is not gated)."""
        return w13.shape[-2] if self.activation == "relu2" else w13.shape[-2] // 2

    def act(self, h):
        a = self.activation
        if a == "silu":
            return silu_mul(h, h.shape[-1] // 2)
        if a == "relu2":
            return torch.relu(h).square()
        if a == "swigluoai":  # gate and up interleaved
            g, u = h[..., ::2].clamp(max=7.0), h[..., 1::2].clamp(-7.0, 7.0)
            return g * torch.sigmoid(1.702 * g) * (u + 1)
        n = h.shape[-1] // 2
        return F.gelu(h[..., :n], approximate="tanh" if a == "gelu_tanh" else "none") * h[..., n:]


SILU = Mlp()


def grouped_mlp(x, w13, w2, offs, mlp=SILU, row_expert=None):
    h = _grouped_mm(x, w13.transpose(-2, -1), offs=offs)
    if mlp.b13 is not None:
        h = h + mlp.b13[row_expert]
    y = _grouped_mm(mlp.act(h), w2.transpose(-2, -1), offs=offs)
    return y if mlp.b2 is None else y + mlp.b2[row_expert]


def _sorted_routes(ids, E, device):
    """Routes sorted by expert (stable; invalid ids last): the order, each expert's inclusive
    end offset (i32), each sorted route's token, which routes are valid, and each sorted
    route's expert (clamped)."""
    K = ids.shape[1]
    flat = ids.flatten().long()
    valid = (flat >= 0) & (flat < E)
    key = torch.where(valid, flat, torch.full_like(flat, E))
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(E + 1, dtype=torch.long, device=device).index_add_(
        0, key, torch.ones_like(key))
    offs = torch.cumsum(counts[:E], 0).to(torch.int32)
    return order, offs, order // K, valid, key[order].clamp(max=E - 1)


def _combine_routes(y, w, order, tok, valid, T):
    """out[t] = sum of w * y over token t's valid sorted routes (f32). The invalid routes'
    rows are masked, not weighted by 0: torch._grouped_mm leaves rows past the last offset
    unwritten (torch 2.11 returned NaN there), and NaN * 0 is NaN."""
    keep = valid[order].unsqueeze(1)
    ww = torch.where(valid, w.flatten(), torch.zeros_like(w.flatten()))[order]
    out = torch.zeros(T, y.shape[1], dtype=torch.float32, device=y.device)
    out.index_add_(0, tok, torch.where(keep, y.float() * ww.unsqueeze(1), 0.0))
    return out


def grouped_experts(x, w13, w2, w, ids, mlp=SILU):
    """Sort routes by expert, two grouped GEMMs, weighted scatter back (f32)."""
    order, offs, tok, valid, row_expert = _sorted_routes(ids, w13.shape[0], x.device)
    y = grouped_mlp(x[tok], w13, w2, offs, mlp, row_expert)
    return _combine_routes(y, w, order, tok, valid, ids.shape[0])


def loop_experts(x, w13, w2, w, ids, mlp=SILU):
    """Eager per-expert loop (the naive MoE): gather each expert's tokens, MLP, weighted add."""
    T, K = ids.shape
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    flat = ids.flatten().long()
    for e in torch.unique(flat[(flat >= 0) & (flat < w13.shape[0])]).tolist():
        idx = torch.nonzero(flat == e).squeeze(1)
        tok = idx // K
        h = x[tok] @ w13[e].t()
        if mlp.b13 is not None:
            h = h + mlp.b13[e]
        y = mlp.act(h) @ w2[e].t()
        if mlp.b2 is not None:
            y = y + mlp.b2[e]
        out.index_add_(0, tok, y.float() * w.flatten()[idx].unsqueeze(1))
    return out


def fp8_weights(gen, shape, scheme, scale):
    """e4m3 codes ~ N(0, 1) and f32 scales of `scheme` in the checkpoints' layout
    (docs/moe.md "Quantized weights"), uniform in [0.5, 1.5] * scale."""
    E, N, K = shape
    w = gen.randn(shape, torch.float32).to(torch.float8_e4m3fn)
    if scheme == "fp8_per_tensor":
        s = gen.rand((E,), 0.5, 1.5) * scale
    elif scheme == "fp8_per_channel":
        s = gen.rand((E, N), 0.5, 1.5) * scale
    else:
        s = gen.rand((E, -(-N // 128), -(-K // 128)), 0.5, 1.5) * scale
    return w, s


def dequant(w, s, scheme, dt):
    """float(w) * scale(e, n, k), in dt (the weights the op's contract multiplies)."""
    E, N, K = w.shape
    if scheme == "fp8_per_tensor":
        sx = s.view(E, 1, 1)
    elif scheme == "fp8_per_channel":
        sx = s.view(E, N, 1)
    else:
        sx = s.repeat_interleave(128, 1)[:, :N].repeat_interleave(128, 2)[:, :, :K]
    return (w.to(dt) * sx.to(dt)).to(dt)


def _quant_rows(a):
    """Dynamic per-row e4m3 quantization: (q, s) with s = max(amax, 1e-10) / 448."""
    s = a.abs().amax(dim=1).float().clamp(min=1e-10) / 448.0
    q = (a.float() / s.unsqueeze(1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, s


def scaled_grouped_experts(x, w13, w2, s13, s2, w, ids):
    """grouped_experts with FP8 operands: per-token activation scales, per-row weight scales
    (torch._scaled_grouped_mm's row-wise contract: per-channel weights, or per-tensor ones
    broadcast to rows)."""
    F2 = w13.shape[1]
    order, offs, tok, valid, _ = _sorted_routes(ids, w13.shape[0], x.device)
    a, sa = _quant_rows(x[tok])
    h = torch._scaled_grouped_mm(a, w13.transpose(-2, -1), sa, s13, offs=offs,
                                 out_dtype=torch.bfloat16)  # fmt: skip
    a2, sa2 = _quant_rows(silu_mul(h, F2 // 2))
    y = torch._scaled_grouped_mm(a2, w2.transpose(-2, -1), sa2, s2, offs=offs,
                                 out_dtype=torch.bfloat16)  # fmt: skip
    return _combine_routes(y, w, order, tok, valid, ids.shape[0])


def _quant_groups(a):
    """Dynamic e4m3 quantization per row and 128 columns: (q, s [rows, ceil(cols/128)])."""
    m, k = a.shape
    g = -(-k // 128)
    pad = torch.zeros((m, g * 128), dtype=torch.float32, device=a.device)
    pad[:, :k] = a.float()
    s = pad.view(m, g, 128).abs().amax(dim=2).clamp(min=1e-10) / 448.0
    q = (pad.view(m, g, 128) / s.unsqueeze(2)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(m, g * 128)[:, :k].contiguous(), s


def _scaled_mm_rowwise(a, wq, sw):
    """a [m, K] (any float) times e4m3 wq [N, K]^T with row scales sw [N] on cuBLASLt:
    per-token activation scales; rows padded to 16 (the FP8 GEMM's shape rule)."""
    q, sa = _quant_rows(a)
    m = q.shape[0]
    mp = -(-m // 16) * 16
    if mp != m:
        q = torch.cat([q, torch.zeros((mp - m, q.shape[1]), dtype=q.dtype, device=q.device)])
        sa = torch.cat([sa, torch.ones(mp - m, dtype=sa.dtype, device=sa.device)])
    y = torch._scaled_mm(q, wq.t(), scale_a=sa.view(-1, 1), scale_b=sw.view(1, -1),
                         out_dtype=torch.bfloat16)  # fmt: skip
    return y[:m]


# The block-scale layouts torch._scaled_mm's 1x128 x 128x128 mode takes, tried in this order
# (torch versions differ): (a's scales [m, K/128] as given or column-major, b's [N/128, K/128]
# or transposed).
_BLOCK_LAYOUTS = [(False, True), (True, True), (False, False), (True, False)]


def _scaled_mm_blocks(a, wq, sw, layout):
    """a [m, K] times e4m3 wq [N, K]^T with 128x128 weight scales sw [N/128, K/128], the
    activations quantized per token and 128 columns (`layout`: _BLOCK_LAYOUTS' entry)."""
    q, sa = _quant_groups(a)
    m = q.shape[0]
    mp = -(-m // 16) * 16
    if mp != m:
        q = torch.cat([q, torch.zeros((mp - m, q.shape[1]), dtype=q.dtype, device=q.device)])
        sa = torch.cat([sa, torch.ones((mp - m, sa.shape[1]), dtype=sa.dtype, device=sa.device)])
    a_cols, b_t = layout
    sa_ = sa.t().contiguous().t() if a_cols else sa
    sb_ = sw.t().contiguous() if b_t else sw
    y = torch._scaled_mm(q, wq.t(), scale_a=sa_, scale_b=sb_, out_dtype=torch.bfloat16)
    return y[:m]


def scaled_mm_per_expert(x, w13, w2, s13, s2, w, ids, quant, layout=None, mm=None):
    """The FP8 layer as one cuBLASLt FP8 GEMM per active expert and projection
    (torch._scaled_mm): routes sorted by expert, per-expert gate/up, silu_and_mul, down,
    weighted scatter (f32). Scales: per-tensor [E] (broadcast to rows), per-channel [E, N]
    (row-wise), 128x128 blocks [E, N/128, K/128] (`layout`). `mm(a, wq, sw)` replaces the
    GEMM (tests)."""
    E, F2, H = w13.shape
    order, offs, tok, valid, _ = _sorted_routes(ids, E, x.device)
    xs = x[tok]
    y = torch.zeros((xs.shape[0], H), dtype=torch.bfloat16, device=x.device)
    if mm is None:
        if quant == "fp8_block128":
            mm = lambda a, wq, sw: _scaled_mm_blocks(a, wq, sw, layout)  # noqa: E731
        else:
            mm = _scaled_mm_rowwise

    def rows(s, e, n):
        if quant == "fp8_per_tensor":
            return s[e].view(1).expand(n).contiguous()
        return s[e]

    start = 0
    for e, end in enumerate(offs.tolist()):  # the counts on the host: a per-expert loop's sync
        if end > start:
            h = mm(xs[start:end], w13[e], rows(s13, e, F2))
            y[start:end] = mm(silu_mul(h.float(), F2 // 2), w2[e], rows(s2, e, H))
        start = end
    return _combine_routes(y, w, order, tok, valid, ids.shape[0])


def dense_mlp(x, w13, w2, mlp=SILU):
    """The shared expert: the routed activation, no biases (the workloads give none)."""
    return mlp.act(x @ w13.t()) @ w2.t()


# ---------------------------------------------------------------- per-op setup


class Case:
    """Inputs of one row, the implementations to time, and the cost model."""

    def __init__(self):
        self.impls = {}  # name -> fn(inputs) -> output
        self.make_inputs = None  # () -> dict of tensors (one copy)
        self.flops = 0.0
        self.bytes = 0.0
        self.notes = {}
        self.active_experts = None
        self.capturable = {}  # name -> False to skip graph capture


def nbytes(*ts):
    return float(sum(t.numel() * t.element_size() for t in ts if t is not None))


def setup_case(row, gen, mk):
    c = Case()
    op, dt = row.op, DTYPES.get(row.in_dtype)
    S = row.shapes

    if op == "FusedTopKFwd":
        T, E = S["gating_output"]
        p = routing_params(row)
        bias = gen.randn((E,), torch.float32, 0.1) if "correction_bias" in S else None
        logits = gen.randn((T, E), dt)
        c.make_inputs = lambda: {"logits": logits.clone(), "bias": bias}
        c.impls["torch-ref"] = lambda i: torch_topk(i["logits"], correction_bias=i["bias"], **p)
        if mk:
            c.impls["moekit"] = lambda i: mk.fused_topk(i["logits"], correction_bias=i["bias"], **p)
        c.bytes = nbytes(logits, bias) + T * p["top_k"] * 8
        c.dtype_for_peak = "f32"

    elif op == "MoEPermuteAlignFwd":
        T, K = S["topk_ids"]
        E = row.int_param("num_experts", 0)
        bs = row.int_param("block_size", 64)
        _, ids = torch_topk(gen.randn((T, E), torch.float32), K)
        c.make_inputs = lambda: {"ids": ids.clone()}
        c.impls["torch-ref"] = lambda i: torch_permute_align(i["ids"], E, bs)
        if mk:
            c.impls["moekit"] = lambda i: mk.moe_permute_align(i["ids"], E, bs)
        c.bytes = nbytes(ids) * 2 + 4 * E * (bs - 1)

    elif op == "MoEPrePermuteFwd":
        T, H = S["hidden_states"]
        K = S["local_expert_ids"][1]
        E = row.int_param("num_local_experts", 0)
        _, ids = torch_topk(gen.randn((T, E), torch.float32), K)
        x = gen.randn((T, H), dt)
        c.make_inputs = lambda: {"x": x.clone(), "ids": ids.clone()}
        c.impls["torch-ref"] = lambda i: torch_pre_permute(i["x"], i["ids"], E)
        if mk:
            c.impls["moekit"] = lambda i: mk.moe_pre_permute(i["x"], i["ids"], E, 1)
        c.bytes = nbytes(x) * (1 + K) + nbytes(ids) * 2 + 4 * E

    elif op == "MoEPostPermuteFwd":
        P, H = S["expert_output"]
        T, K = S["topk_weights"]
        E = max(8, 4 * K)  # routes spread over a few experts; inverse is a permutation
        w, ids = torch_topk(gen.randn((T, E), torch.float32), K, renormalize=True)
        _, _, inverse = torch_pre_permute(torch.zeros(T, 8, device=DEVICE), ids, E)
        eo = gen.randn((P, H), dt)
        out_dt = DTYPES[row.out_dtype]
        c.make_inputs = lambda: {"eo": eo.clone(), "w": w.clone(), "inv": inverse.clone()}
        c.impls["torch-ref"] = lambda i: torch_post_permute(i["eo"], i["w"], i["inv"], out_dt)
        if mk:
            od = None if out_dt == dt else out_dt
            c.impls["moekit"] = lambda i: mk.moe_post_permute(i["eo"], i["w"], i["inv"], od)
        c.bytes = nbytes(eo, w, inverse) + T * H * torch.empty((), dtype=out_dt).element_size()

    elif op == "MoEGroupedGemmFwd":
        E, Nb, Kd = S["b"]
        kind, lay = row.layout()
        silu = row.params.get("activation") == "silu_and_mul"
        N = Nb // 2 if silu else Nb
        out_dt = DTYPES[row.out_dtype]
        b = gen.randn((E, Nb, Kd), dt, 1 / math.sqrt(Kd))
        if kind == "masked":
            max_m = lay
            total = int(row.params.get("T", E * max_m * 3 // 4))
            counts = [min(max_m, total // E + (1 if e < total % E else 0)) for e in range(E)]
            meta = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
            a = gen.randn((E, max_m, Kd), dt)
            rows = sum(counts)
            c.impls["torch-grouped-mm"] = lambda i: _masked_gemm(i["a"], i["b"], silu, N, out_dt)
            c.notes["torch-grouped-mm"] = "3-d batched: computes all max_m rows of every expert"
        else:
            P = S["a"][0]
            meta = equal_ends(P, E, lay)
            a = gen.randn((P, Kd), dt)
            rows = P
            if out_dt == dt:
                c.impls["torch-grouped-mm"] = lambda i: _contig_gemm(i["a"], i["b"], i["meta"],
                                                                     silu, N)  # fmt: skip
            else:
                c.notes["torch-grouped-mm"] = "no f32 output in torch's grouped mm: not timed"
        c.make_inputs = lambda: {"a": a.clone(), "b": b, "meta": meta.clone()}
        if mk:
            od = None if out_dt == dt else out_dt
            act = "silu_and_mul" if silu else "none"
            masked = kind == "masked"
            align = 1 if masked else lay
            c.impls["moekit"] = lambda i: mk.moe_grouped_gemm(i["a"], i["b"], i["meta"], masked,
                                                              align, act, od)  # fmt: skip
        c.flops = 2.0 * rows * Nb * Kd
        c.bytes = nbytes(b) + rows * Kd * a.element_size() + rows * N * 2
        c.active_experts = E

    elif op == "MoEGroupedGemmFP8Fwd" and len(S["a"]) == 2:
        _fp8_contiguous_case(c, row, S, gen)

    elif op == "MoEGroupedGemmFP8Fwd":
        E, max_m, Kd = S["a"]
        N = S["b"][1]
        fp8 = torch.float8_e4m3fn
        total = int(row.params.get("T", E * max_m * 3 // 4))
        counts = [min(max_m, total // E + (1 if e < total % E else 0)) for e in range(E)]
        meta = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
        a = gen.randn((E, max_m, Kd), torch.float32).to(fp8)
        b = gen.randn((E, N, Kd), torch.float32).to(fp8)
        a_scale = gen.rand(tuple(S["a_scale"]), 0.5, 1.5)
        b_scale = gen.rand(tuple(S["b_scale"]), 0.5, 1.5) / math.sqrt(Kd)
        c.make_inputs = lambda: {"a": a.clone(), "b": b, "as": a_scale, "bs": b_scale,
                                 "meta": meta.clone()}  # fmt: skip
        name, fn, note = _fp8_alternative(a, b, a_scale, b_scale)
        if fn is not None:
            c.impls[name] = fn
        c.notes.update(note)
        if mk:
            c.impls["moekit"] = lambda i: mk.moe_grouped_gemm_fp8(i["a"], i["as"], i["b"],
                                                                  i["bs"], i["meta"])  # fmt: skip
        c.flops = 2.0 * sum(counts) * N * Kd
        c.bytes = nbytes(b, b_scale) + sum(counts) * (Kd + N * 2)
        c.dtype_for_peak = "fp8e4m3"
        c.active_experts = sum(1 for n in counts if n)

    elif op == "MoEExpertMLPFwd":
        P, H = S["expert_input"]
        E, F2, _ = S["w_gate_up"]
        x = gen.randn((P, H), dt)
        w13 = gen.randn((E, F2, H), dt, 1 / math.sqrt(H))
        w2 = gen.randn((E, H, F2 // 2), dt, 1 / math.sqrt(F2 // 2))
        meta = equal_ends(P, E)
        c.make_inputs = lambda: {"x": x.clone(), "w13": w13, "w2": w2, "meta": meta.clone()}
        c.impls["torch-grouped-mm"] = lambda i: grouped_mlp(i["x"], i["w13"], i["w2"], i["meta"])
        if mk:
            c.impls["moekit"] = lambda i: mk.moe_expert_mlp(i["x"], i["meta"], i["w13"], i["w2"])
        c.flops = 2.0 * P * (F2 * H + H * F2 // 2)
        c.bytes = nbytes(w13, w2) + 2 * nbytes(x)
        c.active_experts = E

    elif op in ("FusedMoEExpertsFwd", "IndexedExpertMLPFwd", "FusedMoEFwd",
                "FusedMoESharedExpertFwd"):  # fmt: skip
        T, H = S["hidden_states"]
        E, F2, _ = S["w_gate_up"]
        x = gen.randn((T, H), dt)
        quant = row.params.get("weight_quant", "none")
        if quant != "none":
            # FP8 rows (bench/workloads/fp8.json): the live alternatives are "dequantize, then
            # the bf16 grouped path" (the dequantization timed too) and, for row-wise scales,
            # torch._scaled_grouped_mm with per-token activation scales.
            q13, s13 = fp8_weights(gen, (E, F2, H), quant, 1 / math.sqrt(H))
            q2, s2 = fp8_weights(gen, (E, H, F2 // 2), quant, 1 / math.sqrt(F2 // 2))
            p = routing_params(row)
            K = p["top_k"]
            logits = gen.randn((T, E), torch.float32)
            bias = gen.randn((E,), torch.float32, 0.1) if "correction_bias" in S else None
            c.make_inputs = lambda: {"x": x.clone(), "logits": logits.clone()}

            def dequantized(i):
                w_, ids_ = torch_topk(i["logits"], correction_bias=bias, **p)
                return grouped_experts(i["x"], dequant(q13, s13, quant, dt),
                                       dequant(q2, s2, quant, dt), w_, ids_).to(dt)  # fmt: skip

            c.impls["torch-dequant-grouped-mm"] = dequantized
            if quant in ("fp8_per_channel", "fp8_per_tensor"):
                r13 = s13 if quant == "fp8_per_channel" else s13.view(E, 1).expand(E, F2)
                r2 = s2 if quant == "fp8_per_channel" else s2.view(E, 1).expand(E, H)
                r13, r2 = r13.contiguous(), r2.contiguous()

                def rowwise(i):
                    w_, ids_ = torch_topk(i["logits"], correction_bias=bias, **p)
                    return scaled_grouped_experts(i["x"], q13, q2, r13, r2, w_, ids_).to(dt)

                try:
                    rowwise(c.make_inputs())
                    _sync()
                    c.impls["torch-scaled-grouped-mm-rowwise"] = rowwise
                    c.notes["torch-scaled-grouped-mm-rowwise"] = (
                        "activations quantized per token (FP8 GEMMs), weights row-wise")
                except Exception as e:  # not supported by this torch / device
                    c.notes["torch-scaled-grouped-mm-rowwise"] = f"unavailable: {_short(e)}"
            def per_expert(i, layout=None):
                w_, ids_ = torch_topk(i["logits"], correction_bias=bias, **p)
                return scaled_mm_per_expert(i["x"], q13, q2, s13, s2, w_, ids_, quant,
                                            layout).to(dt)  # fmt: skip

            name = "torch-scaled-mm-per-expert"
            layouts = _BLOCK_LAYOUTS if quant == "fp8_block128" else [None]
            want, why = None, "unavailable"
            for layout in layouts:
                try:
                    inp = c.make_inputs()
                    got = per_expert(inp, layout)
                    _sync()
                    if want is None:
                        want = dequantized(inp).float()
                    err = float((got.float() - want).norm() / want.norm().clamp(min=1e-30))
                    if err <= 0.1:  # FP8 activations: a few % from the dequantized bf16 path
                        c.impls[name] = lambda i, layout=layout: per_expert(i, layout)
                        c.notes[name] = ("cuBLASLt FP8 per active expert (torch._scaled_mm), "
                                         "activations quantized as the scheme implies")  # fmt: skip
                        break
                    why = f"unavailable: scale layout {layout} gives rel_l2 {err:.2g}"
                except Exception as e:  # not supported by this torch / device / layout
                    why = f"unavailable: {_short(e)}"
            if name not in c.impls:
                c.notes[name] = why
            if mk:
                q = dict(weight_quant=quant, w_gate_up_scale=s13, w_down_scale=s2)
                c.impls["moekit"] = lambda i: mk.fused_moe(i["x"], i["logits"], q13, q2,
                                                           correction_bias=bias, **p, **q)  # fmt: skip
            route_ids = torch_topk(logits, correction_bias=bias, **p)[1]
            flat = route_ids.flatten()
            active = int(torch.unique(flat[(flat >= 0) & (flat < E)]).numel())
            c.active_experts = active
            c.flops = 2.0 * T * K * (F2 * H + H * F2 // 2)
            c.bytes = active * (nbytes(q13, s13) + nbytes(q2, s2)) / E + 2 * nbytes(x)
            c.dtype_for_peak = "fp8e4m3"
            return c
        w13 = gen.randn((E, F2, H), dt, 1 / math.sqrt(H))
        # The row's activation and biases (moekit-bench's conventions: biases ~ N(0, 0.5^2)).
        mlp = Mlp(row.params.get("activation", "silu"))
        Fw = mlp.width(w13)
        w2 = gen.randn((E, H, Fw), dt, 1 / math.sqrt(Fw))
        if "gate_up_bias" in S:
            mlp.b13 = gen.randn((E, F2), dt, 0.5)
        if "down_bias" in S:
            mlp.b2 = gen.randn((E, H), dt, 0.5)
        act_kw = {} if mlp.activation == "silu" and mlp.b13 is None and mlp.b2 is None else {
            "activation": mlp.activation, "gate_up_bias": mlp.b13, "down_bias": mlp.b2}
        shared = None
        # A FusedMoESharedExpertFwd row without shared weights (the page's
        # qwen3-235b-t512) is the routed layer alone, as moekit's op computes it.
        if op == "FusedMoESharedExpertFwd" and "shared_w_gate_up" in S:
            S2, _ = S["shared_w_gate_up"]
            shared = (gen.randn((S2, H), dt, 1 / math.sqrt(H)),
                      gen.randn((H, S2 // 2), dt, 1 / math.sqrt(S2 // 2)))  # fmt: skip
        if op in ("FusedMoEExpertsFwd", "IndexedExpertMLPFwd"):
            K = S["topk_ids"][1]
            w, ids = torch_topk(gen.randn((T, E), torch.float32), K, renormalize=True)
            c.make_inputs = lambda: {"x": x.clone(), "w": w.clone(), "ids": ids.clone()}
            c.impls["torch-grouped-mm"] = lambda i: grouped_experts(
                i["x"], w13, w2, i["w"], i["ids"], mlp).to(dt)
            c.impls["torch-ref"] = lambda i: loop_experts(i["x"], w13, w2, i["w"], i["ids"],
                                                          mlp).to(dt)  # fmt: skip
            if mk:
                fn = getattr(mk, "fused_moe_experts" if op == "FusedMoEExpertsFwd"
                             else "indexed_expert_mlp")  # fmt: skip
                c.impls["moekit"] = lambda i: fn(i["x"], w13, w2, i["w"], i["ids"], **act_kw)
            route_ids = ids
        else:
            p = routing_params(row)
            K = p["top_k"]
            logits = gen.randn((T, E), torch.float32)
            bias = gen.randn((E,), torch.float32, 0.1) if "correction_bias" in S else None
            c.make_inputs = lambda: {"x": x.clone(), "logits": logits.clone()}

            def composed(i, experts):
                w_, ids_ = torch_topk(i["logits"], correction_bias=bias, **p)
                out = experts(i["x"], w13, w2, w_, ids_, mlp)
                if shared is not None:
                    out = out + dense_mlp(i["x"], *shared, Mlp(mlp.activation)).float()
                return out.to(dt)

            c.impls["torch-grouped-mm"] = lambda i: composed(i, grouped_experts)
            c.impls["torch-ref"] = lambda i: composed(i, loop_experts)
            if mk:
                if op == "FusedMoEFwd":
                    c.impls["moekit"] = lambda i: mk.fused_moe(i["x"], i["logits"], w13, w2,
                                                               correction_bias=bias, **p,
                                                               **act_kw)  # fmt: skip
                else:
                    s13, s2 = shared if shared is not None else (None, None)
                    c.impls["moekit"] = lambda i: mk.fused_moe_shared_expert(
                        i["x"], i["logits"], w13, w2, s13, s2, correction_bias=bias, **p,
                        **act_kw)  # fmt: skip
                    if shared is None:
                        c.notes["moekit"] = "no shared expert in this row: the routed layer alone"
            route_ids = torch_topk(logits, correction_bias=bias, **p)[1]
        c.capturable["torch-ref"] = False  # data-dependent loop (host syncs)
        flat = route_ids.flatten()
        active = int(torch.unique(flat[(flat >= 0) & (flat < E)]).numel())
        c.active_experts = active
        routes = T * K
        c.flops = 2.0 * routes * (F2 * H + H * Fw)
        per_expert = (F2 * H + H * Fw) * x.element_size()
        c.bytes = active * per_expert + 2 * nbytes(x) + nbytes(route_ids) * 2
        if shared is not None:
            c.flops += 2.0 * T * 1.5 * shared[0].shape[0] * H
            c.bytes += nbytes(*shared)

    elif op == "SharedExpertMLPFwd":
        T, H = S["hidden_states"]
        S2, _ = S["w_gate_up"]
        x = gen.randn((T, H), dt)
        w13 = gen.randn((S2, H), dt, 1 / math.sqrt(H))
        w2 = gen.randn((H, S2 // 2), dt, 1 / math.sqrt(S2 // 2))
        c.make_inputs = lambda: {"x": x.clone()}
        c.impls["torch-cublas"] = lambda i: dense_mlp(i["x"], w13, w2)
        if mk:
            c.impls["moekit"] = lambda i: mk.shared_expert_mlp(i["x"], w13, w2)
        c.flops = 2.0 * T * (S2 * H + H * S2 // 2)
        c.bytes = nbytes(w13, w2) + 2 * nbytes(x)
    else:
        raise ValueError(f"unknown op {op}")
    return c


def _contig_gemm(a, b, meta, silu, n):
    c = _grouped_mm(a, b.transpose(-2, -1), offs=meta)
    return silu_mul(c, n) if silu else c


def _masked_gemm(a, b, silu, n, out_dt):
    c = _grouped_mm(a, b.transpose(-2, -1))
    return (silu_mul(c, n) if silu else c).to(out_dt)


def _fp8_contiguous_case(c, row, S, gen):
    """MoEGroupedGemmFP8Fwd on contiguous rows (a [P, Kd]; params.scales, params.activation:
    bench/workloads/fp8_grouped_gemm_contiguous.json). The alternative is
    torch._scaled_grouped_mm over the experts' row ranges with row-wise scales: per-token
    a scales and per-channel b scales, the op's kPerChannel contract (per-tensor scales are
    its special case; block scales are not its contract, said in the note). moekit's
    Python binding runs the masked layout only: moekit-bench times ours."""
    P, Kd = S["a"]
    E, Nb, _ = S["b"]
    _, align = row.layout()
    silu = row.params.get("activation") == "silu_and_mul"
    N = Nb // 2 if silu else Nb
    scales = row.params.get("scales", "block")
    fp8 = torch.float8_e4m3fn
    meta = equal_ends(P, E, align)
    a = gen.randn((P, Kd), torch.float32).to(fp8)
    b = gen.randn((E, Nb, Kd), torch.float32).to(fp8)
    sa = gen.rand((P,), 0.5, 1.5)
    sb = gen.rand((E, Nb), 0.5, 1.5) / math.sqrt(Kd)
    c.make_inputs = lambda: {"a": a.clone(), "b": b, "meta": meta.clone()}

    def rowwise(i):
        out = torch._scaled_grouped_mm(i["a"], i["b"].transpose(-2, -1), sa, sb, offs=i["meta"],
                                       out_dtype=torch.bfloat16)  # fmt: skip
        return silu_mul(out, N) if silu else out

    name = "torch-scaled-grouped-mm"
    try:
        rowwise(c.make_inputs())
        _sync()
        c.impls[name] = rowwise
        note = "row-wise scales over the experts' row ranges"
        if scales == "block":
            note += " (not the op's 128-block contract)"
        if align > 1:
            note += "; alignment padding rows computed with the next expert"
        c.notes[name] = note
    except Exception as e:  # not supported by this torch / device
        c.notes[name] = f"unavailable: {_short(e)}"
    c.flops = 2.0 * P * Nb * Kd
    c.bytes = nbytes(b) + P * (Kd + N * 2)
    c.dtype_for_peak = "fp8e4m3"
    c.active_experts = E


def _fp8_alternative(a, b, a_scale, b_scale):
    """F.scaled_grouped_mm with the op's block scales when this torch can, else
    torch._scaled_grouped_mm with per-row scales (a different, cheaper contract)."""
    notes = {}
    sg = getattr(F, "scaled_grouped_mm", None)
    if sg is not None:
        try:
            ST = F.ScalingType

            def blockwise(i):
                return sg(i["a"], i["b"].transpose(-2, -1), i["as"], ST.BlockWise1x128,
                          i["bs"], ST.BlockWise128x128, output_dtype=torch.bfloat16)  # fmt: skip

            blockwise({"a": a, "b": b, "as": a_scale, "bs": b_scale})
            _sync()
            return "torch-grouped-mm", blockwise, notes
        except Exception as e:  # not supported by this torch / device
            notes["torch-grouped-mm"] = f"block-scaled grouped mm unavailable: {_short(e)}"
    sa = a_scale[:, :, 0].contiguous()
    sb = b_scale[:, :, 0].repeat_interleave(128, dim=1)[:, : b.shape[1]].contiguous()
    try:

        def rowwise(i):
            return torch._scaled_grouped_mm(i["a"], i["b"].transpose(-2, -1), sa, sb,
                                            out_dtype=torch.bfloat16)  # fmt: skip

        rowwise({"a": a, "b": b})
        _sync()
        notes["torch-grouped-mm-rowwise"] = "per-row scales, all max_m rows (not the op's contract)"
        return "torch-grouped-mm-rowwise", rowwise, notes
    except Exception as e:
        notes["torch-grouped-mm-rowwise"] = f"unavailable: {_short(e)}"
        return None, None, notes


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _short(e):
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:160]


# ---------------------------------------------------------------- timing


MAX_SAMPLES = 100  # moekit-bench's sampling plan (bench/src/device.h, device.cu)


def n_samples(sample_ms, max_ms, min_calls):
    """Samples per implementation and round, as moekit-bench plans them: as many as fit
    in max_ms of device time, at least 3 and at most MAX_SAMPLES, and at least
    min_calls whenever min_calls samples fit in max_ms (BENCH.md: "at least 30 timed
    calls or 200 ms")."""
    n = int(min(max(max_ms / max(sample_ms, 1e-4), 3), MAX_SAMPLES))
    if sample_ms * min_calls <= max_ms:
        n = max(n, min_calls)
    return n


class Timer:
    def __init__(self, max_ms, min_calls=30, wall_cap_s=20.0):
        self.max_ms, self.min_calls, self.wall_cap_s = max_ms, min_calls, wall_cap_s
        self.flush_buf = torch.empty(2 * L2_BYTES // 4 * 2, dtype=torch.float32, device="cuda")
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def _timed(self, run):
        self.start.record()
        run()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end)

    def once(self, fn, inputs, flush):
        """One timed call (the estimate that sizes the sample count)."""
        if flush:
            self.flush_buf.zero_()
        return self._timed(lambda: fn(inputs))

    def eager(self, fn, copies, flush, est_ms):
        """Median per-call device time (ms) of eager calls, each between two events,
        L2 flushed before each (outside the timed region) when `flush`."""
        n = n_samples(est_ms, self.max_ms, self.min_calls)
        times, wall0 = [], time.perf_counter()
        for k in range(n):
            if flush:
                self.flush_buf.zero_()
            inputs = copies[k % len(copies)]
            times.append(self._timed(lambda: fn(inputs)))
            if time.perf_counter() - wall0 > self.wall_cap_s and len(times) >= 3:
                break  # a very slow alternative (host-bound): enough samples
        return statistics.median(times)

    def capture(self, fn, copies, per_graph):
        """A CUDA graph of `per_graph` back-to-back calls over the rotating copies, and
        the device time of one replay."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in range(3):
                fn(copies[i % len(copies)])
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(per_graph):
                fn(copies[i % len(copies)])
        g.replay()
        torch.cuda.synchronize()
        return g, self._timed(g.replay)

    def graph(self, g, per_graph, est_ms):
        """Median per-call time of replays of a graph of `per_graph` calls."""
        n = n_samples(est_ms, self.max_ms, self.min_calls)
        return statistics.median(self._timed(g.replay) / per_graph for _ in range(n))


def measure_row(row, case, timer, rounds):
    ideal_s = max(case.flops / PEAK_FLOPS.get(getattr(case, "dtype_for_peak", row.in_dtype), 760e12),
                  case.bytes / PEAK_BW)  # fmt: skip
    working_set = case.bytes
    use_graph = ideal_s < 20e-6
    n_copies = 1
    if use_graph:
        n_copies = max(1, min(16, math.ceil(2 * L2_BYTES / max(working_set, 1))))
    copies = [case.make_inputs() for _ in range(n_copies)]
    flush = (not use_graph) and working_set < 2 * L2_BYTES
    mode = f"graph x{{n}} rot {n_copies}" if use_graph else ("flush" if flush else "plain")

    # Warm up every implementation (and drop the ones that fail); one timed call after
    # the warm-up sizes the sample count (as in moekit-bench).
    errors, est = {}, {}
    for name, fn in list(case.impls.items()):
        try:
            fn(copies[0])
            torch.cuda.synchronize()
            est[name] = timer.once(fn, copies[0], flush)
        except Exception as e:
            errors[name] = _short(e)
            del case.impls[name]
            torch.cuda.synchronize()

    # Graph-timed implementations: captured once per row, replayed in every round.
    graphs, modes = {}, {}
    if use_graph:
        for name, fn in case.impls.items():
            if not case.capturable.get(name, True):
                continue
            # Enough calls that one replay runs ~0.5 ms of device time.
            per_graph = int(min(512, max(16, 0.5e-3 / max(ideal_s, 1e-6))))
            try:
                g, replay_ms = timer.capture(fn, copies, per_graph)
                graphs[name] = (g, per_graph, replay_ms)
                modes[name] = mode.format(n=per_graph)
            except Exception as e:  # not capturable: time it eagerly
                case.notes.setdefault(name, f"eager (capture failed: {_short(e)})")
                torch.cuda.synchronize()

    results = {name: [] for name in case.impls}
    for _ in range(rounds):
        for name, fn in case.impls.items():  # interleaved: A B C A B C ...
            if name in errors:
                continue
            try:
                if name in graphs:
                    g, per_graph, replay_ms = graphs[name]
                    ms = timer.graph(g, per_graph, replay_ms)
                else:
                    ms = timer.eager(fn, copies, flush, est[name])
                    modes[name] = mode if not use_graph else "eager"
                results[name].append(ms)
            except Exception as e:
                errors[name] = _short(e)
                torch.cuda.synchronize()
    graphs.clear()
    final = {n: statistics.median(v) for n, v in results.items() if v and n not in errors}
    return final, errors, modes, ideal_s


def check_against(case, a, b):
    """rel_l2 between two implementations' outputs on the same inputs (None if n/a)."""
    try:
        inp = case.make_inputs()
        x, y = case.impls[a](inp), case.impls[b](inp)
        if isinstance(x, tuple):
            x, y = x[0], y[0]
        if x.shape != y.shape or not x.dtype.is_floating_point:
            return None
        x, y = x.double(), y.double()
        if x.dim() == 3 or x.shape[0] != y.shape[0]:
            return None
        return float((x - y).norm() / y.norm().clamp(min=1e-30))
    except Exception:
        return None


# ---------------------------------------------------------------- main


def smoke(rows, args, mk):
    """Runs every implementation once per row and prints what came out; non-zero when
    one fails. Used by the tests (on the CPU, small workloads) and as a quick check."""
    failures = 0
    for row in rows:
        try:
            case = setup_case(row, Gen(row_seed(args.seed, row)), mk)
            inputs = case.make_inputs()
            shapes = {}
            for name, fn in case.impls.items():
                out = fn(inputs)
                out = out[0] if isinstance(out, tuple) else out
                shapes[name] = tuple(out.shape)
            names = [n for n in case.impls if n != "moekit"]
            ref_name = "moekit" if "moekit" in case.impls else (names[0] if names else None)
            checks = {n: check_against(case, n, ref_name) for n in case.impls if n != ref_name}
            print(f"{row.key():<58} {shapes} rel_l2 vs {ref_name}: {checks}", flush=True)
        except Exception as e:
            failures += 1
            print(f"{row.key():<58} FAILED: {_short(e)}", flush=True)
            traceback.print_exc(file=sys.stderr)
    return 1 if failures else 0




def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=None,
                    help="workload file (default: bench/workloads/seed1.json)")  # fmt: skip
    ap.add_argument("--out", default=None, help="JSON output (default: build/torch-alternatives.json)")
    ap.add_argument("--op", default="", help="comma-separated substrings of op names")
    ap.add_argument("--workload", default="", help="comma-separated substrings of workload names")
    ap.add_argument("--dtype", default="", help="comma-separated substrings of dtypes")
    ap.add_argument("--quick", action="store_true", help="moekit-bench's --quick subset")
    ap.add_argument("--limit", type=int, default=0, help="at most this many rows")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-ms", type=float, default=200.0,
                    help="device time per implementation per round")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokens", default=None,
                    help="each row at these token counts (e.g. 1-16,24,32), named name@T=N as "
                         "moekit-bench --tokens names them; the layer and routing ops only")
    ap.add_argument("--no-moekit", action="store_true", help="time the torch alternatives only")
    ap.add_argument("--list", action="store_true", help="print the selected rows and exit")
    ap.add_argument("--smoke", action="store_true",
                    help="run every implementation once per row, no timing")  # fmt: skip
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a --smoke run of the setup code (small workload files only)")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device

    root = os.path.dirname(HERE)
    wl = args.workloads or os.path.join(HERE, "workloads", "seed1.json")
    if not os.path.exists(wl):
        wl = os.path.join(root, "..", "shared", "workloads", "seed1.json")
    rows = load_rows(wl, args)
    if args.list:
        for r in rows:
            print(r.key())
        return 0
    if DEVICE == "cpu":
        return smoke(rows, args, None)
    if not torch.cuda.is_available():
        print("torch_alternatives: no CUDA GPU visible to PyTorch", file=sys.stderr)
        return 2
    mk = None
    if not args.no_moekit:
        try:
            import moekit

            mk = moekit if moekit.HAS_TORCH else None
        except ImportError as e:
            print(f"torch_alternatives: moekit not importable ({e}); timing torch only",
                  file=sys.stderr)  # fmt: skip
    if args.smoke:
        return smoke(rows, args, mk)
    out_path = args.out or os.path.join(root, "build", "torch-alternatives.json")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)

    torch.backends.cuda.matmul.allow_tf32 = False
    timer = Timer(args.max_ms)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; {len(rows)} rows; "
          f"{args.rounds} rounds; workloads {wl}", flush=True)  # fmt: skip
    print(f"{'op':<24} {'workload':<26} {'dtype':<10} {'moekit-py':>10}  alternatives (ms)")
    records = []
    run_t0 = time.perf_counter()
    for row in rows:
        row_t0 = time.perf_counter()
        rec = {"op": row.op, "workload": row.name, "dtype": row.dtype, "alternatives": {}}
        try:
            case = setup_case(row, Gen(row_seed(args.seed, row)), mk)
            times, errors, modes, ideal = measure_row(row, case, timer, args.rounds)
            if "moekit" in case.impls:
                alt = next((n for n in case.impls if n != "moekit"), None)
                if alt:
                    rec["moekit_vs_" + alt + "_rel_l2"] = check_against(case, "moekit", alt)
            rec["moekit_py_ms"] = times.pop("moekit", None)
            rec["alternatives"] = times
            rec["timing"] = modes
            rec["ideal_us"] = round(ideal * 1e6, 2)
            if case.active_experts is not None:
                rec["active_experts"] = case.active_experts
            if case.notes:
                rec["notes"] = case.notes
            if errors:
                rec["errors"] = errors
        except Exception as e:  # keep going: one broken row must not lose the others
            rec["errors"] = {"setup": _short(e)}
            traceback.print_exc(file=sys.stderr)
        finally:
            case = None
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        rec["wall_s"] = round(time.perf_counter() - row_t0, 2)
        records.append(rec)
        mp = rec.get("moekit_py_ms")
        alts = ", ".join(f"{k} {v:.4f}" for k, v in rec["alternatives"].items())
        errs = f"  [errors: {rec['errors']}]" if rec.get("errors") else ""
        print(f"{row.op:<24} {row.name:<26} {row.dtype:<10} "
              f"{(f'{mp:.4f}' if mp else '-'):>10}  {alts}{errs}  [{rec['wall_s']:.1f} s]",
              flush=True)  # fmt: skip
        with open(out_path, "w") as f:  # rewritten per row: a partial run still counts
            json.dump(records, f, indent=1)
    print(f"# wrote {out_path} ({len(records)} rows in {time.perf_counter() - run_t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
