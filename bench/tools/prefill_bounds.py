#!/usr/bin/env python3
"""Upper bounds on the SOL column of prefill layer rows (issues 31 and 32).

The bench's SOL column is ideal / measured, ideal = max(FLOPs / F, bytes / B) with F the
short-run rate (bf16 ~800 TFLOP/s, FP8 ~1465). Under the H200's power cap a GEMM sustains less
(the bf16 power probe: ~670 TFLOP/s), and a layer with a shared expert runs two parts of
opposite kind:
the routed experts stream their weights (bytes), the shared expert's dense GEMMs compute.
For each row this prints what the SOL column could at most read if every kernel ran at 100%
of the measured read bandwidth and of the sustained bf16 rate, the passes around the GEMMs
(routing, sort, gather, combine) took no time, and either
  - overlap: the whole layer's bytes and FLOPs overlapped perfectly (max of the two), or
  - serial: the routed part and the shared expert each overlapped within itself, one after
    the other (the plan moekit runs: the shared MLP's GEMMs, then the routed chain).
75% of the ideal time is out of reach on a row whose bound is under 0.75.

usage: prefill_bounds.py RESULTS.json [...] [--sustained-tflops 670] [--fp8-tflops R]
FP8-weight rows (fp8.json's) take --fp8-tflops, by default the run's short-run FP8 ceiling (the
sustained rate is lower: bench/tools/dtype_power_probe.py --variants fp8-tensor measures it).
Shapes come from the records' workloads (bench/workloads/*.json and the seed page's file).
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKLOAD_FILES = [
    os.path.join(ROOT, "..", "shared", "workloads", "seed1.json"),
    os.path.join(ROOT, "bench", "workloads", "seed1.json"),
    os.path.join(ROOT, "bench", "workloads", "prefill.json"),
    os.path.join(ROOT, "bench", "workloads", "fp8.json"),
]
LAYER_OPS = ("FusedMoEFwd", "FusedMoEExpertsFwd", "FusedMoESharedExpertFwd")


def load_shapes():
    shapes = {}
    for path in WORKLOAD_FILES:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            doc = json.load(f)
        for op in doc.get("ops", []):
            if op["op"] not in LAYER_OPS:
                continue
            for w in op["workloads"]:
                t = {k: [int(x) for x in v["shape"]] for k, v in w["tensors"].items()}
                E, F2, H = t["w_gate_up"]
                shapes[(op["op"], w["name"])] = {
                    "T": t["hidden_states"][0],
                    "E": E,
                    "F": F2 // 2,
                    "H": H,
                    "K": int(w.get("params", {}).get("top_k", 0)) or t["topk_ids"][1],
                    "S": t["shared_w_gate_up"][0] // 2 if "shared_w_gate_up" in t else 0,
                }
    return shapes


def bounds(rec, s, bw, flops_rate, weight_bytes):
    """(overlap, serial) lower bounds on the row's time in ms."""
    T, F, H, S = s["T"], s["F"], s["H"], s["S"]
    shared_flops = 6.0 * T * S * H
    shared_bytes = 3.0 * S * H * weight_bytes
    routed_flops = rec["flops"] - shared_flops
    routed_bytes = rec["bytes"] - shared_bytes
    ms = lambda b, f: 1e3 * max(b / bw, f / flops_rate)
    overlap = ms(rec["bytes"], rec["flops"])
    serial = ms(routed_bytes, routed_flops) + (ms(shared_bytes, shared_flops) if S else 0.0)
    return overlap, serial


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--sustained-tflops", type=float, default=670.0, help="bf16")
    ap.add_argument("--fp8-tflops", type=float, default=None, help="default: the run's ceiling")
    ap.add_argument(
        "--min-rows", type=float, default=64, help="routed rows an active expert (issue 32: 64)"
    )
    args = ap.parse_args()
    shapes = load_shapes()
    print(
        "| row | rows an expert | measured (SOL) | ideal | bound: overlap | bound: serial |"
        " SOL at most (overlap / serial) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for path in args.results:
        with open(path) as f:
            doc = json.load(f)
        bw = doc["ceilings"]["read_tbps"] * 1e12
        for rec in doc["records"]:
            key = (rec["op"], rec["workload"])
            if rec["op"] not in LAYER_OPS or key not in shapes or rec.get("dtype") != "bf16":
                continue
            if rec.get("status") != "ok" or rec.get("tokens") is not None:
                continue
            per_expert = rec["routed_rows"] / rec["active_experts"]
            if per_expert < args.min_rows:
                continue
            fp8 = "fp8" in rec["workload"]
            rate = args.sustained_tflops
            if fp8:
                rate = args.fp8_tflops or doc["ceilings"]["fp8_tflops"]
            overlap, serial = bounds(rec, shapes[key], bw, rate * 1e12, 1.0 if fp8 else 2.0)
            ideal = rec["ideal_ms"]
            print(
                f"| {rec['op']} {rec['workload']} | {per_expert:.0f} | "
                f"{rec['ours_ms']:.2f} ms ({rec['sol']:.0%}) | {ideal:.2f} ms | "
                f"{overlap:.2f} ms | {serial:.2f} ms | "
                f"{ideal / overlap:.0%} / {ideal / serial:.0%} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
