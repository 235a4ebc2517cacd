#!/usr/bin/env python3
"""CPU test of moekit-plot (the benchmark's pictures, bench/src/plot.h).

    check_plot.py MOEKIT_PLOT OUTDIR

Draws the committed H200 run (results/h200/full.json, no alternatives), a table run with
alternatives, an accuracy failure and a row not measured (bench/tests/data/plot_table_run.json)
a --tokens run (bench/tests/data/plot_tokens_run.json) and a tuned layer (moekit-plot --tune:
plot_tune_layer.table.partial, its table and plot_tune_bench.json; all synthetic), then checks each
SVG as a browser would read it: well-formed XML, a title with the GPU, commit and date, one
panel per op (table) or per op / workload / dtype (tokens), every row's label, the legend's
entries, and every coordinate finite and inside the picture. Also: the default output path
(RUN.svg next to RUN.json, NAME.svg next to a partial file) and a clear failure on a file that
is not a run, or a partial file's line that does not parse (naming the file and line).
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def draw(plot, json_path, svg_path):
    out = subprocess.run([plot, json_path, svg_path], capture_output=True, text=True)
    check(out.returncode == 0, f"moekit-plot {json_path}: exit {out.returncode}: {out.stderr}")


def numbers(value):
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", value)]


def check_svg(svg_path, doc, title_keys=("device", "commit", "date")):
    name = os.path.basename(svg_path)
    text = open(svg_path, encoding="utf-8").read()
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        check(False, f"{name}: not well-formed XML: {e}")
        return None
    check(root.tag == NS + "svg", f"{name}: root is {root.tag}, not svg")
    width, height = float(root.get("width")), float(root.get("height"))
    check(0 < width < 5000 and 0 < height < 20000, f"{name}: size {width} x {height}")
    names = ("class", "data-op", "data-workload", "data-dtype", "data-series")
    values = " ".join(v for el in root.iter() for k, v in el.attrib.items() if k not in names)
    check(not re.search(r"nan|inf", values, re.I), f"{name}: NaN or inf in an attribute")
    # Every coordinate finite and inside the picture (1 px of slack for strokes).
    for el in root.iter():
        for key in ("x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "points"):
            if key in el.attrib:
                for i, v in enumerate(numbers(el.get(key))):
                    horizontal = key in ("x", "x1", "x2", "cx") or (key == "points" and i % 2 == 0)
                    limit = width if horizontal else height
                    if not check(math.isfinite(v) and -1 <= v <= limit + 1,
                                 f"{name}: <{el.tag[len(NS):]} {key}={v}> outside 0..{limit}"):
                        break
        if el.tag == NS + "text" and el.get("x") is not None and el.get("text-anchor") == "start":
            # A left-aligned text that runs past the right edge is cut off.
            est = 0.6 * float(el.get("font-size")) * len(el.text or "")
            check(float(el.get("x")) + est <= width + 4,
                  f"{name}: text past the right edge: {el.text!r}")
    title = root.find(NS + "title")
    for key in title_keys:
        check(title is not None and doc[key] in title.text, f"{name}: the title lacks the {key}")
    return root


def panels(root):
    return [g for g in root.iter(NS + "g") if g.get("class") == "panel"]


def texts(el):
    return [t.text or "" for t in el.iter(NS + "text")]


def legend_series(root):
    return {g.get("data-series") for g in root.iter(NS + "g") if g.get("class") == "legend-entry"}


def alternatives(doc):
    names = []
    for r in doc["records"]:
        for a in r.get("alternatives", {}):
            if a not in names:
                names.append(a)
    return names


def check_table(svg_path, doc):
    root = check_svg(svg_path, doc)
    if root is None:
        return
    name = os.path.basename(svg_path)
    ops = list(dict.fromkeys(r["op"] for r in doc["records"]))
    got = [p.get("data-op") for p in panels(root)]
    check(got == (["all"] if len(ops) > 1 else []) + ops, f"{name}: panels {got}, ops {ops}")
    by_op = {p.get("data-op"): texts(p) for p in panels(root)}
    for r in doc["records"]:
        label = f"{r['workload']} {r['dtype']}"
        row_texts = by_op.get(r["op"], [])
        check(any(t.endswith(label) for t in row_texts), f"{name}: no row {r['op']} {label}")
        if r.get("accuracy") == "fail":
            check("✗ " + label in row_texts, f"{name}: {label}'s accuracy failure not marked")
        if r["status"] != "ok":
            check(any(r["status"][:20] in t for t in row_texts),
                  f"{name}: {label}'s status not shown")
        if r.get("ours_ms") and r.get("page_ms"):
            ratio = f"{r['page_ms'] / r['ours_ms']:.2f}"
            check(ratio in row_texts, f"{name}: {label}'s page/ours {ratio} not shown")
    want = {"page", "sol"} | set(alternatives(doc))
    check(want <= legend_series(root), f"{name}: legend {legend_series(root)}, want {want}")
    # Each alternative of a row is a bar with the numbers in its tooltip.
    tips = [t.text for t in root.iter(NS + "title")]
    for r in doc["records"]:
        for a, ms in r.get("alternatives", {}).items():
            if ms and r.get("ours_ms"):
                row = f"{r['op']} {r['workload']} {r['dtype']}"
                check(any(t and t.startswith(f"{row}: {a} ") for t in tips),
                      f"{name}: no {a} bar for {row}")


def check_tokens(svg_path, doc):
    root = check_svg(svg_path, doc)
    if root is None:
        return
    name = os.path.basename(svg_path)
    want = list(dict.fromkeys((r["op"], r["base_workload"], r["dtype"]) for r in doc["records"]))
    got = [(p.get("data-op"), p.get("data-workload"), p.get("data-dtype")) for p in panels(root)]
    check(got == want, f"{name}: panels {got}, want {want}")
    for p in panels(root):
        t = texts(p)
        check("tokens" in t or "tokens (log)" in t, f"{name}: a panel without its token axis label")
        check(any(x.startswith("time (ms") for x in t),
              f"{name}: a panel without its time axis label")
        check(len(list(p.iter(NS + "polyline"))) >= 2,
              f"{name}: a panel without moekit's and the roofline's curves")
    want_legend = {"moekit", "roofline", "page"} | set(alternatives(doc))
    check(want_legend <= legend_series(root),
          f"{name}: legend {legend_series(root)}, want {want_legend}")
    # One marker of moekit's per measured row, at its token count.
    tips = [t.text for t in root.iter(NS + "title") if t.text and ": moekit " in t.text]
    check(len(tips) == sum(1 for r in doc["records"] if r.get("ours_ms")),
          f"{name}: {len(tips)} moekit points for {len(doc['records'])} rows")


def check_tune(plot, outdir):
    data = os.path.join(ROOT, "bench/tests/data")
    partial = os.path.join(data, "plot_tune_layer.table.partial")
    svg = os.path.join(outdir, "tune.svg")
    args = ["--table", os.path.join(data, "plot_tune_layer.table"),
            "--bench", os.path.join(data, "plot_tune_bench.json"), "--workload", "qwen3-30b"]
    out = subprocess.run([plot, "--tune", partial] + args + [svg], capture_output=True, text=True)
    if not check(out.returncode == 0, f"moekit-plot --tune: exit {out.returncode}: {out.stderr}"):
        return
    root = check_svg(svg, {"device": "NVIDIA H200"}, ("device",))
    if root is None:
        return
    got = [g.get("data-panel") for g in panels(root)]
    check(got == ["time", "ratio"], f"tune.svg: panels {got}")
    series = {g.get("data-series") for g in root.iter(NS + "g") if g.get("class") == "series"}
    want = {f"{s}-{r}" for s in ("tuned", "default", "speedup") for r in ("uniform", "skewed")}
    want |= {"best-alternative", "roofline", "guardrail"}
    check(series == want, f"tune.svg: series {sorted(series)}, want {sorted(want)}")
    check({"tuned", "default", "best-alternative", "roofline"} <= legend_series(root),
          f"tune.svg: legend {legend_series(root)}")
    lines = open(partial).read().splitlines()[1:]
    counts = {int(l.split("|")[0]) for l in lines}
    tips = [t.text for t in root.iter(NS + "title") if t.text and " uniform: default " in t.text]
    check(len(tips) == 2 * len(counts),  # a default point and a ratio point per count
          f"tune.svg: {len(tips)} uniform default tips, {len(counts)} counts")
    # Without OUT: NAME.svg next to the partial file; a bad line: its file and line named.
    copy = os.path.join(outdir, "layer.table.partial")
    head = open(partial).read().splitlines()[:3]
    open(copy, "w").write("\n".join(head + ["7 | uniform"]) + "\n")
    out = subprocess.run([plot, "--tune", copy], capture_output=True, text=True)
    check(out.returncode == 1 and f"{copy}:4: expected 6" in out.stderr,
          f"a bad partial line: exit {out.returncode}, {out.stderr!r}")
    open(copy, "w").write("\n".join(head) + "\n")
    subprocess.run([plot, "--tune", copy], capture_output=True)
    check(os.path.exists(os.path.join(outdir, "layer.svg")),
          "no layer.svg next to the partial file")


def main(plot, outdir):
    os.makedirs(outdir, exist_ok=True)
    runs = [("results/h200/full.json", check_table),
            ("bench/tests/data/plot_table_run.json", check_table),
            ("bench/tests/data/plot_tokens_run.json", check_tokens)]
    for rel, checker in runs:
        doc = json.load(open(os.path.join(ROOT, rel)))
        svg = os.path.join(outdir, os.path.basename(rel)[:-5] + ".svg")
        draw(plot, os.path.join(ROOT, rel), svg)
        if os.path.exists(svg):
            checker(svg, doc)
    # Without OUT: RUN.svg next to RUN.json.
    copy = os.path.join(outdir, "default-name.json")
    shutil.copy(os.path.join(ROOT, "bench/tests/data/plot_tokens_run.json"), copy)
    subprocess.run([plot, copy], capture_output=True)
    check(os.path.exists(os.path.join(outdir, "default-name.svg")),
          "no default-name.svg next to the JSON")
    # Not a run: a clear error, no picture.
    bad = os.path.join(outdir, "not-a-run.json")
    open(bad, "w").write('{"ops": []}')
    out = subprocess.run([plot, bad, os.path.join(outdir, "not-a-run.svg")],
                         capture_output=True, text=True)
    check(out.returncode == 1 and "records" in out.stderr,
          f"not a run: exit {out.returncode}, {out.stderr!r}")
    check_tune(plot, outdir)
    for f in failures:
        print("FAIL:", f)
    print(f"check_plot: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
