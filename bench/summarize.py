#!/usr/bin/env python3
"""Summarize moekit-bench JSON files against the seed page.

Merges the records of one or more `moekit-bench --json` files (later files win for
the same op/workload/dtype), then prints markdown: the geometric mean of page time /
our time overall and per op, the rows furthest behind the page, accuracy counts, and
one line per row (ours, page, ratio).

    python3 bench/summarize.py run1.json [run2.json ...] > summary.md
"""
import json
import math
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
