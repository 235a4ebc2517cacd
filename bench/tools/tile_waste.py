#!/usr/bin/env python3
"""Tensor work the SM90 tiles spend on padding rows, on issue 32's prefill rows (needs torch).

Routes each row's tokens as the bench draws them (N(0,1) logits; softmax, or sigmoid plus a
N(0, 0.1^2) correction bias and DeepSeek-V3's group selection), with this script's own
random draws: the counts follow the bench's distribution, not its exact values. Then counts
the rows the tiles multiply: an expert's rows in 128-row m-tiles, each tile's last warpgroup
skipped when it has no row (64-row granularity), a tail of <= 32 rows swapped (wgmma N =
16 or 32: swap_tile.cuh). The
waste column is multiplied rows / routed rows - 1: what tiles sized to each expert's row
count could save of the GEMMs' tensor work at most.

usage: tile_waste.py [--seed 0]
"""

import argparse

import torch

ROWS = [  # name, T, E, top_k, scoring, correction bias, groups, groups kept
    ("qwen3-235b-prefill", 4096, 128, 8, "softmax", False, 0, 0),
    ("qwen3-30b-prefill-t4096", 4096, 128, 8, "softmax", False, 0, 0),
    ("ds-v2-lite-prefill-t2048", 2048, 64, 6, "softmax", False, 0, 0),
    ("ds-v3-grouped T = 4096", 4096, 256, 8, "sigmoid", True, 8, 4),
    ("ds-v3-grouped T = 2048", 2048, 256, 8, "sigmoid", True, 8, 4),
    ("kimi-k2 T = 4096", 4096, 384, 8, "sigmoid", True, 0, 0),
    ("kimi-k2 T = 2048", 2048, 384, 8, "sigmoid", True, 0, 0),
    ("glm45 T = 4096", 4096, 160, 8, "sigmoid", True, 0, 0),
    ("glm45 T = 2048", 2048, 160, 8, "sigmoid", True, 0, 0),
]


def expert_counts(T, E, K, scoring, bias, groups, keep, gen):
    logits = torch.randn(T, E, generator=gen)
    if scoring == "softmax":
        sel = torch.softmax(logits, -1)
    else:
        sel = torch.sigmoid(logits)
        if bias:
            sel = sel + torch.randn(E, generator=gen) * 0.1
    if groups:
        group_score = sel.view(T, groups, E // groups).topk(2, -1).values.sum(-1)
        kept = torch.zeros(T, groups, dtype=torch.bool)
        kept.scatter_(1, group_score.topk(keep, -1).indices, True)
        sel = sel.masked_fill(~kept.repeat_interleave(E // groups, 1), float("-inf"))
    ids = sel.topk(K, -1).indices
    return torch.bincount(ids.flatten(), minlength=E)


def multiplied_rows(r):
    full, tail = divmod(r, 128)
    if tail == 0:
        return 128 * full
    return 128 * full + (16 if tail <= 16 else 32 if tail <= 32 else 64 if tail <= 64 else 128)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    print("| row | active experts | rows an expert (min / max) | m-tiles | padding |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, T, E, K, scoring, bias, groups, keep in ROWS:
        c = expert_counts(T, E, K, scoring, bias, groups, keep, gen)
        active = c[c > 0].tolist()
        routed = sum(active)
        mult = sum(multiplied_rows(r) for r in active)
        tiles = sum((r + 127) // 128 for r in active)
        print(f"| {name} | {len(active)} | {min(active)} / {max(active)} | {tiles} | "
              f"{100 * (mult / routed - 1):.1f}% |")


if __name__ == "__main__":
    main()
