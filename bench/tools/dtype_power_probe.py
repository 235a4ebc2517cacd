#!/usr/bin/env python3
"""Sustained cuBLAS GEMM rate per input dtype and data pattern, interleaved (H200 probe).

Why: moekit's f16 compute-bound rows run 4-6% slower than its bf16 rows under the 700 W
power cap, where the seed page's f16 and bf16 rows are level. If cuBLAS shows the same gap
on the same GPU, the gap is the data's energy (f16's 10 mantissa bits toggle more of the
multipliers than bf16's 7), not moekit's f16 kernels. Variants per shape, each timed for
--secs seconds of back-to-back GEMMs (the rate of the last half is printed), interleaved
over --rounds rounds:
  bf16           N(0,1) activations, N(0, 1/k) weights (the bench's inputs)
  f16            the same values in f16
  f16-bf16vals   the bf16 values cast to f16 (f16 with bf16's 7 mantissa bits)
  bf16-zeros     all zeros (nothing toggles)
  fp8-tensor     the bf16 values in e4m3 with one scale a tensor (torch._scaled_mm), bf16 out
  fp8-row        the same with one scale a row of a and a row of b (the FP8 layers' ceiling:
                 issue 31's SOL takes FP8 FLOPs at a short run's rate)
Also prints the mean SM clock and power over each variant when pynvml is present.

    python3 bench/tools/dtype_power_probe.py [--secs 2] [--rounds 2] [--variants fp8-tensor,fp8-row]
"""
import argparse
import time

import torch

try:
    import pynvml

    pynvml.nvmlInit()
    _nvml = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
except Exception:  # noqa: BLE001 - optional
    _nvml = None


def sample():
    if _nvml is None:
        return None
    clock = pynvml.nvmlDeviceGetClockInfo(_nvml, pynvml.NVML_CLOCK_SM)
    power = pynvml.nvmlDeviceGetPowerUsage(_nvml) / 1000.0
    return clock, power


def fp8_rows(x, per_row):
    """e4m3 values and fp32 scales (one a row, or one a tensor) of a bf16 matrix."""
    amax = x.abs().amax(dim=1, keepdim=True) if per_row else x.abs().amax().reshape(1, 1)
    scale = (amax.float() / 448.0).clamp(min=1e-12)
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def make(variant, m, n, k):
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(m, k, device="cuda", generator=g)
    b = torch.randn(n, k, device="cuda", generator=g) / k**0.5
    if variant == "bf16":
        return a.bfloat16(), b.bfloat16()
    if variant == "f16":
        return a.half(), b.half()
    if variant == "f16-bf16vals":
        return a.bfloat16().half(), b.bfloat16().half()
    if variant.startswith("fp8-"):
        per_row = variant == "fp8-row"
        qa, sa = fp8_rows(a.bfloat16(), per_row)
        qb, sb = fp8_rows(b.bfloat16(), per_row)
        return qa, qb, sa, sb.t()
    if variant == "bf16-zeros":
        return torch.zeros_like(a, dtype=torch.bfloat16), torch.zeros_like(b, dtype=torch.bfloat16)
    raise ValueError(variant)


def gemm_of(variant, m, n, k):
    """One GEMM call of the variant on its inputs."""
    ops = make(variant, m, n, k)
    if len(ops) == 4:
        qa, qb, sa, sb = ops
        return lambda: torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    a, b = ops
    return lambda: a @ b.t()


def run(variant, m, n, k, secs):
    gemm = gemm_of(variant, m, n, k)
    for _ in range(3):
        gemm()
    torch.cuda.synchronize()
    flops = 2.0 * m * n * k
    t0 = time.time()
    half = []  # per-10-GEMM times in the run's second half
    samples = []
    while True:
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev0.record()
        for _ in range(10):
            gemm()
        ev1.record()
        ev1.synchronize()
        now = time.time() - t0
        if now >= secs / 2:
            s = sample()
            if s:
                samples.append(s)
            ms = ev0.elapsed_time(ev1) / 10
            half.append(ms)
        if now >= secs:
            break
    ms = sorted(half)[len(half) // 2]
    clock = sum(s[0] for s in samples) / len(samples) if samples else float("nan")
    power = sum(s[1] for s in samples) / len(samples) if samples else float("nan")
    return ms, flops / ms / 1e9, clock, power


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="bf16,f16,f16-bf16vals,bf16-zeros")
    args = ap.parse_args()
    shapes = [(8192, 8192, 8192), (4096, 4096, 7168), (32768, 3072, 4096)]
    variants = args.variants.split(",")
    print(f"{'shape':>18} {'variant':>13} {'round':>5} {'ms':>8} {'TFLOP/s':>8} {'SM MHz':>7} {'W':>6}")
    for m, n, k in shapes:
        for r in range(args.rounds):
            for v in variants:
                ms, tf, clock, power = run(v, m, n, k, args.secs)
                print(f"{f'{m}x{n}x{k}':>18} {v:>13} {r:>5} {ms:8.4f} {tf:8.1f} {clock:7.0f} {power:6.0f}")


if __name__ == "__main__":
    main()
