#!/usr/bin/env python3
"""Summarize moekit-bench JSON files against the seed page.

Merges the records of one or more `moekit-bench --json` files (later files win for
the same op/workload/dtype), then prints markdown: the geometric mean of page time /
our time overall and per op, the rows furthest behind the page, accuracy counts, and
one line per row (ours, page, ratio); for runs with alternatives, each row's alternatives
over ours (the slowest margin first) beside its SOL.

    python3 bench/summarize.py run1.json [run2.json ...] > summary.md

With `--alternative NAME` (e.g. torch-grouped-mm) it also prints, per row, that
alternative's time in the run over the page's figure for it (from the seed workloads,
bench/workloads/seed1.json): how fast the run's GPU ran the same third-party kernel
as the page's machine did, next to ours / page.
"""
import json
import math
import os
import sys
from collections import defaultdict


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(paths):
    rows, heads = {}, []
    for p in paths:
        doc = json.load(open(p))
        knobs = doc.get("knobs")  # absent in runs saved before 2026-12-03 (session 7)
        knob_text = "" if knobs is None else " knobs: " + (" ".join(knobs) or "none")
        heads.append(f"{p}: {doc.get('device')} commit {doc.get('commit')} {doc.get('date')}{knob_text}")
        for r in doc["records"]:
            rows[(r["op"], r["workload"], r["dtype"])] = r
    recs = list(rows.values())
    timed = [r for r in recs if r.get("ours_ms") and r.get("page_ms")]
    print("Sources:\n" + "\n".join(f"- {h}" for h in heads) + "\n")
    acc = defaultdict(int)
    for r in recs:
        acc[r.get("accuracy", "none")] += 1
    print(f"Rows: {len(recs)} ({len(timed)} timed with a page figure); accuracy: "
          + ", ".join(f"{k} {v}" for k, v in sorted(acc.items())) + "\n")
    by_op = defaultdict(list)
    for r in timed:
        by_op[r["op"]].append(r["page_ms"] / r["ours_ms"])
    print("| op | rows | geomean page/ours | rows at or under the page |")
    print("| --- | ---: | ---: | ---: |")
    for op, v in by_op.items():
        print(f"| {op} | {len(v)} | {geomean(v):.3f} | {sum(x >= 1 for x in v)} |")
    allv = [r["page_ms"] / r["ours_ms"] for r in timed]
    print(f"| **all** | {len(allv)} | **{geomean(allv):.3f}** | {sum(x >= 1 for x in allv)} |\n")
    print("Furthest behind the page (ours / page):\n")
    for r in sorted(timed, key=lambda r: r["page_ms"] / r["ours_ms"])[:5]:
        print(f"- {r['op']} {r['workload']} {r['dtype']}: {r['ours_ms']:.4g} ms vs "
              f"{r['page_ms']:.4g} ms ({r['ours_ms'] / r['page_ms']:.2f}x)")
    print("\n| op | workload | dtype | ours ms | page ms | ours/page | SOL | accuracy |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for r in recs:
        ours, page = r.get("ours_ms"), r.get("page_ms")
        ratio = f"{ours / page:.2f}" if ours and page else "-"
        sol = f"{100 * r['sol']:.0f}%" if r.get("sol") else "-"
        print(f"| {r['op']} | {r['workload']} | {r['dtype']} | "
              f"{ours:.4g} | {page} | {ratio} | {sol} | {r.get('accuracy', '-')} |"
              if ours else f"| {r['op']} | {r['workload']} | {r['dtype']} | - | {page} | - | - | "
              f"{r.get('status', '-')} |")
    with_alts = [r for r in recs if r.get("ours_ms") and r.get("alternatives")]
    if with_alts:
        # Each live alternative's time over ours (> 1: moekit faster), the slowest margin
        # first: "faster than every live alternative" reads off the first column.
        print("\n| op | workload | dtype | ours ms | SOL | bound | alternative / ours (each) |")
        print("| --- | --- | --- | ---: | ---: | --- | --- |")
        for r in with_alts:
            alts = {k: v for k, v in r["alternatives"].items() if v}
            each = ", ".join(f"{k} {v / r['ours_ms']:.2f}x"
                             for k, v in sorted(alts.items(), key=lambda kv: kv[1]))
            sol = f"{100 * r['sol']:.0f}%" if r.get("sol") else "-"
            print(f"| {r['op']} | {r['workload']} | {r['dtype']} | {r['ours_ms']:.4g} | {sol} | "
                  f"{r.get('bound', '-')} | {each or 'none timed'} |")
    return 0


def alternative_vs_page(paths, name, seed_path):
    """Per row: the run's `name` time over the page's, and ours over the page's."""
    seed = json.load(open(seed_path))
    page_alt = {}
    for o in seed["ops"]:
        for w in o["workloads"]:
            for dt, res in w.get("results", {}).items():
                page_alt[(o["op"], w["name"], dt)] = res.get("alternatives_ms", {}).get(name)
    rows = {}
    for p in paths:
        for r in json.load(open(p))["records"]:
            rows[(r["op"], r["workload"], r["dtype"])] = r
    print(f"\n| op | workload | dtype | {name} run / page | ours / page |")
    print("| --- | --- | --- | ---: | ---: |")
    ratios = []
    for k, r in rows.items():
        run_alt, pa = (r.get("alternatives") or {}).get(name), page_alt.get(k)
        if not run_alt or not pa or not r.get("ours_ms") or not r.get("page_ms"):
            continue
        ratios.append(run_alt / pa)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {run_alt / pa:.3f} | {r['ours_ms'] / r['page_ms']:.3f} |")
    print(f"\n{name} on this run's GPU over the page's: geomean {geomean(ratios):.3f} "
          f"over {len(ratios)} rows")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--alternative" in args:
        i = args.index("--alternative")
        name = args[i + 1]
        files = args[:i] + args[i + 2:]
        seed = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads", "seed1.json")
        main(files)
        sys.exit(alternative_vs_page(files, name, seed))
    sys.exit(main(args))
